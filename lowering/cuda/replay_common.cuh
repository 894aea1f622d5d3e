// replay_common.cuh — hand-written device helpers shared by every generated ReplaySSM kernel.
//
// Layer: lowering (CUDA side). The generated source defines STATE_T (float, or unsigned short holding
// fp16/bf16 bits), VEC (elements per lane access: 4 → 16-byte loads of float state), KCH (chunks of
// 32·VEC elements along K per lane), K, V, BV (rows per CTA), RPW (rows per warp), NREC (records),
// THREADS, W_VEC and W_PITCH (the write records' layout in shared memory) before including this text.
// A lane of a warp owns the K elements e = (c·32 + lane)·VEC + u, c < KCH, u < VEC: one coalesced
// 16-byte access per chunk.
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

// A bf16 token input, widened to float32 as it is read (its raw bits: exact).
__device__ __forceinline__ float bf16_bits_to_f32(unsigned short x) { return __uint_as_float(((unsigned int)x) << 16); }

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

// Sums of C values (C a power of two, at most 32) held by every lane, over the warp, written back to
// x[OFF, OFF + C) of every lane. Transpose-reduce: at each step a lane keeps half of its values (by its
// lane bit) and adds the partner's copy of that half, so C values cost C − 1 + log2(32 / C) shuffles,
// then C broadcasts, instead of 5·C for one warp_sum per value.
template <int W, int OFFSET, int C>  // one transpose step: W values per lane → W / 2, partners at lane ^ OFFSET
__device__ __forceinline__ void transpose_reduce(float (&y)[C], int lane) {
    if constexpr (W > 1) {
        const bool upper = (lane & OFFSET) != 0;
#pragma unroll
        for (int i = 0; i < W / 2; ++i) {
            const float send = upper ? y[i] : y[i + W / 2];
            const float keep = upper ? y[i + W / 2] : y[i];
            y[i] = keep + __shfl_xor_sync(0xffffffffu, send, OFFSET);
        }
        transpose_reduce<W / 2, OFFSET / 2>(y, lane);
    }
}

template <int C, int OFF, int M>
__device__ __forceinline__ void warp_sum_chunk(float (&x)[M], int lane) {
    float y[C];
#pragma unroll
    for (int i = 0; i < C; ++i) y[i] = x[OFF + i];
    transpose_reduce<C, 16>(y, lane);
#pragma unroll
    for (int offset = 16 / C; offset > 0; offset >>= 1) y[0] += __shfl_xor_sync(0xffffffffu, y[0], offset);
    if constexpr (C == 1) {
        x[OFF] = y[0];
    } else {
#pragma unroll
        for (int v = 0; v < C; ++v) x[OFF + v] = __shfl_sync(0xffffffffu, y[0], v * (32 / C));  // value v's lanes
    }
}

// Warp-wide sums of C values (C a power of two, at most 32) held by every lane, left spread out: the
// returned float of lane l is the sum of value l / (32 / C). C − 1 + log2(32 / C) shuffles, no broadcasts.
template <int C>
__device__ __forceinline__ float warp_sum_spread(float (&x)[C], int lane) {
    transpose_reduce<C, 16>(x, lane);
#pragma unroll
    for (int offset = 16 / C; offset > 0; offset >>= 1) x[0] += __shfl_xor_sync(0xffffffffu, x[0], offset);
    return x[0];
}

// Every lane gets the warp-wide sum of each of its M values (M a power of two ≤ 32, or a multiple of 32).
template <int M, int OFF = 0>
__device__ __forceinline__ void warp_sum_all(float (&x)[M], int lane) {
    constexpr int C = M < 32 ? M : 32;
    static_assert((C & (C - 1)) == 0 && M % C == 0, "warp_sum_all: M must be a power of two or a multiple of 32");
    warp_sum_chunk<C, OFF>(x, lane);
    if constexpr (OFF + C < M) warp_sum_all<M, OFF + C>(x, lane);
}

// Dot product of a lane's row registers with a K vector in shared memory (lane partial only), added to
// ``init`` (a record term, say: one fused chain instead of a product and an add after it).
__device__ __forceinline__ float row_dot_partial(const float (&s)[KE], const float* __restrict__ x, int lane,
                                                 float init = 0.f) {
    float acc = init;
#pragma unroll
    for (int i = 0; i < KE; ++i) {
        const int e = k_index(i, lane);
        if (e < K) acc += s[i] * x[e];
    }
    return acc;
}

// Dot product of two K vectors in shared memory, split over lanes as a row's elements (lane partial only).
__device__ __forceinline__ float vec_dot_partial(const float* __restrict__ a, const float* __restrict__ x, int lane) {
    float lane_a[KE];
#pragma unroll
    for (int i = 0; i < KE; ++i) lane_a[i] = (k_index(i, lane) < K) ? a[k_index(i, lane)] : 0.f;
    return row_dot_partial(lane_a, x, lane);
}

// Asynchronous global → shared copies (cp.async, sm_80+): no registers, no wait until cp_async_wait.
// A source size of 0 writes zeros and reads nothing.
__device__ __forceinline__ void cp_async16(float* smem, const float* gmem) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16;" ::"r"(dst), "l"(gmem));
}
// BYTES (4, 8 or 16) through L1; zeros, and nothing read, when not valid.
template <int BYTES>
__device__ __forceinline__ void cp_async_ca(float* smem, const float* gmem, bool valid) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.ca.shared.global [%0], [%1], %2, %3;" ::"r"(dst), "l"(gmem), "n"(BYTES),
                 "r"(valid ? BYTES : 0));
}
// 16 bytes through L2 only (cg); zeros, and nothing read, when not valid.
__device__ __forceinline__ void cp_async16_zfill(void* smem, const void* gmem, bool valid) {
    const unsigned dst = (unsigned)__cvta_generic_to_shared(smem);
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;" ::"r"(dst), "l"(gmem), "r"(valid ? 16 : 0));
}
// Rows [v0, v0 + BV) of `count` tokens' per-row input (token j's rows from src + j * stride) into shared
// memory [count, BV], by cp.async: no registers held, so issued before the state rows' loads, the
// copies do not queue behind the rows' bytes. 16-byte chunks of 16 / sizeof(T) elements, BV and V
// multiples of that (the generator checks), so a chunk lies below V or past it whole (past V: zeros).
template <typename T>
__device__ __forceinline__ void stage_token_rows(T* __restrict__ dst, const T* __restrict__ src, size_t stride,
                                                 int count, int v0, int tid) {
    constexpr int CHUNK = 16 / (int)sizeof(T);
    static_assert(BV % CHUNK == 0 && V % CHUNK == 0, "stage_token_rows: 16-byte chunks must tile the rows and V");
    for (int x = CHUNK * tid; x < count * BV; x += CHUNK * THREADS) {
        const int row = v0 + x % BV;
        cp_async16_zfill(dst + x, src + (size_t)(x / BV) * stride + (row < V ? row : 0), row < V);
    }
}
// Ask L1 for the 128-byte line that holds `p`: a hint, nothing waits on it; the load that later reads
// the line finds it there instead of queueing behind the loads issued in between.
__device__ __forceinline__ void prefetch_l1(const void* p) { asm volatile("prefetch.global.L1 [%0];" ::"l"(p)); }
__device__ __forceinline__ void cp_async_wait() { asm volatile("cp.async.wait_all;" ::: "memory"); }
// cp.async groups (verify's shared fragments): the copies issued so far as one group; then every group but
// the last one committed complete (the last still in flight), or all of them.
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;" ::: "memory"); }
__device__ __forceinline__ void cp_async_wait_all_but_last() { asm volatile("cp.async.wait_group 1;" ::: "memory"); }
// The replay step's shared rows (launch option shared_rows: SRPW > 0): each warp's last SRPW state rows,
// [RREG, RPW) of the warp, are copied into shared memory by one bulk copy per warp (cp.async.bulk, sm_90),
// issued by thread 0 and counted on one mbarrier, so they fly without holding registers: more rows in
// flight per SM than the registers allow. Rows past V are not copied (readers take zeros there).
// ``head_rows``: row 0 of the head's page; ``sh_rows``: WARPS · SRPW rows of K elements.
template <typename T>
__device__ __forceinline__ void shared_rows_copy(T* __restrict__ sh_rows, unsigned long long* bar,
                                                 const T* __restrict__ head_rows, int v0) {
    constexpr unsigned ROW_BYTES = K * sizeof(T);
    static_assert(ROW_BYTES % 16 == 0, "shared_rows: a bulk copy moves whole 16-byte units");
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" ::"r"(b));
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    unsigned bytes = 0;
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        const int first = v0 + w * RPW + RREG, rows = min(SRPW, V - first);
        if (rows > 0) bytes += rows * ROW_BYTES;
    }
    asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;" ::"r"(b), "r"(bytes) : "memory");
#pragma unroll
    for (int w = 0; w < WARPS; ++w) {
        const int first = v0 + w * RPW + RREG, rows = min(SRPW, V - first);
        if (rows > 0) {
            const unsigned dst = (unsigned)__cvta_generic_to_shared(sh_rows + (size_t)w * SRPW * K);
            asm volatile("cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                         ::"r"(dst), "l"(head_rows + (size_t)first * K), "r"(rows * ROW_BYTES), "r"(b) : "memory");
        }
    }
}
// Wait until the shared rows have landed (after a barrier that follows thread 0's shared_rows_copy, or
// on thread 0 itself).
__device__ __forceinline__ void shared_rows_wait(unsigned long long* bar) {
    const unsigned b = (unsigned)__cvta_generic_to_shared(bar);
    asm volatile("{\n\t.reg .pred done;\n\tWAIT:\n\t"
                 "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], 0;\n\t"
                 "@!done bra WAIT;\n\t}" ::"r"(b) : "memory");
}
// Row r of a warp's RPW rows (r known at compile time): the registers for r < NR, else shared row r − NR
// (zeros where the row is past V, as the registers hold there).
template <int NR, typename T>
__device__ __forceinline__ void state_row(const float (&s)[NR][KE], int r, const T* __restrict__ warp_rows,
                                          float (&out)[KE], int lane, bool below_v) {
    if (r < NR) {
#pragma unroll
        for (int i = 0; i < KE; ++i) out[i] = s[r][i];
    } else if (below_v) {
        load_row(warp_rows + (size_t)(r - NR) * K, out, lane);
    } else {
#pragma unroll
        for (int i = 0; i < KE; ++i) out[i] = 0.f;
    }
}

// The replay step's CTAs read a slot's fill through one atomic each: the fill word's low FILL_BITS
// bits hold the fill, its high bits count the CTAs of the row that have read it during this launch
// (zero between launches). Each read is an arrival, so the row's last CTA knows every other one has
// read the fill before it writes the next (atomicity on the one word orders them; no fence needed).
#define FILL_BITS 16
#define FILL_MASK ((1u << FILL_BITS) - 1u)
#define FILL_ARRIVAL (1u << FILL_BITS)
// One arrival: the word as it was before it (the fill in the low bits, the earlier arrivals above).
__device__ __forceinline__ unsigned int arrive_at_fill(unsigned int* word) { return atomicAdd(word, FILL_ARRIVAL); }
// Take an arrival back (a CTA that found the word corrupt and touches nothing else).
__device__ __forceinline__ void leave_fill(unsigned int* word) { atomicSub(word, FILL_ARRIVAL); }
// The row's last arrival sets the next fill and zeroes the count (an atomic, so it follows its own
// arrival, and through it every other one, on the word).
__device__ __forceinline__ void set_fill_word(unsigned int* word, int next) { atomicExch(word, (unsigned int)next); }

// Start copying ``count`` floats (a multiple of 4 when WIDE: 16-byte copies) from global to shared
// memory; complete after cp_async_wait() and a barrier.
template <bool WIDE>
__device__ __forceinline__ void stage_floats(float* __restrict__ dst, const float* __restrict__ src, int count,
                                             int tid) {
    if constexpr (WIDE) {
        for (int x = tid * 4; x < count; x += THREADS * 4) cp_async16(dst + x, src + x);
    } else {
        for (int x = tid; x < count; x += THREADS) cp_async_ca<4>(dst + x, src + x, true);
    }
}

// Records kept as raw bf16 inputs (record_inputs.py): record m's K values go to the upper half of its
// K floats in `dst` (bytes [4mK + 2K, 4mK + 4K)), where widen_records (one warp per record) reads them
// before it writes the record's floats over them. RAW_CHUNK bytes per copy: the widest of 16, 8 and 4
// that a record's 2K bytes divide into (K odd: one element at a time, through registers).
constexpr int RAW_CHUNK = (2 * K) % 16 == 0 ? 16 : (2 * K) % 8 == 0 ? 8 : (2 * K) % 4 == 0 ? 4 : 2;
__device__ __forceinline__ void stage_bf16_records(float* __restrict__ dst, const unsigned short* __restrict__ src,
                                                   int count, int tid) {
    constexpr int PER = RAW_CHUNK / 2, CHUNKS = K / PER;  // elements per copy, copies per record
    for (int x = tid; x < count * CHUNKS; x += THREADS) {
        const int m = x / CHUNKS, c = x % CHUNKS;
        unsigned short* d = reinterpret_cast<unsigned short*>(dst + (size_t)m * K) + K + c * PER;
        const unsigned short* s = src + (size_t)m * K + c * PER;
        if constexpr (RAW_CHUNK == 2) {
            *d = *s;
        } else {
            cp_async_ca<RAW_CHUNK>(reinterpret_cast<float*>(d), reinterpret_cast<const float*>(s), true);
        }
    }
}
// Element e of record m's raw bf16 input, staged by stage_bf16_records into `sh`, widened.
__device__ __forceinline__ float raw_record_element(const float* sh, int m, int e) {
    return bf16_bits_to_f32(reinterpret_cast<const unsigned short*>(sh + (size_t)m * K)[K + e]);
}

// Start copying the buffer's n write records of rows [v0, v0 + BV) into shared memory, record i at
// sh_w[i·W_PITCH + rr], W_VEC rows per copy (W_PITCH pads the records apart against bank conflicts,
// keeping each W_VEC-row chunk aligned; zeros past V; nothing past the fill, never read). Each thread
// keeps one chunk of rows and takes every WRITE_STRIDE-th record, so its division, bounds check and
// address are worked out once (the threads past a whole number of record rows copy nothing). Past
// 32·W_VEC rows per warp a record has more chunks than the CTA has threads: each thread then takes
// every THREADS-th chunk of every record.
__device__ __forceinline__ void stage_writes(float* __restrict__ sh_w, const float* __restrict__ head_writes, int n,
                                             int v0, int tid) {
    constexpr int CHUNKS = BV / W_VEC;  // copies per record
    static_assert(BV % W_VEC == 0 && V % W_VEC == 0 && W_PITCH % W_VEC == 0,
                  "stage_writes: W_VEC must divide the rows, V and the pitch");
    if constexpr (CHUNKS > THREADS) {
        for (int c = tid; c < CHUNKS; c += THREADS) {
            const int rr = c * W_VEC;
            const bool valid = v0 + rr < V;
            const float* src = head_writes + v0 + (valid ? rr : 0);  // past V: read nothing
            for (int i = 0; i < n; ++i) cp_async_ca<W_VEC * 4>(sh_w + i * W_PITCH + rr, src + (size_t)i * V, valid);
        }
    } else {
        constexpr int WRITE_STRIDE = THREADS / CHUNKS;  // records a pass of the CTA's threads covers
        const int rr = tid % CHUNKS * W_VEC, first = tid / CHUNKS;
        if (first >= WRITE_STRIDE) return;
        const bool valid = v0 + rr < V;  // V % W_VEC == 0: a chunk is all below V or all past it
        const float* src = head_writes + (size_t)first * V + v0 + (valid ? rr : 0);  // past V: read nothing
        float* dst = sh_w + first * W_PITCH + rr;
        for (int i = first; i < n; i += WRITE_STRIDE) {
            cp_async_ca<W_VEC * 4>(dst, src, valid);
            src += WRITE_STRIDE * V;
            dst += WRITE_STRIDE * W_PITCH;
        }
    }
}

// W_VEC consecutive write records' floats at w (shared or global memory, aligned to W_VEC floats) into
// wv[r], ..., wv[r + W_VEC - 1]: one 16-, 8- or 4-byte load.
__device__ __forceinline__ void load_write_chunk(float (&wv)[RPW], int r, const float* __restrict__ w) {
    if constexpr (W_VEC == 4) {
        const float4 x = *reinterpret_cast<const float4*>(w);
        wv[r] = x.x; wv[r + 1] = x.y; wv[r + 2] = x.z; wv[r + 3] = x.w;
    } else if constexpr (W_VEC == 2) {
        const float2 x = *reinterpret_cast<const float2*>(w);
        wv[r] = x.x; wv[r + 1] = x.y;
    } else {
        wv[r] = *w;
    }
}

// Lane i < n of a warp takes record i's writes at the warp's RPW rows (W_VEC per shared load; W_PITCH
// makes a warp's loads conflict-free); lanes past the records take zeros.
__device__ __forceinline__ void load_record_rows(float (&wv)[RPW], const float* __restrict__ sh_w, int warp,
                                                 int lane, int n) {
    static_assert(RPW % W_VEC == 0, "load_record_rows: W_VEC must divide the warp's rows");
    if (lane >= n) {  // past the records
#pragma unroll
        for (int r = 0; r < RPW; ++r) wv[r] = 0.f;
        return;
    }
    const float* w = sh_w + lane * W_PITCH + warp * RPW;
#pragma unroll
    for (int r = 0; r < RPW; r += W_VEC) load_write_chunk(wv, r, w + r);
}

// The replay step's write records straight into registers, without shared memory: lane i < count of a
// warp loads record i's writes at the warp's RPW rows (W_VEC rows per load: a warp's rows are
// contiguous, so lane i reads RPW·4 contiguous bytes of record i); rows past V and lanes past the
// records hold zeros. Issued as soon as the fill is known, the loads fly during the head-level work.
__device__ __forceinline__ void load_record_rows_global(float (&wv)[RPW], const float* __restrict__ head_writes,
                                                        int v0, int warp, int lane, int count) {
    static_assert(RPW % W_VEC == 0 && V % W_VEC == 0, "load_record_rows_global: W_VEC must divide the rows and V");
    const int first = v0 + warp * RPW;
    const float* w = head_writes + (size_t)lane * V + first;
#pragma unroll
    for (int r = 0; r < RPW; r += W_VEC) {
        if (lane < count && first + r < V) {  // V % W_VEC == 0: a chunk is all below V or all past it
            load_write_chunk(wv, r, w + r);
        } else {
#pragma unroll
            for (int u = 0; u < W_VEC; ++u) wv[r + u] = 0.f;
        }
    }
}

__device__ __forceinline__ float softplus_f(float x) { return x > 20.f ? x : log1pf(expf(x)); }
__device__ __forceinline__ float sigmoid_f(float x) { return 1.f / (1.f + expf(-x)); }
__device__ __forceinline__ float logsigmoid_f(float x) { return fminf(x, 0.f) - log1pf(expf(-fabsf(x))); }
__device__ __forceinline__ float silu_f(float x) { return x / (1.f + expf(-x)); }

// Tensor-core dot products with fp32 accuracy (verify's rows): mma.sync m16n8k8 takes tf32 inputs (the
// top 19 bits of an fp32 register) and accumulates in fp32. Each fp32 operand splits into a tf32 part
// (rounded to nearest by an integer add on the bits) and the exact fp32 remainder (which the tensor core
// truncates to tf32), and c += a_small·b_big + a_big·b_small + a_big·b_big: about 2^-21 relative error
// per product, against 2^-24 for fp32 FMAs (the dropped a_small·b_small is smaller still).
__device__ __forceinline__ void split_tf32(float x, unsigned& big, unsigned& small) {
    big = (__float_as_uint(x) + 0x1000u) & 0xffffe000u;
    small = __float_as_uint(x - __uint_as_float(big));
}
__device__ __forceinline__ void mma_tf32(float (&c)[4], unsigned a0, unsigned a1, unsigned a2, unsigned a3,
                                         unsigned b0, unsigned b1) {
    asm("mma.sync.aligned.m16n8k8.row.col.f32.tf32.tf32.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
        "{%0, %1, %2, %3};"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a0), "r"(a1), "r"(a2), "r"(a3), "r"(b0), "r"(b1));
}
// c (16×8) += A (16×8) · B (8×8): A split into ab, as (fragment order a0..a3), B = (big b0, big b1,
// small b0, small b1) of this lane.
__device__ __forceinline__ void mma_3xtf32(float (&c)[4], const unsigned (&ab)[4], const unsigned (&as)[4],
                                           const uint4& b) {
    mma_tf32(c, as[0], as[1], as[2], as[3], b.x, b.y);
    mma_tf32(c, ab[0], ab[1], ab[2], ab[3], b.z, b.w);
    mma_tf32(c, ab[0], ab[1], ab[2], ab[3], b.x, b.y);
}
// Where element e of draft d lies in an array of B fragments ([K / 8][32 lanes] float2: lane 4 d + q of
// chunk kc holds elements 16 (kc / 2) + 4 q + 2 (kc % 2) and the one after it; K a multiple of 16).
__device__ __forceinline__ int fragment_slot(int d, int e) {
    return 2 * ((2 * (e >> 4) + ((e >> 1) & 1)) * 32 + 4 * d + ((e >> 2) & 3)) + (e & 1);
}
// mma_3xtf32 into two accumulators: the big × big product into c, the two correction products into
// cs (each chain half as long; the caller adds cs into c once).
__device__ __forceinline__ void mma_3xtf32_two(float (&c)[4], float (&cs)[4], const unsigned (&ab)[4],
                                               const unsigned (&as)[4], const uint4& b) {
    mma_tf32(cs, as[0], as[1], as[2], as[3], b.x, b.y);
    mma_tf32(cs, ab[0], ab[1], ab[2], ab[3], b.z, b.w);
    mma_tf32(c, ab[0], ab[1], ab[2], ab[3], b.x, b.y);
}
// A B fragment (two fp32 values of this lane) split for mma_3xtf32.
__device__ __forceinline__ uint4 split_b_fragment(float x0, float x1) {
    uint4 b;
    split_tf32(x0, b.x, b.z);
    split_tf32(x1, b.y, b.w);
    return b;
}
// An A fragment (four fp32 values of this lane, in fragment order) split for mma_3xtf32.
__device__ __forceinline__ void split_a_fragment(float a0, float a1, float a2, float a3, unsigned (&ab)[4],
                                                 unsigned (&as)[4]) {
    split_tf32(a0, ab[0], as[0]);
    split_tf32(a1, ab[1], as[1]);
    split_tf32(a2, ab[2], as[2]);
    split_tf32(a3, ab[3], as[3]);
}
// c += A·B for one 16×8×8 tile from fp32 fragments (A: a0..a3, B: b0, b1), each split here.
__device__ __forceinline__ void mma_3xtf32_floats(float (&c)[4], float a0, float a1, float a2, float a3, float b0,
                                                  float b1) {
    unsigned ab[4], as[4];
    split_a_fragment(a0, a1, a2, a3, ab, as);
    mma_3xtf32(c, ab, as, split_b_fragment(b0, b1));
}
