"""Records of decay-scaled keys (lowering/record_keys.py) and the value ranges that allow them.

The interval analysis (``replayssm_dsl.bounds``) must be sound: every value an expression takes
lies in its range (Hypothesis, random expressions and inputs up to ±1e4). The lowering keeps scaled
keys only for a bounded gate whose range fits; the traffic model counts the decays of the newest
record alone. The CPU backend in float32, and on a GPU the generated kernels, then meet the float64
plain recurrence with the gate at both ends of its range: channels at the bound (log-decay −5 per
token, so G reaches capacity · −5 = −120 in the records) beside channels that barely decay,
through full buffers, verify at full capacity and commit.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayssm_dsl import ModelShape, Recurrence, ReplayConfig, ops, variants
from replayssm_dsl.bounds import value_range
from replayssm_dsl.config import PRESETS
from replayssm_dsl.errors import DeclarationError
from replayssm_dsl.evaluate import evaluate
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.record_keys import SHIFT_LIMIT, key_shift
from replayssm_dsl.lowering.traffic import replay_step_amortized
from replayssm_dsl.random_inputs import random_tokens
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
from replayssm_dsl.variants.kimi_delta import _kda
from twin import ReplayTwin

FP32_TOL = 2e-4
SAFE = variants.get("kda_safe_gate")

# --- the interval analysis -----------------------------------------------------------------------


def _expressions(x):
    """Random expressions over one input ``x`` (and constants), from the DSL's own ops."""
    consts = st.floats(-6, 6, allow_nan=False).map(lambda c: c + 0.0)
    # (-softplus(x) + c: a range wholly below or above a unary op's turning point, e.g. silu's at -1.28)
    leaves = st.one_of(st.just(x), consts.map(lambda c: x * 0 + c), consts.map(lambda c: c - ops.softplus(x)))
    unary = [ops.exp, ops.softplus, ops.sigmoid, ops.logsigmoid, ops.silu, ops.sqrt, ops.log, lambda e: -e]
    exponents = st.sampled_from([2, 3, -1, 0.5, 2.0])

    def extend(children):
        return st.one_of(
            st.tuples(st.sampled_from(unary), children).map(lambda p: p[0](p[1])),
            st.tuples(children, children).map(lambda p: p[0] + p[1]),
            st.tuples(children, children).map(lambda p: p[0] - p[1]),
            st.tuples(children, children).map(lambda p: p[0] * p[1]),
            st.tuples(children, children).map(lambda p: p[0] / p[1]),
            st.tuples(children, children).map(lambda p: p[0] / (1.0 + ops.exp(p[1]))),
            st.tuples(consts, children).map(lambda p: p[0] * p[1]),
            st.tuples(consts, children).map(lambda p: p[0] - p[1]),  # reflected: float - Expr
            st.tuples(consts.filter(lambda c: c != 0.0), children).map(lambda p: p[1] / p[0]),
            st.tuples(consts, children).map(lambda p: p[0] / (1.0 + ops.exp(p[1]))),  # reflected division
            st.tuples(children, exponents).map(lambda p: p[0] ** p[1]))
    return st.recursive(leaves, extend, max_leaves=6)


def _evaluate_at(expr, x_values):
    shape = ModelShape(1, 1, 1, len(x_values))
    values = {"x": np.asarray(x_values, np.float64).reshape(1, 1, -1)}
    with np.errstate(all="ignore"):
        return np.asarray(evaluate(expr, values, shape, "head", np.float64), np.float64).ravel()


_r = Recurrence("ranges")
_X = _r.token("x", size="K")


@settings(max_examples=300, deadline=None)
@given(expr=_expressions(_X), xs=st.lists(st.floats(-1e4, 1e4, allow_nan=False), min_size=1, max_size=8))
def test_every_value_lies_in_the_expressions_range(expr, xs):
    lo, hi = value_range(expr)
    got = _evaluate_at(expr, xs)
    finite = got[np.isfinite(got)]  # (exp of 1e4 overflows float64; the range says +inf there)
    slack = 1e-9 * np.maximum(1.0, np.abs(finite))
    assert np.all(finite >= lo - slack) and np.all(finite <= hi + slack), (expr, lo, hi, finite)


def test_the_gates_ranges():
    assert SAFE.decay_lower_bound == -5.0
    assert variants.get("kda_safe_gate").decay_lower_bound == -5.0  # the built-in, by name
    assert variants.kda_safe_gate(-2.5).decay_lower_bound == -2.5
    for unbounded in ("kda", "gla", "gdn", "mamba2"):
        assert variants.get(unbounded).decay_lower_bound == -math.inf, unbounded
    assert variants.get("deltanet").decay_lower_bound == 0.0
    assert value_range(ops.sigmoid(_X) * -5.0) == (-5.0, 0.0)
    assert value_range(ops.l2norm(_X)) == (-1.0, 1.0)
    assert value_range(ops.sigmoid(_X) / 0.5) == (0.0, 2.0)  # division takes the divisor's reciprocal
    assert value_range(ops.sigmoid(_X) / -0.1) == (-10.0, 0.0)
    assert value_range(ops.silu(-ops.softplus(_X) - 2.0))[1] == 0.0  # silu's sup there is its limit at -inf
    assert value_range(ops.sqrt(ops.sigmoid(_X) * 0.25)) == (0.0, 0.5)


@pytest.mark.parametrize("bad", [0, 0.0, 1.0, math.inf, -math.inf, math.nan, True, "-5"])
def test_a_safe_gate_needs_a_finite_negative_bound(bad):
    with pytest.raises(DeclarationError, match="lower_bound"):
        variants.kda_safe_gate(bad)


# --- when the lowering keeps scaled keys ------------------------------------------------------------


def _divided_gate(divisor: float):
    """KDA whose gate is bounded through a division: -sigmoid(e^{A_log} · x) / divisor."""
    return _kda("kda_divided", "KDA with a divided gate",
                lambda A_log, x: -ops.sigmoid(ops.exp(A_log) * x) / divisor)


def test_scaled_keys_only_where_the_range_fits():
    assert key_shift(SAFE, ReplayConfig()) == -60.0  # capacity 24 · −5 / 2
    assert key_shift(SAFE, ReplayConfig(scaled_keys=False)) is None
    assert key_shift(variants.get("kda"), ReplayConfig()) is None  # Kimi's gate is unbounded
    assert key_shift(variants.get("gla"), ReplayConfig()) is None
    assert key_shift(variants.get("gdn"), ReplayConfig()) is None  # a scalar decay: nothing to scale
    wide = ReplayConfig(window=23, max_drafts=8)  # capacity 31: C = −77.5, past the limit
    assert -wide.capacity * 5 / 2 < -SHIFT_LIMIT and key_shift(SAFE, wide) is None
    # A gate bounded through a division: -sigmoid(.) / 0.5 is in [-2, 0] (C = 24 · −2 / 2), / 0.1 in
    # [-10, 0], whose C = −120 is past the limit.
    assert key_shift(_divided_gate(0.5), ReplayConfig()) == -24.0
    assert key_shift(_divided_gate(0.1), ReplayConfig()) is None
    bf16 = SAFE.with_token_dtype("bfloat16")
    assert key_shift(bf16, ReplayConfig(record_dtype="bfloat16")) is None  # records of raw bf16 inputs
    assert key_shift(bf16, ReplayConfig()) == -60.0


def test_scaled_keys_are_stored_per_value_head_and_read_with_one_decay_row():
    grouped = lower(SAFE, ModelShape(6, 2, 80, 96), ReplayConfig())
    assert grouped.buffer("rec_key").dims == ("slots", "HV", "cap", "K")
    assert lower(variants.get("kda"), ModelShape(6, 2, 80, 96), ReplayConfig()).buffer("rec_key").dims[1] == "H"
    kimi = PRESETS["kimi-linear"].shape
    plain = replay_step_amortized(lower(variants.get("kda"), kimi, ReplayConfig())).total
    scaled = replay_step_amortized(lower(SAFE, kimi, ReplayConfig())).total
    # records at the mean fill 7.5: 7.5 · (512 B keys + 512 writes) + 15/16 · 512 B of G_{n-1}, not 7.5 · 1,536
    assert (plain, scaled) == (82592, 79232)


def test_the_generated_source_scales_keys_only_where_lowered_so():
    from replayssm_dsl.lowering.render_cuda import render_program
    kimi = PRESETS["kimi-linear"].shape
    assert "#define KEY_SHIFT (-60.0f)" in render_program(lower(SAFE, kimi, ReplayConfig()))
    assert "KEY_SHIFT" not in render_program(lower(SAFE, kimi, ReplayConfig(scaled_keys=False)))
    assert "KEY_SHIFT" not in render_program(lower(variants.get("kda"), kimi, ReplayConfig()))


# --- the gate at both ends of its range, against the float64 recurrence -------------------------


def gates_at_both_ends(decl, shape, rng, lead):
    """Random tokens whose gate input drives every other key channel to the bound (σ → 1: log-decay
    −5 each token) and the others to no decay (σ → 0), the rest of each token random."""
    toks = random_tokens(decl, shape, rng, lead)
    ends = np.where(np.arange(shape.k_dim) % 2 == 0, 60.0, -60.0)
    toks["g_raw"] = np.broadcast_to(ends, toks["g_raw"].shape) + 0.1 * rng.standard_normal(toks["g_raw"].shape)
    return toks


def drive_to_full_capacity(twin, slots):
    """Fill L − 1 by steps, verify T at L − 1 and accept all (fill L − 1 + T = capacity − 1), verify
    one more draft at full capacity (G_i down to capacity · −5), then steps through the flush."""
    cfg = twin.config
    twin.load(slots)
    for _ in range(cfg.window - 1):
        twin.step(slots)
    toks = twin.verify(slots, [cfg.max_drafts] * len(slots))
    twin.commit(slots, toks, [cfg.max_drafts] * len(slots))
    assert list(twin.cache.fills()[slots]) == [cfg.capacity - 1] * len(slots)
    toks = twin.verify(slots, [1] * len(slots))  # n + t = capacity: no fold before it
    twin.commit(slots, toks, [1] * len(slots))
    twin.check_materialize(slots)
    for _ in range(3):
        twin.step(slots)  # the first one folds the full buffer
    twin.check_materialize(slots)


def saturated_twin(cache_cls, seed, **kw):
    shape, config = ModelShape(4, 2, 64, 64), ReplayConfig(window=16, max_drafts=8)
    twin = ReplayTwin(cache_cls, SAFE, shape, config, np.random.default_rng(seed), slots=2, tol=FP32_TOL, **kw)
    twin.tokens = lambda lead: gates_at_both_ends(SAFE, shape, twin.rng, lead)
    return twin


@pytest.mark.parametrize("seed", [0, 1])
def test_cpu_float32_meets_the_recurrence_with_the_gate_at_its_bound(seed):
    twin = saturated_twin(CpuReplayCache, seed, precision="float32")
    drive_to_full_capacity(twin, [1, 0])
    keys = twin.cache.buffers["rec_key"]
    assert np.isfinite(keys).all() and np.abs(keys).max() > 1e20  # e^{C − G} reached the top of its range


@pytest.mark.gpu
@pytest.mark.parametrize("seed", [0, 1])
def test_gpu_meets_the_recurrence_with_the_gate_at_its_bound(seed):
    pytest.importorskip("cupy")
    from replayssm_dsl.runtime.cuda_cache import CudaReplayCache
    twin = saturated_twin(CudaReplayCache, seed)
    drive_to_full_capacity(twin, [1, 0])
    assert twin.max_err <= FP32_TOL
