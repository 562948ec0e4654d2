"""The ``nsysan`` command line. Each command is a thin shell over the library.

Errors nsysan raises on purpose (:class:`~nsysan.errors.NsysanError`) become one line on stderr
and the error's exit code: 2 for unusable input, 3 when ``--fail-on`` matched.
"""

from __future__ import annotations

import os
import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Any

import typer

from nsysan import __version__
from nsysan.errors import GateFailed, InputError, NsysanError
from nsysan.report.formats import FORMATS
from nsysan.workloads import WORKLOADS

app = typer.Typer(
    name="nsysan",
    help="Findings from Nsight Systems captures of distributed PyTorch jobs.",
    no_args_is_help=True,
    rich_markup_mode=None,  # plain click help: no `<bool>` after every flag (typer 0.29), choices listed, no ANSI
    pretty_exceptions_enable=False,
)


OutputFormat = Enum("OutputFormat", {name: name for name in FORMATS}, type=str)  # type: ignore[misc]
Workload = Enum("Workload", {name: name for name in WORKLOADS}, type=str)  # type: ignore[misc]


# how a bundled workload's ranks may talk: every transport some workload runs with
Transport = Enum(  # type: ignore[misc]
    "Transport", {t: t for t in sorted({t for _, transports, _ in WORKLOADS.values() for t in transports})}, type=str
)
DEFAULT_TRANSPORT = Transport("gloo")


# an --output file's suffix -> the format it implies when --format is not given
SUFFIX_FORMATS = {".json": "json", ".md": "markdown", ".markdown": "markdown", ".html": "html", ".htm": "html"}


def output_format_for(given: str | None, output: Path | None) -> str:
    """The format to write: --format when given, else the one --output's suffix names, else terminal.
    A --format that contradicts the suffix is refused rather than writing, say, text into a .json file."""
    implied = SUFFIX_FORMATS.get(output.suffix.lower()) if output is not None else None
    if given is not None and implied is not None and given != implied:
        raise InputError(f"--format {given} contradicts --output {output} (a {implied} file name); "
                         f"drop --format or rename the file")  # fmt: skip
    return given or implied or "terminal"


class FailOn(str, Enum):
    warning = "warning"
    critical = "critical"


def _version(value: bool) -> None:
    if value:
        typer.echo(f"nsysan {__version__}")
        raise typer.Exit()


@app.callback()
def _main(
    version: Annotated[
        bool | None,
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Findings from Nsight Systems captures of distributed PyTorch jobs."""


# the frame cache (docs/cache.md): report, diff and the cache commands
CacheDir = Annotated[
    Path | None,
    typer.Option(
        "--cache",
        metavar="DIR",
        help="The frame cache's directory (default: $XDG_CACHE_HOME/nsysan/frames): the frames read from each "
        "export, and report's map result of it, are kept there, so the next look at an unchanged export skips "
        "SQLite (and the next report the analysis). Use a directory only you can write.",
    ),
]
NoCache = Annotated[bool, typer.Option("--no-cache", help="Read and analyse every export afresh; write no cache.")]
NoColor = Annotated[
    bool, typer.Option("--no-color", help="Terminal output without colour (as does a non-empty NO_COLOR variable).")
]
AllowMixed = Annotated[
    bool,
    typer.Option(
        "--allow-mixed",
        help="Analyse exports whose processes announce the same rank (two captures given together are "
        "refused by default); the repeats are numbered as guessed ranks.",
    ),
]
PIPED_WIDTH = 160  # columns of terminal output that goes to a file or a pipe, unless COLUMNS says otherwise


def terminal_style(output: Path | None, no_color: bool = False) -> tuple[int | None, bool]:
    """(width, colour) of terminal-format output: a terminal's own width and colour; to a file or a
    pipe, COLUMNS columns (else 160) and no colour; NO_COLOR (https://no-color.org) or --no-color
    turns colour off anywhere."""
    interactive = output is None and sys.stdout.isatty()
    columns = os.environ.get("COLUMNS", "")
    width = int(columns) if columns.isdigit() and int(columns) > 0 else (None if interactive else PIPED_WIDTH)
    return width, interactive and not no_color and not os.environ.get("NO_COLOR")


@app.command()
def report(
    traces: Annotated[
        list[str],
        typer.Argument(
            help="nsys exports (SQLite, .nsys-rep, .arrows, parquetdir/arrowdir directories): files, directories "
            "of them, or globs. Give all ranks of one job together (one export per rank, or one holding all processes).",
            metavar="TRACE...",
            show_default=False,
        ),
    ],
    output_format: Annotated[
        OutputFormat | None,
        typer.Option(
            "--format",
            "-f",
            help="terminal for reading; json for tools and CI; markdown/html to share. "
            "Default: from --output's suffix (.json, .md, .html), else terminal.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[
        Path | None,
        typer.Option("--output", "-o", help="Write the report to this file instead of standard output."),
    ] = None,
    settings: Annotated[
        list[str] | None,
        typer.Option(
            "--set",
            metavar="KIND.PARAM=VALUE",
            help="Override a detector threshold, e.g. --set comm_compute_slowdown.min_ratio=1.3 "
            "(repeatable; `nsysan detectors` lists them).",
        ),
    ] = None,
    fail_on: Annotated[
        FailOn | None,
        typer.Option(
            "--fail-on",
            help="Exit with code 3 when a finding at this severity or worse exists: use it as a CI gate.",
        ),
    ] = None,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    workers: Annotated[
        int | None,
        typer.Option(
            "--workers",
            min=0,
            help="Analyse the exports on a local Dask cluster of this many worker processes, one export (or one "
            "slice of an export's ranks) at a time each (0 or 1: in this process). Default: in this process for "
            "one export or under 512 MiB of exports, else one worker per core. Under 32 MiB of exports, in this "
            "process whatever N (a cluster takes longer to start than the analysis), saying so.",
            show_default=False,
        ),
    ] = None,
    scheduler: Annotated[
        str | None,
        typer.Option(
            "--scheduler",
            metavar="ADDRESS",
            help="Use a running Dask scheduler (e.g. tcp://10.0.0.5:8786, started with `dask scheduler` and "
            "`dask worker` on a Slurm allocation); its workers must read the exports at the same paths.",
        ),
    ] = None,
    step_pattern: Annotated[
        str | None,
        typer.Option(
            "--step-pattern",
            "--step-regex",
            metavar="REGEX",
            help="NVTX range names that mark a training step (case-insensitive regular expression); default: "
            "step / iter / iteration / train_step / ProfilerStep#. Without matching ranges, steps come from the "
            "repeating kernel sequence.",
            show_default=False,
        ),
    ] = None,
    show_all: Annotated[
        bool,
        typer.Option(
            "--all",
            help="Terminal report: list info finding groups too (by default only warning and critical ones, "
            "the info ones counted in one line). Use it to see everything that was found.",
        ),
    ] = False,
    verbose: Annotated[
        bool,
        typer.Option(
            "--verbose",
            "-v",
            help="Terminal report: each listed finding group's evidence (where, when, kernels, streams, ids "
            "to find in the nsys GUI) and the fix to try. Use it when you act on a finding. Markdown and HTML "
            "always hold all of it; JSON is always complete.",
        ),
    ] = False,
    allow_mixed: AllowMixed = False,
    no_color: NoColor = False,
) -> None:
    """Analyse nsys exports: where each rank's step time went, what to fix first, NCCL, NVTX, capture limits.

    Example: nsysan report fixtures/samples/allreduce-2rank.sqlite --format markdown -o report.md
    """
    from nsysan.detect import parse_settings
    from nsysan.diff import capture_notes, read_manifest
    from nsysan.engine import analyse_files, open_engine, too_small_for_workers
    from nsysan.findings import Severity
    from nsysan.ingest import expand_inputs
    from nsysan.report.renderers import RENDERERS, render_terminal
    from nsysan.steps import DEFAULT_STEP_PATTERN, check_pattern

    fmt = output_format_for(output_format.value if output_format else None, output)
    pattern = DEFAULT_STEP_PATTERN if step_pattern is None else step_pattern
    check_pattern(pattern)
    overrides = parse_settings(settings or [])
    _configure_cache(cache_dir, no_cache)
    manifests = [m for m in map(read_manifest, traces) if m is not None]  # run directories of `nsysan capture`
    paths = expand_inputs(traces)
    if output is not None and output.resolve() in {p.resolve() for p in paths}:
        raise InputError(f"{output}: is one of the input traces; choose another --output file")
    if (
        workers is not None
        and workers > 1
        and scheduler is None
        and (small := too_small_for_workers(paths)) is not None
    ):
        typer.echo(f"nsysan: --workers {workers}: {len(paths)} export(s), {small / 2**20:.1f} MiB in all, are analysed "
                   "sooner in this process than a local cluster starts; analysing here", err=True)  # fmt: skip
        workers = 0
    with open_engine(workers, scheduler, paths) as engine:
        # json carries the profile `nsysan diff` needs from a saved baseline
        doc = analyse_files(traces, overrides, engine, pattern if fmt == "json" else None, step_pattern=pattern,
                            allow_mixed=allow_mixed)  # fmt: skip
    if manifests:
        doc["capture"] = manifests[0] if len(manifests) == 1 else manifests
        ranks = len({r for t in doc["traces"] for r in t["ranks"]})
        notes = [n for m in manifests for n in capture_notes(m, ranks)]
        doc["summary"]["limitations"][:0] = notes
        for note in notes:
            typer.echo(f"nsysan: warning: {note}", err=True)
    if fmt == "terminal":
        width, color = terminal_style(output, no_color)
        text = render_terminal(doc, width=width, color=color, verbose=verbose, show_all=show_all)
    else:
        text = RENDERERS[fmt](doc)
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{output}: cannot write report ({exc.strerror})") from None
    if fail_on is not None:
        threshold = Severity(fail_on.value).rank
        matched = sum(Severity(f["severity"]).rank >= threshold for f in doc["findings"])
        if matched:
            raise GateFailed(f"{matched} finding(s) at {fail_on.value} or worse")
        unclean = [m for m in manifests if m["status"] != "ok"]
        if unclean:
            raise GateFailed(f"the capture {unclean[0]['status']} (manifest.json): no clean run to pass the gate")


def _configure_cache(directory: Path | None, off: bool) -> None:
    """The frame cache for this command's loads: on unless --no-cache (or NSYSAN_CACHE=0 with no --cache)."""
    from nsysan.ingest import raw_reports
    from nsysan.ingest.cache import ENV, configure

    unset = os.environ.get(ENV, "").strip().lower() in ("0", "off", "no", "false")
    enabled = not off and (directory is not None or not unset)
    configure(enabled=enabled, directory=directory)
    # a .nsys-rep's SQLite export: kept beside the frames, or for this run only
    raw_reports.configure(raw_reports.exports_dir(directory), cached=enabled)


class DiffFailOn(str, Enum):
    new_findings = "new-findings"
    warning = "warning"
    critical = "critical"


def _write(text: str, output: Path | None) -> None:
    if output is None:
        sys.stdout.write(text)
        return
    try:
        output.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise InputError(f"{output}: cannot write ({exc.strerror})") from None


@app.command()
def diff(
    before: Annotated[
        str,
        typer.Argument(
            help="The capture before the change: an export, a directory of per-rank "
            "exports (or a capture's run directory), a glob, or a saved `report --format json`.",
            metavar="BEFORE",
            show_default=False,
        ),
    ],
    after: Annotated[
        str,
        typer.Argument(
            help="The capture after the change, in any of the same forms.", metavar="AFTER", show_default=False
        ),
    ],
    output_format: Annotated[
        OutputFormat | None,
        typer.Option(
            "--format",
            "-f",
            help="terminal; json (versioned, docs/diff.md); markdown for a PR "
            "comment; html. Default: from --output's suffix, else terminal.",
            show_default=False,
        ),
    ] = None,
    output: Annotated[Path | None, typer.Option("--output", "-o", help="Write the diff to this file.")] = None,
    fail_on_regression: Annotated[
        str | None,
        typer.Option(
            "--fail-on-regression",
            metavar="PCT",
            help="Exit 3 when --metric is worse by more than "
            "PCT (e.g. 5%) and the per-step spread makes the change at least 95% likely to be real.",
        ),
    ] = None,
    metric: Annotated[
        str,
        typer.Option(
            "--metric",
            help="What --fail-on-regression gates: step, busy, nccl, a step breakdown category (compute, "
            "communication_exposed, waiting_for_peer, copy_exposed, idle: its time per step) or kernel:NAME.",
        ),
    ] = "step",
    fail_on: Annotated[
        DiffFailOn | None,
        typer.Option(
            "--fail-on", help="Exit 3 on any new finding group, or on a new or worsened one at this severity or worse."
        ),
    ] = None,
    force: Annotated[
        bool, typer.Option("--force", help="Compare even when the two captures are not comparable.")
    ] = False,
    step_pattern: Annotated[
        str | None,
        typer.Option(
            "--step-pattern",
            metavar="REGEX",
            help="NVTX range names that mark a step (case-insensitive); default: step / iter / iteration / train_step.",
        ),
    ] = None,
    settings: Annotated[
        list[str] | None,
        typer.Option("--set", metavar="KIND.PARAM=VALUE", help="Detector threshold, as for `report` (repeatable)."),
    ] = None,
    cache_dir: CacheDir = None,
    no_cache: NoCache = False,
    allow_mixed: AllowMixed = False,
    no_color: NoColor = False,
) -> None:
    """Compare two captures of one job (before/after a change): step time, GPU time, NCCL, kernels, findings.

    Example: nsysan diff runs/before/ runs/after/ --fail-on-regression 5% --format markdown -o diff.md
    """
    from nsysan.detect import parse_settings
    from nsysan.diff import DEFAULT_STEP_PATTERN, NotComparable, diff_documents, gate, load_side, parse_threshold
    from nsysan.diff.compare import METRICS
    from nsysan.diff.render import RENDERERS, render_terminal

    if metric not in METRICS and not (metric.startswith("kernel:") and len(metric) > 7):
        raise InputError(f"--metric {metric!r}: one of {', '.join(METRICS)}, kernel:NAME")
    fmt = output_format_for(output_format.value if output_format else None, output)
    threshold = parse_threshold(fail_on_regression) if fail_on_regression is not None else None
    overrides = parse_settings(settings or [])
    _configure_cache(cache_dir, no_cache)
    if output is not None:
        from nsysan.ingest import expand_inputs

        inputs = {Path(arg).resolve() for arg in (before, after) if Path(arg).suffix == ".json"}
        inputs |= {p.resolve() for arg in (before, after) if Path(arg).suffix != ".json" for p in expand_inputs([arg])}
        if output.resolve() in inputs:
            raise InputError(f"{output}: is one of the inputs; choose another --output file")
    from nsysan.engine import Serial, analyse_files

    pattern = step_pattern or DEFAULT_STEP_PATTERN

    def analyse_traces(arg: str) -> dict[str, Any]:  # as `report` does: map results kept in the cache
        return analyse_files([arg], overrides, Serial(), pattern, allow_mixed=allow_mixed)

    sides = [load_side(arg, settings=overrides, step_pattern=pattern, analyse_traces=analyse_traces)
             for arg in (before, after)]  # fmt: skip
    doc = diff_documents(*sides, labels=(before, after))
    if not doc["comparable"]["ok"] and not force:
        raise NotComparable(
            "not comparable: " + "; ".join(doc["comparable"]["reasons"]) + " (--force compares them anyway)"
        )
    verdict = gate(doc, *sides, threshold=threshold, metric=metric, fail_on=fail_on.value if fail_on else None)
    if threshold is not None or fail_on is not None:
        doc["gate"] = verdict
    if fmt == "terminal":
        width, color = terminal_style(output, no_color)
        text = render_terminal(doc, width=width, color=color)
    else:
        text = RENDERERS[fmt](doc)
    _write(text, output)
    if verdict["failed"]:
        raise GateFailed("; ".join(verdict["reasons"]))


cache_app = typer.Typer(
    help="The frame cache: what `report` and `diff` keep of each export they read (docs/cache.md).",
    no_args_is_help=True,
)
app.add_typer(cache_app, name="cache")


@cache_app.command("info")
def cache_info(cache_dir: CacheDir = None) -> None:
    """Where the frame cache is, how many exports it holds and its size on disk."""
    from nsysan.ingest.cache import FrameCache
    from nsysan.ingest.raw_reports import exports_dir, exports_info

    info = FrameCache(cache_dir).info()
    reports, report_bytes = exports_info(exports_dir(cache_dir))
    typer.echo(f"location: {info.location}")
    typer.echo(f"entries:  {info.entries} export(s), {info.files} file(s)")
    typer.echo(f"size:     {info.size_bytes / 2**20:.1f} MiB")
    typer.echo(
        f"reports:  {reports} .nsys-rep or Arrow/Parquet export(s) made into SQLite, {report_bytes / 2**20:.1f} MiB in "
        f"{exports_dir(cache_dir)}"
    )


@cache_app.command("clear")
def cache_clear(cache_dir: CacheDir = None) -> None:
    """Remove every entry of the frame cache and the SQLite made of .nsys-rep reports and Arrow/Parquet exports (only nsysan's entries)."""
    from nsysan.ingest.cache import FrameCache
    from nsysan.ingest.raw_reports import clear_exports, exports_dir

    cache = FrameCache(cache_dir)
    removed, left = cache.clear()
    reports, reports_left = clear_exports(exports_dir(cache_dir))
    typer.echo(f"removed {removed} cache entr{'y' if removed == 1 else 'ies'}"
               + (f" and {reports} exported report{'' if reports == 1 else 's'}" if reports else ""))  # fmt: skip
    if left:
        typer.echo(f"nsysan: error: could not remove {left} cache entr{'y' if left == 1 else 'ies'} in "
                   f"{cache.directory} (no permission to delete there?)", err=True)  # fmt: skip
    if reports_left:
        typer.echo(f"nsysan: error: could not remove {reports_left} exported report{'' if reports_left == 1 else 's'} "
                   f"in {exports_dir(cache_dir)} (no permission to delete there?)", err=True)  # fmt: skip
    if left or reports_left:
        raise typer.Exit(1)


@app.command()
def capture(
    command: Annotated[
        list[str] | None,
        typer.Argument(
            help="The job to run, after `--` (e.g. -- torchrun --nproc_per_node=8 train.py).",
            metavar="COMMAND...",
            show_default=False,
        ),
    ] = None,
    output_dir: Annotated[
        Path, typer.Option("--output-dir", "-d", help="Where run directories go; each run gets its own.")
    ] = Path("nsysan-runs"),
    nsys_options: Annotated[
        list[str] | None,
        typer.Option(
            "--nsys",
            metavar="--OPTION=VALUE",
            help="An nsys profile option, overriding nsysan's default of the same name (repeatable), e.g. --nsys=--trace=nvtx,osrt.",
        ),
    ] = None,
    workload: Annotated[
        Workload | None,
        typer.Option("--workload", "-w", help="Run a bundled workload instead of a command (see docs/capture.md)."),
    ] = None,
    nproc: Annotated[int, typer.Option("--nproc", metavar="N", help="Processes (ranks) for --workload.")] = 2,
    transport: Annotated[
        Transport, typer.Option("--transport", help="For --workload: how the ranks talk (p2p: nsysan's transport).")
    ] = DEFAULT_TRANSPORT,
) -> None:
    """Run a job under nsys with the flags distributed users need; export to SQLite; write a manifest.

    Example: nsysan capture -- torchrun --nproc_per_node=4 train.py
    """
    from nsysan.capture import capture as run_capture
    from nsysan.capture import check_nsys, check_overrides, run_directory
    from nsysan.workloads import torchrun_command

    workload_name = workload.value if workload is not None else None
    transport_name = transport.value
    if workload_name is not None:
        from nsysan.workloads.preflight import check_workload

        if command:
            raise InputError("give either --workload or a command after `--`, not both")
        # a workload that cannot run would still leave an empty report
        check_workload(workload_name, nproc, transport_name)
        command = torchrun_command(workload_name, nproc, transport_name)
    if not command:
        raise InputError("no command to capture: give one after `--`, or --workload NAME")
    try:
        check_overrides(nsys_options or [])
    except ValueError as exc:
        raise InputError(f"--nsys: {exc}") from None
    nsys = check_nsys()  # before creating anything
    name = workload_name or Path(command[0]).name
    manifest, run_dir = run_capture(
        command, run_directory(output_dir, name), nsys_options=nsys_options or [], nsys=nsys,
        workload={"name": workload_name, "nproc": nproc, "transport": transport_name} if workload_name else None,
    )  # fmt: skip
    empty = _nothing_recorded(manifest.outputs.get("sqlite"))
    if empty:
        failed = (
            f"the job failed (exit code {manifest.exit_code}; see its messages above) and "
            if manifest.exit_code
            else ""
        )
        typer.echo(f"nsysan: {failed}the capture recorded nothing to report ({empty}); "
                   f"{run_dir / 'manifest.json'} has what was run", err=True)  # fmt: skip
    elif "sqlite" in manifest.outputs:
        typer.echo(f"nsysan: next: nsysan report {manifest.outputs['sqlite']}", err=True)
    if manifest.exit_code:
        sys.exit(manifest.exit_code)


def _nothing_recorded(sqlite: str | None) -> str | None:
    """Why a capture's export has nothing `nsysan report` can read (no CUDA activity and no NVTX
    events, say), or None when it can be reported: a next step that fails would send the user in a
    circle."""
    from nsysan.ingest import load_trace

    if sqlite is None:
        return None
    try:
        with load_trace([sqlite]):
            return None
    except InputError as exc:  # its own text would suggest capturing with nsysan capture: a circle
        text = str(exc)
        return "no CUDA activity and no NVTX events" if "no CUDA activity and no NVTX events" in text else text


@app.command()
def detectors() -> None:
    """List the detectors and their parameters (defaults; change them with `report --set`)."""
    import dataclasses

    from rich.console import Console
    from rich.table import Table
    from rich.text import Text

    from nsysan.detect import registered

    table = Table(title=Text("Detectors"), title_justify="left")
    for column in ("parameter", "default", "meaning"):
        table.add_column(column, overflow="fold")
    for kind, spec in registered().items():
        table.add_row(Text(kind, style="bold"), Text(""), Text(spec.summary))
        for f in dataclasses.fields(spec.params):
            table.add_row(Text(f"{kind}.{f.name}"), Text(str(f.default)), Text(f.metadata.get("help", "")))
    width, color = terminal_style(None)
    Console(width=width, no_color=not color).print(table)


def _bundled_traces() -> Path | None:
    """The committed sample traces, when nsysan runs from its source tree (pip install -e .)."""
    samples = Path(__file__).resolve().parent.parent / "fixtures" / "samples"
    return samples if samples.is_dir() else None


@app.command()
def serve(
    db: Annotated[
        str | None,
        typer.Option(
            "--db",
            help="The review store: a SQLite file (default ./nsysan-review.sqlite), or a URL such as "
            "postgresql+psycopg://user:pw@host/db.",
        ),
    ] = None,
    traces_dir: Annotated[
        Path | None,
        typer.Option(
            "--traces",
            help="A directory of exports to register at start (and on demand); each "
            "file is one trace, each subdirectory of exports one job. Default: the bundled samples.",
        ),
    ] = None,
    host: Annotated[
        str, typer.Option("--host", help="Address to listen on; anything but loopback requires login.")
    ] = "127.0.0.1",
    port: Annotated[int, typer.Option("--port", help="Port to listen on.")] = 8050,
    users_file: Annotated[
        Path | None,
        typer.Option(
            "--users",
            help='A TOML file with a \\[users] table of name = "<hash>" (see `nsysan hash-password`); '
            "NSYSAN_USERS=name=<hash>,... adds more.",
        ),
    ] = None,
    uploads_dir: Annotated[Path, typer.Option("--uploads", help="Where uploaded exports are kept.")] = Path(
        "nsysan-uploads"
    ),
    max_upload_mb: Annotated[int, typer.Option("--max-upload-mb", help="Largest upload accepted, in MiB.")] = 200,
    session_hours: Annotated[
        float,
        typer.Option("--session-hours", help="A login lasts this long at most (and ends sooner when idle as long)."),
    ] = 12.0,
    secure_cookies: Annotated[
        bool,
        typer.Option("--secure-cookies", help="Send the session cookie over HTTPS only (serve behind a TLS proxy)."),
    ] = False,
    reanalyse_by: Annotated[
        str,
        typer.Option(
            "--reanalyse-by",
            help="Who may re-analyse a trace with other settings from the dashboard: everyone, nobody, "
            "or a comma-separated list of users (needs login).",
        ),
    ] = "everyone",
    admins: Annotated[
        str,
        typer.Option("--admins", help="Comma-separated users who may delete anyone's upload (needs login)."),
    ] = "",
    upload_quota_mb: Annotated[
        int,
        typer.Option("--upload-quota-mb", help="What one uploader's traces may take on disk, in MiB (0: no quota)."),
    ] = 2000,
) -> None:
    """Open the web dashboard where a team reviews traces and findings together.

    Example: nsysan serve --traces runs/ --db postgresql+psycopg://nsysan@dbhost/nsysan --host 0.0.0.0 --users users.toml
    """
    from nsysan.extras import require

    require("dashboard", "nsysan serve")
    from dashboards.app import start
    from dashboards.auth import USERS_ENV, is_loopback, load_users
    from dashboards.server import Server
    from nsysan.store import ReviewStore

    users = load_users(users_file, os.environ.get(USERS_ENV))
    if not is_loopback(host) and not users:
        raise InputError(f"--host {host} is reachable from other machines, so login is required: give users with "
                         f"--users FILE or {USERS_ENV} (hashes from `nsysan hash-password`)")  # fmt: skip
    traces_dir = traces_dir or _bundled_traces()
    if traces_dir is not None and not traces_dir.is_dir():
        raise InputError(f"--traces {traces_dir}: not a directory")
    if max_upload_mb <= 0:
        raise InputError("--max-upload-mb must be positive")
    if not 0 < session_hours <= 24 * 365:
        raise InputError("--session-hours must be positive (and at most a year)")
    reanalysers = _reanalysers(reanalyse_by, users)
    admin_names = _users_named("--admins", admins, users) if admins.strip() else frozenset()
    if upload_quota_mb < 0:
        raise InputError("--upload-quota-mb must be 0 (no quota) or positive")
    _configure_cache(None, off=False)  # a re-analysis or a restart reads the exports' frames from the cache
    store = ReviewStore(db)
    typer.echo(f"nsysan: serving http://{host}:{port}/ (store {store.engine.url.render_as_string(hide_password=True)}"
               f"{', traces from ' + str(traces_dir) if traces_dir else ''}{', login required' if users else ''})", err=True)  # fmt: skip
    start(Server(store, traces_dir=traces_dir, uploads_dir=uploads_dir, max_upload_bytes=max_upload_mb * 2**20,
                 users=users, session_hours=session_hours, secure_cookies=secure_cookies, reanalysers=reanalysers,
                 admins=admin_names, upload_quota_bytes=upload_quota_mb * 2**20 or None),
          host, port)  # fmt: skip


def _reanalysers(option: str, users: dict[str, str]) -> frozenset[str] | None:
    """``--reanalyse-by``: None for everyone, else the users it names (none for "nobody")."""
    said = option.strip()
    if said == "everyone":
        return None
    if said == "nobody":
        return frozenset()
    return _users_named("--reanalyse-by", said, users, "everyone, nobody, or ")


def _users_named(option: str, said: str, users: dict[str, str], also: str = "") -> frozenset[str]:
    """A comma-separated list of the server's users, as an option names them."""
    names = frozenset(n.strip() for n in said.split(",") if n.strip())
    if not users:
        raise InputError(f"{option} names users, but the server has no login: give --users"
                         + (f", or say {also.removesuffix(', or ').replace(', ', ' or ')}" if also else ""))  # fmt: skip
    unknown = sorted(names - set(users))
    if not names or unknown:
        raise InputError(f"{option}: {', '.join(unknown) or repr(said)} is not a user of this server "
                         f"({also}users of --users / NSYSAN_USERS)")  # fmt: skip
    return names


@app.command("hash-password")
def hash_password() -> None:
    """Read a password (twice, not echoed) and print its salted hash for --users or NSYSAN_USERS."""
    from nsysan.extras import require

    require("dashboard", "nsysan hash-password (a login of nsysan serve)")
    from dashboards.auth import hash_password as make_hash

    password = typer.prompt("Password", hide_input=True, confirmation_prompt=True, err=True)
    if len(password) < 8:
        raise InputError("use a password of at least 8 characters")
    typer.echo(make_hash(password))


# click's UsageError and ClickException, from whichever click typer runs on (typer >= 0.2x vendors
# its own copy; older ones use the click package): through typer's public BadParameter
_USAGE_ERROR: type[Any] = typer.BadParameter.__mro__[1]
_CLICK_ERROR: type[Any] = typer.BadParameter.__mro__[2]


def main() -> None:
    """Console entry point. A usage error (an unknown option, a value not among the choices) and
    nsysan's own errors become one line and their exit code (2 for the user's mistake); anything
    else is a bug, reported in one line (exit 70) unless NSYSAN_DEBUG is set, which shows the
    traceback."""
    try:
        code = app(standalone_mode=False)
    except _USAGE_ERROR as exc:
        if type(exc).__name__ == "NoArgsIsHelpError":  # `nsysan` or `nsysan cache` alone: the help, exit 2
            typer.echo(exc.ctx.get_help() if exc.ctx else exc.format_message(), err=True)
            sys.exit(exc.exit_code)
        where = f" (`{exc.ctx.command_path} --help` lists the options)" if exc.ctx else ""
        typer.echo(f"nsysan: error: {exc.format_message()}{where}", err=True)
        sys.exit(exc.exit_code)
    except _CLICK_ERROR as exc:
        typer.echo(f"nsysan: error: {exc.format_message()}", err=True)
        sys.exit(exc.exit_code)
    except typer.Abort:  # Ctrl-C at a prompt
        sys.exit(130)
    except NsysanError as exc:
        from nsysan.ingest.raw_reports import with_sources

        typer.echo(f"nsysan: error: {with_sources(str(exc))}", err=True)
        sys.exit(exc.exit_code)
    except Exception as exc:
        if os.environ.get("NSYSAN_DEBUG"):
            raise
        typer.echo(
            f"nsysan: internal error: {type(exc).__name__}: {exc} "
            "(a bug in nsysan: please report it; NSYSAN_DEBUG=1 shows the traceback)",
            err=True,
        )
        sys.exit(70)
    sys.exit(code if isinstance(code, int) else 0)  # typer.Exit(code) comes back as a value, not raised
