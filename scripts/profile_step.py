"""Launch the decode kernels of one preset at one batch size, as the benchmark does, for a profiler.

Run on a GPU under Nsight Compute, one kernel at a time (what ``scripts/gpu-check.sh profile`` does)::

    ncu --clock-control none --kernel-name replay_step --launch-skip 6 --launch-count 1 \\
        --section SpeedOfLight --section Occupancy --section WarpStateStats \\
        python scripts/profile_step.py --preset qwen3.5-4b --batch 256

Each kernel is launched several times: the replay step in the mixed steady state (slot b at fill
b mod L), then the conventional step, the flush alone, and verify with ``--drafts`` drafts (its
commit accepting none, as the benchmark runs it), with the launch shapes the autotuner's table gives
(or ``choose_launch``'s).
"""

from __future__ import annotations

import argparse

import numpy as np

from replayssm_dsl.config import PRESETS
from replayssm_dsl.random_inputs import random_tokens
from replayssm_dsl.runtime.benchmark import mixed_steady_state, preset_setup, verify_and_commit, verify_inputs
from replayssm_dsl.runtime.cuda_cache import CudaReplayCache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--preset", default="qwen3.5-4b", choices=sorted(PRESETS))
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--launches", type=int, default=9, help="launches of each kernel")
    parser.add_argument("--drafts", type=int, default=8, help="verify's drafts per row")
    args = parser.parse_args()
    import cupy as cp

    decl, shape, config, rng, params = preset_setup(args.preset)
    cache = CudaReplayCache(decl, shape, config, slots=args.batch, params=params)
    cache.buffers["checkpoint"][...] = 0.01
    cache.baseline_state()[...] = 0.01
    batch = mixed_steady_state(cache, args.batch)
    toks = {k: cp.asarray(v[:, None].astype(np.float32)) for k, v in random_tokens(decl, shape, rng, (args.batch,)).items()}
    out = cp.empty((args.batch, 1, shape.heads, shape.v_dim), cp.float32)
    for _ in range(args.launches):
        cache.launch_step(batch, toks, out)
    for _ in range(args.launches):
        cache._launch("conventional_step", args.batch, batch, toks, out=out)
    for _ in range(args.launches):
        cache._launch("flush", args.batch, batch)
    (drafts,), verify_batch, out_drafts = verify_inputs(cp, decl, shape, rng, batch, args.drafts)
    for _ in range(args.launches):
        verify_and_commit(cache, verify_batch, drafts, out_drafts, args.drafts)
    cp.cuda.runtime.deviceSynchronize()
    print(f"profile_step: {args.preset} B={args.batch}: {args.launches} launches each of replay_step, "
          f"conventional_step, flush, verify (T={args.drafts})")


if __name__ == "__main__":
    main()
