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

The CUDA kernels keep each slot's fill in one 64-bit word: the low ``FILL_BITS`` bits hold the fill
as a kernel (commit, the resets) or the host last wrote it, the bits above count the decode steps
since in fixed point (``STEP_BITS`` bits per step; each CTA of a step adds its state rows' share at
its end, so no CTA writes the fill while others of its row may still read it). ``fills_of_words``
reads the fills back; a word with no count is a plain fill, so the host writes plain fills.
"""

from __future__ import annotations

import numpy as np


def capacity(window: int, max_drafts: int) -> int:
    return window + max_drafts


def step_flushes(fill: int, window: int) -> bool:
    return fill + 1 >= window


def fill_after_step(fill: int, window: int) -> int:
    return 0 if step_flushes(fill, window) else fill + 1


FILL_BITS = STEP_BITS = 16


def step_share(rows: int, holds_last_row: bool, step_rows: int) -> int:
    """A replay-step CTA's share of one step (``1 << STEP_BITS``) for ``rows`` of the step's
    ``step_rows`` = V * HV state rows; the CTA that holds the last row adds the remainder, so a row's
    shares sum to one step, each at least one unit (``step_rows <= 1 << STEP_BITS``)."""
    per_row = (1 << STEP_BITS) // step_rows
    return rows * per_row + ((1 << STEP_BITS) - per_row * step_rows if holds_last_row else 0)


def fills_of_words(words, window: int):
    """The fills that the CUDA kernels' fill words hold (an integer array), as int64; a negative word
    (corrupt: no kernel writes one) reads as -1."""
    words = np.asarray(words, dtype=np.int64)
    base, steps = words & ((1 << FILL_BITS) - 1), words >> (FILL_BITS + STEP_BITS)
    after = (np.minimum(base, window - 1) + steps) % window  # from window - 1 or past it the next is 0
    return np.where(words < 0, -1, np.where(steps == 0, base, after))


def verify_flushes(fill: int, drafts: int, window: int, max_drafts: int) -> bool:
    return fill + drafts > capacity(window, max_drafts)
