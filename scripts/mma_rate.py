"""The tensor cores' ``mma.sync`` m16n8k8 TF32 rate against the FP32 FMA rate, per SM (on the GPU machine).

A measurement script (not part of the library) behind the fused fold on tensor cores
(``experiment_variants.py``'s "fold on tensor cores"): per warp of 16 rows the fold's rank-one
updates over 16 records are 1,024 FMAs per lane on SIMT cores, or 2 × K/8 tiles × 3 (the 3xTF32
split of ``replay_common.cuh``'s ``mma_3xtf32``) = 96 ``mma.sync`` at K = 128. Two kernels, each a
loop of independent chains (8 accumulators per thread) at full occupancy, the mma operands' bits
fixed, give each instruction's throughput in warp instructions per SM per clock (at the device's
reported clock), and the time of the fold's 96 mma against its 1,024 FMAs at those rates.

Usage: ``python scripts/mma_rate.py [--iters 4096]``.
"""

from __future__ import annotations

import argparse

from replayssm_dsl.lowering.render_cuda import COMMON_HEADER

CHAINS = 8  # independent accumulators per thread
KERNELS = r"""
extern "C" __global__ void __launch_bounds__(256) mma_loop(float* out, int iters) {
    const unsigned a = __float_as_uint(1.0f + threadIdx.x * 1e-3f), b = __float_as_uint(0.5f);
    float c[CHAINS][4] = {};
    for (int i = 0; i < iters; ++i) {
        #pragma unroll
        for (int t = 0; t < CHAINS; ++t) mma_tf32(c[t], a, a + 1, a + 2, a + 3, b, b + 1);
    }
    float s = 0.f;
    #pragma unroll
    for (int t = 0; t < CHAINS; ++t) s += c[t][0] + c[t][1] + c[t][2] + c[t][3];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;  // kept live
}
extern "C" __global__ void __launch_bounds__(256) ffma_loop(float* out, int iters) {
    float x[CHAINS];
    #pragma unroll
    for (int t = 0; t < CHAINS; ++t) x[t] = threadIdx.x * 1e-3f + t;
    const float y = 0.999f, z = 1e-3f;
    for (int i = 0; i < iters; ++i) {
        #pragma unroll
        for (int t = 0; t < CHAINS; ++t) x[t] = fmaf(x[t], y, z);
    }
    float s = 0.f;
    #pragma unroll
    for (int t = 0; t < CHAINS; ++t) s += x[t];
    out[blockIdx.x * blockDim.x + threadIdx.x] = s;
}
"""
FOLD_MMAS, FOLD_FMAS = 96, 1024  # per warp of 16 rows at K = 128 and 16 records (mma.sync, FFMA per lane)


def source() -> str:
    """The two kernels after the shared device helpers (``mma_tf32`` among them), with the macros
    those helpers need for a K = 128 layout."""
    defines = "\n".join(f"#define {k} {v}" for k, v in
                        {"K": 128, "V": 128, "VEC": 4, "KCH": 1, "BV": 128, "RPW": 16, "NREC": 25,
                         "THREADS": 256, "W_VEC": 4, "W_PITCH": 132, "CHAINS": CHAINS}.items())
    return defines + "\n" + COMMON_HEADER.read_text() + KERNELS


def rates(iters: int) -> dict:
    """Warp instructions per SM per clock of each kernel (median of 20 timed launches)."""
    import cupy as cp
    from replayssm_dsl.runtime.benchmark import _median_ms
    module = cp.RawModule(code=source(), options=("-std=c++17",))
    dev = cp.cuda.Device()
    sms = dev.attributes["MultiProcessorCount"]
    clock_hz = dev.attributes["ClockRate"] * 1e3
    blocks, threads = sms * 8, 256  # 64 warps per SM
    out = cp.empty(blocks * threads, cp.float32)
    result = {"sms": sms, "clock_ghz": clock_hz / 1e9}
    for name in ("mma_loop", "ffma_loop"):
        kernel = module.get_function(name)
        ms = _median_ms(cp, lambda i: kernel((blocks,), (threads,), (out, cp.int32(iters))), 20)
        warp_instructions = blocks * threads // 32 * iters * CHAINS
        result[name] = warp_instructions / sms / (ms * 1e-3 * clock_hz)
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--iters", type=int, default=4096)
    r = rates(parser.parse_args().iters)
    mma, ffma = r["mma_loop"], r["ffma_loop"]
    print(f"{r['sms']} SMs at {r['clock_ghz']:.2f} GHz (reported): mma.sync m16n8k8 tf32 {mma:.3f}, "
          f"FFMA {ffma:.3f} warp instructions per SM per clock")
    print(f"the fold's products per warp: {FOLD_MMAS} mma take {FOLD_MMAS / mma:.0f} SM clocks, "
          f"{FOLD_FMAS} FFMA {FOLD_FMAS / ffma:.0f} (mma / FFMA time {FOLD_MMAS / mma / (FOLD_FMAS / ffma):.2f})")


if __name__ == "__main__":
    main()
