"""Tests of scripts/experiment_variants.py (no GPU): every source variant it offers still applies to
the kernels the generator renders today, so a change to the generator cannot leave a variant that
fails only once the script runs on the GPU machine."""

from __future__ import annotations

import pytest

from replayssm_dsl import ReplayConfig, variants
from replayssm_dsl.config import PRESETS, preset
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.lower import lower

from scripts_loader import load_script

SCRIPT = load_script("experiment_variants")


@pytest.mark.parametrize("preset_name", sorted(PRESETS))
@pytest.mark.parametrize("label", sorted(SCRIPT.VARIANTS))
def test_every_variant_applies_to_the_rendered_kernels(preset_name, label):
    if preset_name not in SCRIPT.VARIANT_PRESETS.get(label, (preset_name,)):
        pytest.skip(f"{label}: a variant of {', '.join(SCRIPT.VARIANT_PRESETS[label])} only")
    p = preset(preset_name)
    program = lower(variants.get(p.variant), p.shape, ReplayConfig())
    launch = LaunchConfig.from_label(SCRIPT.VARIANT_TEST_LAUNCH.get(label, "8x8/r64"))  # a variant of shared rows at a launch with them
    render = SCRIPT.patched_renderer(SCRIPT.VARIANTS[label])
    source = render(program, launch)  # SystemExit names the edit that no longer applies
    assert "replay_step(" in source
    if SCRIPT.VARIANTS[label]:
        base = SCRIPT.patched_renderer([])(program, launch)
        assert source != base or label in SCRIPT.RENDER_THE_BASE, f"{label}: the edit changed nothing"
