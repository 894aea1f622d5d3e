"""How close to the read and copy floors can a state-row kernel get: one CTA per tile, or persistent CTAs
that load the next tile while they compute the current one.

A measurement script for the GPU machine (not part of the library). It times hand-written kernels
shaped like the generated steps at ``[B, HV, V, K]`` = ``[256, 32, 128, 128]`` float32 (qwen3.5-4b):

* ``blocked`` (the generated kernels' structure): each CTA of 4 warps loads its tile (RPW rows per warp,
  one float4 per lane per row) into registers, meets the others at a barrier, reduces each row
  against a vector and writes one float per row (the replay step with an empty buffer); ``+store``
  also scales and writes the rows back (the conventional step);
* ``pipelined``: a persistent grid (CTAs per SM × SMs); each CTA walks the tiles and issues the next
  tile's loads into a second register set before it reduces the current one;
* ``_body64``, ``_body256``: the indexed kernels with a chain of 64 or 256 dependent shuffles once a
  tile has landed, a stand-in for the generated step's work between its rows' arrival and its last
  row: does a persistent CTA, which has the next tile's loads in flight meanwhile, hide it?

Usage: ``python scripts/experiment_pipelined.py``; prints ms and the ratio to the floors.
"""

from __future__ import annotations

import numpy as np

SOURCE = r"""
template <int RPW>
__device__ __forceinline__ void load_tile(const float* __restrict__ S, long tile, float4 (&s)[RPW], int warp, int lane) {
    const float4* base = reinterpret_cast<const float4*>(S + (tile * 4 * RPW + warp * RPW) * 128);
#pragma unroll
    for (int r = 0; r < RPW; ++r) s[r] = base[r * 32 + lane];
}

// BODY dependent shuffles once the tile has landed: a stand-in for the generated step's work between
// its rows' arrival and its last row (fields, barriers, scores, reductions), which holds the registers
template <int BODY>
__device__ __forceinline__ float body_chain(float x) {
#pragma unroll 1
    for (int i = 0; i < BODY; ++i) x = __shfl_xor_sync(0xffffffffu, x, 1) * 0.999f + 1e-7f;
    return x;
}

template <int RPW, bool STORE, int BODY = 0>
__device__ __forceinline__ void finish_tile(float* __restrict__ S, const float* __restrict__ q, float* __restrict__ out,
                                            long tile, float4 (&s)[RPW], int warp, int lane) {
    const long head = tile * 4 * RPW / 128;
    const float4 qq = reinterpret_cast<const float4*>(q + (head % 4096) * 128)[lane];
    const float chain = BODY ? body_chain<BODY>(s[0].x) * 1e-30f : 0.f;
#pragma unroll
    for (int r = 0; r < RPW; ++r) {
        float d = s[r].x * qq.x + s[r].y * qq.y + s[r].z * qq.z + s[r].w * qq.w + chain;
#pragma unroll
        for (int o = 16; o; o >>= 1) d += __shfl_xor_sync(0xffffffffu, d, o);
        const long row = tile * 4 * RPW + warp * RPW + r;
        if (lane == 0) out[row] = d;
        if (STORE) {
            float4 v = s[r];
            v.x = 0.99f * v.x + 1e-6f * d * qq.x; v.y = 0.99f * v.y + 1e-6f * d * qq.y;
            v.z = 0.99f * v.z + 1e-6f * d * qq.z; v.w = 0.99f * v.w + 1e-6f * d * qq.w;
            reinterpret_cast<float4*>(S + row * 128)[lane] = v;
        }
    }
}

template <int RPW, bool STORE>
__device__ void blocked(float* __restrict__ S, const float* __restrict__ q, float* __restrict__ out) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __shared__ float sh[128];
    float4 s[RPW];
    load_tile<RPW>(S, blockIdx.x, s, warp, lane);
    sh[threadIdx.x] = q[threadIdx.x];
    __syncthreads();
    finish_tile<RPW, STORE>(S, q, out, blockIdx.x, s, warp, lane);
}

template <int RPW, int BODY = 0>
__device__ void blocked_indexed(float* __restrict__ S, const float* __restrict__ q, float* __restrict__ out,
                                const int* __restrict__ index) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    __shared__ float sh[128];
    float4 s[RPW];
    const long tile = index[blockIdx.x];  // the tile's place comes from memory, as a slot's page does
    load_tile<RPW>(S, tile, s, warp, lane);
    sh[threadIdx.x] = q[threadIdx.x];
    __syncthreads();
    finish_tile<RPW, false, BODY>(S, q, out, tile, s, warp, lane);
}

template <int RPW, int BODY = 0>
__device__ void pipelined_indexed(float* __restrict__ S, const float* __restrict__ q, float* __restrict__ out,
                                  const int* __restrict__ index, long tiles) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float4 a[RPW], b[RPW];
    long t = blockIdx.x;
    long ia = t < tiles ? index[t] : 0;
    if (t < tiles) load_tile<RPW>(S, ia, a, warp, lane);
    long ib = t + gridDim.x < tiles ? index[t + gridDim.x] : 0;
    for (; t < tiles; t += 2 * gridDim.x) {
        const long t1 = t + gridDim.x, t2 = t1 + gridDim.x, t3 = t2 + gridDim.x;
        if (t1 < tiles) load_tile<RPW>(S, ib, b, warp, lane);
        const long ia_next = t2 < tiles ? index[t2] : 0;
        finish_tile<RPW, false, BODY>(S, q, out, ia, a, warp, lane);
        ia = ia_next;
        if (t2 < tiles) load_tile<RPW>(S, ia, a, warp, lane);
        const long ib_next = t3 < tiles ? index[t3] : 0;
        if (t1 < tiles) finish_tile<RPW, false, BODY>(S, q, out, ib, b, warp, lane);
        ib = ib_next;
    }
}

template <int RPW, bool STORE>
__device__ void pipelined(float* __restrict__ S, const float* __restrict__ q, float* __restrict__ out, long tiles) {
    const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
    float4 a[RPW], b[RPW];
    long t = blockIdx.x;
    if (t < tiles) load_tile<RPW>(S, t, a, warp, lane);
    for (; t < tiles; t += 2 * gridDim.x) {
        const long t1 = t + gridDim.x, t2 = t1 + gridDim.x;
        if (t1 < tiles) load_tile<RPW>(S, t1, b, warp, lane);
        finish_tile<RPW, STORE>(S, q, out, t, a, warp, lane);
        if (t2 < tiles) load_tile<RPW>(S, t2, a, warp, lane);
        if (t1 < tiles) finish_tile<RPW, STORE>(S, q, out, t1, b, warp, lane);
    }
}

extern "C" {
__global__ void __launch_bounds__(128, 4) blocked16(float* S, const float* q, float* out) { blocked<16, false>(S, q, out); }
__global__ void __launch_bounds__(128, 4) blocked16_store(float* S, const float* q, float* out) { blocked<16, true>(S, q, out); }
__global__ void __launch_bounds__(128, 4) blocked16_indexed(float* S, const float* q, float* out, const int* i) { blocked_indexed<16>(S, q, out, i); }
__global__ void __launch_bounds__(128, 4) pipelined8_indexed(float* S, const float* q, float* out, const int* i, long n) { pipelined_indexed<8>(S, q, out, i, n); }
__global__ void __launch_bounds__(128, 4) blocked16_indexed_body64(float* S, const float* q, float* out, const int* i) { blocked_indexed<16, 64>(S, q, out, i); }
__global__ void __launch_bounds__(128, 4) blocked16_indexed_body256(float* S, const float* q, float* out, const int* i) { blocked_indexed<16, 256>(S, q, out, i); }
__global__ void __launch_bounds__(128, 4) pipelined8_indexed_body64(float* S, const float* q, float* out, const int* i, long n) { pipelined_indexed<8, 64>(S, q, out, i, n); }
__global__ void __launch_bounds__(128, 4) pipelined8_indexed_body256(float* S, const float* q, float* out, const int* i, long n) { pipelined_indexed<8, 256>(S, q, out, i, n); }
__global__ void __launch_bounds__(128, 8) blocked8(float* S, const float* q, float* out) { blocked<8, false>(S, q, out); }
__global__ void __launch_bounds__(128, 4) pipelined8(float* S, const float* q, float* out, long n) { pipelined<8, false>(S, q, out, n); }
__global__ void __launch_bounds__(128, 4) pipelined8_store(float* S, const float* q, float* out, long n) { pipelined<8, true>(S, q, out, n); }
__global__ void __launch_bounds__(128, 8) pipelined4(float* S, const float* q, float* out, long n) { pipelined<4, false>(S, q, out, n); }
__global__ void __launch_bounds__(128, 8) pipelined4_store(float* S, const float* q, float* out, long n) { pipelined<4, true>(S, q, out, n); }
}
"""


def main() -> None:
    import cupy as cp

    from replayssm_dsl.runtime.benchmark import _floors, _median_ms

    B, HV, V, K = 256, 32, 128, 128
    rows = B * HV * V
    S = cp.full(rows * K, 0.01, cp.float32)
    q = cp.asarray(np.random.default_rng(0).standard_normal(4096 * 128).astype(np.float32))
    out = cp.empty(rows, cp.float32)
    module = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    sms = cp.cuda.Device().attributes["MultiProcessorCount"]
    copy_ms, read_ms = _floors(cp, rows * K * 4, 60)
    print(f"floors: copy {copy_ms:.4f} ms, read {read_ms:.4f} ms")
    print("| kernel | grid | ms | / read floor | / copy floor |")
    print("|---|---|---|---|---|")
    cases = [("blocked16", 16, None), ("blocked8", 8, None), ("blocked16_store", 16, None),
             ("blocked16", 16, "4 CTAs/SM"), ("blocked16_indexed", 16, None), ("blocked16_indexed", 16, "4 CTAs/SM"),
             ("pipelined8_indexed", 8, 4)]
    for body in (64, 256):  # a longer body after the rows land: one CTA per tile against persistent CTAs
        cases += [(f"blocked16_indexed_body{body}", 16, "4 CTAs/SM"), (f"pipelined8_indexed_body{body}", 8, 4)]
    for per_sm in (4, 8):
        cases += [("pipelined8", 8, per_sm), ("pipelined8_store", 8, per_sm)]
    for per_sm in (8, 12, 16):
        cases += [("pipelined4", 4, per_sm), ("pipelined4_store", 4, per_sm)]
    for name, rpw, per_sm in cases:
        kernel = module.get_function(name)
        tiles = rows // (4 * rpw)
        index = cp.arange(tiles, dtype=cp.int32)
        shared = 0
        if per_sm is None or isinstance(per_sm, str):
            grid, args = (tiles,), (S, q, out) + ((index,) if "indexed" in name else ())
            if per_sm is not None:  # dynamic shared memory that lets only 4 CTAs share an SM, as 128 registers do
                shared = 52 * 1024
                kernel.max_dynamic_shared_size_bytes = shared
        elif "indexed" in name:
            grid, args = (sms * per_sm,), (S, q, out, index, np.int64(tiles))
        else:
            grid, args = (sms * per_sm,), (S, q, out, np.int64(tiles))
        out[...] = np.nan
        ms = _median_ms(cp, lambda i: kernel(grid, (128,), args, shared_mem=shared), 60)
        assert not bool(cp.isnan(out).any()), name  # every row written
        print(f"| {name} | {grid[0]} CTAs{', ' + per_sm if isinstance(per_sm, str) else ''} | {ms:.4f} | {ms / read_ms:.3f} | {ms / copy_ms:.3f} |", flush=True)


if __name__ == "__main__":
    main()
