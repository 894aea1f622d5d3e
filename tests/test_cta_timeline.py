"""Tests of scripts/cta_timeline.py (no GPU): its timer probe still applies to the step kernels the
generator renders at the presets' launch shapes and builds them clean, and its summary reads a
synthetic timeline right."""

from __future__ import annotations

import numpy as np
import pytest

from replayssm_dsl import ReplayConfig, variants
from replayssm_dsl.config import DESIGN_PRESETS, preset
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.lower import lower

from scripts_loader import load_script

SCRIPT = load_script("cta_timeline")
VARIANTS = load_script("experiment_variants")
PROBES = [SCRIPT.probe("replay_step", "n"), SCRIPT.probe("conventional_step", "0")]


@pytest.mark.nvrtc
@pytest.mark.parametrize("preset_name", sorted(DESIGN_PRESETS))
def test_the_probe_applies_and_builds_both_step_kernels_clean(preset_name):
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    p = preset(preset_name)
    program = lower(variants.get(p.variant), p.shape, ReplayConfig())
    for kernel, label in zip(("replay_step", "conventional_step"), SCRIPT.LAUNCHES[preset_name]):
        launch = LaunchConfig.from_label(label)
        source = VARIANTS.patched_renderer(PROBES)(program, launch)  # SystemExit if the probe no longer applies
        assert source.count("%%globaltimer") == 4, "a start and an end time in each of the two step kernels"
        result = compile_cubin(source, f"probe-{preset_name}.cu")
        assert not result.warnings, result.log
        res = result.resources[kernel]
        assert res.clean and res.registers <= launch.max_registers, f"{preset_name} {kernel} {label}: {res}"


def test_the_probe_refuses_a_kernel_it_does_not_find():
    with pytest.raises(SystemExit, match="probe does not apply"):
        SCRIPT.probe("replay_step", "n")("extern \"C\" __global__ void __launch_bounds__(128) replay_step(float* x) {\n}\n")


def test_summary_of_a_synthetic_timeline():
    """Two SMs, two CTAs each one after the other (1 us apart in start), 10 us per CTA, fills 0 and 15."""
    t0 = np.array([0, 1_000, 10_000, 11_000], np.uint64)
    words = np.stack([t0, t0 + 10_000, np.array([0, 1, 0, 1], np.uint64), np.array([0, 15, 0, 15], np.uint64)], 1)
    found = SCRIPT.summary(words, event_ms=0.025, window=16)
    assert found["event us"] == pytest.approx(25.0)
    assert found["span us"] == pytest.approx(21.0)
    assert found["ramp us"] == pytest.approx(10.0)
    assert found["tail us"] == pytest.approx(10.0)
    assert found["CTA us"] == found["folding CTA us"] == pytest.approx(10.0)
    assert found["most resident"] == 2.0, "a CTA's end and the next one's start at the same time do not overlap"
    assert found["empty slots us"] == pytest.approx(1.0)
    assert found["SMs' last ends spread us"] == pytest.approx(1.0)
    assert found["timer step ns"] == 1000.0
