"""The replay step's fused fold on tensor cores, as source edits (a measurement, not part of the
library; ``experiment_variants.py`` times them, ``variant_tests.py`` runs the GPU tests with them).

Timed at B = 256 it is correct and 2–3 % slower than the SIMT fold
(``benchmarks/results/experiments/h200-2026-12-02-81ece37-fold-on-tensor-cores-B256.md``); kept to
re-measure.
"""

from __future__ import annotations

import re

from source_edits import NotApplicable, in_kernel

# The fused fold on tensor cores (fp32 state, RPW = 16, K a multiple of 16, shared rows): per warp the
# records' rank-one updates are one [16 rows, n] x [n, K] product, ``mma.sync`` m16n8k8 with verify's
# 3xTF32 split, accumulated onto the decayed rows in fragment layout (lane (g, q) holds rows g and
# g + 8, elements 16 m + 4 q .. + 3). The shared rows are read there in that layout; the register rows
# are stored decayed first (per-lane layout) and read back from L2 (``__ldcg``, after ``__syncwarp``).
# The writes (A operands) come from ``sh_w`` (record n stored by lane n) or, where the launch keeps
# them in registers (``/w``), from ``sh_G`` (a decay vector's: dead after the decays) as [NREC, 16] per
# warp, or else by shuffles from the lanes that hold them. Modules at other launches stay unedited.
FOLD_START = "    if (flush) {\n        for (int x = tid; x < (n + t) * K; x += THREADS) {\n"
FOLD_END = "\n    if (tid == 0 && (sh_fill_word"
FOLD_LOOP = "        for (int m = 0; m < n + t; ++m) {"  # the SIMT fold's first loop over the records


def _fold_on_tensor_cores(text: str, passes: int = 2) -> str:
    """The replay step's text (``text``) with its fold after the keys' decays replaced: K in ``passes``
    passes of 2·K/16/passes accumulator tiles each (2 keeps 32 accumulators per lane)."""
    if FOLD_START not in text or "sh_rows" not in text:
        raise NotApplicable("no fused fold with shared rows")
    start = text.index(FOLD_START)
    barrier = text.index("        __syncthreads();\n", start) + len("        __syncthreads();\n")
    end = text.index(FOLD_END, barrier)
    vector_decay = "sh_ed[e]" in text[start:end]
    writes_in_shared = "__shared__ __align__(16) float sh_w[" in text
    if writes_in_shared:  # the staged records, and record n stored by lane n
        stash = ("        if (lane == n) {  // the token's writes into record n's place (past the staged records)\n"
                 "            #pragma unroll\n"
                 "            for (int r = 0; r < RPW; ++r) sh_w[n * W_PITCH + warp * RPW + r] = wv[r];\n"
                 "        }\n")
        a_fragment = ("                split_a_fragment(l0 ? sh_w[m0 * W_PITCH + warp * RPW + g] : 0.f, l0 ? sh_w[m0 * W_PITCH + warp * RPW + g + 8] : 0.f,\n"
                      "                                 l1 ? sh_w[m1 * W_PITCH + warp * RPW + g] : 0.f, l1 ? sh_w[m1 * W_PITCH + warp * RPW + g + 8] : 0.f, ab, as);\n")
    elif vector_decay:  # sh_G (NREC x K) is dead after the decays: [NREC, RPW] of the warp's writes there
        stash = ("        static_assert(WARPS * RPW <= K, \"the writes fit in sh_G\");\n"
                 "        float* const sh_wf = sh_G + warp * RPW * NREC;  // [NREC, RPW]: the warp's writes (sh_G is dead)\n"
                 "        if (lane < n + t) {\n"
                 "            #pragma unroll\n"
                 "            for (int r = 0; r < RPW; r += 4) *reinterpret_cast<float4*>(sh_wf + lane * RPW + r) = make_float4(wv[r], wv[r + 1], wv[r + 2], wv[r + 3]);\n"
                 "        }\n")
        a_fragment = ("                split_a_fragment(l0 ? sh_wf[m0 * RPW + g] : 0.f, l0 ? sh_wf[m0 * RPW + g + 8] : 0.f,\n"
                      "                                 l1 ? sh_wf[m1 * RPW + g] : 0.f, l1 ? sh_wf[m1 * RPW + g + 8] : 0.f, ab, as);\n")
    else:  # the writes in registers only (lane m: record m's, zeros past n + t): 8 shuffles per fragment element
        stash = ""
        a_fragment = ("                float a[4] = {0.f, 0.f, 0.f, 0.f};\n"
                      "                #pragma unroll\n"
                      "                for (int gg = 0; gg < 8; ++gg) {\n"
                      "                    const float x0 = __shfl_sync(0xffffffffu, wv[gg], m0), x1 = __shfl_sync(0xffffffffu, wv[gg + 8], m0);\n"
                      "                    const float x2 = __shfl_sync(0xffffffffu, wv[gg], m1), x3 = __shfl_sync(0xffffffffu, wv[gg + 8], m1);\n"
                      "                    if (g == gg) { a[0] = x0; a[1] = x1; a[2] = x2; a[3] = x3; }\n"
                      "                }\n"
                      "                split_a_fragment(a[0], a[1], a[2], a[3], ab, as);\n")
    # the register rows' decay as the generator writes it (the lines before its first loop over the records)
    reg_decay = text[barrier:text.index(FOLD_LOOP, barrier)]
    scale = ("const float4 d = *reinterpret_cast<const float4*>(sh_ed + e);" if vector_decay
             else "const float4 d = make_float4(a, a, a, a);")  # (a: the scalar decay, from those lines)
    body = (
        "        static_assert(RPW == 16 && K % 16 == 0 && VEC == 4 && sizeof(STATE_T) == 4, \"the fold's tensor-core layout\");\n"
        + stash + reg_decay +
        "        #pragma unroll\n        for (int r = 0; r < RREG; ++r) {  // the register rows, decayed, through L2\n"
        "            const int row = v0 + warp * RPW + r;\n"
        "            if (r < RPW && row < V) store_row(checkpoint + (((size_t)dst * HV + hv) * V + row) * K, s[r], lane);\n"
        "        }\n"
        "        __syncwarp();\n"
        "        {\n"
        "        const int g = lane >> 2, q = lane & 3;\n"
        "        STATE_T* const dst_rows = checkpoint + ((size_t)dst * HV + hv) * V * K + (size_t)(v0 + warp * RPW) * K;\n"
        f"        constexpr int PASSES = {passes}, GROUPS = K / 16 / PASSES;  // passes over K, 16-element groups each\n"
        "        #pragma unroll\n"
        "        for (int hf = 0; hf < PASSES; ++hf) {  // 2 GROUPS tiles of 8 columns each\n"
        "            float c[2 * GROUPS][4];\n"
        "            #pragma unroll\n"
        "            for (int h = 0; h < 2; ++h) {\n"
        "                const int r = g + 8 * h, row = v0 + warp * RPW + r;\n"
        "                #pragma unroll\n"
        "                for (int mm = 0; mm < GROUPS; ++mm) {\n"
        "                    const int e = 16 * (GROUPS * hf + mm) + 4 * q;\n"
        "                    float4 x = make_float4(0.f, 0.f, 0.f, 0.f);\n"
        "                    if (row < V) {\n"
        "                        if (r < RREG) x = __ldcg(reinterpret_cast<const float4*>(dst_rows + r * K + e));\n"
        "                        else {\n"
        "                            " + scale + "\n"
        "                            x = *reinterpret_cast<const float4*>(sh_rows + ((size_t)warp * SRPW + r - RREG) * K + e);\n"
        "                            x.x *= d.x; x.y *= d.y; x.z *= d.z; x.w *= d.w;\n"
        "                        }\n"
        "                    }\n"
        "                    c[2 * mm][2 * h] = x.x; c[2 * mm + 1][2 * h] = x.y; c[2 * mm][2 * h + 1] = x.z; c[2 * mm + 1][2 * h + 1] = x.w;\n"
        "                }\n"
        "            }\n"
        "            for (int k0 = 0; k0 < n + t; k0 += 8) {\n"
        "                const int m0 = k0 + q, m1 = k0 + q + 4;\n"
        "                const bool l0 = m0 < n + t, l1 = m1 < n + t;\n"
        "                unsigned ab[4], as[4];\n"
        + a_fragment +
        "                #pragma unroll\n"
        "                for (int mm = 0; mm < GROUPS; ++mm) {\n"
        "                    const int e = 16 * (GROUPS * hf + mm) + 4 * (g >> 1) + 2 * (g & 1);\n"
        "                    const float2 k0v = l0 ? *reinterpret_cast<const float2*>(sh_key + m0 * K + e) : make_float2(0.f, 0.f);\n"
        "                    const float2 k1v = l1 ? *reinterpret_cast<const float2*>(sh_key + m1 * K + e) : make_float2(0.f, 0.f);\n"
        "                    mma_3xtf32(c[2 * mm], ab, as, split_b_fragment(k0v.x, k1v.x));\n"
        "                    mma_3xtf32(c[2 * mm + 1], ab, as, split_b_fragment(k0v.y, k1v.y));\n"
        "                }\n"
        "            }\n"
        "            #pragma unroll\n"
        "            for (int h = 0; h < 2; ++h) {\n"
        "                const int r = g + 8 * h, row = v0 + warp * RPW + r;\n"
        "                if (row < V) {\n"
        "                    #pragma unroll\n"
        "                    for (int mm = 0; mm < GROUPS; ++mm) {\n"
        "                        const int e = 16 * (GROUPS * hf + mm) + 4 * q;\n"
        "                        *reinterpret_cast<float4*>(dst_rows + r * K + e) =\n"
        "                            make_float4(c[2 * mm][2 * h], c[2 * mm + 1][2 * h], c[2 * mm][2 * h + 1], c[2 * mm + 1][2 * h + 1]);\n"
        "                    }\n"
        "                }\n"
        "            }\n"
        "        }\n"
        "        }\n"
        "    }")
    return text[:barrier] + body + text[end:]


def fold_on_tensor_cores(passes: int):
    """The edit for modules whose layout it serves (float32 state, 16 rows per warp, K a multiple of 16)."""
    fold = in_kernel("replay_step", lambda text: _fold_on_tensor_cores(text, passes))

    def edit(source: str) -> str:
        k = re.search(r"^#define K (\d+)$", source, re.M)
        if "#define RPW 16\n" not in source or "typedef float STATE_T;\n" not in source or not k or int(k.group(1)) % 16:
            return source  # another launch's module (the conventional group's, say): unedited
        return fold(source)
    return edit


VARIANTS = {}  # label: [edit of the whole source]
VARIANTS["fold on tensor cores"] = [fold_on_tensor_cores(2)]
VARIANTS["fold on tensor cores, K in 4 passes"] = [fold_on_tensor_cores(4)]
# Two bounds of it (results wrong, time right): the register rows not read back through L2 (their
# fragments start at zero), and no products (the rows decayed and stored in fragment layout only).
TC_REGISTER_ROWS_BACK = "if (r < RREG) x = __ldcg(reinterpret_cast<const float4*>(dst_rows + r * K + e));"
TC_PRODUCTS = "for (int k0 = 0; k0 < n + t; k0 += 8) {"


def _tc_fold_then(old: str, new: str):
    """The fold on tensor cores with ``old`` (once in its text) replaced by ``new``: one of its bounds."""
    def edit(source: str) -> str:
        edited = fold_on_tensor_cores(2)(source)
        if edited == source:
            return source  # a module the fold leaves unedited
        if edited.count(old) != 1:
            raise SystemExit(f"bound edit does not apply once to the fold on tensor cores: {old[:60]!r}")
        return edited.replace(old, new)
    return edit


VARIANTS["fold on tensor cores, register rows not read back (bound)"] = [
    _tc_fold_then(TC_REGISTER_ROWS_BACK, "if (r < RREG) x = make_float4(0.f, 0.f, 0.f, 0.f);")]
VARIANTS["fold on tensor cores, no products (bound)"] = [_tc_fold_then(TC_PRODUCTS, "for (int k0 = 0; k0 < 0; k0 += 8) {")]
TEST_LAUNCH = {label: "8x16/r80/s11/w" for label in VARIANTS}  # a launch with shared rows, where every edit applies
