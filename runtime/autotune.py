"""Runtime layer: a small autotuner for the launch shape of the generated kernels, with a cached table.

``tune_step`` times the replay step (mixed steady state, CUDA graph, median) of a scratch cache
for each candidate ``LaunchConfig`` and records the fastest in a JSON table keyed by declaration
fingerprint, shape, replay settings and batch size (``REPLAYSSM_AUTOTUNE_CACHE``). Caches consult
the table before falling back to ``choose_launch``'s rule. Needs a GPU.
"""

from __future__ import annotations

import json

import numpy as np

from replayssm_dsl import knobs
from replayssm_dsl.lowering.launch import LaunchConfig

from .benchmark import capture_graphs, time_graphs

CANDIDATES = (LaunchConfig(4, 4), LaunchConfig(4, 2), LaunchConfig(4, 8), LaunchConfig(8, 8), LaunchConfig(4, 16),
              LaunchConfig(4, 4, max_registers=64), LaunchConfig(8, 4, max_registers=64))


def _usable(cache) -> bool:
    """The candidate's module builds (shared memory fits) and no kernel spills to local memory."""
    import cupy as cp
    try:
        return not cache.compiled.local_memory()
    except cp.cuda.compiler.CompileException:
        return False


def table_key(program, rows: int) -> str:
    s, c = program.shape, program.config
    return (f"{program.declaration.fingerprint}|{s.heads},{s.key_heads},{s.v_dim},{s.k_dim}|"
            f"{c.window},{c.max_drafts},{c.state_dtype}|{rows}")


def load_table() -> dict:
    path = knobs.autotune_cache()
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}


def lookup(program, rows: int) -> LaunchConfig | None:
    entry = load_table().get(table_key(program, rows))
    return LaunchConfig(**entry["launch"]) if entry else None


def tune_step(decl, shape, config, params: dict, rows: int, reps: int = 20) -> tuple[LaunchConfig, dict]:
    """Time every candidate on a scratch cache of ``rows`` slots; store and return the fastest."""
    import cupy as cp

    from replayssm_dsl.random_inputs import random_tokens

    from .cuda_cache import CudaReplayCache

    timings = {}
    rng = np.random.default_rng(0)
    for launch in CANDIDATES:
        cache = CudaReplayCache(decl, shape, config, slots=rows, params=params, launch=launch)
        if not _usable(cache):
            continue
        cache.buffers["checkpoint"][...] = 0.01
        cache.buffers["fill"][...] = cp.arange(rows, dtype=cp.int32) % config.window
        batch = {k: cp.asarray(v) for k, v in cache._batch(np.arange(rows, dtype=np.int32)).items()}
        toks = {k: cp.asarray(v[:, None].astype(np.float32)) for k, v in random_tokens(decl, shape, rng, (rows,)).items()}
        out = cp.empty((rows, 1, shape.heads, shape.v_dim), cp.float32)
        stream, graphs = capture_graphs(cp, lambda i: cache.launch_step(batch, toks, out), 1)
        timings[launch] = time_graphs(cp, stream, graphs, reps)
        program = cache.program
        del cache
    best = min(timings, key=timings.get)
    table = load_table()
    table[table_key(program, rows)] = {
        "launch": {"warps": best.warps, "rows_per_warp": best.rows_per_warp, "max_registers": best.max_registers},
        "ms": {c.label: t for c, t in timings.items()}}
    path = knobs.autotune_cache()
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(table, indent=1, sort_keys=True))
    tmp.replace(path)
    return best, timings
