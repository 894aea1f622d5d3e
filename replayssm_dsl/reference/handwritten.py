"""DSL layer: hand-written token-loop oracles for the built-in variants, from the engines' own code.

Each takes the raw inputs exactly as a user passes them (``tokens[name]`` ``[T, heads(, size)]``,
``params[name]``) and returns ``(outputs [T, HV, V], final state [HV, V, K])`` in float64. They use no
declaration and no expression: the transforms are written out by hand, following vLLM's
``selective_state_update`` (Mamba-2) and FLA's ``naive_recurrent_*`` (which keep the state as
``[K, V]``: these do too, and transpose at the end). They check the generic plain recurrence and
the declarations of the built-ins.
"""

from __future__ import annotations

import numpy as np

from ..config import ModelShape


def _softplus(x):  # vLLM / Triton: threshold 20
    return np.where(x <= 20.0, np.log1p(np.exp(np.minimum(x, 20.0))), x)


def _sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def _l2norm(x, eps=1e-6):
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


def _group_of(shape: ModelShape):
    return np.arange(shape.heads) // shape.group_size  # value head -> key head


def _as_kv(state, shape):
    if state is None:
        return np.zeros((shape.heads, shape.k_dim, shape.v_dim))
    return np.swapaxes(np.array(state, np.float64), 1, 2).copy()


def mamba2_oracle(tokens, params, shape, state=None):
    x, dt, B, C = (np.asarray(tokens[n], np.float64) for n in ("x", "dt", "B", "C"))
    z = tokens.get("z")
    A = -np.exp(np.asarray(params["A_log"], np.float64))
    dt_bias, D = np.asarray(params["dt_bias"], np.float64), np.asarray(params["D"], np.float64)
    S = np.zeros((shape.heads, shape.v_dim, shape.k_dim)) if state is None else np.array(state, np.float64)
    grp = _group_of(shape)
    out = np.empty(x.shape)
    for t in range(x.shape[0]):
        for h in range(shape.heads):
            step = _softplus(dt[t, h] + dt_bias[h])
            S[h] = S[h] * np.exp(A[h] * step) + np.outer(step * x[t, h], B[t, grp[h]])
            y = S[h] @ C[t, grp[h]] + D[h] * x[t, h]
            if z is not None:
                zz = np.asarray(z[t, h], np.float64)
                y = y * zz * _sigmoid(zz)
            out[t, h] = y
    return out, S


def _delta_rule_kv(q, k, v, beta, log_decay, shape, state):
    """FLA ``naive_recurrent_*_delta_rule`` in ``[K, V]`` layout; q already scaled; per value head."""
    h_kv = _as_kv(state, shape)
    grp = _group_of(shape)
    out = np.empty(v.shape)
    for t in range(v.shape[0]):
        for h in range(shape.heads):
            kk, qq = k[t, grp[h]], q[t, grp[h]]
            h_kv[h] = h_kv[h] * np.exp(log_decay[t, h]).reshape(-1, 1)
            u = beta[t, h] * (v[t, h] - kk @ h_kv[h])
            h_kv[h] = h_kv[h] + np.outer(kk, u)
            out[t, h] = qq @ h_kv[h]
    return out, np.swapaxes(h_kv, 1, 2)


def gdn_oracle(tokens, params, shape, state=None):
    q = _l2norm(np.asarray(tokens["q"], np.float64)) * shape.k_dim ** -0.5
    k = _l2norm(np.asarray(tokens["k"], np.float64))
    g = -np.exp(np.asarray(params["A_log"], np.float64)) * _softplus(tokens["a"] + params["dt_bias"])
    return _delta_rule_kv(q, k, np.asarray(tokens["v"], np.float64), _sigmoid(tokens["b"]), g, shape, state)


def kda_oracle(tokens, params, shape, state=None):
    q = _l2norm(np.asarray(tokens["q"], np.float64)) * shape.k_dim ** -0.5
    k = _l2norm(np.asarray(tokens["k"], np.float64))
    A_log = np.asarray(params["A_log"], np.float64)[:, None]
    g = -np.exp(A_log) * _softplus(tokens["g_raw"] + params["dt_bias"])  # [T, HV, K]
    return _delta_rule_kv(q, k, np.asarray(tokens["v"], np.float64), _sigmoid(tokens["b"]), g, shape, state)


def kda_safe_gate_oracle(tokens, params, shape, state=None, lower_bound=-5.0):
    """FLA's safe gate (``fused_recurrent_kda(..., lower_bound=...)``): lower_bound·σ(e^{A_log}·(g + dt_bias))."""
    q = _l2norm(np.asarray(tokens["q"], np.float64)) * shape.k_dim ** -0.5
    k = _l2norm(np.asarray(tokens["k"], np.float64))
    A_log = np.asarray(params["A_log"], np.float64)[:, None]
    g = lower_bound * _sigmoid(np.exp(A_log) * (tokens["g_raw"] + params["dt_bias"]))  # [T, HV, K]
    return _delta_rule_kv(q, k, np.asarray(tokens["v"], np.float64), _sigmoid(tokens["b"]), g, shape, state)


def deltanet_oracle(tokens, params, shape, state=None):
    q = _l2norm(np.asarray(tokens["q"], np.float64)) * shape.k_dim ** -0.5
    k = _l2norm(np.asarray(tokens["k"], np.float64))
    beta = _sigmoid(np.asarray(tokens["b"], np.float64))
    return _delta_rule_kv(q, k, np.asarray(tokens["v"], np.float64), beta, np.zeros_like(beta), shape, state)


def _linear_kv(q, k, v, log_decay, shape, state):
    """FLA ``naive_recurrent_gla`` / simple GLA in ``[K, V]`` layout; q already scaled."""
    h_kv = _as_kv(state, shape)
    grp = _group_of(shape)
    out = np.empty(v.shape)
    for t in range(v.shape[0]):
        for h in range(shape.heads):
            h_kv[h] = h_kv[h] * np.exp(log_decay[t, h]).reshape(-1, 1) + np.outer(k[t, grp[h]], v[t, h])
            out[t, h] = q[t, grp[h]] @ h_kv[h]
    return out, np.swapaxes(h_kv, 1, 2)


def gla_oracle(tokens, params, shape, state=None):
    gk = np.asarray(tokens["gk"], np.float64)
    log_decay = -np.log1p(np.exp(-gk)) / 16.0
    q = np.asarray(tokens["q"], np.float64) * shape.k_dim ** -0.5
    return _linear_kv(q, np.asarray(tokens["k"], np.float64), np.asarray(tokens["v"], np.float64),
                      log_decay, shape, state)


def retnet_oracle(tokens, params, shape, state=None):
    v = np.asarray(tokens["v"], np.float64)
    log_decay = np.broadcast_to(np.asarray(params["log_gamma"], np.float64), v.shape[:2])
    q = np.asarray(tokens["q"], np.float64) * shape.k_dim ** -0.5
    return _linear_kv(q, np.asarray(tokens["k"], np.float64), v, log_decay, shape, state)


HANDWRITTEN = {
    "mamba2": mamba2_oracle,
    "gdn": gdn_oracle,
    "kda": kda_oracle,
    "kda_safe_gate": kda_safe_gate_oracle,
    "gla": gla_oracle,
    "retnet": retnet_oracle,
    "deltanet": deltanet_oracle,
}
