"""The FLA baseline the benchmark times is a correct kernel every way it runs (device machine; needs a
GPU, torch and fla).

``replayssm bench`` times FLA's step every way ``fla_ways`` names and reports the fastest
(``runtime/bench_fla.py``): the public ``fused_recurrent_*`` with the state in FLA's default layout
``[B, HV, K, V]`` and, with ``state_v_first=True``, in ours, ``[B, HV, V, K]``; for KDA also the
in-place decode entry (a state pool indexed per row, one token per call). A faster time only counts
if the kernel computes the same step: here ``fla_call``, the very call the benchmark times, runs a
few decode steps of fresh random inputs each way and is compared with FLA's own naive recurrence on
the same inputs (``tests/test_fla_reference.py`` checks the naive recurrences against our float64
oracle), outputs and final state, within float32 tolerance; the in-place way must also leave the
pool's other rows as they were.

May import: NumPy, pytest, torch, fla, the runtime layer's FLA baseline, tests helpers.
"""

from __future__ import annotations

import numpy as np
import pytest

from twin import assert_close

from replayssm_dsl.runtime.bench_fla import fla_call, fla_ways

pytestmark = [pytest.mark.fla, pytest.mark.gpu]

torch = pytest.importorskip("torch")
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


def _to_way(state, v_first: bool):
    return state.transpose(-1, -2).contiguous() if v_first else state


def _fused(variant: str, way: str, q, k, v, gate, beta, state, seed: int):
    """FLA's step the benchmark's way ``way``, over the T tokens; outputs ``[B, T, HV, V]`` and the final
    state in ``[B, HV, K, V]`` whatever the way. The in-place way runs a token per call on a pool of
    more rows than the batch, at rows in a random order, and checks that the other rows did not move."""
    v_first, in_place = fla_ways(variant)[way]
    h0 = _to_way(state, v_first)
    if not in_place:
        o, s = fla_call(variant, way, q, k, v, gate, beta, h0)
        return o, _to_way(s, v_first)
    rng = np.random.default_rng(seed)
    spare = 3  # pool rows no batch row owns
    rows = torch.as_tensor(rng.permutation(B + spare)[:B].astype(np.int32), device="cuda")
    pool = torch.randn(B + spare, *h0.shape[1:], device="cuda") * 0.1
    pool[rows.long()] = h0
    untouched = [i for i in range(B + spare) if i not in set(rows.tolist())]
    before = pool[untouched].clone()
    outs = []
    for i in range(T):  # (FLA's in-place entry takes contiguous tensors: it does not copy them)
        token = [x[:, i:i + 1].contiguous() for x in (q, k, v, gate, beta)]
        out = torch.full_like(token[2], float("nan"))  # poisoned: the kernel must write every element
        fla_call(variant, way, *token, pool, out=out, indices=rows)
        outs.append(out)
    assert torch.equal(pool[untouched], before), f"{way}: rows of the pool outside the batch moved"
    return torch.cat(outs, dim=1), _to_way(pool[rows.long()], v_first)


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


WAYS = [(variant, way) for variant in ("gdn", "kda", "mamba2") for way in fla_ways(variant)]


@pytest.mark.parametrize("seed", range(3))
@pytest.mark.parametrize("variant, way", WAYS, ids=[f"{v}-{w}" for v, w in WAYS])
def test_fla_step_matches_its_naive_recurrence_every_way_the_benchmark_times_it(variant, way, seed):
    q, k, v, gate, beta, state = _inputs(variant, seed)
    o, s = _fused(variant, way, q, k, v, gate, beta, state, seed)
    want_o, want_s = _naive(variant, q, k, v, gate, beta, state)
    assert np.isfinite(_np(o)).all() and np.isfinite(_np(s)).all()
    assert_close(_np(o), _np(want_o), TOL, f"{variant} {way} outputs")
    assert_close(_np(s), _np(want_s), TOL, f"{variant} {way} final state")
    assert not np.allclose(_np(want_s), _np(state)), "the state did not move: the comparison is vacuous"

