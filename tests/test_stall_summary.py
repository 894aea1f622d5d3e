"""Tests of scripts/stall_summary.py (no GPU): the stall shares and the top instructions it reports
from an Nsight Compute source-page CSV."""

from __future__ import annotations

import csv
from pathlib import Path

from scripts_loader import load_script


def write_export(path: Path, rows: list[tuple[str, str, int, int, int, int]]) -> None:
    """rows: (address, source, samples, executed, barrier samples, long_sb samples)."""
    header = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Instructions Executed",
              "stall_barrier", "stall_long_sb", "stall_barrier (Not Issued)"]
    with path.open("w", newline="") as handle:
        out = csv.writer(handle)
        out.writerow(["Kernel Name", "replay_step"])
        out.writerow(header)
        for address, source, samples, executed, barrier, long_sb in rows:
            out.writerow([address, source, f"{samples:,}", f"{executed:,}", barrier, long_sb, 999])


def test_summary_reports_shares_offsets_and_the_top_instruction_first(tmp_path):
    path = tmp_path / "stalls.csv"
    write_export(path, [("0x7f0000000000", "LDG.E.128 R4, [R2]", 10, 4096, 0, 10),
                        ("0x7f0000000010", "BAR.SYNC.DEFER_BLOCKING 0x0", 0, 4096, 0, 0),
                        ("0x7f0000000020", "@P0 BRA 0x7f0000000100", 30, 4096, 30, 0)])
    text = load_script("stall_summary").summarise(str(path), top=2)
    lines = text.splitlines()
    assert lines[0].startswith("replay_step: 40 stall samples, 12288 warp instructions executed")
    assert "barrier 75.0%" in lines[1] and "long_sb 25.0%" in lines[1]  # 'Not Issued' columns left out
    assert lines[3].startswith("0000020       30  75.0%") and "{'barrier': 30}" in lines[3]
    assert lines[4].startswith("0000000       10  25.0%") and "{'long_sb': 10}" in lines[4]
    assert len(lines) == 5  # top=2
