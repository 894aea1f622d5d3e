"""An engine-style decode loop: requests arrive with a prefill state, fork for parallel sampling,
decode, speculate (verify 4 drafts, accept a prefix) and finish, through ``ReplayEngine`` (the
Cython slot pool + the replay cache). Every output is checked against decoding that request alone
with the float64 oracle. GPU when CuPy sees one, else the CPU backend.

    python examples/engine_loop.py [--steps 200] [--backend auto|cpu|cuda]
"""

import argparse
import sys

import numpy as np

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.reference import plain_recurrence
from replayssm_dsl.runtime.engine import ReplayEngine
from replayssm_dsl.runtime.selfcheck import TOLERANCE, best_backend, exit_status


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200)
    parser.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
    args = parser.parse_args(argv)
    backend = best_backend(args.backend)
    if backend == "cuda":
        from replayssm_dsl.runtime.cuda_cache import CudaReplayCache as cache_cls
    else:
        from replayssm_dsl.runtime.cpu_cache import CpuReplayCache as cache_cls
    decl, shape, config = variants.get("gdn"), ModelShape(8, 4, 64, 64), ReplayConfig(window=8, max_drafts=4)
    rng = np.random.default_rng(0)
    params = random_params(decl, shape, rng)
    engine = ReplayEngine(cache_cls, decl, shape, config, slots=16, params=params)
    oracle, worst, served = {}, 0.0, 0

    def check(got, want):
        got = np.asarray(got.get() if hasattr(got, "get") else got, np.float64)
        return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))

    for step in range(args.steps):
        live = [int(s) for s in engine.pool.live_slots()]
        if engine.pool.free_slot_count() and rng.random() < 0.2:  # a request arrives after prefill
            state = random_state(shape, rng)
            oracle[engine.add(state.astype(np.float32))] = state
        if live and engine.pool.free_slot_count() and rng.random() < 0.05:  # parallel sampling
            parent = int(rng.choice(live))
            oracle[engine.fork(parent)] = oracle[parent].copy()
        if len(live) > 4 and rng.random() < 0.1:  # a request finishes
            slot = int(rng.choice(live))
            engine.finish(slot)
            del oracle[slot]
            served += 1
        live = [int(s) for s in engine.pool.live_slots()]
        if not live:
            continue
        if step % 5 == 4:
            drafts = rng.integers(1, config.max_drafts + 1, len(live))
            toks = random_tokens(decl, shape, rng, (len(live), config.max_drafts))
            out = engine.verify(live, {k: v.astype(np.float32) for k, v in toks.items()}, drafts, batch_size=32)
            accepted = [int(rng.integers(0, d + 1)) for d in drafts]
            engine.accept(accepted)
            for i, slot in enumerate(live):
                mine = {k: v[i] for k, v in toks.items()}
                ref, _ = plain_recurrence(decl, shape, {k: v[:drafts[i]] for k, v in mine.items()}, params, oracle[slot])
                worst = max(worst, check(out[i, :drafts[i]], ref))
                _, oracle[slot] = plain_recurrence(decl, shape, {k: v[:accepted[i]] for k, v in mine.items()},
                                                   params, oracle[slot])
        else:
            toks = random_tokens(decl, shape, rng, (len(live),))
            out = engine.step(live, {k: v.astype(np.float32) for k, v in toks.items()}, batch_size=32)
            for i, slot in enumerate(live):
                ref, oracle[slot] = plain_recurrence(decl, shape, {k: v[i:i + 1] for k, v in toks.items()},
                                                     params, oracle[slot])
                worst = max(worst, check(out[i], ref[0]))
    print(f"engine loop on {backend}: {args.steps} steps, {served} requests finished, "
          f"{len(engine.pool.live_slots())} live, {engine.pool.free_page_count()} free pages; "
          f"largest relative error {worst:.2e} (tolerance {TOLERANCE:g})")
    return 0 if worst <= TOLERANCE else 1


if __name__ == "__main__":
    sys.exit(exit_status(main))
