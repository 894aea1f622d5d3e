"""When each CTA of a step kernel starts and ends (``%globaltimer``), to see where a launch's fixed part goes.

A measurement script for the GPU machine (not part of the library). The step kernel's source is
edited (``probe``) so that thread 0 of every CTA reads ``%globaltimer`` first thing and, after a
closing barrier, again last thing, and stores both with its SM and its buffer fill into the
``materialized`` argument (unused by the step kernels). Each launch is queued behind the
benchmark's busy kernel. Per launch it prints the span from the first CTA's start to the last CTA's
end beside the CUDA-event time (an eager launch: it also holds what of the host's enqueueing the
busy kernel does not cover, so the span is the kernel's time); the ramp (until the first CTA ends);
the tail (from the last CTA's start); the CTAs' mean durations (folding and not); how far apart the
SMs' last CTAs end; and the slot time lost to CTA slots standing empty (the span less the sum of the
CTAs' durations over the most CTAs resident at once). The medians over the launches come last.

``--no-fold`` puts row b at fill b mod (L - 1) before each launch (the same spread of records, no row
folding), to see what the folding CTAs add.

Usage: ``python scripts/cta_timeline.py --presets kimi-linear,qwen3.5-4b --batch 256 [--no-fold]``
(launch shapes from ``launch_overhead.LAUNCHES``).
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np

from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.runtime import benchmark, cuda_module
from replayssm_dsl.runtime.benchmark import mixed_steady_state, preset_setup

sys.path.insert(0, str(Path(__file__).resolve().parent))
from experiment_variants import patched_renderer, scratch_cache, step_inputs  # noqa: E402
from launch_overhead import LAUNCHES  # noqa: E402
from source_edits import in_kernel  # noqa: E402

START = "    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;\n"
TIMER = 'asm volatile("mov.u64 %0, %%globaltimer;" : "=l"({}) :: "memory");'
WORDS = ("(reinterpret_cast<unsigned long long*>(materialized) + "
         "4 * (((size_t)blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x))")


def probe(kernel: str, fill: str):
    """The edit of ``kernel``: the start time after its first line, the end time, SM and ``fill`` (an
    expression, or 0) before its closing brace; 4 words per CTA in ``materialized``."""
    def edit(text: str) -> str:
        if text.count(START) != 1:
            raise SystemExit(f"probe does not apply to {kernel}")
        text = text.replace(START, START + "    if (threadIdx.x == 0) {  // (stored at once: nothing stays live)\n"
                            f"        unsigned long long t0; {TIMER.format('t0')}\n"
                            f"        {WORDS}[0] = t0;\n    }}\n", 1)
        end = text.rindex("\n}\n")
        tail = ("    __syncthreads();\n"
                "    if (threadIdx.x == 0) {\n"
                f"        unsigned long long t1; {TIMER.format('t1')}\n"
                '        unsigned sm; asm volatile("mov.u32 %0, %%smid;" : "=r"(sm));\n'
                f"        {WORDS}[1] = t1; {WORDS}[2] = sm; {WORDS}[3] = (unsigned long long)({fill});\n"
                "    }")
        return text[:end] + "\n" + tail + text[end:]
    return in_kernel(kernel, edit)


def summary(words: np.ndarray, event_ms: float, window: int) -> dict:
    """One launch's timeline from its probe words (per CTA: start, end, SM, fill); a CTA at fill
    ``window - 1`` folds."""
    t0, t1, fill = words[:, 0].astype(np.int64), words[:, 1].astype(np.int64), words[:, 3]
    start, end = t0.min(), t1.max()
    duration = (t1 - t0) / 1e3
    events = np.concatenate([np.stack([t0, np.ones_like(t0)], 1), np.stack([t1, -np.ones_like(t1)], 1)])
    events = events[np.lexsort((events[:, 1], events[:, 0]))]
    resident = np.cumsum(events[:, 1]).max()
    span = (end - start) / 1e3
    folding = fill >= window - 1
    sm = words[:, 2].astype(np.int64)
    sm_last_end = np.array([t1[sm == i].max() for i in np.unique(sm)])
    return {"event us": event_ms * 1e3, "span us": span, "ramp us": (t1.min() - start) / 1e3,
            "tail us": (end - t0.max()) / 1e3, "CTA us": duration[~folding].mean(),
            "folding CTA us": duration[folding].mean() if folding.any() else float("nan"),
            "most resident": float(resident), "empty slots us": span - duration.sum() / resident,
            "SMs' last ends spread us": (sm_last_end.max() - sm_last_end.min()) / 1e3,
            "timer step ns": float(np.diff(np.unique(t0)).min()) if len(np.unique(t0)) > 1 else float("nan")}


def finite_median(values) -> float:
    """The median of the finite ``values`` (a mean over no CTAs, e.g. no folding one, is nan), or nan."""
    finite = [v for v in values if np.isfinite(v)]
    return float(np.median(finite)) if finite else float("nan")


def timeline(cp, cache, kernel: str, rows: int, batch, tokens, out, launches: int, no_fold: bool) -> list[dict]:
    grid_ctas = None
    probe_words = cp.zeros(4 * rows * cache.shape.heads * 64, cp.uint64)  # ample for any tile split
    stream = cp.cuda.get_current_stream()
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    found = []
    for i in range(launches + 3):
        probe_words[...] = 0
        if no_fold:  # fills 0 .. L-2 across the batch: the same spread of records, no row folds
            cache.buffers["fill"][:rows] = cp.arange(rows, dtype=cp.int32) % (cache.config.window - 1)
        benchmark.hold_gpu(cp, stream)
        start.record(stream)
        cache._launch(kernel, rows, batch, tokens[i % len(tokens)], out=out, materialized=probe_words.view(cp.float32))
        stop.record(stream)
        stop.synchronize()
        if i < 3:
            continue
        words = cp.asnumpy(probe_words).reshape(-1, 4)
        grid_ctas = grid_ctas or int(np.flatnonzero(words[:, 1]).max()) + 1
        found.append(summary(words[:grid_ctas], cp.cuda.get_elapsed_time(start, stop), cache.config.window))
    return found


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="kimi-linear,qwen3.5-4b")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--launches", type=int, default=32)
    parser.add_argument("--no-fold", action="store_true",
                        help="before each launch put row b at fill b mod (L - 1), so that no row folds")
    args = parser.parse_args()
    import cupy as cp

    cuda_module.render_program = patched_renderer([probe("replay_step", "n"), probe("conventional_step", "0")])
    rows, table = args.batch, []
    for name in args.presets.split(","):
        decl, shape, config, rng, params = preset_setup(name)
        tokens, out = step_inputs(cp, decl, shape, rng, rows)
        for kernel, label in (("replay_step", LAUNCHES[name][0]), ("conventional_step", LAUNCHES[name][1])):
            cache = scratch_cache(decl, shape, config, rows, params, LaunchConfig.from_label(label))
            found = timeline(cp, cache, kernel, rows, mixed_steady_state(cache, rows), tokens, out, args.launches, args.no_fold)
            medians = {k: finite_median([f[k] for f in found]) for k in found[0]}
            table.append((name, f"{kernel} {label}", medians))
            print(name, kernel, label, "  ".join(f"{k} {v:.2f}" for k, v in medians.items()), flush=True)
            cache = None
            cp.get_default_memory_pool().free_all_blocks()
    keys = list(table[0][2])
    print(f"\nB = {rows}{', no row folding' if args.no_fold else ''}; medians over {args.launches} launches")
    print("| preset | kernel | " + " | ".join(keys) + " |")
    print("|---|---|" + "---|" * len(keys))
    for name, kernel, medians in table:
        print(f"| {name} | {kernel} | " + " | ".join(f"{medians[k]:.2f}" for k in keys) + " |")


if __name__ == "__main__":
    main()
