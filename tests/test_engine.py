"""Engine-style runs: requests join, fork, decode, speculate and leave through ``ReplayEngine``
(the Cython slot pool + a replay cache); every request must get exactly the outputs of decoding it
alone with the float64 oracle, and the pool's host mirror must equal the device fills throughout."""

from __future__ import annotations

import numpy as np
import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.reference import plain_recurrence
from replayssm_dsl.runtime.bookkeeping import PySlotPool, SlotPool
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
from replayssm_dsl.runtime.engine import ReplayEngine
from twin import assert_close


def _cuda_cache():
    from replayssm_dsl.runtime.cuda_cache import CudaReplayCache
    return CudaReplayCache


BACKENDS = [pytest.param("cpu", 1e-9, id="cpu"), pytest.param("cuda", 2e-4, id="cuda", marks=pytest.mark.gpu)]


def run_engine(backend, tol, pool_cls, variant, seed, rounds, slots=8):
    decl, shape = variants.get(variant), ModelShape(4, 2, 24, 32)
    config = ReplayConfig(window=4, max_drafts=3)
    rng = np.random.default_rng(seed)
    params = random_params(decl, shape, rng)
    cache_cls = CpuReplayCache if backend == "cpu" else _cuda_cache()
    engine = ReplayEngine(cache_cls, decl, shape, config, slots=slots, params=params, pool_cls=pool_cls)
    oracle = {}  # slot -> float64 state of the request living there

    def oracle_run(slot, toks):
        return plain_recurrence(decl, shape, toks, params, oracle[slot])

    for r in range(rounds):
        live = [int(s) for s in engine.pool.live_slots()]
        action = rng.choice(["add", "fork", "finish", "step", "step", "step", "verify"])
        if action == "add" and engine.pool.free_slot_count() > 0:
            state = random_state(shape, rng)
            oracle[engine.add(state.astype(np.float32) if backend == "cuda" else state)] = state
        elif action == "fork" and live and engine.pool.free_slot_count() > 0:
            parent = int(rng.choice(live))
            oracle[engine.fork(parent)] = oracle[parent].copy()
        elif action == "finish" and len(live) > 2:
            slot = int(rng.choice(live))
            engine.finish(slot)
            del oracle[slot]
        elif action == "step" and live:
            req = list(rng.permutation(live))
            toks = random_tokens(decl, shape, rng, (len(req),))
            out = engine.step(req, toks, batch_size=len(req) + int(rng.integers(0, 3)))
            for i, slot in enumerate(req):
                o, oracle[slot] = oracle_run(slot, {k: v[i:i + 1] for k, v in toks.items()})
                assert_close(out[i], o[0], tol, f"round {r} step slot {slot}")
        elif action == "verify" and live:
            req = list(rng.permutation(live))
            drafts = rng.integers(1, config.max_drafts + 1, len(req))
            toks = random_tokens(decl, shape, rng, (len(req), config.max_drafts))
            out = engine.verify(req, toks, drafts, batch_size=len(req) + 1)
            accepted = [int(rng.integers(0, d + 1)) for d in drafts]
            for i, slot in enumerate(req):
                o, _ = oracle_run(slot, {k: v[i, :drafts[i]] for k, v in toks.items()})
                assert_close(out[i, :drafts[i]], o, tol, f"round {r} verify slot {slot}")
            engine.accept(accepted)
            for i, slot in enumerate(req):
                if accepted[i]:
                    _, oracle[slot] = oracle_run(slot, {k: v[i, :accepted[i]] for k, v in toks.items()})
        live = [int(s) for s in engine.pool.live_slots()]
        fills = engine.cache.fills()
        assert [engine.pool.fill_of(s) for s in live] == [int(fills[s]) for s in live], "host mirror != device fills"
    for slot in [int(s) for s in engine.pool.live_slots()]:
        got = engine.cache.materialize([slot], src_pages=[engine.pool.page_of(slot)])
        assert_close(got[0], oracle[slot], tol, f"final state slot {slot}")


@pytest.mark.parametrize("backend,tol", BACKENDS)
@pytest.mark.parametrize("variant", ["gdn", "mamba2", "kda"])
def test_engine_run_matches_each_request_decoded_alone(backend, tol, variant):
    run_engine(backend, tol, SlotPool, variant, seed=sum(map(ord, variant)), rounds=150 if backend == "cpu" else 400)


@pytest.mark.parametrize("pool_cls", [SlotPool, PySlotPool], ids=["cython", "python"])
def test_engine_runs_with_either_pool(pool_cls):
    run_engine("cpu", 1e-9, pool_cls, "gla", seed=3, rounds=120)
