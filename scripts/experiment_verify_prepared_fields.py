"""Verify with its drafts' fields prepared by small kernels first (GDN), beside the generated verify.

A measurement script for the GPU machine (not part of the library). Leaving verify's per-draft fields
out (the L2-normalised key and query, the log-decay and the strength of each draft, computed by one
warp per draft inside every verify CTA) took 24 % off verify T = 8 for qwen3.5-4b as a bound
(``experiment_verify_bounds.py``). This script asks how much of that a real design keeps: a
``prepare`` step (all drafts of the batch at once, at full occupancy: one warp per draft and key
head for the normalised keys and scaled queries, one thread per draft and value head for the decays
and strengths) writes them in the token layout; verify then copies them into shared memory with
``cp.async`` (no arithmetic, no wait in the CTA's critical path but the copy's; the generator's own
early loads of the first draft's key and query, since 8d0cc0b, are left unused). For each preset
(GDN only) it

* checks the variant against the generated verify on the same inputs (outputs and written records,
  largest relative difference, NaN fails; the scratch cache's state and records are constants, so
  this is a weak check of anything indexed by row);
* times, as ``replayssm bench`` does (CUDA graphs, medians, verify with its commit), the generated
  verify, and ``prepare`` + the variant in one graph, and ``prepare`` alone.

Usage: ``python scripts/experiment_verify_prepared_fields.py --presets qwen3.5-4b,qwen3.5-122b``.
"""

from __future__ import annotations

import argparse
import re

import numpy as np

from experiment_variants import in_kernel, patched_renderer, scratch_cache  # this folder's script (run as scripts/...)
from experiment_verify_bounds import TUNED
from replayssm_dsl.runtime import cuda_module
from replayssm_dsl.runtime.benchmark import capture_graphs, mixed_steady_state, preset_setup, time_graphs, verify_and_commit, verify_inputs

FIELDS = re.compile(r"    for \(int j = warp; j < t; j \+= WARPS\) \{\n.*?\n    \}\n(?=    for \(int x = THREADS - 1 - tid; x < t \* BV)", re.S)
PREPARED = """    for (int j = 0; j < t; ++j) {  // the drafts' fields, prepared: normalised key, scaled query, decay, strength
        stage_floats<VEC == 4>(sh_kd + j * K, tok_k + ((size_t)(b * t_tok + j) * H + hk) * K, K, tid);
        stage_floats<VEC == 4>(sh_q + j * K, tok_q + ((size_t)(b * t_tok + j) * H + hk) * K, K, tid);
    }
    for (int j = tid; j < t; j += THREADS) {
        sh_g[j] = tok_a[(size_t)(b * t_tok + j) * HV + hv];
        sh_beta[j] = tok_b[(size_t)(b * t_tok + j) * HV + hv];
    }
"""
PREPARE_SOURCE = r"""
extern "C" __global__ void prepare_norms(const float* __restrict__ q, const float* __restrict__ k,
                                         float* __restrict__ qn, float* __restrict__ kn, int vectors, int K, float scale) {
    const int v = blockIdx.x * (blockDim.x / 32) + threadIdx.x / 32, lane = threadIdx.x % 32;
    if (v >= vectors) return;
    const float* qv = q + (size_t)v * K; const float* kv = k + (size_t)v * K;
    float sq = 0.f, sk = 0.f;
    for (int e = lane; e < K; e += 32) { sq += qv[e] * qv[e]; sk += kv[e] * kv[e]; }
    for (int o = 16; o; o >>= 1) { sq += __shfl_xor_sync(0xffffffffu, sq, o); sk += __shfl_xor_sync(0xffffffffu, sk, o); }
    const float iq = rsqrtf(sq + 1e-06f) * scale, ik = rsqrtf(sk + 1e-06f);
    for (int e = lane; e < K; e += 32) { qn[(size_t)v * K + e] = qv[e] * iq; kn[(size_t)v * K + e] = kv[e] * ik; }
}
extern "C" __global__ void prepare_gates(const float* __restrict__ a, const float* __restrict__ b,
                                         const float* __restrict__ A_log, const float* __restrict__ dt_bias,
                                         float* __restrict__ g, float* __restrict__ beta, int count, int HV) {
    const int x = blockIdx.x * blockDim.x + threadIdx.x;
    if (x >= count) return;
    const int hv = x % HV;
    const float u = a[x] + dt_bias[hv];
    g[x] = -expf(A_log[hv]) * (u > 20.f ? u : log1pf(expf(u)));
    beta[x] = 1.f / (1.f + expf(-b[x]));
}
"""


def prepared_verify(source: str) -> str:
    def edit(text: str) -> str:
        new, count = FIELDS.subn(PREPARED, text, count=1)
        if count != 1:
            raise SystemExit("the drafts' fields loop was not found in verify")
        return new
    return in_kernel("verify", edit)(source)


def main() -> None:  # noqa: C901 - one measurement
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="qwen3.5-4b,qwen3.5-122b")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--drafts", type=int, default=8)
    args = parser.parse_args()
    import cupy as cp

    module = cp.RawModule(code=PREPARE_SOURCE)
    norms, gates = module.get_function("prepare_norms"), module.get_function("prepare_gates")
    rows, t = args.batch, args.drafts
    table = []
    for name in args.presets.split(","):
        decl, shape, config, _, params = preset_setup(name)
        if decl.name != "gdn":
            raise SystemExit(f"{name}: the prepared fields are written for GDN only")
        H, HV, K = shape.key_heads, shape.heads, shape.k_dim
        results = {}
        for label, edits in (("generated", []), ("prepared", [prepared_verify])):
            cuda_module.render_program = patched_renderer(edits)
            cache = scratch_cache(decl, shape, config, rows, params, TUNED[name])
            batch = mixed_steady_state(cache, rows)
            rng_inputs = np.random.default_rng(1)  # the same inputs for both
            tokens, drafted, out = verify_inputs(cp, decl, shape, rng_inputs, batch, t, sets=2)
            ready = [{k: (v if k == "v" else cp.empty_like(v)) for k, v in toks.items()} for toks in tokens]
            A_log, dt_bias = cache.buffers["A_log"], cache.buffers["dt_bias"]

            def prepare(i):
                raw, prep = tokens[i], ready[i]
                vectors = rows * t * H
                norms(((vectors + 7) // 8,), (256,), (raw["q"], raw["k"], prep["q"], prep["k"], np.int32(vectors),
                                                      np.int32(K), np.float32(K ** -0.5)))
                count = rows * t * HV
                gates(((count + 255) // 256,), (256,), (raw["a"], raw["b"], A_log, dt_bias, prep["a"], prep["b"],
                                                      np.int32(count), np.int32(HV)))

            if label == "prepared":
                def step(i):
                    prepare(i)
                    verify_and_commit(cache, drafted, ready[i], out, t)
            else:
                def step(i):
                    verify_and_commit(cache, drafted, tokens[i], out, t)
            if label == "prepared":
                prepare(0)
            out[...] = cp.nan  # poisoned: every output must be written
            cache.launch_verify(drafted, ready[0] if label == "prepared" else tokens[0], out)
            cp.cuda.Device().synchronize()
            results[label] = (out.get(), cache.buffers["rec_write"].get(), cache.buffers["rec_key"].get())
            stream, graphs = capture_graphs(cp, step, 2)
            ms = time_graphs(cp, stream, graphs, 60)
            row = [name, TUNED[name].label, label + (" (prepare + verify + commit)" if label == "prepared" else ""), f"{ms:.4f}"]
            if label == "prepared":
                stream, graphs = capture_graphs(cp, prepare, 2)
                row.append(f"prepare alone {time_graphs(cp, stream, graphs, 60):.4f}")
            table.append(row)
            print(*row, flush=True)
            cache = graphs = None
            cp.get_default_memory_pool().free_all_blocks()
        cuda_module.render_program = patched_renderer([])
        for what, new, old in zip(("outputs", "record writes", "record keys"), results["prepared"], results["generated"]):
            finite = bool(np.isfinite(new).all() and np.isfinite(old).all())
            rel = float(np.max(np.abs(new - old)) / max(np.max(np.abs(old)), 1e-30))
            print(f"{name} check {what}: finite={finite} largest difference / largest value = {rel:.2e}", flush=True)
            table.append([name, "check", what, f"finite={finite}", f"{rel:.2e}"])
    print("\n| preset | launch | verify T = 8 | ms | note |\n|---|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row + [""] * (5 - len(row))) + " |")


if __name__ == "__main__":
    main()
