"""Lowering layer: when a replay buffer flushes, stated once.

Every backend (CPU executor, CUDA kernels, host bookkeeping) follows these rules; the host mirror
re-implements them in Cython for speed and is tested against them.

- ``capacity = window + max_drafts`` records per slot.
- A decode step at fill ``n`` flushes when ``n + 1 >= window``: it folds the ``n`` stored records and
  the current token into the checkpoint and leaves the slot empty (fill 0). Otherwise it appends one
  record (fill ``n + 1``).
- ``verify`` with ``t`` drafts at fill ``n`` first flushes the ``n`` records when ``n + t > capacity``,
  then writes ``t`` draft records after the committed ones; it does not move the fill.
- ``commit(a)`` moves the fill by ``a <= t`` (the accepted drafts); rejected drafts are forgotten.
"""

from __future__ import annotations


def capacity(window: int, max_drafts: int) -> int:
    return window + max_drafts


def step_flushes(fill: int, window: int) -> bool:
    return fill + 1 >= window


def fill_after_step(fill: int, window: int) -> int:
    return 0 if step_flushes(fill, window) else fill + 1


def verify_flushes(fill: int, drafts: int, window: int, max_drafts: int) -> bool:
    return fill + drafts > capacity(window, max_drafts)
