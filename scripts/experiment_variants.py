"""Time source variants of the generated step kernels side by side, and split the replay step's time.

A measurement script for the GPU machine (not part of the library): for each preset at one batch
size it times, with CUDA graphs and medians as ``replayssm bench`` does,

* the conventional step and the replay step (mixed steady state) for each *variant*: the generated
  source with a textual change applied before compilation (where the replay step's arrival and fill
  check sit; with ``--cache-hints`` also cache hints on the state rows' loads and stores), so a change
  is measured before the code generator adopts it;
* the replay step with every fill reset to 0 before each step (no records, no flush: the state read
  and the token's own work) and with every fill at L - 1 (each step folds its whole buffer);
* the copy and read floors.

Usage: ``python scripts/experiment_variants.py --presets qwen3.5-4b,kimi-linear --batch 256``.
"""

from __future__ import annotations

import argparse
import re

import numpy as np

from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.random_inputs import random_tokens
from replayssm_dsl.runtime import cuda_module
from replayssm_dsl.runtime.benchmark import _floors, capture_graphs, mixed_steady_state, preset_setup, time_graphs

ARRIVE = ("    if (tid == THREADS - 1) arrival = arrive_release(reinterpret_cast<unsigned int*>(arrivals) + slot, last_arrival);\n")
RECORD_STORES = "    if (!flush) {\n        if (blockIdx.x == 0) {"
FILL_CHECK = "    if (n < 0 || n > CAPACITY) { cp_async_wait(); return; }\n    const bool flush = n + 1 >= WINDOW;\n"
LAZY_STAGE = "    if (!EAGER_RECORDS) {\n"
LOAD = "const float4 v = *reinterpret_cast<const float4*>(row + e);"
STORE_HEAD = "*reinterpret_cast<float4*>(row + e) =\n                    make_float4("
VARIANTS = {  # label: [(old, new) or a function of the source, ...] replacements of the generated source, each of which must apply
    "base": [],
    # the replay step's arrival (a release at gpu scope) after its scores, when its state rows have landed
    "arrival after scores": [(ARRIVE, ""), (RECORD_STORES, ARRIVE + RECORD_STORES)],
    # the fill's check after the token's fields, so their loads need not wait for the fill
    "fill check after fields": [(FILL_CHECK, ""), (LAZY_STAGE, FILL_CHECK + LAZY_STAGE)],
    "fill check after fields + arrival after scores": [(FILL_CHECK, ""), (LAZY_STAGE, FILL_CHECK + LAZY_STAGE),
                                                      (ARRIVE, ""), (RECORD_STORES, ARRIVE + RECORD_STORES)],
    # no release at all: what the arrival's ordering costs (not a correct kernel, a measurement)
    "relaxed arrival": [("atom.release.gpu.global.inc.u32", "atom.relaxed.gpu.global.inc.u32")],
}


# Since d155e55 the generator itself copies the records right after the fill's check, so "fill check
# after fields" and "records before fields" now render the base source (kept: they measured 4fbb6df).
RENDER_THE_BASE = {"fill check after fields", "records before fields"}


def _lazy_stage(source: str, label: str) -> str:
    """The replay step's block that copies the n records (``if (!EAGER_RECORDS) { ... }``), from the
    newline before it; SystemExit when the source has none."""
    block = re.search(r"\n    if \(!EAGER_RECORDS\) \{\n.*?\n    \}\n", source, re.S)
    if not block or FILL_CHECK not in source:
        raise SystemExit(f"variant edit does not apply: {label}")
    return block.group(0)


def records_before_fields(source: str) -> str:
    """The n records' copies issued as soon as the fill is checked, before the token's fields."""
    block = _lazy_stage(source, "records before fields")
    source = source.replace(block, "\n", 1)
    return source.replace(FILL_CHECK, FILL_CHECK + block[1:], 1)


FILL_LOAD = "    int n = fill[slot];\n"


def records_first(source: str) -> str:
    """The fill (by row), its check and the records' copies ahead of the state rows' loads."""
    block = _lazy_stage(source, "records first")
    if FILL_CHECK + block[1:] not in source:
        raise SystemExit("variant edit does not apply: records first")
    early = FILL_LOAD.replace("slot", "b") + FILL_CHECK + block[1:]
    source = source.replace(FILL_CHECK + block[1:], "", 1).replace(FILL_LOAD, "", 1)
    return source.replace("    int page = src;\n", early + "    int page = src;\n", 1)


def in_kernel(name: str, edit):
    """``edit`` applied to kernel ``name``'s text only (from its signature to the next kernel's)."""
    def apply(source: str) -> str:
        start = source.index(f") {name}(")
        end = source.find("extern \"C\" __global__", start)
        end = len(source) if end < 0 else end
        return source[:start] + edit(source[start:end]) + source[end:]
    return apply


def l2_prefetch_ahead(ahead: int):
    """One thread of the replay step's CTA prefetches into L2 (one ``cp.async.bulk.prefetch``) the
    state rows of the CTA ``ahead`` places later in launch order, so that CTA's loads hit L2 and the
    DRAM stream no longer waits for CTAs to finish (a measurement: not yet a generator option)."""
    ids = "    const int src = src_page[b], dst = dst_page[b];\n"
    page = (ids + f"    const unsigned ahead_cta = (blockIdx.z * gridDim.y + blockIdx.y) * gridDim.x + blockIdx.x + {ahead};\n"
            "    int ahead_page = -1, ahead_x = 0, ahead_y = 0;\n"
            "    if (tid == THREADS - 32 && ahead_cta < gridDim.x * gridDim.y * gridDim.z) {\n"
            "        ahead_x = ahead_cta % gridDim.x; ahead_y = (ahead_cta / gridDim.x) % gridDim.y;\n"
            "        ahead_page = src_page[ahead_cta / (gridDim.x * gridDim.y)];\n"
            "    }\n")
    after_rows = "    if (EAGER_RECORDS) {\n"
    prefetch = ("    if (tid == THREADS - 32 && ahead_page >= 0 && ahead_page < num_pages && ahead_x * BV < V) {\n"
                "        const int r0 = ahead_x * BV, nr = min(BV, V - r0);\n"
                "        asm volatile(\"cp.async.bulk.prefetch.L2.global [%0], %1;\" :: \"l\"(checkpoint + (((size_t)ahead_page * HV + ahead_y) * V + r0) * K),\n"
                "                     \"r\"((unsigned)(nr * K * sizeof(STATE_T))) : \"memory\");\n"
                "    }\n" + after_rows)

    def edit(text: str) -> str:
        if ids not in text or after_rows not in text:
            raise SystemExit("variant edit does not apply: L2 prefetch")
        return text.replace(ids, page, 1).replace(after_rows, prefetch, 1)
    return in_kernel("replay_step", edit)


ACQ_REL_FENCE = [("__threadfence();  // acquire", 'asm volatile("fence.acq_rel.gpu;" ::: "memory");  // acquire')]
VARIANTS["records before fields"] = [records_before_fields]
# the last arrival's acquire as fence.acq_rel instead of __threadfence's sequentially consistent fence
VARIANTS["acq_rel fence"] = ACQ_REL_FENCE
VARIANTS["records before fields + acq_rel fence"] = [records_before_fields] + ACQ_REL_FENCE
# the fill read by batch row, not through the slot (the benchmark puts slot b in row b, so the same
# values): its load no longer waits for the slot's. Not a kernel to ship, a bound on what a fill the
# host passes with the batch would buy
VARIANTS["fill by row (bound)"] = [(FILL_LOAD, "    int n = fill[b];\n")]
VARIANTS["fill by row, records first (bound)"] = [records_first]
for _waves, _ahead in (("half a wave", 264), ("a wave", 528), ("two waves", 1056)):
    VARIANTS[f"L2 prefetch {_waves} ahead"] = [l2_prefetch_ahead(_ahead)]
CACHE_HINTS = {  # measured on the H200: none is faster (docs/performance.md); kept to re-measure
    "ld.cs": [(LOAD, "const float4 v = __ldcs(reinterpret_cast<const float4*>(row + e));")],
    "st.cs": [(STORE_HEAD, "__stcs(reinterpret_cast<float4*>(row + e),\n                    make_float4("),
              ("s[c * VEC + 3]);\n            } else", "s[c * VEC + 3]));\n            } else")],
    "ld.L2::256B": [(LOAD, "float4 v; asm volatile(\"ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];\""
                           " : \"=f\"(v.x), \"=f\"(v.y), \"=f\"(v.z), \"=f\"(v.w) : \"l\"(row + e));")],
}


def patched_renderer(edits):
    original = cuda_module.render_program.__wrapped__ if hasattr(cuda_module.render_program, "__wrapped__") \
        else cuda_module.render_program

    def render(program, launch, kernels=None):
        source = original(program, launch)  # every kernel (a group's module compiles them all), edits as written
        for edit in edits:
            if callable(edit):
                source = edit(source)
                continue
            old, new = edit
            if old not in source:
                raise SystemExit(f"variant edit does not apply: {old!r}")
            source = source.replace(old, new, 1)
        return source
    render.__wrapped__ = original
    return render


def time_step(cp, cache, kernel, batch, batch_dev, tokens, out, fill=None) -> float:
    fills = cache.buffers["fill"]

    def build(i):
        if fill is not None:
            fills[...] = fill
        if kernel == "replay_step":
            cache.launch_step(batch_dev, tokens[i], out)
        else:
            cache._launch(kernel, batch, batch_dev, tokens[i], out=out)
    stream, graphs = capture_graphs(cp, build, len(tokens))
    return time_graphs(cp, stream, graphs, 60)


def scratch_cache(decl, shape, config, rows, params, launch):
    """A cache of ``rows`` slots at ``launch`` whose kernels render through the current (patched)
    renderer, with small constant state and records."""
    from replayssm_dsl.runtime.cuda_cache import CudaReplayCache
    cache = CudaReplayCache(decl, shape, config, slots=rows, params=params, launch=launch)
    cache.buffers["checkpoint"][...] = 0.01
    cache.buffers["state"][...] = 0.01
    cache.buffers["rec_write"][...] = 0.01
    cache.buffers["rec_key"][...] = 0.05
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="qwen3.5-4b,kimi-linear")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--replay-launch", default="4,16,128", help="warps,rows_per_warp,max_registers[,eager_records 0/1]")
    parser.add_argument("--conv-launch", default="4,8,80")
    parser.add_argument("--cache-hints", action="store_true", help="also the state rows' cache-hint variants")
    parser.add_argument("--variants", help="labels of the variants to time, separated by ';' (default: all)")
    args = parser.parse_args()
    import cupy as cp

    rows = args.batch
    warps, rpw, regs, *eager = map(int, args.replay_launch.split(","))
    replay_launch = LaunchConfig(warps, rpw, regs, eager_records=bool(eager and eager[0]))
    conv_launch = LaunchConfig(*map(int, args.conv_launch.split(",")))
    table = []
    for name in args.presets.split(","):
        decl, shape, config, rng, params = preset_setup(name)
        tokens = [{k: cp.asarray(v[:, None].astype(np.float32)) for k, v in random_tokens(decl, shape, rng, (rows,)).items()}
                  for _ in range(4)]
        out = cp.empty((rows, 1, shape.heads, shape.v_dim), cp.float32)
        state_bytes = rows * shape.heads * shape.v_dim * shape.k_dim * 4
        copy_ms, read_ms = _floors(cp, state_bytes, 60)
        table.append((name, "floors", f"copy {copy_ms:.4f}", f"read {read_ms:.4f}", ""))
        chosen = VARIANTS | (CACHE_HINTS if args.cache_hints else {})
        if args.variants:
            chosen = {label: chosen[label] for label in args.variants.split(";")}
        for label, edits in chosen.items():
            cuda_module.render_program = patched_renderer(edits)
            times = {}
            for kernel, launch in (("conventional_step", conv_launch), ("replay_step", replay_launch)):
                cache = scratch_cache(decl, shape, config, rows, params, launch)
                batch_dev = mixed_steady_state(cache, rows)
                times[kernel] = time_step(cp, cache, kernel, rows, batch_dev, tokens, out)
                if kernel == "replay_step":
                    times["replay n=0"] = time_step(cp, cache, kernel, rows, batch_dev, tokens, out, fill=0)
                    if label == "base":
                        times["replay n=L-1"] = time_step(cp, cache, kernel, rows, batch_dev, tokens, out,
                                                          fill=config.window - 1)
                del cache
                cp.get_default_memory_pool().free_all_blocks()
            conv, replay = times["conventional_step"], times["replay_step"]
            extra = "  ".join(f"{k} {v:.4f}" for k, v in times.items() if k.startswith("replay n"))
            table.append((name, f"{label} ({replay_launch.label})", f"conv {conv:.4f} ({conv / copy_ms:.3f} copy)",
                          f"replay {replay:.4f} ({replay / read_ms:.3f} read)", extra))
            print(*table[-1], flush=True)
        cuda_module.render_program = patched_renderer([])
    print("\n| preset | variant | conventional step ms | replay step ms | replay split |")
    print("|---|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
