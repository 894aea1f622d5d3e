"""Tests of scripts/experiment_verify_bounds.py (no GPU): every bound it offers still edits the verify
the generator renders today, for every preset at the launch shape the script times it at, so a change
to the generator cannot leave a bound that prints n/a only once the script runs on the GPU machine."""

from __future__ import annotations

import sys

import pytest

from replayssm_dsl import ReplayConfig, variants
from replayssm_dsl.config import DESIGN_PRESETS, preset
from replayssm_dsl.lowering.lower import lower

from scripts_loader import SCRIPTS, load_script

sys.path.insert(0, str(SCRIPTS))  # the script imports experiment_variants as its neighbour
BOUNDS = load_script("experiment_verify_bounds")


@pytest.mark.parametrize("preset_name", sorted(DESIGN_PRESETS))
@pytest.mark.parametrize("label", [label for label in BOUNDS.VARIANTS if label != "base"])
def test_every_bound_edits_the_rendered_verify(preset_name, label):
    p = preset(preset_name)
    program = lower(variants.get(p.variant), p.shape, ReplayConfig())
    launch = BOUNDS.TUNED[preset_name]
    edits, skip_flush = BOUNDS.variant_edits(label)
    base = BOUNDS.patched_renderer([])(program, launch)
    try:
        source = BOUNDS.patched_renderer(edits)(program, launch)  # NotApplicable names the edit that no longer applies
    except BOUNDS.NotApplicable:
        if label in BOUNDS.FAMILY_SPECIFIC:  # (the script prints n/a for this family)
            return
        raise
    assert skip_flush or source != base, f"{label}: the edit changed nothing"
