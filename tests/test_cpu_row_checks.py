"""The CPU backend makes the generated kernels' row checks (lowering/interpret.py mirrors
render_blocks' OUTSIDE_CACHE, DRAFTS_UNHELD, FILL_UNHELD): batch arrays that bypass the host checks
(as on the graph path) skip the rows the kernels skip, touching no buffer and no output.
"""

from __future__ import annotations

import numpy as np
import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
from twin import assert_buffers_kept, buffers_snapshot

SHAPE, CONFIG = ModelShape(4, 2, 16, 8), ReplayConfig(window=4, max_drafts=2)


def _loaded(name: str, seed: int) -> tuple[CpuReplayCache, np.random.Generator]:
    rng = np.random.default_rng(seed)
    decl = variants.get(name)
    cache = CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=random_params(decl, SHAPE, rng))
    cache.load([0, 1], random_state(SHAPE, rng, (2,)))
    return cache, rng


def _batch(slot, src, dst, drafts=1, accepted=0) -> dict:
    return {k: np.asarray(v, np.int32) for k, v in
            {"slot": [slot], "src_page": [src], "dst_page": [dst], "drafts": [drafts], "accepted": [accepted]}.items()}


@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2"])
@pytest.mark.parametrize("row", [(2, 0, 0), (0, 2, 0), (0, 0, 2), (-1, 0, 0), (0, -1, 0), (0, 0, -1), (1, 0, 9)])
def test_rows_outside_the_cache_touch_nothing(name, row):
    cache, rng = _loaded(name, 3)
    for _ in range(CONFIG.window + 1):  # every fill, through a flush
        before = buffers_snapshot(cache)
        toks = {k: v[:, None] for k, v in random_tokens(cache.decl, SHAPE, rng, (1,)).items()}
        out = cache.poisoned((1, 1, SHAPE.heads, SHAPE.v_dim))
        cache._launch("replay_step", 1, _batch(*row), toks, out=out)
        assert_buffers_kept(np, cache, before, f"step of row {row}")
        assert np.isnan(out).all(), "a skipped row wrote its output"
        cache.step([0], {k: v[:, 0] for k, v in toks.items()})  # move slot 0 to its next fill


@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2"])
@pytest.mark.parametrize("drafts,t_tok", [(0, 2), (3, 3), (2, 1)])  # none; past T_max; past the tokens' T
def test_draft_counts_the_buffers_or_tokens_cannot_hold_touch_nothing(name, drafts, t_tok):
    cache, rng = _loaded(name, 4)
    for fill in range(CONFIG.capacity + 1):  # every fill, including those where verify would fold first
        cache.buffers["fill"][0] = fill
        before = buffers_snapshot(cache)
        toks = random_tokens(cache.decl, SHAPE, rng, (1, t_tok))
        out = cache.poisoned((1, t_tok, SHAPE.heads, SHAPE.v_dim))
        batch = _batch(0, 0, 0, drafts=drafts, accepted=min(drafts, 1))
        cache._launch("flush_for_verify", 1, batch, t_tok=t_tok)
        cache._launch("verify", 1, batch, toks, out=out)
        cache._launch("commit", 1, batch, t_tok=t_tok)
        assert_buffers_kept(np, cache, before, f"verify of {drafts} drafts with T = {t_tok} at fill {fill}")
        assert np.isnan(out).all(), "a skipped row wrote its output"


def test_accepted_past_drafts_or_negative_keeps_the_fill():
    cache, rng = _loaded("gdn", 5)
    for accepted in (3, -1):
        toks = random_tokens(cache.decl, SHAPE, rng, (1, 2))
        cache.verify([0], toks, [2])
        fills = cache.fills()
        batch = _batch(0, 0, 0, drafts=2, accepted=accepted)
        cache._launch("commit", 1, batch, t_tok=2)
        assert np.array_equal(cache.fills(), fills), f"accepted {accepted} of 2 moved the fill"
        cache.commit([0])


UNHELD_FILLS = (CONFIG.capacity + 1, -1, -2**31)  # corrupted fills: no kernel writes one


@pytest.mark.parametrize("fill", UNHELD_FILLS)
@pytest.mark.parametrize("name", ["gdn", "kda", "mamba2"])
def test_a_fill_outside_the_buffer_touches_nothing(name, fill):
    """Every kernel that reads the fill skips a row whose fill is past capacity or negative."""
    cache, rng = _loaded(name, 6)
    cache.buffers["fill"][0] = fill
    before = buffers_snapshot(cache)
    toks = {k: v[:, None] for k, v in random_tokens(cache.decl, SHAPE, rng, (1,)).items()}
    out = cache.poisoned((1, 1, SHAPE.heads, SHAPE.v_dim))
    cache._launch("replay_step", 1, _batch(0, 0, 0), toks, out=out)
    assert_buffers_kept(np, cache, before, f"step at fill {fill}")
    assert np.isnan(out).all(), f"the step at fill {fill} wrote its output"
    cache._launch("flush", 1, _batch(0, 0, 0))
    assert_buffers_kept(np, cache, before, f"flush at fill {fill}")
    state = cache.poisoned((1, SHAPE.heads, SHAPE.v_dim, SHAPE.k_dim))
    cache._launch("materialize", 1, _batch(0, 0, 0), materialized=state)
    assert np.isnan(state).all(), f"materialize at fill {fill} wrote a state"
    drafts = random_tokens(cache.decl, SHAPE, rng, (1, 2))
    out = cache.poisoned((1, 2, SHAPE.heads, SHAPE.v_dim))
    batch = _batch(0, 0, 0, drafts=2, accepted=1)
    for kernel, kwargs in (("flush_for_verify", {}), ("verify", {"out": out}), ("commit", {})):
        cache._launch(kernel, 1, batch, drafts if kernel == "verify" else None, t_tok=2, **kwargs)
        assert_buffers_kept(np, cache, before, f"{kernel} at fill {fill}")
    assert np.isnan(out).all(), f"verify at fill {fill} wrote its output"


def test_load_resets_a_fill_past_capacity():
    """reset_fill zeroes the fill whatever it was (as the CUDA template does), so load repairs a slot."""
    cache, rng = _loaded("gdn", 7)
    cache.buffers["fill"][1] = CONFIG.capacity + 3
    cache.load([1], random_state(SHAPE, rng, (1,)))
    assert cache.fills()[1] == 0
