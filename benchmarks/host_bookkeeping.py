"""Runtime layer benchmark: host cost of the replay-buffer bookkeeping per decode step.

Measures, for B live requests (default 512, fills staggered over the window, some forked so that
copy-on-write flushes happen), the host time of
- a plain decode step:   ``build_step(requests, B)`` + ``report_step()``
- a speculative step:    ``build_verify(requests, drafts, B)`` (drafts 1..max_drafts) + ``commit(accepted)``
for the compiled ``SlotPool`` and its pure-Python twin ``PySlotPool``, as the median over many
repetitions timed with ``time.perf_counter_ns``. Target: SlotPool <= 20 us per step and >= 10x the twin.

Usage: ``python benchmarks/host_bookkeeping.py [--batch 512] [--reps 5000] [--python-reps 200]``

May import: NumPy, ``replayssm_dsl.runtime.bookkeeping``.
"""

from __future__ import annotations

import argparse
import statistics
import time

import numpy as np

from replayssm_dsl.runtime.bookkeeping import PySlotPool, SlotPool

TARGET_US, TARGET_RATIO = 20.0, 10.0


def make_pool(pool_class, batch: int, window: int, max_drafts: int, seed: int):
    """A pool with ``batch`` live requests: 7/8 allocated, 1/8 forked, fills staggered."""
    rng = np.random.default_rng(seed)
    pool = pool_class(batch, 2 * batch, window, max_drafts)
    parents = [pool.allocate() for _ in range(batch - batch // 8)]
    forks = [pool.fork(int(p)) for p in rng.choice(parents, batch // 8, replace=False)]
    live = np.array(parents + forks, dtype=np.int32)
    for phase in range(window):  # stagger the fills: every slot steps a random number of times
        subset = live[rng.random(live.size) < 0.5]
        pool.build_step(subset, batch)
        pool.report_step()
    return pool, rng.permutation(live).astype(np.int32)


def time_decode(pool, requests, batch: int, reps: int) -> float:
    samples = []
    for _ in range(reps):
        start = time.perf_counter_ns()
        pool.build_step(requests, batch)
        pool.report_step()
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e3


def time_speculative(pool, requests, batch: int, max_drafts: int, reps: int, seed: int) -> float:
    rng = np.random.default_rng(seed)
    plans = []
    for _ in range(16):  # rotate through a few draft / acceptance patterns, made ahead of time
        drafts = rng.integers(1, max_drafts + 1, requests.size).astype(np.int32)
        accepted = rng.integers(0, drafts + 1).astype(np.int32)
        plans.append((drafts, accepted))
    samples = []
    for rep in range(reps):
        drafts, accepted = plans[rep % len(plans)]
        start = time.perf_counter_ns()
        pool.build_verify(requests, drafts, batch)
        pool.commit(accepted)
        samples.append(time.perf_counter_ns() - start)
    return statistics.median(samples) / 1e3


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--batch", type=int, default=512, help="live requests per step (B)")
    parser.add_argument("--window", type=int, default=16, help="replay window L")
    parser.add_argument("--max-drafts", type=int, default=8, help="max drafts per request T")
    parser.add_argument("--reps", type=int, default=5000, help="repetitions for SlotPool")
    parser.add_argument("--python-reps", type=int, default=200, help="repetitions for PySlotPool")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args(argv)

    results = {}
    for name, pool_class, reps in (("SlotPool", SlotPool, args.reps), ("PySlotPool", PySlotPool, args.python_reps)):
        pool, requests = make_pool(pool_class, args.batch, args.window, args.max_drafts, args.seed)
        time_decode(pool, requests, args.batch, max(reps // 10, 5))  # warm up
        decode = time_decode(pool, requests, args.batch, reps)
        speculative = time_speculative(pool, requests, args.batch, args.max_drafts, reps, args.seed)
        results[name] = (decode, speculative)

    print(f"host bookkeeping, B = {args.batch} live requests, L = {args.window}, T = {args.max_drafts}"
          f" (median us per step; {args.reps} / {args.python_reps} reps)")
    print(f"{'step':<34}{'SlotPool':>10}{'PySlotPool':>12}{'ratio':>8}")
    ok = True
    for row, label in enumerate(("decode (build_step + report_step)", "speculative (build_verify + commit)")):
        fast, slow = results["SlotPool"][row], results["PySlotPool"][row]
        print(f"{label:<34}{fast:>10.2f}{slow:>12.1f}{slow / fast:>7.0f}x")
        ok &= fast <= TARGET_US and slow / fast >= TARGET_RATIO
    print(f"target (SlotPool <= {TARGET_US:.0f} us and >= {TARGET_RATIO:.0f}x): {'met' if ok else 'NOT met'}")
    return 0 if ok else 1


if __name__ == "__main__":
    raise SystemExit(main())
