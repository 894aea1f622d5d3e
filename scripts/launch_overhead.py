"""Split the step kernels' times into a part per batch row and a fixed part, and time what the fixed part is.

A measurement script for the GPU machine (not part of the library). For each preset at its launch
shapes and each batch size it times, with CUDA graphs behind the benchmark's busy kernel as
``replayssm bench`` does:

* the replay step (mixed steady state) and the conventional step, one launch per graph (the
  benchmark's way) and four back-to-back launches per graph (per launch);
* the replay step with the busy kernel, or the replay kernel itself, preferring the most shared
  memory (``preferred_shared_memory_carveout = 100``), in case the fixed part is the SMs' shared
  memory being reconfigured between the busy kernel and a kernel that needs most of it;
* the copy and read floors (eager, as the benchmark times them).

Then, per measurement, a least-squares line ``ms = fixed + per_row * B`` over the batch sizes.

Usage: ``python scripts/launch_overhead.py --presets kimi-linear,qwen3.5-4b --batches 128,256,512``
(launch shapes from ``LAUNCHES``, or ``--launch PRESET=REPLAY,CONV``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.runtime import benchmark
from replayssm_dsl.runtime.benchmark import _floors, capture_graphs, mixed_steady_state, preset_setup, time_graphs

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_variants import scratch_cache, step_inputs  # noqa: E402

LAUNCHES = {  # preset: (replay step, conventional step), the launches the tuner picked at B = 256
    "nemotron-nano-4b": ("4x20/r96/s10", "4x16"),
    "nemotron-super-120b": ("4x16/r96/s8", "4x8/r80"),
    "qwen3.5-4b": ("8x16/r80/s11/w", "4x8/r80"),
    "qwen3.5-122b": ("8x16/r80/s11/w", "4x16"),
    "kimi-linear": ("8x16/r80/s12/w/v", "4x8/r80"),
}
MAX_SHARED = 100  # CU_SHAREDMEM_CARVEOUT_MAX_SHARED


def timed(cp, build, sets: int, reps: int, rotation: int) -> float:
    stream, graphs = capture_graphs(cp, build, sets)
    return time_graphs(cp, stream, graphs, reps, rotation=rotation)


def spin_kernel(cp):
    """The benchmark's busy kernel (compiled by its first use)."""
    benchmark.hold_gpu(cp, cp.cuda.get_current_stream())
    cp.cuda.get_current_stream().synchronize()
    return benchmark._spin_kernels[cp.cuda.Device().id]


def replay_times(cp, cache, rows: int, tokens, out, reps: int) -> dict:
    batch = mixed_steady_state(cache, rows)
    L = cache.config.window

    def steps(count):
        return lambda i: [cache.launch_step(batch, tokens[i], out) for _ in range(count)]
    res = {"replay": timed(cp, steps(1), 4, reps, L),
           "replay, 4 per graph (per launch)": timed(cp, steps(4), 4, reps, L) / 4}
    kernel = cache._compiled_for(rows, "replay_step").kernel("replay_step")
    for label, which in (("busy kernel", spin_kernel(cp)), ("kernel", kernel)):
        which.preferred_shared_memory_carveout = MAX_SHARED
        res[f"replay, {label} max shared"] = timed(cp, steps(1), 4, reps, L)
        which.preferred_shared_memory_carveout = -1  # (the module is shared by the next batch sizes' caches)
    return res


def conv_times(cp, cache, rows: int, tokens, out, reps: int) -> dict:
    batch = mixed_steady_state(cache, rows)

    def steps(count):
        return lambda i: [cache._launch("conventional_step", rows, batch, tokens[i], out=out) for _ in range(count)]
    return {"conv": timed(cp, steps(1), 4, reps, 1),
            "conv, 4 per graph (per launch)": timed(cp, steps(4), 4, reps, 1) / 4}


def measure(cp, name: str, rows: int, launches: tuple[str, str], reps: int) -> dict:
    decl, shape, config, rng, params = preset_setup(name)
    tokens, out = step_inputs(cp, decl, shape, rng, rows)
    res = {}
    for times, label in ((replay_times, launches[0]), (conv_times, launches[1])):
        cache = scratch_cache(decl, shape, config, rows, params, LaunchConfig.from_label(label))
        res.update(times(cp, cache, rows, tokens, out, reps))
        cache = None
        cp.get_default_memory_pool().free_all_blocks()
    res["copy floor"], res["read floor"] = _floors(cp, rows * shape.heads * shape.v_dim * shape.k_dim * 4, reps)
    return res


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="kimi-linear,qwen3.5-4b")
    parser.add_argument("--batches", default="128,256,512")
    parser.add_argument("--launch", action="append", default=[], help="PRESET=REPLAY,CONV launch labels")
    parser.add_argument("--reps", type=int, default=40)
    args = parser.parse_args()
    import cupy as cp

    launches = dict(LAUNCHES)
    for item in args.launch:
        preset, labels = item.split("=")
        launches[preset] = tuple(labels.split(","))
    batches = [int(b) for b in args.batches.split(",")]
    lines = []
    for name in args.presets.split(","):
        results = {rows: measure(cp, name, rows, launches[name], args.reps) for rows in batches}
        for label in results[batches[0]]:
            ms = np.array([results[rows][label] for rows in batches])
            per_row, fixed = np.polyfit(batches, ms, 1)
            times = " | ".join(f"{m:.4f}" for m in ms)
            lines.append(f"| {name} | {label} | {times} | {fixed * 1e3:.1f} | {per_row * 1e3:.4f} |")
            print(lines[-1], flush=True)
    print(f"\nlaunches: {launches}")
    print("| preset | measurement | " + " | ".join(f"B = {b} ms" for b in batches) + " | fixed us | us per row |")
    print("|---|---|" + "---|" * len(batches) + "---|---|")
    print("\n".join(lines))


if __name__ == "__main__":
    main()
