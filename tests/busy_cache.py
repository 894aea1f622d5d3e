"""Test helper (no tests): a CPU replay cache with four live slots at different fills and the float64
oracle state of each, and ``refused``, which checks that a bad call raises naming its argument and
changes no buffer."""

from __future__ import annotations

from contextlib import contextmanager

import numpy as np
import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.reference import plain_recurrence
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
from twin import assert_close, buffers_snapshot

SHAPE = ModelShape(heads=4, key_heads=2, v_dim=6, k_dim=5)
CONFIG = ReplayConfig(window=4, max_drafts=3)  # capacity 7
SLOTS, PAGES = 4, 6


class Busy:
    """A gdn cache with four live slots at different fills, and the oracle state of each."""

    def __init__(self, seed: int = 0, decl=None, shape=SHAPE, config=CONFIG):
        self.decl = decl or variants.get("gdn")
        self.shape, self.config = shape, config
        self.rng = np.random.default_rng(seed)
        self.params = random_params(self.decl, shape, self.rng)
        self.cache = CpuReplayCache(self.decl, shape, config, slots=SLOTS, params=self.params, pages=PAGES)
        states = random_state(shape, self.rng, (SLOTS,))
        self.cache.load(list(range(SLOTS)), states)
        self.cache.load_conventional(list(range(SLOTS)), states)
        self.state = {s: states[s] for s in range(SLOTS)}
        for fill_to, slots in ((1, [0, 1, 2, 3]), (2, [1, 2, 3]), (3, [2, 3])):
            self.step(slots)
        assert list(self.cache.fills()) == [1, 2, 3, 3]

    def tokens(self, rows: int, t: int | None = None) -> dict:
        return random_tokens(self.decl, self.shape, self.rng, (rows,) if t is None else (rows, t))

    def step(self, slots, toks=None):
        toks = toks if toks is not None else self.tokens(len(slots))
        out = self.cache.step(slots, toks)
        for b, s in enumerate(slots):
            o, self.state[s] = plain_recurrence(self.decl, self.shape, {k: v[b:b + 1] for k, v in toks.items()},
                                                self.params, self.state[s])
            assert_close(out[b], o[0], 1e-9, f"step slot {s}")
        return out

    def check_all(self):
        got = self.cache.materialize(list(range(SLOTS)))
        for s in range(SLOTS):
            assert_close(got[s], self.state[s], 1e-9, f"materialize slot {s}")


def assert_same(before: dict, cache, what: str):
    assert sorted(before) == sorted(cache.buffers), f"{what}: buffers added or removed"
    for name, arr in before.items():
        now = cache.buffers[name]
        assert now.dtype == arr.dtype and now.shape == arr.shape, f"{what}: buffer {name!r} reshaped"
        assert np.array_equal(now, arr, equal_nan=True), f"{what}: buffer {name!r} changed by a refused call"


@contextmanager
def refused(cache, exc, *fragments, exact: bool = False):
    """The call inside raises ``exc`` (exactly that class when ``exact``), its message holds every
    fragment, and no buffer of ``cache`` changed."""
    before = buffers_snapshot(cache)
    pending = cache._last_verify
    with pytest.raises(exc) as info:
        yield info
    if exact:
        assert type(info.value) is exc, f"raised {type(info.value).__name__}, expected {exc.__name__}"
    text = str(info.value)
    for frag in fragments:
        assert frag in text, f"message {text!r} does not contain {frag!r}"
    assert_same(before, cache, text)
    assert cache._last_verify is pending, "a refused call changed the pending verify"


def slot_ops(busy, slots, **kw):
    """Every slot-taking operation, called on ``slots`` with well-formed everything else."""
    c, rows = busy.cache, len(slots)
    states = random_state(SHAPE, busy.rng, (rows,))
    return {
        "step": lambda: c.step(slots, busy.tokens(rows), **kw),
        "verify": lambda: c.verify(slots, busy.tokens(rows, 2), [2] * rows, **kw),
        "flush": lambda: c.flush(slots, **kw),
        "load": lambda: c.load(slots, states, **({"dst_pages": kw["dst_pages"]} if "dst_pages" in kw else {})),
        "materialize": lambda: c.materialize(slots, **({"src_pages": kw["src_pages"]} if "src_pages" in kw else {})),
        "conventional_step": lambda: c.conventional_step(slots, busy.tokens(rows)),
        "snapshot_verify": lambda: c.snapshot_verify(slots, busy.tokens(rows, 2), [2] * rows),
        "load_conventional": lambda: c.load_conventional(slots, states),
    }


OPS = ["step", "verify", "flush", "load", "materialize", "conventional_step", "snapshot_verify", "load_conventional"]
