"""The test exports' writer (fixtures/exporter.py) keeps every value it is given."""

from __future__ import annotations

import sqlite3

from fixtures.exporter import ExportWriter


def test_a_column_first_given_late_in_a_batch_keeps_its_values(tmp_path):
    """Columns were once chosen from a batch's first 1,000 rows: the NCCL domain's name of every
    rank but the first vanished from the benchmark exports, and with it their NCCL sizes."""
    w = ExportWriter(tmp_path / "late.sqlite")
    for pid in range(1, 4):
        w.process(pid, "python3")
        for i in range(1_200):
            w.runtime(pid, pid, 1_000 + i * 10, 1_005 + i * 10, "cudaLaunchKernel", i + 1)
            w.nvtx_range(pid, pid, 1_000 + i * 10, 1_004 + i * 10, "op")
        w.nvtx_domain(pid, pid, 3, "NCCL", 0)  # after 1,200 ranges: past the first 1,000 rows
    path = w.close()
    with sqlite3.connect(path) as con:
        named = con.execute("SELECT count(*) FROM NVTX_EVENTS WHERE text = 'NCCL'").fetchone()[0]
    assert named == 3
