"""Runtime layer: an engine's decode loop over a replay cache and the host slot pool.

``ReplayEngine`` ties the Cython ``SlotPool`` (slots, copy-on-write checkpoint pages, host mirror
of the fills) to a replay cache (CPU or CUDA): the pool builds the int32 batch arrays, the cache
launches the kernels with them, and the pool's mirror advances by the same rules the kernels
follow, so the scheduler never reads the device. A decode loop is::

    slot = engine.add(prefill_state)            # or engine.fork(parent)
    out = engine.step(requests, tokens)         # one token per request
    out = engine.verify(requests, drafts_tokens, drafts)
    engine.accept(accepted)                     # pointer move
    states = engine.materialize(requests)       # the plain states, read from each request's own page
    engine.finish(slot)
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from replayssm_dsl.errors import InputError

from .validation import as_index, check_array, check_slots, host_int_array, is_device_array, readable_host_array


def _pad(tokens, requests: int, rows: int):
    """Host token arrays (NumPy, CPU torch tensors) of one row per request padded with zeros to ``rows``
    batch rows (the padded rows' slot is -1); any other length is left for the cache to refuse, naming
    the input. Device arrays must come padded."""
    if not isinstance(tokens, Mapping):
        return tokens
    out = {}
    for name, value in tokens.items():
        shape = getattr(value, "shape", ())
        if not is_device_array(value) and len(shape) and shape[0] == requests < rows:
            value = readable_host_array(value, f"tokens[{name!r}]")
            pad = np.zeros((rows - value.shape[0],) + value.shape[1:], value.dtype)
            value = np.concatenate([value, pad])
        out[name] = value
    return out


def _requests(requests) -> np.ndarray:
    requests = host_int_array(requests, "requests")
    if requests.shape[0] == 0:
        raise InputError("requests: empty batch")
    return requests


def _rows(batch_size, requests: int) -> int:
    """The padded batch's rows: ``batch_size`` (at least one per request), or one per request if None."""
    if batch_size is None:
        return requests
    rows = as_index(batch_size)
    if rows is None or rows < requests:
        raise InputError(f"batch_size: expected an int >= {requests} (one row per request), got {batch_size!r}")
    return rows


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
        shape = self.cache.shape
        check_array(state, "state", (shape.heads, shape.v_dim, shape.k_dim), check_values=False)  # values: load's
        slot = self.pool.allocate()
        page = self.pool.prepare_load(slot)
        try:
            self.cache.load([slot], state[None], dst_pages=[page])
        except Exception:
            self.pool.free(slot)  # the cache refused the state: the slot and its page go back
            raise
        return slot

    def fork(self, parent: int) -> int:
        """A child sharing the parent's checkpoint copy-on-write; its records are copied."""
        child = self.pool.fork(parent)
        try:
            self.cache.copy_records(parent, child)
        except Exception:
            self.pool.free(child)  # the cache refused the copy: the child and its share of the page go back
            raise
        return child

    def finish(self, slot: int) -> None:
        self.pool.free(slot)

    def step(self, requests, tokens: dict, batch_size: int | None = None):
        """One token per request (``tokens[name]`` ``[len(requests), ...]``); ``[len(requests), HV, V]``."""
        requests = _requests(requests)
        rows = _rows(batch_size, requests.shape[0])
        slot, src, dst = self.pool.build_step(requests, rows)
        out = self._refused_or(lambda: self.cache.step(slot, _pad(tokens, requests.shape[0], rows),
                                                       src_pages=src, dst_pages=dst))
        self.pool.report_step()
        return out[:requests.shape[0]]

    def verify(self, requests, tokens: dict, drafts, batch_size: int | None = None):
        """Outputs of ``drafts[i]`` speculative tokens per request (``tokens[name]`` ``[n, T, ...]``)."""
        requests = _requests(requests)
        rows = _rows(batch_size, requests.shape[0])
        slot, src, dst, drafts_out = self.pool.build_verify(requests, host_int_array(drafts, "drafts"), rows)
        out = self._refused_or(lambda: self.cache.verify(slot, _pad(tokens, requests.shape[0], rows), drafts_out,
                                                         src_pages=src, dst_pages=dst))
        self._verify_rows = rows
        return out[:requests.shape[0]]

    def materialize(self, requests):
        """The plain state of each request, ``[len(requests), HV, V, K]``: its checkpoint page (after
        copy-on-write no longer the page numbered like its slot) folded with its records."""
        requests = _requests(requests)
        live = set(self.pool.live_slots().tolist())
        for i, slot in enumerate(requests.tolist()):
            if slot not in live:  # out of range and -1 too: materialize has no padding rows
                raise InputError(f"requests[{i}] = {slot} is not an allocated slot")
        check_slots(requests, self.cache.num_slots, "requests")  # each once
        return self.cache.materialize(requests, src_pages=[self.pool.page_of(slot) for slot in requests.tolist()])

    def _refused_or(self, call):
        """``call()``, the cache's launch of the batch the pool has just built; if the cache refuses it
        (its checks run before any kernel), the pool drops that batch too, so the engine stays usable."""
        try:
            return call()
        except Exception:
            self.pool.cancel_batch()
            raise

    def accept(self, accepted) -> None:
        """Commit ``accepted[i]`` drafts of the last verify per request."""
        if self._verify_rows == 0:
            raise InputError("accept: no verify to accept")
        accepted = host_int_array(accepted, "accepted")
        if accepted.shape[0] > self._verify_rows:
            raise InputError(f"accepted: length {accepted.shape[0]}, but the last verify had {self._verify_rows} rows")
        padded = np.zeros(self._verify_rows, np.int32)
        padded[:accepted.shape[0]] = accepted
        self.pool.commit(accepted)
        self.cache.commit(padded)
        self._verify_rows = 0
