"""Test helper (no tests): the shapes, launches and kernel names that the generated-CUDA tests share,
the launch shapes the autotuner may pick, and the source of one built-in at one of those shapes."""

from __future__ import annotations

from pathlib import Path

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.config import DESIGN_PRESETS, PRESETS
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import LaunchConfig, choose_launch
from replayssm_dsl.lowering.render_cuda import render_program
from replayssm_dsl.runtime.autotune import GROUP_EXTRAS, candidates

GOLDEN = Path(__file__).with_name("golden")
SHAPES = {name: PRESETS[name].shape for name in DESIGN_PRESETS}  # (the safe-gate preset: Kimi's shape again)
SHAPES["odd-grouped"] = ModelShape(6, 2, 80, 96)
SHAPES["odd-unaligned"] = ModelShape(3, 1, 60, 100)
CASES = [(v, s) for v in sorted(variants.BUILTINS) for s in SHAPES]
KERNELS = ["conventional_step", "snapshot_verify", "replay_step", "flush_for_verify", "verify",
           "commit", "flush", "load", "reset_fill", "materialize"]


def source(variant: str, shape: str, config=None, batch: int = 1) -> str:
    return render_program(lower(variants.get(variant), SHAPES[shape], config or ReplayConfig()),
                          choose_launch(SHAPES[shape], batch))


TUNER_LAUNCHES = sorted({launch for group in GROUP_EXTRAS for launch in candidates(group)}, key=lambda c: c.label)
"""Every launch shape the autotuner may time, in any group, once."""

SHARED_ROW_LAUNCHES = [LaunchConfig(4, 16, max_registers=96, shared_rows=8), LaunchConfig(4, 20, max_registers=96, shared_rows=10),
                       LaunchConfig(4, 10, max_registers=64, shared_rows=4)]
