"""Tests of scripts/rows_in_flight.py: the CTAs per SM that registers and shared memory allow, and
the report for launch shapes of the built-in presets (NVRTC, no GPU)."""

from __future__ import annotations

import pytest

from scripts_loader import load_script


@pytest.mark.parametrize("registers,shared,warps,want", [
    (64, 21704, 8, {"registers": 4, "shared": 10, "warps": 8, "ctas": 4}),
    (96, 38160, 4, {"registers": 5, "shared": 5, "warps": 16, "ctas": 5}),
    (72, 0, 4, {"registers": 7, "shared": 228, "warps": 16, "ctas": 7}),  # 72 · 32 = 2,304, nine units of 256
    (32, 100, 2, {"registers": 32, "shared": 207, "warps": 32, "ctas": 32}),  # the CTA count caps
])
def test_ctas_per_sm_take_the_scarcest_resource(registers, shared, warps, want):
    assert load_script("rows_in_flight").ctas_per_sm(registers, shared, warps) == want


@pytest.mark.nvrtc
def test_shared_rows_hold_more_rows_per_sm_where_shared_memory_allows():
    """At qwen3.5-4b's shape 4x16/r96/s8 holds 320 rows per SM against 256 at 8x8/r64; at kimi's,
    KDA's records in shared memory leave room for 4 of its CTAs, 256 rows, no more than 8x8/r64."""
    script = load_script("rows_in_flight")
    qwen = {row["launch"]: row for row in script.report("qwen3.5-4b", ["8x8/r64", "4x16/r96/s8"])}
    assert qwen["8x8/r64"]["rows_per_sm"] == 256 and qwen["4x16/r96/s8"]["rows_per_sm"] == 320
    assert qwen["4x16/r96/s8"]["dynamic_shared"] == 4 * 8 * 128 * 4 and qwen["8x8/r64"]["dynamic_shared"] == 0
    assert all(row["resources"].clean for row in qwen.values())
    (kimi,) = script.report("kimi-linear", ["4x16/r96/s8"])
    assert kimi["limits"]["shared"] == 4 < kimi["limits"]["registers"] and kimi["rows_per_sm"] == 256


@pytest.mark.nvrtc
def test_write_records_in_registers_leave_kda_room_for_more_rows():
    """KDA's records fill shared memory: with its write records in registers (``/w``) 8x16/r80/s11 holds
    3 CTAs per SM (384 rows) against 2 with them staged; one shared row more per warp (``/s12/w``) is
    2 again until the token's values go into registers too (``/v``), and both of those build clean."""
    script = load_script("rows_in_flight")
    labels = ["8x16/r80/s11", "8x16/r80/s11/w", "8x16/r80/s12/w", "8x16/r80/s12/w/v"]
    rows = {row["launch"]: row for row in script.report("kimi-linear", labels)}
    assert [rows[label]["rows_per_sm"] for label in labels] == [256, 384, 256, 384]
    staged, in_registers, fields = rows["8x16/r80/s11"], rows["8x16/r80/s11/w"], rows["8x16/r80/s12/w/v"]
    assert fields["resources"].shared_bytes < in_registers["resources"].shared_bytes < staged["resources"].shared_bytes
    assert in_registers["resources"].clean and fields["resources"].clean


@pytest.mark.nvrtc
def test_five_warp_verify_ctas_hold_a_whole_v80_head_three_per_sm():
    """Nano's value heads have V = 80 rows: verify at 5x16 is one CTA per head in five full 16-row
    tiles, and at 128 registers three such CTAs share an SM (240 rows), against two of 8x16 (which
    hold 80 real rows each at V = 80); both build clean (the reason 5x16 is a verify candidate)."""
    script = load_script("rows_in_flight")
    rows = {row["launch"]: row for row in script.report("nemotron-nano-4b", ["5x16", "8x16"], kernel="verify")}
    assert rows["5x16"]["limits"]["ctas"] == 3 and rows["8x16"]["limits"]["ctas"] == 2
    assert rows["5x16"]["rows_per_sm"] == 3 * 80
    assert all(row["resources"].clean for row in rows.values())
