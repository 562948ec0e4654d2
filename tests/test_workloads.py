"""The bundled workloads run on a CPU machine (gloo and nsysan's transport) and check their results."""

from __future__ import annotations

import subprocess
import sys

import pytest

from nsysan.workloads import WORKLOADS, torchrun_command
from tests.conftest import need


def run(name: str, nproc: int, transport: str) -> subprocess.CompletedProcess[str]:
    need(__import__("importlib").util.find_spec("torch") is not None, "torch")
    cmd = [*torchrun_command(name, nproc, transport), "--steps=2"]
    return subprocess.run(cmd, capture_output=True, text=True, timeout=300)


@pytest.mark.parametrize(("name", "nproc", "transport"), [("pipeline", 3, "gloo"), ("pg-scaling", 3, "gloo")])
def test_workload_runs(name, nproc, transport):
    r = run(name, nproc, transport)
    assert r.returncode == 0, r.stderr[-3000:]


@pytest.mark.parametrize("transport", ["gloo", "p2p"])
def test_redistribute_moves_the_right_blocks(transport):
    r = run("redistribute", 4, transport)
    assert r.returncode == 0, r.stderr[-3000:]  # each rank asserts it ends with block (j, i)
    assert f"redistribute [{transport}] collectives: 12 blocks = 48 MiB moved" in r.stdout
    assert f"redistribute [{transport}] p2p: 2 blocks = 8 MiB moved" in r.stdout


def test_overlap_times_gemms_alone_and_overlapped():
    r = run("overlap", 2, "p2p")
    assert r.returncode == 0, r.stderr[-3000:]
    assert "overlap [p2p]: GEMM 512x512 median alone" in r.stdout and "while moving 16 MiB messages" in r.stdout


def test_graph_allreduce_says_it_needs_a_gpu():
    need(__import__("importlib").util.find_spec("torch") is not None, "torch")
    if __import__("torch").cuda.is_available():
        pytest.skip("this machine has a GPU")
    r = subprocess.run(
        [sys.executable, "-m", "nsysan.workloads.graph_allreduce"], capture_output=True, text=True, timeout=120
    )
    assert r.returncode == 1 and "needs CUDA GPUs and NCCL" in r.stderr and "Traceback" not in r.stderr


def test_every_workload_is_listed_with_its_transports():
    assert set(WORKLOADS) == {"pg-scaling", "pipeline", "redistribute", "overlap", "graph-allreduce"}
    assert WORKLOADS["graph-allreduce"][1:] == (("nccl",), False)
