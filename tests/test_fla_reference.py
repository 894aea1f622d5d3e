"""Reference tests against flash-linear-attention's own naive recurrences (device machine; needs torch + fla).

Our float64 oracle (``reference.plain_recurrence`` on the built-in declarations) is compared with
FLA's ``naive_recurrent_gated_delta_rule`` (GDN), ``naive_recurrent_kda`` (KDA) and
``naive_recurrent_simple_gla`` (a scalar decay per head and token: RetNet's fixed decay, and a
declaration with a decay token), from random initial states, with ``output_final_state=True``.

FLA's conventions, read from ``fla/ops/{gated_delta_rule,kda,simple_gla}/naive.py`` (fla-core 0.6.0):

- ``q``, ``k`` ``[B, T, H, K]``, ``v`` ``[B, T, HV, V]``; the state is ``[B, HV, K, V]`` (ours is
  ``[HV, V, K]``: transposed here both ways).
- The naive functions normalise nothing: ``q`` and ``k`` are passed already L2-normalised (GDN,
  KDA: ``x / sqrt(Σx² + 1e-6)``, as our ``ops.l2norm``), and ``scale = K^-½`` is passed explicitly.
- ``g`` is the log-space decay (``[B, T, H]`` scalar, ``[B, T, HV, K]`` for KDA), ``beta`` ``[B, T, HV]``;
  both are computed here from the raw inputs with the engines' formulas.
- Argument order differs: GDN ``(q, k, v, beta, g, scale, initial_state, output_final_state)``,
  KDA ``(q, k, v, g, beta, scale, initial_state, output_final_state)``, simple GLA
  ``(q, k, v, g, scale, initial_state, output_final_state)``; all are passed by keyword here.
- Grouped heads: only ``naive_recurrent_kda`` accepts ``H < HV`` (``repeat_interleave``: value head
  ``hv`` reads key head ``hv // (HV / H)``, our convention). For GDN and simple GLA the keys and
  queries are expanded to value heads here, the same way. KDA is run both natively grouped and
  expanded.
- All three cast their inputs to float32 internally (``.to(torch.float32)`` / ``.float()``), so FLA
  runs in float32 on the CPU; the stated tolerance is a relative error of 1e-4 (max |Δ| over
  max(1, max |oracle|)), far above float32 rounding over these lengths and far below any convention
  error (a wrong layout, scale or decay gives O(1) differences).

May import: NumPy, pytest, Hypothesis, torch, fla, ``replayssm_dsl``, tests helpers.
"""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayssm_dsl import ModelShape, Recurrence, plain, variants
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.reference import plain_recurrence
from strategies import seeds, shapes
from twin import assert_close

pytestmark = pytest.mark.fla

torch = pytest.importorskip("torch")
_gdn = pytest.importorskip("fla.ops.gated_delta_rule.naive")
_kda = pytest.importorskip("fla.ops.kda.naive")
_sgla = pytest.importorskip("fla.ops.simple_gla.naive")

TOL = 1e-4  # FLA's naive recurrences compute in float32
FLA = settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])


# -- conversions ------------------------------------------------------------------------------------
def _t(x) -> "torch.Tensor":
    """One sequence ``[T, ...]`` (float64 NumPy) → ``[1, T, ...]`` float32 CPU tensor."""
    return torch.from_numpy(np.ascontiguousarray(x, dtype=np.float32))[None]


def _state_in(S) -> "torch.Tensor":
    """Our ``[HV, V, K]`` → FLA's ``[1, HV, K, V]`` float32."""
    return torch.from_numpy(np.ascontiguousarray(np.swapaxes(S, -1, -2), dtype=np.float32))[None]


def _out(o) -> np.ndarray:
    """FLA's ``[1, T, HV, V]`` → ``[T, HV, V]`` float64."""
    return o.detach().to(torch.float64).cpu().numpy()[0]


def _state_out(S) -> np.ndarray:
    """FLA's ``[1, HV, K, V]`` → our ``[HV, V, K]`` float64."""
    return np.swapaxes(S.detach().to(torch.float64).cpu().numpy()[0], -1, -2)


def _expand(x, shape: ModelShape):
    """Key-head values ``[T, H, ...]`` → value heads ``[T, HV, ...]`` (value head hv reads hv // G)."""
    return np.repeat(x, shape.group_size, axis=1)


def _l2norm(x, eps=1e-6):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def _softplus(x):
    return np.logaddexp(0.0, x)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _draw(decl, shape, seed, steps):
    rng = np.random.default_rng(seed)
    params = random_params(decl, shape, rng)
    tokens = random_tokens(decl, shape, rng, (steps,))
    state = random_state(shape, rng)
    return params, tokens, state


def _compare(decl, shape, tokens, params, state, o_fla, s_fla, what):
    want_o, want_s = plain_recurrence(decl, shape, tokens, params, state)
    got_o, got_s = _out(o_fla), _state_out(s_fla)
    assert_close(got_o, want_o, TOL, f"{what} outputs")
    assert_close(got_s, want_s, TOL, f"{what} final state")
    assert not np.allclose(want_s, state), f"{what}: the state did not move; the comparison is vacuous"


# -- Gated DeltaNet -----------------------------------------------------------------------------------
@FLA
@given(shape=shapes(), seed=seeds, steps=st.integers(1, 16))
def test_gdn_matches_fla_naive_recurrent_gated_delta_rule(shape, seed, steps):
    decl = variants.get("gdn")
    params, tok, state = _draw(decl, shape, seed, steps)
    g = -np.exp(params["A_log"]) * _softplus(tok["a"] + params["dt_bias"])  # [T, HV]
    o, S = _gdn.naive_recurrent_gated_delta_rule(
        q=_t(_expand(_l2norm(tok["q"]), shape)), k=_t(_expand(_l2norm(tok["k"]), shape)), v=_t(tok["v"]),
        beta=_t(_sigmoid(tok["b"])), g=_t(g), scale=shape.k_dim ** -0.5,
        initial_state=_state_in(state), output_final_state=True)
    assert tuple(o.shape) == (1, steps, shape.heads, shape.v_dim)
    assert tuple(S.shape) == (1, shape.heads, shape.k_dim, shape.v_dim)
    _compare(decl, shape, tok, params, state, o, S, "gdn")


# -- Kimi Delta Attention -----------------------------------------------------------------------------
@FLA
@given(shape=shapes(), seed=seeds, steps=st.integers(1, 16), expand=st.booleans())
def test_kda_matches_fla_naive_recurrent_kda(shape, seed, steps, expand):
    """KDA accepts grouped heads natively; run it grouped and with keys expanded to value heads."""
    decl = variants.get("kda")
    params, tok, state = _draw(decl, shape, seed, steps)
    g = -np.exp(params["A_log"])[:, None] * _softplus(tok["g_raw"] + params["dt_bias"])  # [T, HV, K]
    q, k = _l2norm(tok["q"]), _l2norm(tok["k"])
    if expand:
        q, k = _expand(q, shape), _expand(k, shape)
    o, S = _kda.naive_recurrent_kda(
        q=_t(q), k=_t(k), v=_t(tok["v"]), g=_t(g), beta=_t(_sigmoid(tok["b"])), scale=shape.k_dim ** -0.5,
        initial_state=_state_in(state), output_final_state=True)
    assert tuple(S.shape) == (1, shape.heads, shape.k_dim, shape.v_dim)
    _compare(decl, shape, tok, params, state, o, S, f"kda ({'expanded' if expand else 'grouped'})")


# -- simple GLA: a scalar decay per head (RetNet) and per head and token ------------------------------
@FLA
@given(shape=shapes(), seed=seeds, steps=st.integers(1, 16))
def test_retnet_matches_fla_naive_recurrent_simple_gla(shape, seed, steps):
    decl = variants.get("retnet")
    params, tok, state = _draw(decl, shape, seed, steps)
    g = np.broadcast_to(params["log_gamma"], (steps, shape.heads))
    o, S = _sgla.naive_recurrent_simple_gla(
        q=_t(_expand(tok["q"], shape)), k=_t(_expand(tok["k"], shape)), v=_t(tok["v"]), g=_t(g),
        scale=shape.k_dim ** -0.5, initial_state=_state_in(state), output_final_state=True)
    _compare(decl, shape, tok, params, state, o, S, "retnet / simple gla")


def simple_gla():
    """Simple GLA as FLA defines it: a log-space decay token ``g ≤ 0`` per head, plain write, scaled q."""
    r = Recurrence("simple_gla")
    q = r.token("q", per="group", size="K")
    k = r.token("k", per="group", size="K")
    v = r.token("v", size="V")
    g = r.token("g", sign="nonpositive", doc="[B, HV] log decay")
    return r.build(decay=g, key=k, query=q * r.K ** -0.5, write=plain(value=v))


@FLA
@given(shape=shapes(), seed=seeds, steps=st.integers(1, 16))
def test_simple_gla_declaration_matches_fla_naive_recurrent_simple_gla(shape, seed, steps):
    decl = simple_gla()
    params, tok, state = _draw(decl, shape, seed, steps)
    assert params == {} and (tok["g"] <= 0).all()
    o, S = _sgla.naive_recurrent_simple_gla(
        q=_t(_expand(tok["q"], shape)), k=_t(_expand(tok["k"], shape)), v=_t(tok["v"]), g=_t(tok["g"]),
        scale=shape.k_dim ** -0.5, initial_state=_state_in(state), output_final_state=True)
    _compare(decl, shape, tok, params, state, o, S, "simple gla")


def test_a_transposed_state_is_caught():
    """The comparison can fail: handing FLA our ``[V, K]`` state untransposed (square V = K) disagrees."""
    shape = ModelShape(2, 1, 8, 8)
    decl = variants.get("retnet")
    params, tok, state = _draw(decl, shape, 1, 4)
    g = np.broadcast_to(params["log_gamma"], (4, shape.heads))
    wrong = torch.from_numpy(state.astype(np.float32))[None]  # not transposed
    o, S = _sgla.naive_recurrent_simple_gla(
        q=_t(_expand(tok["q"], shape)), k=_t(_expand(tok["k"], shape)), v=_t(tok["v"]), g=_t(g),
        scale=shape.k_dim ** -0.5, initial_state=wrong, output_final_state=True)
    with pytest.raises(AssertionError, match="relative error"):
        _compare(decl, shape, tok, params, state, o, S, "transposed")
