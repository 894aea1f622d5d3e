"""The write records' shared-memory layout (``launch.write_record_layout``), without a GPU: for
every launch shape the autotuner may pick and every built-in shape, a chunk divides the warp's rows,
the CTA's rows and V (so copies stay aligned and never straddle V), and a warp's loads of the records,
a record per lane and a chunk per load, fall in distinct shared-memory banks in each of the hardware's
phases (8 lanes for 16-byte loads, 16 for 8-byte, 32 for 4-byte).
"""

from __future__ import annotations

import pytest

from codegen_cases import TUNER_LAUNCHES
from replayssm_dsl import ModelShape
from replayssm_dsl.config import PRESETS
from replayssm_dsl.lowering.launch import write_record_layout

# V = 66 and 63 take 2- and 1-float chunks at every launch shape
SHAPES = [p.shape for p in PRESETS.values()] + [ModelShape(6, 2, 80, 96), ModelShape(3, 1, 60, 100),
                                                 ModelShape(4, 2, 66, 64), ModelShape(4, 2, 63, 64)]
BANKS, LANES = 32, 32


def banks_in_conflict(vec: int, pitch: int, column: int, records: int) -> list[tuple[int, int]]:
    """Lanes of one phase of a warp's loads (lane i: record i's ``vec`` floats from ``column``) that
    touch a bank another lane of the phase touches at a different address."""
    phase = 128 // (4 * vec)  # lanes per phase: a phase serves 128 bytes
    clashes = []
    for start in range(0, min(records, LANES), phase):
        seen: dict[int, int] = {}
        for lane in range(start, min(start + phase, records)):
            for word in range(vec):
                address = lane * pitch + column + word
                bank = address % BANKS
                if bank in seen and seen[bank] != address:
                    clashes.append((lane, bank))
                seen[bank] = address
    return clashes


@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: f"V{s.v_dim}")
@pytest.mark.parametrize("launch", TUNER_LAUNCHES, ids=lambda c: c.label)
def test_write_records_chunks_are_aligned_and_loads_conflict_free(launch, shape):
    rows, cta_rows = launch.rows_per_warp, launch.rows_per_cta
    vec, pitch = write_record_layout(rows, cta_rows, shape.v_dim)
    assert vec in (1, 2, 4) and rows % vec == 0 and cta_rows % vec == 0 and shape.v_dim % vec == 0
    assert pitch >= cta_rows and pitch % vec == 0 and (pitch // vec) % 2 == 1
    if vec < 4:  # the widest chunk that fits: a wider one would not divide the rows or V
        assert rows % (2 * vec) or shape.v_dim % (2 * vec)
    for warp in range(launch.warps):
        for column in range(warp * rows, (warp + 1) * rows, vec):
            assert not banks_in_conflict(vec, pitch, column, records=LANES), (launch.label, column)


def test_the_conflict_check_sees_a_pitch_of_the_cta_rows():
    """Unpadded records (pitch = the CTA's 64 rows) put every lane of a phase on the same banks."""
    assert banks_in_conflict(4, 64, 0, records=LANES)
    assert banks_in_conflict(1, 64, 0, records=LANES)
    assert not banks_in_conflict(1, 65, 0, records=LANES)
