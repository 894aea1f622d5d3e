"""Test helper: drives a replay cache and, beside it, the float64 plain recurrence per slot.

``ReplayTwin`` keeps the oracle state of every slot, advances it only by accepted tokens, and
checks each output the cache returns against the oracle (verify outputs against the oracle run
from the committed state over the drafts; the positions past a row's drafts stay NaN). NaN never passes: ``assert_close`` requires finite values.
"""

from __future__ import annotations

import numpy as np

from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.reference import plain_recurrence


def to_host(array) -> np.ndarray:
    """NumPy copy of a NumPy, CuPy or torch array."""
    if hasattr(array, "get"):
        array = array.get()
    elif hasattr(array, "detach"):
        array = array.detach().cpu().numpy()
    return np.asarray(array, np.float64)


def assert_close(got, want, tol: float, what: str = "") -> float:
    got, want = to_host(got), to_host(want)
    assert got.shape == want.shape, f"{what}: shape {got.shape} != {want.shape}"
    assert np.isfinite(got).all(), f"{what}: non-finite output (unwritten or NaN)"
    err = float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))
    assert err <= tol, f"{what}: relative error {err:.3e} > {tol:.1e}"
    return err


def buffers_snapshot(cache) -> dict:
    """A copy of every buffer of a replay cache, where it lives (NumPy or CuPy)."""
    return {k: v.copy() for k, v in cache.buffers.items()}


def assert_buffers_kept(xp, cache, before: dict, what: str) -> None:
    """Every buffer of ``cache`` holds the bytes of ``before`` (``buffers_snapshot``; NaN equal to NaN);
    ``xp``: NumPy for the CPU cache, CuPy for the CUDA one."""
    for key, value in cache.buffers.items():
        assert xp.array_equal(before[key], value, equal_nan=True), f"{key} changed: {what}"


class ReplayTwin:
    def __init__(self, cache_cls, decl, shape, config, rng, slots: int = 4, tol: float = 1e-9, **kw):
        """``cache_cls``: ``CpuReplayCache``, ``CudaReplayCache`` or any class with their API."""
        self.decl, self.shape, self.config, self.rng, self.tol = decl, shape, config, rng, tol
        self.params = random_params(decl, shape, rng)
        self.cache = cache_cls(decl, shape, config, slots=slots, params=self.params, **kw)
        self.state = {}
        self.max_err = 0.0

    def tokens(self, lead):
        return random_tokens(self.decl, self.shape, self.rng, lead)

    def load(self, slots):
        states = random_state(self.shape, self.rng, (len(slots),))
        self.cache.load(slots, states)
        for s, st in zip(slots, states):
            self.state[s] = st

    def _oracle(self, slot, toks):
        return plain_recurrence(self.decl, self.shape, toks, self.params, self.state[slot])

    def step(self, slots, toks=None):
        """One decode step for ``slots`` (``-1`` entries are padding); checks every live row."""
        toks = toks if toks is not None else self.tokens((len(slots),))
        out = self.cache.step(slots, toks, out=self.cache.poisoned((len(slots), 1, self.shape.heads, self.shape.v_dim)))
        for b, s in enumerate(slots):
            if s < 0:
                continue
            o, self.state[s] = self._oracle(s, {k: v[b:b + 1] for k, v in toks.items()})
            self.max_err = max(self.max_err, assert_close(out[b], o[0], self.tol, f"step slot {s}"))
        return out

    def verify(self, slots, drafts):
        t = int(max(drafts))
        toks = self.tokens((len(slots), t))
        out = self.cache.verify(slots, toks, drafts,
                                out=self.cache.poisoned((len(slots), t, self.shape.heads, self.shape.v_dim)))
        for b, s in enumerate(slots):
            if s < 0:
                continue
            o, _ = self._oracle(s, {k: v[b, :drafts[b]] for k, v in toks.items()})
            self.max_err = max(self.max_err, assert_close(out[b, :drafts[b]], o, self.tol, f"verify slot {s}"))
            assert np.isnan(to_host(out[b, drafts[b]:])).all(), f"verify slot {s}: written past drafts = {drafts[b]}"
        return toks

    def commit(self, slots, toks, accepted):
        self.cache.commit(accepted)
        for b, s in enumerate(slots):
            if s >= 0 and accepted[b]:
                _, self.state[s] = self._oracle(s, {k: v[b, :accepted[b]] for k, v in toks.items()})

    def check_materialize(self, slots):
        got = self.cache.materialize(slots, out=self.cache.poisoned(
            (len(slots), self.shape.heads, self.shape.v_dim, self.shape.k_dim)))
        for b, s in enumerate(slots):
            self.max_err = max(self.max_err, assert_close(got[b], self.state[s], self.tol, f"materialize slot {s}"))
