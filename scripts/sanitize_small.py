"""Exercise every generated kernel once on small shapes (for compute-sanitizer memcheck/racecheck).

Run on a GPU: ``compute-sanitizer --tool memcheck python scripts/sanitize_small.py``.
"""

from __future__ import annotations

import numpy as np

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.runtime.cuda_cache import CudaReplayCache


def exercise(name: str, shape: ModelShape, config: ReplayConfig, seed: int = 0, launch: LaunchConfig | None = None,
             token_dtype: str = "float32") -> None:
    decl = variants.get(name) if token_dtype == "float32" else variants.get(name).with_token_dtype(token_dtype)
    rng = np.random.default_rng(seed)
    cache = CudaReplayCache(decl, shape, config, slots=4, params=random_params(decl, shape, rng), launch=launch)
    cache.load([0, 1, 2], random_state(shape, rng, (3,)).astype(np.float32))
    cache.load_conventional([0, 1], random_state(shape, rng, (2,)).astype(np.float32))
    for i in range(config.window + 3):
        cache.step([2, -1, 0, 1], {k: v.astype(np.float32) for k, v in random_tokens(decl, shape, rng, (4,)).items()})
        cache.conventional_step([1, 0], {k: v.astype(np.float32) for k, v in random_tokens(decl, shape, rng, (2,)).items()})
    for t in (1, config.max_drafts):
        toks = {k: v.astype(np.float32) for k, v in random_tokens(decl, shape, rng, (3, t)).items()}
        cache.verify([1, -1, 0], toks, [t, 0, max(1, t - 1)])
        cache.commit([t, 0, 1])
    for _ in range(3):  # accept every draft: the fills grow past the capacity, so flush_for_verify folds
        t = config.max_drafts
        cache.verify([0, 1, 2], {k: v.astype(np.float32) for k, v in random_tokens(decl, shape, rng, (3, t)).items()}, [t] * 3)
        cache.commit([t] * 3)
    cache.snapshot_verify([0, 1], {k: v.astype(np.float32) for k, v in random_tokens(decl, shape, rng, (2, 2)).items()}, [2, 1])
    cache.flush([0, 1])
    cache.materialize([2, 0])
    import cupy
    cupy.cuda.runtime.deviceSynchronize()


if __name__ == "__main__":
    for name in ("gdn", "kda", "mamba2", "gla"):
        exercise(name, ModelShape(4, 2, 40, 64), ReplayConfig(window=4, max_drafts=3))
    exercise("gdn", ModelShape(2, 1, 8, 6), ReplayConfig(window=2, max_drafts=2))
    for name in ("gdn", "kda", "mamba2"):  # 10 rows per warp, V = 60: flush_for_verify's fold in chunks of 4, the last partial
        exercise(name, ModelShape(4, 2, 60, 64), ReplayConfig(window=4, max_drafts=3), launch=LaunchConfig(4, 10))
    for name in ("gdn", "kda", "mamba2"):  # shared rows: the last tile's bulk copy stops at V = 60, mid-warp
        exercise(name, ModelShape(4, 2, 60, 64), ReplayConfig(window=4, max_drafts=3),
                 launch=LaunchConfig(4, 16, max_registers=96, shared_rows=8))
    for name in ("gdn", "kda"):  # the write records in registers: loaded once the fill is known, or all of them eagerly
        for launch in (LaunchConfig(4, 16, max_registers=96, shared_rows=8, register_writes=True),
                       LaunchConfig(4, 4, eager_records=True, register_writes=True)):
            exercise(name, ModelShape(4, 2, 60, 64), ReplayConfig(window=4, max_drafts=3), launch=launch)
    for name in ("kda", "mamba2"):  # the token's row fields in registers (Mamba-2: value, skip, gate; KDA's sh_ed in sh_q)
        exercise(name, ModelShape(4, 2, 60, 64), ReplayConfig(window=4, max_drafts=3),
                 launch=LaunchConfig(8, 16, max_registers=80, shared_rows=12, register_writes=True, register_fields=True))
    for name in ("gdn", "mamba2"):  # verify under a register cap, its last fragment chunks through dynamic shared
        # memory after the write records; V = 60 in 64- and 128-row CTAs: the rows past V copy zeros
        for launch in (LaunchConfig(4, 16, max_registers=96, shared_fragments=2),
                       LaunchConfig(8, 16, max_registers=80, shared_fragments=4)):
            exercise(name, ModelShape(4, 2, 60, 64), ReplayConfig(window=4, max_drafts=3), launch=launch)
    for name in ("gdn", "mamba2", "kda_safe_gate"):  # verify's rows on tensor cores, its scores on CUDA cores (/c)
        exercise(name, ModelShape(4, 2, 60, 64), ReplayConfig(window=4, max_drafts=3), launch=LaunchConfig(8, 16, simt_scores=True))
    # bf16 tokens, records of bf16: the records keep the keys' (and KDA's gates') bits, widened in place in shared memory;
    # K = 64, 6 and 33 stage them 16, 4 and 2 bytes at a time
    raw = ReplayConfig(window=4, max_drafts=3, record_dtype="bfloat16")
    for name in ("gdn", "kda"):
        exercise(name, ModelShape(4, 2, 40, 64), raw, token_dtype="bfloat16")
        exercise(name, ModelShape(4, 2, 60, 64), raw, token_dtype="bfloat16",
                 launch=LaunchConfig(4, 4, eager_records=True, register_writes=True))
    raw2 = ReplayConfig(window=2, max_drafts=2, record_dtype="bfloat16")
    exercise("kda", ModelShape(2, 1, 8, 6), raw2, token_dtype="bfloat16")
    exercise("gdn", ModelShape(2, 1, 8, 33), raw2, token_dtype="bfloat16")
    print("sanitize_small: all kernels ran")
