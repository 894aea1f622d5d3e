"""Tests of scripts/twin_times.py (no GPU): it pairs each launch of a tuner table's first pass with its
twin (``/c``, ``/n``), with the confirmed medians where both were finalists, and names the launch of
least confirmed median as the entry's choice."""

from __future__ import annotations

from scripts_loader import load_script

SCRIPT = load_script("twin_times")


def test_twins_are_paired_with_their_ratio_and_the_least_confirmed_median_is_the_choice():
    table = {
        "v24|fp|32,16,128,128|16,8,float32,float32|2|verify_few": {
            "launch": {}, "ms": {"8x16": 0.2, "8x16/c": 0.18, "4x16": 0.25},
            "confirmed_ms": {"8x16": 0.21, "8x16/c": 0.19, "4x16": 0.26}},
        "v24|fp|96,8,80,128|16,8,float32,float32|1": {
            "launch": {}, "ms": {"4x8": 0.006, "4x8/n": 0.0066, "8x16/n": 0.007}, "confirmed_ms": {"4x8": 0.0061}},
    }
    rows = SCRIPT.twin_rows(table)
    assert rows == [
        "32,16,128,128 B=2 verify_few: 8x16 0.20000, 8x16/c 0.18000 = 0.900; confirmed 0.21000 / 0.19000 = 0.905",
        "32,16,128,128 B=2 verify_few: chose 8x16/c",
        "96,8,80,128 B=1 replay: 4x8 0.00600, 4x8/n 0.00660 = 1.100",
        "96,8,80,128 B=1 replay: chose 4x8",
    ], rows  # 8x16/n has no 8x16 beside it: no pair


def test_an_entry_without_twins_or_confirmed_rounds_gives_no_rows():
    assert SCRIPT.twin_rows({"v24|fp|1,1,16,16|4,2,float32,float32|8|conventional": {"launch": {}, "ms": {"4x4": 1.0}}}) == []
