"""Test helper: drives a replay cache and, beside it, the float64 plain recurrence per slot.

``ReplayTwin`` keeps the oracle state of every slot, advances it only by accepted tokens, and
checks each output the cache returns against the oracle (verify outputs against the oracle run
from the committed state over the drafts; the positions past a row's drafts stay NaN). NaN never
passes: ``assert_close`` requires finite values.
"""

from __future__ import annotations

import numpy as np

from replayssm_dsl.lowering.buffer_rules import step_flushes, verify_flushes
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
    def __init__(self, cache_cls, decl, shape, config, rng, slots: int = 4, tol: float = 1e-9,
                 pages: int | None = None, **kw):
        """``cache_cls``: ``CpuReplayCache``, ``CudaReplayCache`` or any class with their API.
        ``pages``: checkpoint pages apart from the slots (more than ``slots``); the twin then names
        every page, puts each load on a free page and moves every flushing row to a free page, as an
        engine does for a shared checkpoint (``page_of``), highest pages first, so that a slot's page
        and its index part ways."""
        self.decl, self.shape, self.config, self.rng, self.tol = decl, shape, config, rng, tol
        self.params = random_params(decl, shape, rng)
        paged = {} if pages is None else {"pages": pages}
        self.cache = cache_cls(decl, shape, config, slots=slots, params=self.params, **paged, **kw)
        self.pages = pages
        self.page_of = {}
        self.state = {}
        self.max_err = 0.0
        self._verify_pages = None

    def tokens(self, lead):
        return random_tokens(self.decl, self.shape, self.rng, lead)

    def _free_page(self, taken: set) -> int:
        """The highest page no slot holds and this batch has not taken (high first: never the slot's own)."""
        page = max(set(range(self.pages)) - set(self.page_of.values()) - taken)
        taken.add(page)
        return page

    def _pages(self, slots, flushes):
        """``src_pages`` and ``dst_pages`` keywords for a batch (none when not paged): a flushing row
        writes its fold to a free page."""
        if self.pages is None:
            return {}
        taken = set()
        src = [self.page_of[s] if s >= 0 else -1 for s in slots]
        dst = [self._free_page(taken) if s >= 0 and f else p for s, p, f in zip(slots, src, flushes)]
        return {"src_pages": src, "dst_pages": dst}

    def _move(self, slots, pages: dict) -> None:
        for s, p in zip(slots, pages.get("dst_pages", ())):
            if s >= 0:
                self.page_of[s] = p

    def load(self, slots):
        states = random_state(self.shape, self.rng, (len(slots),))
        if self.pages is None:
            self.cache.load(slots, states)
        else:
            taken = set()
            dst = [self._free_page(taken) for _ in slots]
            self.cache.load(slots, states, dst_pages=dst)
            self.page_of.update(zip(slots, dst))
        for s, st in zip(slots, states):
            self.state[s] = st

    def _oracle(self, slot, toks):
        return plain_recurrence(self.decl, self.shape, toks, self.params, self.state[slot])

    def step(self, slots, toks=None):
        """One decode step for ``slots`` (``-1`` entries are padding); checks every live row."""
        toks = toks if toks is not None else self.tokens((len(slots),))
        fills = self.cache.fills()
        pages = self._pages(slots, [s >= 0 and step_flushes(int(fills[s]), self.config.window) for s in slots])
        out = self.cache.step(slots, toks, out=self.cache.poisoned((len(slots), 1, self.shape.heads, self.shape.v_dim)),
                              **pages)
        self._move(slots, pages)
        for b, s in enumerate(slots):
            if s < 0:
                continue
            o, self.state[s] = self._oracle(s, {k: v[b:b + 1] for k, v in toks.items()})
            self.max_err = max(self.max_err, assert_close(out[b], o[0], self.tol, f"step slot {s}"))
        return out

    def verify(self, slots, drafts):
        t = int(max(drafts))
        toks = self.tokens((len(slots), t))
        fills, cfg = self.cache.fills(), self.config
        pages = self._pages(slots, [s >= 0 and verify_flushes(int(fills[s]), int(d), cfg.window, cfg.max_drafts)
                                    for s, d in zip(slots, drafts)])
        out = self.cache.verify(slots, toks, drafts,
                                out=self.cache.poisoned((len(slots), t, self.shape.heads, self.shape.v_dim)), **pages)
        self._verify_pages = pages  # the flushing rows move to their dst pages at commit
        for b, s in enumerate(slots):
            if s < 0:
                continue
            o, _ = self._oracle(s, {k: v[b, :drafts[b]] for k, v in toks.items()})
            self.max_err = max(self.max_err, assert_close(out[b, :drafts[b]], o, self.tol, f"verify slot {s}"))
            assert np.isnan(to_host(out[b, drafts[b]:])).all(), f"verify slot {s}: written past drafts = {drafts[b]}"
        return toks

    def commit(self, slots, toks, accepted):
        self.cache.commit(accepted)
        self._move(slots, self._verify_pages or {})
        self._verify_pages = None
        for b, s in enumerate(slots):
            if s >= 0 and accepted[b]:
                _, self.state[s] = self._oracle(s, {k: v[b, :accepted[b]] for k, v in toks.items()})

    def check_materialize(self, slots):
        pages = {} if self.pages is None else {"src_pages": [self.page_of[s] for s in slots]}
        got = self.cache.materialize(slots, out=self.cache.poisoned(
            (len(slots), self.shape.heads, self.shape.v_dim, self.shape.k_dim)), **pages)
        for b, s in enumerate(slots):
            self.max_err = max(self.max_err, assert_close(got[b], self.state[s], self.tol, f"materialize slot {s}"))
