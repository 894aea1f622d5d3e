"""Test helpers for the GPU tests: the declarations they run (the builtins and one declared here),
the FP32 tolerance, a twin of the CUDA cache against the float64 oracle and a run of every kernel
through one."""

from __future__ import annotations

import numpy as np
from hypothesis import strategies as st

from replayssm_dsl import Recurrence, delta, ops, variants
from twin import ReplayTwin

FP32_TOL = 2e-4


def gated_delta_with_skip():
    """A variant that is not built in, declared here: GDN-like with a per-head decay bias, a
    D skip on the value and a silu(z) output gate."""
    r = Recurrence("gated_delta_skip")
    q, k = r.token("q", per="group", size="K"), r.token("k", per="group", size="K")
    v, a, b, z = r.token("v", size="V"), r.token("a"), r.token("b"), r.token("z", size="V")
    bias, D = r.param("bias"), r.param("D")
    return r.build(decay=-ops.softplus(a + bias) * 0.5, key=ops.l2norm(k), query=ops.l2norm(q),
                   write=delta(value=v, beta=ops.sigmoid(b)), skip=D * v, gate=z)


ALL_DECLS = {**{name: variants.get(name) for name in variants.BUILTINS}, "custom": gated_delta_with_skip()}
decl_names = st.sampled_from(sorted(ALL_DECLS))


def cuda_cache():
    from replayssm_dsl.runtime.cuda_cache import CudaReplayCache
    return CudaReplayCache


def make_twin(decl, shape, config, seed, slots=4, tol=FP32_TOL):
    return ReplayTwin(cuda_cache(), decl, shape, config, np.random.default_rng(seed), slots=slots, tol=tol)


def steps_verifies_and_flush(twin):
    """Steps of three rows (one padded) with verifies and commits between, a flush, then the
    materialized states; the twin checks every output against the oracle."""
    twin.load([0, 2])
    for i in range(11):
        twin.step([2, -1, 0])
        if i % 4 == 1:
            toks = twin.verify([0, 2], [3, 2])
            twin.commit([0, 2], toks, [2, 1])
    twin.cache.flush([2])
    twin.check_materialize([0, 2])
