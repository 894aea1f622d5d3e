// replay_common.cuh — hand-written device helpers shared by every generated ReplaySSM kernel.
//
// Layer: lowering (CUDA side). The generated source defines STATE_T (float, or unsigned short holding
// fp16/bf16 bits), VEC (elements per lane access: 4 → 16-byte loads of float state), KCH (chunks of
// 32·VEC elements along K per lane), K, V, BV (rows per CTA), NREC (records) and THREADS before
// including this text. A lane of a warp owns the K elements e = (c·32 + lane)·VEC + u, c < KCH,
// u < VEC: one coalesced 16-byte access per chunk.
#pragma once

#define KE (KCH * VEC)  // K elements a lane holds

__device__ __forceinline__ float warp_sum(float x) {
#pragma unroll
    for (int offset = 16; offset > 0; offset >>= 1) x += __shfl_xor_sync(0xffffffffu, x, offset);
    return x;
}

__device__ __forceinline__ int k_index(int i, int lane) {  // i < KE: the lane's i-th element along K
    return ((i / VEC) * 32 + lane) * VEC + (i % VEC);
}

__device__ __forceinline__ float to_f32(float x) { return x; }
__device__ __forceinline__ void from_f32(float& dst, float x) { dst = x; }
// Half-precision states are stored as raw 16-bit patterns and converted with PTX (no headers needed).
#ifdef REPLAY_HALF_STATE
__device__ __forceinline__ float to_f32(unsigned short x) {
    float f; asm("cvt.f32.f16 %0, %1;" : "=f"(f) : "h"(x)); return f;
}
__device__ __forceinline__ void from_f32(unsigned short& dst, float x) { asm("cvt.rn.f16.f32 %0, %1;" : "=h"(dst) : "f"(x)); }
#endif
#ifdef REPLAY_BF16_STATE
__device__ __forceinline__ float to_f32(unsigned short x) { return __uint_as_float(((unsigned int)x) << 16); }
__device__ __forceinline__ void from_f32(unsigned short& dst, float x) { asm("cvt.rn.bf16.f32 %0, %1;" : "=h"(dst) : "f"(x)); }
#endif

// One state row (K elements) into a lane's registers, 16 bytes per access for float32 state.
template <typename T>
__device__ __forceinline__ void load_row(const T* __restrict__ row, float (&s)[KE], int lane) {
#pragma unroll
    for (int c = 0; c < KCH; ++c) {
        const int e = (c * 32 + lane) * VEC;
        if (e < K) {
            if constexpr (VEC == 4 && sizeof(T) == 4) {
                const float4 v = *reinterpret_cast<const float4*>(row + e);
                s[c * VEC + 0] = v.x; s[c * VEC + 1] = v.y; s[c * VEC + 2] = v.z; s[c * VEC + 3] = v.w;
            } else {
#pragma unroll
                for (int u = 0; u < VEC; ++u) s[c * VEC + u] = to_f32(row[e + u]);
            }
        } else {
#pragma unroll
            for (int u = 0; u < VEC; ++u) s[c * VEC + u] = 0.f;
        }
    }
}

template <typename T>
__device__ __forceinline__ void store_row(T* __restrict__ row, const float (&s)[KE], int lane) {
#pragma unroll
    for (int c = 0; c < KCH; ++c) {
        const int e = (c * 32 + lane) * VEC;
        if (e < K) {
            if constexpr (VEC == 4 && sizeof(T) == 4) {
                *reinterpret_cast<float4*>(row + e) =
                    make_float4(s[c * VEC + 0], s[c * VEC + 1], s[c * VEC + 2], s[c * VEC + 3]);
            } else {
#pragma unroll
                for (int u = 0; u < VEC; ++u) from_f32(row[e + u], s[c * VEC + u]);
            }
        }
    }
}

// Dot product of a lane's row registers with a K vector in shared memory (lane partial only).
__device__ __forceinline__ float row_dot_partial(const float (&s)[KE], const float* __restrict__ x, int lane) {
    float acc = 0.f;
#pragma unroll
    for (int i = 0; i < KE; ++i) {
        const int e = k_index(i, lane);
        if (e < K) acc += s[i] * x[e];
    }
    return acc;
}

// Copy ``count`` floats (count <= MAXN; a multiple of 4 when WIDE) from global to shared memory, all
// loads issued before the first store: the copy costs one memory latency, not one per loop trip.
template <int MAXN, bool WIDE>
__device__ __forceinline__ void stage_floats(float* __restrict__ dst, const float* __restrict__ src, int count,
                                             int tid) {
    if constexpr (WIDE) {
        constexpr int PER = (MAXN / 4 + THREADS - 1) / THREADS;
        float4 v[PER];
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int x = (p * THREADS + tid) * 4;
            if (x < count) v[p] = *reinterpret_cast<const float4*>(src + x);
        }
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int x = (p * THREADS + tid) * 4;
            if (x < count) *reinterpret_cast<float4*>(dst + x) = v[p];
        }
    } else {
        constexpr int PER = (MAXN + THREADS - 1) / THREADS;
        float v[PER];
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int x = p * THREADS + tid;
            if (x < count) v[p] = src[x];
        }
#pragma unroll
        for (int p = 0; p < PER; ++p) {
            const int x = p * THREADS + tid;
            if (x < count) dst[x] = v[p];
        }
    }
}

// The buffer's write records of rows [v0, v0 + BV) into shared memory, record i at sh_w[i·(BV+1) + rr]
// (padded against bank conflicts; zero past the fill and past V). Loads first, then stores.
__device__ __forceinline__ void stage_writes(float* __restrict__ sh_w, const float* __restrict__ head_writes, int n,
                                             int v0, int tid) {
    constexpr int PER = (NREC * BV + THREADS - 1) / THREADS;
    float v[PER];
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        const int x = p * THREADS + tid, i = x / BV, rr = x % BV;
        v[p] = (i < n && v0 + rr < V) ? head_writes[(size_t)i * V + v0 + rr] : 0.f;
    }
#pragma unroll
    for (int p = 0; p < PER; ++p) {
        const int x = p * THREADS + tid, i = x / BV, rr = x % BV;
        if (x < NREC * BV) sh_w[i * (BV + 1) + rr] = v[p];
    }
}

__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float logsigmoid_f(float x) { return fminf(x, 0.f) - log1pf(expf(-fabsf(x))); }
__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }
