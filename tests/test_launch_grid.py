"""Lowering layer tests, without a GPU: the grid covers every row of V exactly once per head, for every
launch shape the autotuner may pick and the default's, the default keeps a warp's rows within what
its registers hold past K = 128, and the CUDA cache's fallbacks from the default only shrink.
"""

from __future__ import annotations

import pytest

from codegen_cases import TUNER_LAUNCHES
from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.config import PRESETS
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import choose_launch, fallback_launches, grid_of, key_chunks, v_tiles

SHAPES = [p.shape for p in PRESETS.values()] + [ModelShape(4, 2, v, 64) for v in (60, 63, 66, 100, 8, 1)]


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"V{s.v_dim}-K{s.k_dim}")
def test_v_tiles_cover_v_and_no_tile_lies_wholly_past_it(shape):
    program = lower(variants.get("gdn"), shape, ReplayConfig())
    for launch in TUNER_LAUNCHES + [choose_launch(shape, rows) for rows in (1, 8, 256)]:
        tiles, rows = v_tiles(program, launch), launch.rows_per_cta
        assert tiles * rows >= shape.v_dim, f"{launch.label}: {tiles} tiles of {rows} rows miss rows of V = {shape.v_dim}"
        assert (tiles - 1) * rows < shape.v_dim, f"{launch.label}: a tile wholly past V = {shape.v_dim}"
        (gx, gy, gz), _ = grid_of(program.kernel("replay_step"), program, launch, 5)
        assert (gx, gy, gz) == (tiles, shape.heads, 5)


@pytest.mark.parametrize("k_dim", [144, 192, 256])
@pytest.mark.parametrize("rows", [1, 8, 64, 256, 512])
def test_default_launches_past_k128_take_fewer_rows_per_warp(k_dim, rows):
    shape = ModelShape(32, 16, 128, k_dim)
    assert key_chunks(k_dim) == 2
    for family in ("replay", "verify", "conventional"):
        launch = choose_launch(shape, rows, family, ReplayConfig())
        assert launch.rows_per_warp <= 8, f"{family} at K = {k_dim}, {rows} rows: {launch.label}"


@pytest.mark.parametrize("rows", [1, 256])
@pytest.mark.parametrize("family", ["replay", "verify", "conventional"])
def test_fallback_launches_start_at_the_default_and_only_shrink(family, rows):
    """The CUDA cache's fallbacks: ``choose_launch``'s shape first, then half its warps with the same
    rows per warp, then the small shapes; none twice, none with more rows per CTA than the first."""
    shape, config = ModelShape(32, 16, 128, 128), ReplayConfig()
    first = choose_launch(shape, rows, family, config)
    launches = fallback_launches(shape, rows, family, config)
    assert launches[0] == first and len(set(launches)) == len(launches)
    assert launches[1].warps == first.warps // 2 and launches[1].rows_per_warp == first.rows_per_warp
    assert launches[1].max_registers == first.max_registers
    assert "4x4" in [c.label for c in launches] and [c.label for c in launches[-2:]] == ["4x2", "2x2"]
    assert all(c.rows_per_cta <= first.rows_per_cta for c in launches)
