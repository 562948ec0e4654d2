"""The ``nsysan`` command line. Each command is a thin shell over the library.

Errors nsysan raises on purpose (:class:`~nsysan.errors.NsysanError`) become one line on stderr
and the error's exit code: 2 for unusable input, 3 when ``--fail-on`` matched.
"""

from __future__ import annotations

import sys
from enum import Enum
from pathlib import Path
from typing import Annotated, Optional

import typer

from nsysan import __version__
from nsysan.errors import GateFailed, InputError, NsysanError

app = typer.Typer(
    name="nsysan",
    help="Findings from Nsight Systems captures of distributed PyTorch jobs.",
    no_args_is_help=True,
    rich_markup_mode="rich",
    pretty_exceptions_enable=False,
)


class OutputFormat(str, Enum):
    terminal = "terminal"
    json = "json"
    markdown = "markdown"
    html = "html"


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
        Optional[bool],
        typer.Option("--version", callback=_version, is_eager=True, help="Print the version and exit."),
    ] = None,
) -> None:
    """Findings from Nsight Systems captures of distributed PyTorch jobs."""


@app.command()
def report(
    traces: Annotated[
        list[str],
        typer.Argument(
            help="nsys SQLite exports: files, directories of them, or globs. "
            "Give all ranks of one job together (one export per rank, or one holding all processes).",
            show_default=False,
        ),
    ],
    output_format: Annotated[
        OutputFormat,
        typer.Option("--format", "-f", help="terminal for reading; json for tools and CI; markdown/html to share."),
    ] = OutputFormat.terminal,
    output: Annotated[
        Optional[Path],
        typer.Option("--output", "-o", help="Write the report to this file instead of standard output."),
    ] = None,
    fail_on: Annotated[
        Optional[FailOn],
        typer.Option(
            "--fail-on",
            help="Exit with code 3 when a finding at this severity or worse exists: use it as a CI gate.",
        ),
    ] = None,
) -> None:
    """Analyse nsys exports: per-rank GPU time, NCCL, NVTX, limits of the capture, and findings.

    Example: nsysan report fixtures/samples/allreduce-2rank.sqlite --format markdown -o report.md
    """
    from nsysan.findings import Severity
    from nsysan.ingest import load_trace
    from nsysan.report import RENDERERS, analyse

    with load_trace(traces) as trace:
        doc = analyse(trace)
    text = RENDERERS[output_format.value](doc)
    if output is None:
        sys.stdout.write(text)
    else:
        try:
            output.write_text(text, encoding="utf-8")
        except OSError as exc:
            raise InputError(f"{output}: cannot write report ({exc.strerror})") from None
    if fail_on is not None:
        severities = [Severity(f["severity"]) for f in doc["findings"]]
        matched = [s for s in severities if s.rank >= Severity(fail_on.value).rank]
        if matched:
            raise GateFailed(f"{len(matched)} finding(s) at {fail_on.value} or worse")


def main() -> None:
    """Console entry point: run the app, turning nsysan's own errors into one line and a code."""
    try:
        app(standalone_mode=False)
    except NsysanError as exc:
        typer.echo(f"nsysan: error: {exc}", err=True)
        sys.exit(exc.exit_code)
    except typer.Exit as exc:
        sys.exit(exc.exit_code)
    except typer.Abort:
        typer.echo("nsysan: aborted", err=True)
        sys.exit(130)
    except Exception as exc:  # click usage errors carry their own exit code
        import click

        if isinstance(exc, click.ClickException):
            exc.show()
            sys.exit(exc.exit_code)
        raise
