"""Bounds on verify's time: verify T = 8 as generated, beside copies that leave one of its parts out.

A measurement script for the GPU machine (not part of the library). Verify spends about half its
stall samples before its first barrier, waiting on loads (docs/performance.md). Whether a verify that
overlaps one tile's loads with another tile's work could get much faster depends on how long the
rest takes. So for each preset at one batch size it times, with CUDA graphs and medians as
``replayssm bench`` does (verify with its commit, accepting none):

* ``base``: the generated verify;
* ``rows from cache (bound)``: every CTA reads its rows from the first rows of the buffer (the same
  few KiB for all, so L1 and L2 serve them), so the time is everything but the rows' DRAM bytes and
  latency: what the kernel's own work costs when the rows are free, at the same registers and
  occupancy;
* ``records not staged (bound)``: the buffer's records are not copied to shared memory;
* ``rows from cache, records not staged (bound)``;

and the read floor, with verify's state bytes (one state-sized read) for scale. The bounds are not
correct kernels: they only say where the time goes.

Usage: ``python scripts/experiment_verify_bounds.py --presets qwen3.5-4b,nemotron-nano-4b,kimi-linear``
(launch shapes: ``--launch PRESET=WARPS,ROWS[,REGS]``, default the ones tuned in the latest headline).
"""

from __future__ import annotations

import argparse

from experiment_variants import in_kernel, patched_renderer, preset_setup, scratch_cache  # this folder's script (run as scripts/...)
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.runtime import cuda_module
from replayssm_dsl.runtime.benchmark import (_floors, capture_graphs, mixed_steady_state, time_graphs,
                                             verify_and_commit, verify_inputs)

TUNED = {  # verify's launch shapes at B = 256 in the 69001d0 headline
    "nemotron-nano-4b": LaunchConfig(8, 10), "nemotron-super-120b": LaunchConfig(4, 16),
    "qwen3.5-4b": LaunchConfig(8, 16), "qwen3.5-122b": LaunchConfig(8, 16), "kimi-linear": LaunchConfig(4, 16)}
ROW_ADDRESS = "checkpoint + (((size_t)page * HV + hv) * V + row) * K + 4 * (quad + 4 * m)"
RECORD_STAGE = "    if (!flush) {\n        stage_floats"


def _replace(old: str, new: str, label: str):
    def edit(text: str) -> str:
        if old not in text:
            raise SystemExit(f"variant edit does not apply: {label}")
        return text.replace(old, new, 1)
    return in_kernel("verify", edit)


CACHED_ROWS = _replace(ROW_ADDRESS, "checkpoint + (size_t)rw * K + 4 * (quad + 4 * m)", "rows from cache")
NO_RECORDS = _replace(RECORD_STAGE, "    if (!flush && t < 0) {\n        stage_floats", "records not staged")
VARIANTS = {"base": [], "rows from cache (bound)": [CACHED_ROWS], "records not staged (bound)": [NO_RECORDS],
            "rows from cache, records not staged (bound)": [CACHED_ROWS, NO_RECORDS]}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="qwen3.5-4b,nemotron-nano-4b,kimi-linear")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--drafts", type=int, default=8)
    parser.add_argument("--launch", action="append", default=[], help="PRESET=WARPS,ROWS[,REGS] (repeatable)")
    args = parser.parse_args()
    import cupy as cp

    launches = dict(TUNED)
    for item in args.launch:
        name, shape = item.split("=")
        launches[name] = LaunchConfig(*map(int, shape.split(",")))
    rows, t = args.batch, args.drafts
    table = []
    for name in args.presets.split(","):
        decl, shape, config, rng, params = preset_setup(name)
        _, read_ms = _floors(cp, rows * shape.heads * shape.v_dim * shape.k_dim * 4, 60)
        for label, edits in VARIANTS.items():
            cuda_module.render_program = patched_renderer(edits)
            cache = scratch_cache(decl, shape, config, rows, params, launches[name])
            batch = mixed_steady_state(cache, rows)
            tokens, drafted, out = verify_inputs(cp, decl, shape, rng, batch, t, sets=2)
            stream, graphs = capture_graphs(cp, lambda i: verify_and_commit(cache, drafted, tokens[i], out, t), 2)
            ms = time_graphs(cp, stream, graphs, 60)
            table.append((name, launches[name].label, label, f"{ms:.4f}", f"{ms / read_ms:.2f}"))
            print(*table[-1], flush=True)
            cache = graphs = None  # the next variant's buffers reuse the memory
            cp.get_default_memory_pool().free_all_blocks()
        cuda_module.render_program = patched_renderer([])
    print(f"\n| preset | launch | verify T = {t} | ms | / read floor |")
    print("|---|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
