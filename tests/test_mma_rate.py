"""Tests of scripts/mma_rate.py (no GPU): its two throughput kernels compile for sm_90 without spills,
and the mma kernel's loop is the tensor-core instruction the fold on tensor cores uses."""

from __future__ import annotations

import pytest

from scripts_loader import load_script

SCRIPT = load_script("mma_rate")


@pytest.mark.nvrtc
def test_the_rate_kernels_compile_for_sm_90_without_spills():
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    result = compile_cubin(SCRIPT.source(), "mma_rate.cu", "sm_90")
    for name in ("mma_loop", "ffma_loop"):
        res = result.resources[name]
        assert res.spill_stores == 0 and res.spill_loads == 0, f"{name} spills: {res}"
    assert "mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32" in SCRIPT.source()
