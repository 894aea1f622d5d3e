"""The CUDA kernels' fill words (lowering/buffer_rules.py, replay_common.cuh), without a GPU: replay
steps whose CTAs read the word in any order, each adding its share of the step only after its own
read, leave words that read back (``fills_of_words``) as the decode rule says, at every read."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from replayssm_dsl.lowering.buffer_rules import FILL_BITS, STEP_BITS, fill_after_step, fills_of_words, step_share


def _ctas(v_dim: int, heads: int, tile: int) -> list[tuple[int, bool]]:
    """(rows, holds the last row) of each CTA of one batch row: V-tiles of ``tile`` rows per head."""
    return [(min(tile, v_dim - v0), hv == heads - 1 and v0 + tile >= v_dim)
            for hv in range(heads) for v0 in range(0, v_dim, tile)]


@settings(max_examples=300, deadline=None)
@given(window=st.integers(2, 32), extra=st.integers(0, 8), v_dim=st.integers(1, 256), heads=st.integers(1, 256),
       tile_fraction=st.floats(0.01, 1.0), steps=st.integers(0, 40), data=st.data())
def test_steps_read_back_as_the_decode_rule(window, extra, v_dim, heads, tile_fraction, steps, data):
    step_rows = v_dim * heads
    if step_rows > 1 << STEP_BITS:
        return
    tile = max(1, int(v_dim * tile_fraction))
    ctas = _ctas(v_dim, heads, tile)
    shares = [step_share(rows, last, step_rows) for rows, last in ctas]
    assert min(shares) >= 1 and sum(shares) == 1 << STEP_BITS
    fill = data.draw(st.integers(0, window + extra), label="fill")  # as commit or the host last wrote it
    word = fill
    for _ in range(steps):
        order = data.draw(st.permutations(range(len(ctas))), label="arrival order")
        reads_before = data.draw(st.lists(st.integers(0, len(ctas) - 1), min_size=len(ctas), max_size=len(ctas)))
        added = 0
        for position, cta in enumerate(order):  # a CTA reads after some CTAs of the launch have added theirs
            seen = word + (sum(shares[c] for c in order[:min(reads_before[cta], position)]) << FILL_BITS)
            assert int(fills_of_words(np.array([seen]), window)[0]) == fill
            added += shares[cta]
        word += added << FILL_BITS
        assert (word >> FILL_BITS) & ((1 << STEP_BITS) - 1) == 0, "a launch's shares leave a whole step"
        fill = fill_after_step(fill, window)
    assert int(fills_of_words(np.array([word]), window)[0]) == fill


def test_a_negative_word_reads_as_corrupt():
    assert fills_of_words(np.array([-1, -(1 << 40), 3]), 16).tolist() == [-1, -1, 3]
