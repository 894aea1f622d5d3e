"""Lowering layer tests: the traffic model of the lowered plans against the formulas of docs/design.md ("Traffic model").

For every design preset (``config.DESIGN_PRESETS``), lowered with ``ReplayConfig(window=16)`` and FP32 state:
conventional ``2·E·4``; replay non-flush ``E·4 + n·R + R``; flush ``E·4 + 15·R + E·4``; the
amortised step equals the hand formula and saves 1.7–2.0× (Mamba-2, GDN) or 1.4–2.0× (KDA, whose
per-channel decays make records larger); verify reads one state and writes records, never a state;
snapshot verify writes one state per draft.

May import: pytest, Hypothesis, ``replayssm_dsl``, ``replayssm_dsl.lowering``.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.config import DESIGN_PRESETS, PRESETS
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.buffer_rules import verify_flushes
from replayssm_dsl.lowering.traffic import (Traffic, design_formulas, kernel_traffic, record_bytes,
                                            replay_step_amortized, verify_mixed)
from strategies import shapes

L = 16
PRESET_NAMES = sorted(DESIGN_PRESETS)  # (the safe-gate preset's bytes: test_scaled_keys.py)
RATIO = {"mamba2": (1.7, 2.0), "gdn": (1.7, 2.0), "kda": (1.4, 2.0)}


def _program(name: str, window: int = L, **cfg):
    p = PRESETS[name]
    return lower(variants.get(p.variant), p.shape, ReplayConfig(window=window, **cfg))


def _expected_record_bytes(variant: str, shape: ModelShape) -> float:
    """By hand: cumulative decay (1 or K floats) + write (V floats) + key (K floats shared by a group)."""
    decay = {"mamba2": 1, "gdn": 1, "kda": shape.k_dim}[variant]
    return 4.0 * (decay + shape.v_dim + shape.k_dim / shape.group_size)


@pytest.fixture(params=PRESET_NAMES)
def preset_program(request):
    return PRESETS[request.param], _program(request.param)


def test_record_bytes_by_hand(preset_program):
    preset, program = preset_program
    assert record_bytes(program) == pytest.approx(_expected_record_bytes(preset.variant, preset.shape), rel=1e-12)


def test_conventional_step_reads_and_writes_one_state(preset_program):
    preset, program = preset_program
    E = preset.shape.state_elements
    for fill in (0, 7, 15):  # the baseline does not look at the replay buffer
        t = kernel_traffic(program, "conventional_step", fill)
        assert t.total == 2 * E * 4
        assert (t.state_read, t.state_write, t.record_read, t.record_write) == (E * 4, E * 4, 0, 0)
    assert design_formulas(program)["conventional"] == 2 * E * 4


def test_replay_step_non_flush_and_flush(preset_program):
    preset, program = preset_program
    E, R = preset.shape.state_elements, record_bytes(program)
    for n in range(L - 1):
        t = kernel_traffic(program, "replay_step", n)
        assert t.total == pytest.approx(E * 4 + n * R + R, rel=1e-12), n
        assert t.state_read == E * 4 and t.state_write == 0, n
        assert t.record_read == pytest.approx(n * R) and t.record_write == pytest.approx(R), n
    flush = kernel_traffic(program, "replay_step", L - 1)
    assert flush.total == pytest.approx(E * 4 + 15 * R + E * 4, rel=1e-12)
    assert flush.state_read == E * 4 and flush.state_write == E * 4 and flush.record_write == 0
    f = design_formulas(program)
    assert f["replay_non_flush_n0"] == pytest.approx(E * 4 + R)
    assert f["replay_flush"] == pytest.approx(flush.total)


def test_amortised_replay_step_equals_design_formula_and_saves_traffic(preset_program):
    preset, program = preset_program
    E, R = preset.shape.state_elements, record_bytes(program)
    amortised = replay_step_amortized(program).total
    assert amortised == pytest.approx(design_formulas(program)["replay_amortized"], rel=1e-12)
    by_hand = (sum(E * 4 + n * R + R for n in range(L - 1)) + E * 4 + 15 * R + E * 4) / L
    assert amortised == pytest.approx(by_hand, rel=1e-12)
    ratio = kernel_traffic(program, "conventional_step", 0).total / amortised
    low, high = RATIO[preset.variant]
    assert low <= ratio <= high, f"{preset.name}: conventional / replay = {ratio:.3f}"


def test_kda_saves_less_than_mamba2_and_gdn():
    """Per-channel decays make KDA's records K floats longer: its saving is the smallest."""
    ratio = {}
    for name in PRESET_NAMES:
        program = _program(name)
        ratio[name] = kernel_traffic(program, "conventional_step", 0).total / replay_step_amortized(program).total
    assert ratio["kimi-linear"] < min(r for n, r in ratio.items() if n != "kimi-linear")


@pytest.mark.parametrize("drafts", range(1, 9))
def test_verify_reads_one_state_writes_records_and_no_state(preset_program, drafts):
    preset, program = preset_program
    E, R, cap = preset.shape.state_elements, record_bytes(program), program.config.capacity
    for n in range(cap + 1):
        folds = verify_flushes(n, drafts, L, program.config.max_drafts)
        assert folds == (n + drafts > cap)
        v = kernel_traffic(program, "verify", n, drafts)
        assert v.state_read == E * 4, (n, drafts)
        assert v.state_write == 0, (n, drafts)
        assert v.record_write == pytest.approx(drafts * R), (n, drafts)
        assert v.record_read == pytest.approx(0 if folds else n * R), (n, drafts)
        pre = kernel_traffic(program, "flush_for_verify", n, drafts)
        if folds:  # the fold runs in its own launch: one state read, one written, n records read
            assert (pre.state_read, pre.state_write) == (E * 4, E * 4), (n, drafts)
            assert pre.record_read == pytest.approx(n * R) and pre.record_write == 0
        else:
            assert pre.total == 0, (n, drafts)
        assert (v + pre).state_write == (E * 4 if folds else 0)


# By hand, floats per batch row and value head of one token: GDN's and KDA's q and k shared by a
# key group, v, and the gates (GDN a, b; KDA a over K, b; Mamba-2 x, z over V, dt, B and C shared).
def _token_floats(variant: str, shape: ModelShape) -> float:
    K, V, G = shape.k_dim, shape.v_dim, shape.group_size
    return {"gdn": 2 * K / G + V + 2, "kda": 2 * K / G + V + K + 1, "mamba2": 2 * V + 1 + 2 * K / G}[variant]


@pytest.mark.parametrize("drafts", (1, 2, 8))
def test_tokens_read_and_outputs_written_per_draft(preset_program, drafts):
    preset, program = preset_program
    V = preset.shape.v_dim
    for kernel, t in (("verify", drafts), ("replay_step", 1), ("conventional_step", 1)):
        x = kernel_traffic(program, kernel, 3, drafts)
        assert x.token_read == pytest.approx(4 * t * _token_floats(preset.variant, preset.shape)), kernel
        assert x.output_write == t * V * 4, kernel
        assert x.io == x.token_read + x.output_write


def test_verify_mixed_is_the_mean_over_the_fills_of_verify_and_its_fold(preset_program):
    """Verify at T = 8 as the benchmark times it: rows at fills 0 .. L - 1, the fold before it included."""
    preset, program = preset_program
    E, R = preset.shape.state_elements, record_bytes(program)
    mixed = verify_mixed(program, 8)
    folds = [verify_flushes(n, 8, L, program.config.max_drafts) for n in range(L)]
    assert mixed.state_read == pytest.approx(E * 4 * (1 + sum(folds) / L))
    assert mixed.state_write == pytest.approx(E * 4 * sum(folds) / L)
    assert mixed.record_write == pytest.approx(8 * R)
    assert mixed.record_read == pytest.approx(R * sum(range(L)) / L)  # verify's or, where it folds, the fold's
    assert mixed.output_write == 8 * preset.shape.v_dim * 4
    total = Traffic()
    for n in range(L):
        total += kernel_traffic(program, "verify", n, 8) + kernel_traffic(program, "flush_for_verify", n, 8)
    assert mixed.total == pytest.approx(total.total / L) and mixed.io == pytest.approx(total.io / L)


@pytest.mark.parametrize("drafts", range(1, 9))
def test_snapshot_verify_writes_one_state_per_draft(preset_program, drafts):
    preset, program = preset_program
    E = preset.shape.state_elements
    s = kernel_traffic(program, "snapshot_verify", 0, drafts)
    assert s.state_read == E * 4
    assert s.state_write == drafts * E * 4
    assert s.record_read == 0 and s.record_write == 0
    v = kernel_traffic(program, "verify", 0, drafts)
    if drafts > 1:
        assert v.total < s.total


def test_commit_and_fill_kernels_move_no_state_or_records(preset_program):
    _, program = preset_program
    for kernel in ("commit", "reset_fill"):
        assert kernel_traffic(program, kernel, 5, 3).total == 0, kernel


def test_flush_and_materialize(preset_program):
    preset, program = preset_program
    E, R = preset.shape.state_elements, record_bytes(program)
    for n in (0, 1, 15, program.config.capacity):
        f = kernel_traffic(program, "flush", n)
        assert (f.state_read, f.state_write) == (E * 4, E * 4)
        assert f.record_read == pytest.approx(n * R) and f.record_write == 0
        m = kernel_traffic(program, "materialize", n)
        assert m.state_read == E * 4 and m.record_read == pytest.approx(n * R)
        assert m.state_write == E * 4  # the float32 materialised copy


@settings(max_examples=40, deadline=None)
@given(variant=st.sampled_from(sorted(variants.BUILTINS)), shape=shapes(),
       window=st.integers(1, 23), state_dtype=st.sampled_from(("float32", "float16", "bfloat16")))
def test_amortised_step_matches_formula_for_any_declaration_and_dtype(variant, shape, window, state_dtype):
    program = lower(variants.get(variant), shape, ReplayConfig(window=window, state_dtype=state_dtype))
    f = design_formulas(program)
    s = 4 if state_dtype == "float32" else 2
    E = shape.state_elements
    assert kernel_traffic(program, "conventional_step", 0).total == 2 * E * s == f["conventional"]
    assert replay_step_amortized(program).total == pytest.approx(f["replay_amortized"], rel=1e-12)
    assert kernel_traffic(program, "replay_step", window - 1).total == pytest.approx(f["replay_flush"], rel=1e-12)


def test_bf16_tokens_are_charged_two_bytes(preset_program):
    preset, program = preset_program
    decl = variants.get(preset.variant).with_token_dtype("bfloat16")
    bf16 = lower(decl, preset.shape, ReplayConfig(window=L))
    for kernel, drafts in (("replay_step", 1), ("verify", 8), ("conventional_step", 1)):
        want = kernel_traffic(program, kernel, 3, drafts).token_read / 2
        assert kernel_traffic(bf16, kernel, 3, drafts).token_read == pytest.approx(want), kernel
    assert verify_mixed(bf16, 8).token_read == pytest.approx(verify_mixed(program, 8).token_read / 2)
