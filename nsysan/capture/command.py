"""The ``nsys profile`` command line nsysan runs: defaults distributed users need, user overrides.

Pure functions, so the exact argv is testable without nsys.
"""

from __future__ import annotations

from collections.abc import Container, Sequence

# What a distributed PyTorch capture needs, as --option=value pairs a user may override:
DEFAULT_OPTIONS: dict[str, str] = {
    "--trace": "cuda,nvtx,osrt",  # kernels/copies/API, NVTX (NCCL, PyTorch, nsysan), OS runtime
    "--cuda-graph-trace": "node",  # kernels inside graph replays (graph_allreduce_gap needs them)
    "--sample": "none",  # CPU sampling needs perf permissions containers rarely grant
    "--cpuctxsw": "none",
    "--export": "sqlite",  # what nsysan reads
    "--force-overwrite": "true",
}


# Options newer nsys releases offer, set only when the installed nsys lists them in `nsys profile --help`
# (2022.4 has none of them):
NEWER_OPTIONS: dict[str, str] = {
    "--cuda-event-trace": "true",  # event records: when an NCCL op's input was ready (nccl_ordering_stall)
}

# short spellings of the options nsysan sets, so an override replaces rather than repeats them
_SHORT = {"-t": "--trace", "-s": "--sample", "-f": "--force-overwrite"}


def split_option(arg: str) -> tuple[str, str | None]:
    """'--trace=cuda' -> ('--trace', 'cuda'); '-t=cuda' -> ('--trace', 'cuda'); '--stats' -> ('--stats', None)."""
    name, sep, value = arg.partition("=")
    return _SHORT.get(name, name), (value if sep else None)


def check_overrides(overrides: Sequence[str]) -> None:
    """Refuse the options nsysan must set itself (the output), before any run directory exists."""
    for arg in overrides:
        if split_option(arg)[0] in ("-o", "--output"):
            raise ValueError("the output is set by nsysan capture (--output-dir)")


def nsys_argv(nsys: str, output: str, command: Sequence[str], overrides: Sequence[str] = (),
              supported: Container[str] = ()) -> list[str]:  # fmt: skip
    """``nsys profile`` argv: defaults (and those of :data:`NEWER_OPTIONS` in ``supported``), then the
    user's ``--option=value`` overrides (an override of a default replaces it; anything else is
    appended as given), then the workload command."""
    options = dict(DEFAULT_OPTIONS) | {k: v for k, v in NEWER_OPTIONS.items() if k in supported}
    check_overrides(overrides)
    extra: list[str] = []
    for arg in overrides:
        name, value = split_option(arg)
        if name in options and value is not None:
            options[name] = value
        else:
            extra.append(arg)
    argv = [nsys, "profile", *(f"{k}={v}" for k, v in options.items()), *extra, f"--output={output}"]
    return [*argv, *command]
