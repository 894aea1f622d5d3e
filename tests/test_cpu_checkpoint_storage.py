"""Runtime layer tests: what the CPU cache's accessors hand back, and the range its half-precision
checkpoints keep.

``fills()`` and ``checkpoint(page)`` are copies (as the CUDA cache's ``asnumpy`` reads are): a caller
who keeps or writes one neither sees later kernels nor changes the cache. A bfloat16 checkpoint has
bf16's range (float32's exponent), not float16's: a state entry of 1e5 or 1e-30 survives a load.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.bfloat16 import round_to_bfloat16
from replayssm_dsl.errors import InputError
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache

SHAPE = ModelShape(4, 2, 16, 8)


def _cache(config: ReplayConfig, seed: int, precision: str = "float64") -> tuple[CpuReplayCache, np.random.Generator]:
    rng = np.random.default_rng(seed)
    decl = variants.get("gdn")
    cache = CpuReplayCache(decl, SHAPE, config, slots=2, params=random_params(decl, SHAPE, rng),
                           precision=precision)
    cache.load([0, 1], random_state(SHAPE, rng, (2,)))
    return cache, rng


def test_fills_and_checkpoints_are_copies():
    cache, rng = _cache(ReplayConfig(window=2, max_drafts=2), 1)
    fills, checkpoint = cache.fills(), cache.checkpoint(0)
    assert not np.shares_memory(fills, cache.buffers["fill"])
    assert not np.shares_memory(checkpoint, cache.buffers["checkpoint"])
    kept_fills, kept_checkpoint = fills.copy(), checkpoint.copy()
    cache.step([0], random_tokens(cache.decl, SHAPE, rng, (1,)))  # fill 0 -> 1
    assert cache.fills()[0] == 1 and np.array_equal(fills, kept_fills), "a kept fills() followed a step"
    cache.step([0], random_tokens(cache.decl, SHAPE, rng, (1,)))  # window 2: this one folds
    assert not np.array_equal(cache.checkpoint(0), kept_checkpoint), "the fold did not change page 0"
    assert np.array_equal(checkpoint, kept_checkpoint), "a kept checkpoint() followed a later fold"
    before = cache.checkpoint(0), cache.fills()
    fills[:], checkpoint[...] = 7, np.nan
    assert np.array_equal(cache.checkpoint(0), before[0]) and np.array_equal(cache.fills(), before[1]), \
        "writing a returned copy changed the cache"


@pytest.mark.parametrize("page", [-1, 2, 99, True, 1.0, None])
def test_a_page_outside_the_pages_is_refused_by_checkpoint(page):
    """``checkpoint(-1)`` would read the last page as NumPy counts from the end; it, a page past the
    end, a bool and a non-integer are refused naming the page."""
    cache, _ = _cache(ReplayConfig(window=2, max_drafts=2), 3)
    with pytest.raises(InputError, match=re.escape(f"page: expected a checkpoint page, an int in [0, 2), got {page!r}")):
        cache.checkpoint(page)
    assert np.array_equal(cache.checkpoint(np.int64(1)), cache.buffers["checkpoint"][1])

@pytest.mark.parametrize("precision", ["float64", "float32"])
def test_bfloat16_checkpoints_keep_bfloat16_range(precision):
    cache, rng = _cache(ReplayConfig(window=2, max_drafts=2, state_dtype="bfloat16"), 2, precision)
    state = random_state(SHAPE, rng, (1,))
    state[0, 0, 0, :4] = [1e5, -3e38, 1e-30, 7.0e4]  # past float16's range, or below its smallest
    cache.load([1], state)
    checkpoint = cache.checkpoint(1)
    assert np.isfinite(checkpoint).all(), "a bfloat16 checkpoint overflowed"
    assert np.array_equal(checkpoint.astype(np.float64), round_to_bfloat16(state[0]).astype(np.float64)), \
        "a loaded bfloat16 checkpoint is not the state rounded to bf16"
    assert np.array_equal(cache.materialize([1]), round_to_bfloat16(state).astype(cache.compute))
