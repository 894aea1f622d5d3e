"""Runtime layer: an engine's decode loop over a replay cache and the host slot pool.

``ReplayEngine`` ties the Cython ``SlotPool`` (slots, copy-on-write checkpoint pages, host mirror
of the fills) to a replay cache (CPU or CUDA): the pool builds the int32 batch arrays, the cache
launches the kernels with them, and the pool's mirror advances by the same rules the kernels
follow, so the scheduler never reads the device. A decode loop is::

    slot = engine.add(prefill_state)            # or engine.fork(parent)
    out = engine.step(requests, tokens)         # one token per request
    out = engine.verify(requests, drafts_tokens, drafts)
    engine.accept(accepted)                     # pointer move
    engine.finish(slot)
"""

from __future__ import annotations

import numpy as np

from replayssm_dsl.errors import InputError


def _pad(tokens: dict, rows: int) -> dict:
    """Host token arrays padded with zeros to ``rows`` batch rows (device arrays must come padded)."""
    out = {}
    for name, value in tokens.items():
        if isinstance(value, np.ndarray) and value.shape[0] < rows:
            pad = np.zeros((rows - value.shape[0],) + value.shape[1:], value.dtype)
            value = np.concatenate([value, pad])
        out[name] = value
    return out


class ReplayEngine:
    def __init__(self, cache_cls, decl, shape, config, *, slots: int, params: dict, pages: int | None = None,
                 pool_cls=None, max_batch: int | None = None, **cache_kw):
        if pool_cls is None:
            from .bookkeeping import SlotPool as pool_cls
        pages = 2 * slots if pages is None else pages
        self.pool = pool_cls(slots, pages, config.window, config.max_drafts)
        self.cache = cache_cls(decl, shape, config, slots=slots, pages=pages, params=params, **cache_kw)
        self._verify_rows = 0
        if hasattr(self.cache, "cp"):  # a GPU cache: the batch arrays live in pinned host memory
            import cupyx
            rows = max_batch or 2 * slots
            self.pool.set_step_buffers(*(cupyx.empty_pinned((rows,), dtype=np.int32) for _ in range(4)))

    def add(self, state) -> int:
        """A new request whose checkpoint is ``state`` ``[HV, V, K]`` (e.g. prefill's final state)."""
        slot = self.pool.allocate()
        page = self.pool.prepare_load(slot)
        self.cache.load([slot], state[None], dst_pages=[page])
        return slot

    def fork(self, parent: int) -> int:
        """A child sharing the parent's checkpoint copy-on-write; its records are copied."""
        child = self.pool.fork(parent)
        self.cache.copy_records(parent, child)
        return child

    def finish(self, slot: int) -> None:
        self.pool.free(slot)

    def step(self, requests, tokens: dict, batch_size: int | None = None):
        """One token per request (``tokens[name]`` ``[len(requests), ...]``); ``[len(requests), HV, V]``."""
        requests = np.asarray(requests, np.int32)
        rows = batch_size or requests.shape[0]
        slot, src, dst = self.pool.build_step(requests, rows)
        out = self.cache.step(slot, _pad(tokens, rows), src_pages=src, dst_pages=dst)
        self.pool.report_step()
        return out[:requests.shape[0]]

    def verify(self, requests, tokens: dict, drafts, batch_size: int | None = None):
        """Outputs of ``drafts[i]`` speculative tokens per request (``tokens[name]`` ``[n, T, ...]``)."""
        requests = np.asarray(requests, np.int32)
        rows = batch_size or requests.shape[0]
        slot, src, dst, drafts_out = self.pool.build_verify(requests, np.asarray(drafts, np.int32), rows)
        out = self.cache.verify(slot, _pad(tokens, rows), drafts_out, src_pages=src, dst_pages=dst)
        self._verify_rows = rows
        return out[:requests.shape[0]]

    def accept(self, accepted) -> None:
        """Commit ``accepted[i]`` drafts of the last verify per request."""
        accepted = np.asarray(accepted, np.int32)
        if self._verify_rows == 0:
            raise InputError("accept: no verify to accept")
        padded = np.zeros(self._verify_rows, np.int32)
        padded[:accepted.shape[0]] = accepted
        self.pool.commit(accepted)
        self.cache.commit(padded)
        self._verify_rows = 0
