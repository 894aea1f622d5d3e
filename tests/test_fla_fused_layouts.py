"""The FLA baseline the benchmark times is a correct kernel in both state layouts (device machine; needs
a GPU, torch and fla).

``replayssm bench`` times FLA's ``fused_recurrent_*`` with the state in FLA's default layout
``[B, HV, K, V]`` and, with ``state_v_first=True``, in ours, ``[B, HV, V, K]``, and reports the faster
(``runtime/bench_fla.py``, ``FLA_LAYOUTS``). A faster time only counts if the kernel computes the same
step: here each layout's fused kernel runs a few decode steps of fresh random inputs and is compared
with FLA's own naive recurrence on the same inputs (``tests/test_fla_reference.py`` checks the naive
recurrences against our float64 oracle), outputs and final state, within float32 tolerance.

May import: NumPy, pytest, torch, fla, tests helpers.
"""

from __future__ import annotations

import numpy as np
import pytest

from twin import assert_close

pytestmark = [pytest.mark.fla, pytest.mark.gpu]

torch = pytest.importorskip("torch")
fused_gdn = pytest.importorskip("fla.ops.gated_delta_rule").fused_recurrent_gated_delta_rule
fused_kda = pytest.importorskip("fla.ops.kda").fused_recurrent_kda
fused_sgla = pytest.importorskip("fla.ops.simple_gla").fused_recurrent_simple_gla
naive_gdn = pytest.importorskip("fla.ops.gated_delta_rule.naive").naive_recurrent_gated_delta_rule
naive_kda = pytest.importorskip("fla.ops.kda.naive").naive_recurrent_kda
naive_sgla = pytest.importorskip("fla.ops.simple_gla.naive").naive_recurrent_simple_gla

TOL = 2e-4  # float32 kernels against a float32 reference, relative to the largest reference value
B, T, HV, K, V = 3, 4, 4, 64, 32  # V != K, so a transposed state cannot pass by accident


def _inputs(variant: str, seed: int):
    g = torch.Generator(device="cuda").manual_seed(seed)

    def rnd(*s):
        return torch.randn(*s, device="cuda", generator=g)

    q, k, v = rnd(B, T, HV, K), rnd(B, T, HV, K), rnd(B, T, HV, V)
    gate = -torch.rand(*((B, T, HV, K) if variant == "kda" else (B, T, HV)), device="cuda", generator=g)
    beta = torch.rand(B, T, HV, device="cuda", generator=g)
    state = rnd(B, HV, K, V) * 0.1  # FLA's default layout
    return q, k, v, gate, beta, state


def _fused(variant: str, q, k, v, gate, beta, state, v_first: bool):
    """FLA's fused kernel; the state and the final state in [B, HV, K, V] whatever the layout run."""
    h0 = state.transpose(-1, -2).contiguous() if v_first else state
    layout = {"state_v_first": True} if v_first else {}
    if variant == "gdn":
        o, s = fused_gdn(q, k, v, g=gate, beta=beta, initial_state=h0, output_final_state=True,
                         use_qk_l2norm_in_kernel=True, **layout)
    elif variant == "kda":
        o, s = fused_kda(q, k, v, g=gate, beta=beta, initial_state=h0, output_final_state=True,
                         use_qk_l2norm_in_kernel=True, **layout)
    else:
        o, s = fused_sgla(q, k, v, g=gate, initial_state=h0, output_final_state=True, **layout)
    return o, (s.transpose(-1, -2) if v_first else s)


def _naive(variant: str, q, k, v, gate, beta, state):
    scale = K ** -0.5
    if variant == "mamba2":
        return naive_sgla(q=q, k=k, v=v, g=gate, scale=scale, initial_state=state, output_final_state=True)
    q, k = (torch.nn.functional.normalize(x, p=2, dim=-1, eps=1e-6) for x in (q, k))
    if variant == "gdn":
        return naive_gdn(q=q, k=k, v=v, beta=beta, g=gate, scale=scale, initial_state=state, output_final_state=True)
    return naive_kda(q=q, k=k, v=v, g=gate, beta=beta, scale=scale, initial_state=state, output_final_state=True)


def _np(x) -> np.ndarray:
    return x.detach().to(torch.float64).cpu().numpy()


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("v_first", [False, True], ids=["K-V", "V-K"])
@pytest.mark.parametrize("variant", ["gdn", "kda", "mamba2"])
def test_fla_fused_recurrent_matches_its_naive_recurrence_in_both_layouts(variant, v_first, seed):
    q, k, v, gate, beta, state = _inputs(variant, seed)
    o, s = _fused(variant, q, k, v, gate, beta, state, v_first)
    want_o, want_s = _naive(variant, q, k, v, gate, beta, state)
    assert np.isfinite(_np(o)).all() and np.isfinite(_np(s)).all()
    assert_close(_np(o), _np(want_o), TOL, f"{variant} outputs")
    assert_close(_np(s), _np(want_s), TOL, f"{variant} final state")
    assert not np.allclose(_np(want_s), _np(state)), "the state did not move: the comparison is vacuous"
