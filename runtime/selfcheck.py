"""Runtime layer: decode a variant end to end on the best backend present and compare every output
with the float64 plain recurrence (``replayssm check`` and the examples use it).

Two sequences decode together; every seventh token is a speculative round (verify min(4, T) drafts,
T the configuration's ``max_drafts``, and accept 0..that many at random), so steps, flushes, verify
and commit are all exercised. The tolerance follows the checkpoints' dtype (``tolerance``).
"""

from __future__ import annotations

import sys
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from replayssm_dsl.errors import BackendUnavailable
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.reference import plain_recurrence

TOLERANCE = 2e-4  # relative, FP32 arithmetic against the float64 oracle
# against the float64 oracle: half-precision checkpoints are rounded at every flush (the CPU property
# tests hold them to the same bounds)
STATE_DTYPE_TOLERANCE = {"float32": TOLERANCE, "float16": 5e-3, "bfloat16": 4e-2}
SPECULATIVE_DRAFTS = 4  # drafts per speculative round, at most the configuration's max_drafts


def tolerance(config) -> float:
    """The largest relative error a check accepts for ``config``'s checkpoint dtype."""
    return STATE_DTYPE_TOLERANCE[config.state_dtype]


def best_backend(requested: str = "auto") -> str:
    if requested != "auto":
        return requested
    try:
        import cupy
        return "cuda" if cupy.cuda.runtime.getDeviceCount() > 0 else "cpu"
    except Exception:
        return "cpu"


@dataclass
class CheckReport:
    name: str
    backend: str
    shape: object
    config: object
    tokens: int
    worst: float
    fills: list

    @property
    def tolerance(self) -> float:
        return tolerance(self.config)

    @property
    def ok(self) -> bool:
        return self.worst <= self.tolerance

    def summary(self) -> str:
        s, c = self.shape, self.config
        what = "generated CUDA" if self.backend == "cuda" else "lowered plans, NumPy float32"
        if c.state_dtype != "float32":
            what += f", {c.state_dtype} checkpoints"
        return (f"check {self.name} on {self.backend} ({what}): HV={s.heads} H={s.key_heads} V={s.v_dim} K={s.k_dim}, "
                f"L={c.window}, {self.tokens} tokens incl. verify/commit rounds, fills now {self.fills}\n"
                f"largest relative error against the float64 plain recurrence: {self.worst:.2e} "
                f"({'ok' if self.ok else 'TOO LARGE'}, tolerance {self.tolerance:g})")


def _host(array):
    return np.asarray(array.get() if hasattr(array, "get") else array, np.float64)


def _rel(got, want) -> float:
    got = _host(got)
    if not np.isfinite(got).all():
        return float("inf")
    return float(np.max(np.abs(got - want)) / max(1.0, float(np.max(np.abs(want)))))


def decode_and_compare(decl, shape, config, *, backend: str = "auto", tokens: int = 64, seed: int = 0) -> CheckReport:
    backend = best_backend(backend)
    rng = np.random.default_rng(seed)
    params = random_params(decl, shape, rng)
    if backend == "cuda":
        from .cuda_cache import CudaReplayCache
        cache = CudaReplayCache(decl, shape, config, slots=2, params=params)
    else:
        from .cpu_cache import CpuReplayCache
        cache = CpuReplayCache(decl, shape, config, slots=2, params=params, precision="float32")
    states = random_state(shape, rng, (2,))
    cache.load([0, 1], states.astype(np.float32))
    worst, done = 0.0, 0
    drafts = min(SPECULATIVE_DRAFTS, config.max_drafts)
    while done < tokens:
        if done % 7 == 6:  # a speculative round
            toks = random_tokens(decl, shape, rng, (2, drafts))
            out = cache.verify([1, 0], {k: v.astype(np.float32) for k, v in toks.items()}, [drafts, drafts])
            accepted = [int(x) for x in rng.integers(0, drafts + 1, 2)]
            cache.commit(accepted)
            for b, slot in enumerate((1, 0)):
                mine = {k: v[b] for k, v in toks.items()}
                ref, _ = plain_recurrence(decl, shape, mine, params, states[slot])
                worst = max(worst, _rel(out[b], ref))
                if accepted[b]:
                    _, states[slot] = plain_recurrence(decl, shape, {k: v[:accepted[b]] for k, v in mine.items()},
                                                       params, states[slot])
            done += drafts
        else:
            toks = random_tokens(decl, shape, rng, (2,))
            out = cache.step([0, 1], {k: v.astype(np.float32) for k, v in toks.items()})
            for b in range(2):
                ref, states[b] = plain_recurrence(decl, shape, {k: v[b:b + 1] for k, v in toks.items()}, params, states[b])
                worst = max(worst, _rel(out[b], ref[0]))
            done += 1
    final = cache.materialize([0, 1])
    for b in range(2):
        worst = max(worst, _rel(final[b], states[b]))
    return CheckReport(decl.name, backend, shape, config, done, worst, [int(x) for x in cache.fills()])


def run_example(decl, shape, config, argv=None, tokens: int = 300) -> int:
    """Command line of the examples: ``[--tokens N] [--backend auto|cpu|cuda]``; exit status 0 when
    every output is within ``tolerance(config)`` of the oracle (2, with one line, for a backend not present)."""
    import argparse

    def main(argv) -> int:
        parser = argparse.ArgumentParser(description=f"decode {decl.name} and check it against the oracle")
        parser.add_argument("--tokens", type=int, default=tokens)
        parser.add_argument("--backend", default="auto", choices=["auto", "cpu", "cuda"])
        args = parser.parse_args(argv)
        report = decode_and_compare(decl, shape, config, backend=args.backend, tokens=args.tokens)
        print(report.summary())
        return 0 if report.ok else 1
    return exit_status(main, argv)


def exit_status(main, argv=None) -> int:
    """``main(argv)``'s exit status; where it asked for a backend this machine lacks (``--backend
    cuda`` without CuPy or a GPU), one line saying what to install and status 2, not a traceback."""
    try:
        return main(argv)
    except BackendUnavailable as exc:
        print(f"{Path(sys.argv[0]).name}: error: {exc}", file=sys.stderr)
        return 2
