"""Tests of scripts/launch_overhead.py (no GPU): its launch shapes are the presets' and parse as labels."""

from __future__ import annotations

from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.config import DESIGN_PRESETS
from scripts_loader import load_script

SCRIPT = load_script("launch_overhead")


def test_launch_shapes_name_every_preset_and_parse_as_labels():
    assert set(SCRIPT.LAUNCHES) == set(DESIGN_PRESETS)
    for replay, conv in SCRIPT.LAUNCHES.values():
        assert LaunchConfig.from_label(replay).label == replay
        assert LaunchConfig.from_label(conv).label == conv
