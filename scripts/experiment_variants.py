"""Time source variants of the generated step kernels side by side, and split the replay step's time.

A measurement script for the GPU machine (not part of the library): for each preset at one batch
size it times, with CUDA graphs and medians as ``replayssm bench`` does,

* the conventional step and the replay step (mixed steady state) for each *variant*: the generated
  source with a textual change applied before compilation (an L2 prefetch of a later CTA's rows;
  with ``--cache-hints`` also cache hints on the state rows' loads and stores), so a change
  is measured before the code generator adopts it;
* the replay step with every fill reset to 0 before each step (no records, no flush: the state read
  and the token's own work) and with every fill at L - 1 (each step folds its whole buffer);
* the copy and read floors.

Usage: ``python scripts/experiment_variants.py --presets qwen3.5-4b,kimi-linear --batch 256
--replay-launch 8x16/r80/s11/w --variants "base;fused cumulate"`` (launches as labels; a variant
of some presets only, ``VARIANT_PRESETS``, is timed for those).
"""

from __future__ import annotations

import argparse
import re
import sys
from pathlib import Path

import numpy as np

from replayssm_dsl import variants
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.render_replay import _cumulate
from replayssm_dsl.random_inputs import random_tokens
from replayssm_dsl.runtime import cuda_module
from replayssm_dsl.runtime.benchmark import _floors, capture_graphs, mixed_steady_state, preset_setup, time_graphs

sys.path.insert(0, str(Path(__file__).resolve().parent))  # the scripts' folder: its edit helpers and variant sets
from source_edits import NotApplicable, in_kernel, replay_step_edits  # noqa: E402
import tensor_core_fold  # noqa: E402
import verify_decay_in_products  # noqa: E402

LOAD = "const float4 v = *reinterpret_cast<const float4*>(row + e);"
STORE_HEAD = "*reinterpret_cast<float4*>(row + e) =\n                    make_float4("
VARIANTS = {  # label: [(old, new) or a function of the source, ...] replacements of the generated source, each of which must apply
    "base": [],
}
RENDER_THE_BASE: set[str] = set()  # variants whose edits now render the base source (none)
# The placements of the replay step's fill read, its check and its release arrival measured at 4fbb6df
# (benchmarks/results/experiments/h200-4fbb6df-step-variants.md) edited lines the step no longer has:
# it reads the fill with one atomic that is also its arrival (no fence).


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


for _waves, _ahead in (("half a wave", 264), ("a wave", 528), ("two waves", 1056)):
    VARIANTS[f"L2 prefetch {_waves} ahead"] = [l2_prefetch_ahead(_ahead)]
# KDA's cumulate phase and its barrier as the generator writes them (t = 1, float32 records)
CUMULATE = "".join(f"    {line}\n" for line in _cumulate(variants.get("kda"), {}) + ["__syncthreads();"])
# The same work in the scores' phase: G_n, the token's key into the records' arrays and the decayed
# query and key into arrays of their own, which only the rows read (after the scores' barrier); the
# scores read the token's G_n and key from registers, so no thread reads what another writes here.
CUMULATE_IN_SCORES = """    for (int e = tid; e < K; e += THREADS) {  // the cumulate, in the scores' phase
        const float g = (n ? sh_G[(n - 1) * K + e] : 0.f) + sh_qd[e], dec = expf(g), key = sh_kd[e];
        sh_G[n * K + e] = g;
        sh_key[n * K + e] = key;
        sh_qx[e] = sh_q[e] * dec;
        sh_kx[e] = key * dec;
    }
    float gn[KE], tk[KE];  // this lane's elements of the token's G_n and key
    #pragma unroll
    for (int c = 0; c < KE; ++c) {
        const int e = k_index(c, lane);
        gn[c] = e < K ? (n ? sh_G[(n - 1) * K + e] : 0.f) + sh_qd[e] : 0.f;
        tk[c] = e < K ? sh_kd[e] : 0.f;
    }
"""
# Timed at a7ecd20 (kimi, B = 256, 8x16/r80/s11/w): 0.1846 ms against the base's 0.1801, so not adopted
# (docs/performance.md, "Next steps"); kept to re-measure when the step changes.
FUSED_CUMULATE_EDITS = [  # KDA's replay step (t = 1, a decay vector, the delta rule, float32 records)
    ("    __shared__ __align__(16) float sh_G[NREC * K];\n",
     "    __shared__ __align__(16) float sh_G[NREC * K];\n    __shared__ __align__(16) float sh_qx[K];\n    __shared__ __align__(16) float sh_kx[K];\n"),
    (CUMULATE, CUMULATE_IN_SCORES),
    ("const float kd = sh_key[rec * K + e] * expf(sh_G[(n + j) * K + e] - sh_G[(rec) * K + e]);",
     "const float kd = rec == n ? tk[c] : sh_key[rec * K + e] * expf(gn[c] - sh_G[(rec) * K + e]);"),
    ("ak += kd * sh_key[(n + j) * K + e];", "ak += kd * tk[c];"),
    ("* K + x] = sh_G[n * K + x];", "* K + x] = (n ? sh_G[(n - 1) * K + x] : 0.f) + sh_qd[x];"),
    ("* K + x] = sh_key[n * K + x];", "* K + x] = sh_kd[x];"),
    (", sh_qd + j * K, lane, wv[r] * sq_lane)", ", sh_qx, lane, wv[r] * sq_lane)"),  # the rows' dot products
    (", sh_kd + j * K, lane, wv[r] * sk_lane)", ", sh_kx, lane, wv[r] * sk_lane)"),
]


ROW_FIELDS_LOOP = "    for (int x = THREADS - 1 - tid; x < t * BV; x += THREADS) {\n"
FIRST_BARRIER = "    cp_async_wait();\n    __syncthreads();\n"
_ROW_INPUT = re.compile(r"tok_(\w+)\[\(\(size_t\)\(b \* t_tok \+ j\) \* HV \+ hv\) \* V \+ row\]")


def row_inputs_first(kernel: str, after: str):
    """``kernel``'s per-row token inputs (v; Mamba-2's x and z) copied into shared memory by cp.async
    before the state rows' loads (issued after the line ``after``), so they no longer queue behind the
    rows' bytes and hold no registers; the row fields' loop then reads them there, after the first
    barrier (the rows phase reads the fields two barriers later). Full V-tiles of a V that is a multiple
    of 4 (16-byte copies): every preset at its tuned launches."""
    def edit(text: str) -> str:
        start = text.find(ROW_FIELDS_LOOP)
        end = text.find(FIRST_BARRIER, start)
        if start < 0 or end < 0 or after not in text[:start]:
            raise NotApplicable(f"row inputs first ({kernel})")
        loop = text[start:end]
        names = sorted(set(_ROW_INPUT.findall(loop)))
        if not names:
            raise NotApplicable(f"row inputs first ({kernel}): no row input")
        copies = ""
        for name in names:
            loop = _ROW_INPUT.sub(lambda m: f"sh_raw_{m.group(1)}[x]", loop)
            copies += (f"    __shared__ __align__(16) float sh_raw_{name}[TMAX_ROWS * BV];\n"
                       f"    for (int x = 4 * tid; x < t * BV; x += 4 * THREADS)  // no registers held\n"
                       f"        cp_async16(sh_raw_{name} + x, tok_{name} + ((size_t)(b * t_tok + x / BV) * HV + hv) * V + v0 + x % BV);\n")
        tmax = "TMAX" if "TMAX * BV]" in text else "1"
        copies = copies.replace("TMAX_ROWS", tmax)
        text = text[:start] + text[end:end + len(FIRST_BARRIER)] + loop + text[end + len(FIRST_BARRIER):]
        at = text.index(after) + len(after)
        return text[:at] + copies + text[at:]
    return in_kernel(kernel, edit)


SLOT_CHECK = "dst >= num_pages) return;  // a null slot (padded row), or indices outside this cache\n"
VARIANTS["row inputs first"] = [row_inputs_first("replay_step", SLOT_CHECK)]
VARIANTS["fused cumulate"] = [replay_step_edits(FUSED_CUMULATE_EDITS)]
# Bounds for the replay step at B = 1 (results wrong, time right): where its extra microseconds over
# the conventional step go. The fill read by a plain load instead of the counting atomic (the first
# row's CTA then sets the next fill, racing the others' reads); the records not staged (the buffer's
# bytes, the load that waits on the fill); the head-level phases (the cumulate, the scores, the
# records' appends and their two barriers) left out, the rows run straight after the first barrier.
ARRIVE = ("    if (tid == 0) sh_fill_word = arrive_at_fill(reinterpret_cast<unsigned int*>(fill) + slot);"
          "  // read the fill and count this CTA: one atomic\n")
BARRIER = "    __syncthreads();\n"
LAST_ARRIVAL = "if (tid == 0 && (sh_fill_word >> FILL_BITS) == (gridDim.x * gridDim.y - 1)) set_fill_word("
PLAIN_FILL = [replay_step_edits([
    (ARRIVE, "    if (tid == 0) sh_fill_word = __ldcg(reinterpret_cast<const unsigned int*>(fill) + slot) & FILL_MASK;\n"),
    (LAST_ARRIVAL, "if (tid == 0 && blockIdx.x == 0 && blockIdx.y == 0) set_fill_word(")])]
NO_RECORDS = [replay_step_edits([("    if (!EAGER_RECORDS) {\n", "    if (false) {\n")])]
ROWS_START = BARRIER + "    float wv[RPW];\n"
ROWS_START_REGISTER_WRITES = BARRIER + "    shared_rows_wait(&sh_rows_bar);"  # /w: the records' writes loaded early


def _without_head_phases(text: str) -> str:
    end = text.find(ROWS_START)
    end = text.find(ROWS_START_REGISTER_WRITES) if end < 0 else end
    start = text.rfind(FIRST_BARRIER, 0, end)
    if start < 0 or end < 0:
        raise SystemExit("variant edit does not apply: no head-level phases")
    return text[:start + len(FIRST_BARRIER)] + text[end + len(BARRIER):]


NO_HEAD_PHASES = [in_kernel("replay_step", _without_head_phases)]
FILL_CHECK = re.compile(r"    __syncthreads\(\);  // thread 0's arrival holds the fill\n"
                        r"    int n = \(int\)\(sh_fill_word & FILL_MASK\);\n"
                        r"    if \(n < 0 \|\| n > CAPACITY \|\| \(sh_fill_word >> FILL_BITS\) > \(gridDim.x \* gridDim.y - 1\)\) \{\n"
                        r"        if \(tid == 0\) leave_fill\(reinterpret_cast<unsigned int\*>\(fill\) \+ slot\);\n"
                        r"(?P<stop>        .*\n)        return;\n    \}\n")
RELAXED_FILL_LOAD = ("    unsigned int fill_seen;  // every thread: the word before this CTA's arrival\n"
                     "    asm volatile(\"ld.relaxed.gpu.global.u32 %0, [%1];\" : \"=r\"(fill_seen) : \"l\"(fill + slot));\n")
APPENDS = "    if (!flush) {\n        if (blockIdx.x == 0) {\n"
# thread 0's arrival issued later than the fill's read, its count kept in a register
LATE_ARRIVAL = "    const unsigned int arrival = tid == 0 ? arrive_at_fill(reinterpret_cast<unsigned int*>(fill) + slot) : 0u;\n"


def _fill_check_without_arrival(text: str, check, fill: str) -> str:
    """The generated fill check (``check``: FILL_CHECK's match in ``text``) with ``n`` taken from the C
    expression ``fill`` and no arrival to check or take back; a fill out of range still stops the row."""
    stop = check.group("stop").strip()
    return FILL_CHECK.sub(lambda _: f"    int n = {fill};\n    if (n < 0 || n > CAPACITY) {{ {stop} return; }}\n",
                          text, count=1)


def _arrival_after_first_barrier(text: str) -> str:
    """A correct kernel: every thread reads the fill word itself (a relaxed load, before its CTA's
    arrival), so the records' staging waits for no atomic and no barrier; thread 0 arrives after the
    first barrier (every thread's read done) and its count reaches the CTA at the rows' barrier, where
    a count past the row's CTAs still leaves before anything is written (the records' appends move
    after that barrier; the leave waits for the CTA's copies as before)."""
    check = FILL_CHECK.search(text)
    appends = text.find(APPENDS)
    rows = text.find(BARRIER, appends)
    first = text.rfind(FIRST_BARRIER, 0, appends)
    if check is None or min(appends, rows, first) < 0 or ARRIVE not in text:
        raise SystemExit("variant edit does not apply: arrival after the first barrier")
    leave = ("    if (tid == 0) sh_fill_word = arrival;\n" + BARRIER +
             "    if ((sh_fill_word >> FILL_BITS) > (gridDim.x * gridDim.y - 1)) {  // a count past the row's CTAs\n"
             "        if (tid == 0) leave_fill(reinterpret_cast<unsigned int*>(fill) + slot);\n"
             + check.group("stop") + "        return;\n    }\n")
    at = first + len(FIRST_BARRIER)
    text = text[:at] + LATE_ARRIVAL + text[at:appends] + leave + text[appends:rows] + text[rows + len(BARRIER):]
    text = text.replace(ARRIVE, RELAXED_FILL_LOAD, 1)
    return _fill_check_without_arrival(text, check, "(int)(fill_seen & FILL_MASK)")


VARIANTS["fill loaded, arrival after the first barrier"] = [in_kernel("replay_step", _arrival_after_first_barrier)]
IDS = "    const int src = src_page[b], dst = dst_page[b];\n"
FILL_DECL = "    __shared__ unsigned int sh_fill_word;\n"


def _fill_by_row_atomic(text: str) -> str:
    """The fill word addressed by the batch row (``fill + b``), its atomic issued with the row's first
    loads, before the slot's check: the same word as ``fill + slot`` in the benchmark's batches (slot b
    in row b, no null rows), so the results are right there and the records' staging no longer waits
    for the slot's load before the fill's round trip starts (timing only: a padded row would arrive)."""
    if IDS not in text or FILL_DECL + ARRIVE not in text:
        raise SystemExit("variant edit does not apply: fill by row")
    arrive = ARRIVE.replace("(fill) + slot)", "(fill) + b)")
    text = text.replace(FILL_DECL + ARRIVE, "", 1)
    return text.replace(IDS, IDS + FILL_DECL + arrive, 1)


def _fill_by_row_loaded(text: str) -> str:
    """A bound for a fill passed with the batch (one word per row, read by every thread with the row's
    first loads): no atomic, no barrier before the records' staging; the first row's CTA sets the next
    fill at its end (racing the others' reads only where a row's CTAs do not start together)."""
    check = FILL_CHECK.search(text)
    if IDS not in text or ARRIVE not in text or check is None or LAST_ARRIVAL not in text:
        raise SystemExit("variant edit does not apply: fill by row, loaded")
    text = text.replace(ARRIVE, "", 1).replace(
        IDS, IDS + "    const int fill_row = (int)(__ldcg(reinterpret_cast<const unsigned int*>(fill) + b) & FILL_MASK);\n", 1)
    text = _fill_check_without_arrival(text, check, "fill_row")
    return text.replace(LAST_ARRIVAL, "if (tid == 0 && blockIdx.x == 0 && blockIdx.y == 0) set_fill_word(", 1)


def _fill_loaded_arrival_at_rows(text: str) -> str:
    """A correct kernel: every thread reads the fill word with a relaxed load of its own (the slot's
    check before it), so no atomic and no barrier stand between the slot and the records' staging;
    thread 0 counts the CTA after the rows' barrier (every thread of the CTA has used its read by then)
    and keeps the count in a register to the end, where the row's last arrival writes the next fill as
    before. A fill out of range leaves before the CTA has arrived: nothing to take back."""
    check = FILL_CHECK.search(text)
    appends = text.find(APPENDS)
    rows = text.find(BARRIER, appends)
    if check is None or appends < 0 or rows < 0 or ARRIVE not in text or LAST_ARRIVAL not in text:
        raise SystemExit("variant edit does not apply: fill loaded, arrival at the rows")
    at = rows + len(BARRIER)
    text = text[:at] + LATE_ARRIVAL + text[at:]
    text = text.replace(ARRIVE, "    unsigned int fill_seen;  // every thread: the word as the last launch left it (its low bits)\n"
                        "    asm(\"ld.relaxed.gpu.global.u32 %0, [%1];\" : \"=r\"(fill_seen) : \"l\"(fill + slot));\n", 1)
    text = _fill_check_without_arrival(text, check, "(int)(fill_seen & FILL_MASK)")
    return text.replace(LAST_ARRIVAL, LAST_ARRIVAL.replace("sh_fill_word", "arrival"), 1)


VARIANTS["fill loaded, arrival at the rows"] = [in_kernel("replay_step", _fill_loaded_arrival_at_rows)]


def _fill_loaded_arrival_in_shared(text: str) -> str:
    """As "fill loaded, arrival at the rows", with thread 0's count in shared memory (``sh_fill_word``)
    rather than a register held through the rows (which spills 8-12 bytes at some tuned launches)."""
    text = _fill_loaded_arrival_at_rows(text)
    text = text.replace(LATE_ARRIVAL, "    if (tid == 0) sh_fill_word = arrive_at_fill(reinterpret_cast<unsigned int*>(fill) + slot);\n", 1)
    return text.replace("(arrival >> FILL_BITS)", "(sh_fill_word >> FILL_BITS)", 1)


VARIANTS["fill loaded, arrival at the rows, in shared"] = [in_kernel("replay_step", _fill_loaded_arrival_in_shared)]
VARIANTS["fill by row, one atomic (slot b in row b)"] = [in_kernel("replay_step", _fill_by_row_atomic)]
VARIANTS["fill by row, loaded, no barrier (bound)"] = [in_kernel("replay_step", _fill_by_row_loaded)]
VARIANTS["plain fill load (bound)"] = PLAIN_FILL
VARIANTS["records not staged (bound)"] = NO_RECORDS
VARIANTS["no head-level phases (bound)"] = NO_HEAD_PHASES
VARIANTS["plain fill, no records, no head-level phases (bound)"] = PLAIN_FILL + NO_RECORDS + NO_HEAD_PHASES
# The replay step's decays by the hardware's approximate exponential (``__expf``: ex2.approx of x * log2 e,
# about 2 + 1.16 |x| ulp), every exp of the kernel's text (the scores' record decays, the cumulate, the
# fold) or the scores' alone: what the exponentials on the head-level chain cost.
VARIANTS["fast exponentials"] = [in_kernel("replay_step", lambda text: re.sub(r"(?<![_\w])expf\(", "__expf(", text))]
VARIANTS["fast exponentials, scores only"] = [replay_step_edits([(
    "const float kd = sh_key[rec * K + e] * expf(sh_G[(n + j) * K + e] - sh_G[(rec) * K + e]);",
    "const float kd = sh_key[rec * K + e] * __expf(sh_G[(n + j) * K + e] - sh_G[(rec) * K + e]);")])]
# KDA's fused fold with the records' writes read from shared memory instead of shuffled from the lane
# that holds each record: after the fold's decays, sh_G (NREC x K floats) is dead, and [NREC, BV] of the
# writes fit there (BV = K at a whole head per CTA); each lane stores its record's writes of the warp's
# rows there (16-byte chunks swizzled by record, 4-way conflicts), the fold reads record m's writes as
# broadcasts. A shuffle and four FMAs per row and record, against a broadcast load and four FMAs.
FOLD_WRITES_STORED = (
    "        for (int e = tid; e < K; e += THREADS) sh_ed[e] = expf(sh_G[(n + t - 1) * K + e]);\n"
    "        __syncthreads();\n")
FOLD_WRITES_FROM_SHARED = [  # the writes stored, and the register rows' fold reading them: each exactly once
    (FOLD_WRITES_STORED, FOLD_WRITES_STORED +
     "        static_assert(BV <= K && RPW % 4 == 0 && BV % 32 == 0 && NREC <= 32, \"the writes fit in sh_G\");\n"
     "        float* const sh_wf = sh_G;  // [NREC, BV]: record m's writes of the CTA's rows (sh_G is dead here)\n"
     "        #pragma unroll\n"
     "        for (int r = 0; r < RPW; r += 4) {\n"
     "            const int c = (warp * RPW + r) / 4;\n"
     "            if (lane < n + t) *reinterpret_cast<float4*>(sh_wf + lane * BV + ((c ^ (lane & 7)) * 4)) =\n"
     "                make_float4(wv[r], wv[r + 1], wv[r + 2], wv[r + 3]);\n"
     "        }\n"
     "        __syncwarp();\n"),
    ("const float wm = __shfl_sync(0xffffffffu, wv[r], m);",
     "const float wm = sh_wf[m * BV + ((((warp * RPW + r) >> 2) ^ (m & 7)) << 2) + (r & 3)];"),
]
SHARED_ROWS_FOLD_WRITES = (  # the shared rows' fold, at launches that have shared rows
    "const float wm = __shfl_sync(0xffffffffu, (r0 + r < RPW ? wv[r0 + r] : 0.f), m);",
    "const float wm = r0 + r < RPW ? sh_wf[m * BV + ((((warp * RPW + r0 + r) >> 2) ^ (m & 7)) << 2) + ((r0 + r) & 3)] : 0.f;")
VARIANTS["fold writes from shared"] = [replay_step_edits(FOLD_WRITES_FROM_SHARED),
                                       in_kernel("replay_step", lambda text: text.replace(*SHARED_ROWS_FOLD_WRITES))]
FOLD_LOOP = "for (int m = 0; m < n + t; ++m) {"  # the fused fold's loops over the records (register rows, shared rows)


def fold_loops_as(new: str):
    """The replay step's fused-fold loops over the records, every one of them, rewritten as ``new``."""
    def edit(text: str) -> str:
        if FOLD_LOOP not in text:
            raise NotApplicable("no fold loop")
        return text.replace(FOLD_LOOP, new)
    return in_kernel("replay_step", edit)


# A bound (results wrong, time right): the fused fold without its records' rank-one updates (the rows
# scaled by the decay and stored, the keys decayed, no loop over the records): what the fold's
# arithmetic costs against its state write.
VARIANTS["fold without its records' updates (bound)"] = [fold_loops_as("for (int m = 0; m < 0; ++m) {")]
# The fused fold's loops over the records unrolled (by 2 or 4, a remainder loop after), so the next
# records' key and write loads issue while the current record's FMAs run.
for _u in (2, 4):
    VARIANTS[f"fold loops unrolled by {_u}"] = [fold_loops_as(f"#pragma unroll {_u}\n        " + FOLD_LOOP)]
# A bound for scheduling the folding rows' CTAs first (a fold takes about twice a replay CTA's time,
# and the ones that start last set the step's end): CTA row z takes batch row b = z L + L - 1 for the
# first B / L of them, the other rows in order after. Only the held fills b mod L put the folding
# rows there, so it is timed with them (B a multiple of L), beside the base with the same fills.
VARIANTS["folding rows first (bound, fills held)"] = [replay_step_edits([(
    "    const int b = blockIdx.z, hv = blockIdx.y,",
    "    const int z = blockIdx.z, folding_rows = gridDim.z / WINDOW;\n"
    "    const int b = z < folding_rows ? z * WINDOW + WINDOW - 1\n"
    "                                   : (z - folding_rows) / (WINDOW - 1) * WINDOW + (z - folding_rows) % (WINDOW - 1), hv = blockIdx.y,")])]
HELD_FILLS = {"folding rows first (bound, fills held)"}  # variants timed (besides) with the fills b mod L held
VARIANTS.update(tensor_core_fold.VARIANTS)
VARIANTS.update(verify_decay_in_products.VARIANTS)  # verify's (variant_tests.py runs the GPU tests with it)
VARIANT_TEST_LAUNCH = {**tensor_core_fold.TEST_LAUNCH, **verify_decay_in_products.TEST_LAUNCH}  # (the rest: 8x8/r64)
VARIANT_PRESETS = {"fused cumulate": ("kimi-linear",), "fast exponentials, scores only": ("kimi-linear",), "fold writes from shared": ("kimi-linear",),
                   **verify_decay_in_products.PRESETS}  # variants that apply to some presets only
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


def step_inputs(cp, decl, shape, rng, rows: int, sets: int = 4):
    """``sets`` device token sets of one token for ``rows`` rows (float32, ``[rows, 1, ...]``) and an
    output ``[rows, 1, HV, V]``, as the measurement scripts time the steps."""
    tokens = [{k: cp.asarray(v[:, None].astype(np.float32)) for k, v in random_tokens(decl, shape, rng, (rows,)).items()}
              for _ in range(sets)]
    return tokens, cp.empty((rows, 1, shape.heads, shape.v_dim), cp.float32)


def scratch_cache(decl, shape, config, rows, params, launch):
    """A cache of ``rows`` slots at ``launch`` whose kernels render through the current (patched)
    renderer, with small constant state and records."""
    from replayssm_dsl.runtime.cuda_cache import CudaReplayCache
    cache = CudaReplayCache(decl, shape, config, slots=rows, params=params, launch=launch)
    cache.buffers["checkpoint"][...] = 0.01
    cache.baseline_state()[...] = 0.01
    cache.buffers["rec_write"][...] = 0.01
    cache.buffers["rec_key"][...] = 0.05
    return cache


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="qwen3.5-4b,kimi-linear")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--replay-launch", default="4x16", help="a launch label (8x16/r80/s11/w)")
    parser.add_argument("--conv-launch", default="4x8/r80")
    parser.add_argument("--cache-hints", action="store_true", help="also the state rows' cache-hint variants")
    parser.add_argument("--variants", help="labels of the variants to time, separated by ';' (default: all)")
    args = parser.parse_args()
    import cupy as cp

    rows = args.batch
    replay_launch = LaunchConfig.from_label(args.replay_launch)
    conv_launch = LaunchConfig.from_label(args.conv_launch)
    table = []
    for name in args.presets.split(","):
        decl, shape, config, rng, params = preset_setup(name)
        tokens, out = step_inputs(cp, decl, shape, rng, rows)
        chosen = VARIANTS | (CACHE_HINTS if args.cache_hints else {})
        if args.variants:
            chosen = {label: chosen[label] for label in args.variants.split(";")}
        held_misfit = [label for label in chosen if label in HELD_FILLS and rows % config.window]
        if held_misfit:  # before any timing
            raise SystemExit(f"{held_misfit[0]}: --batch must be a multiple of the window L = {config.window}")
        state_bytes = rows * shape.heads * shape.v_dim * shape.k_dim * 4
        copy_ms, read_ms = _floors(cp, state_bytes, 60)
        table.append((name, "floors", f"copy {copy_ms:.5f}", f"read {read_ms:.5f}", ""))
        for label, edits in chosen.items():
            if name not in VARIANT_PRESETS.get(label, (name,)):
                continue
            cuda_module.render_program = patched_renderer(edits)
            times = {}
            for kernel, launch in (("conventional_step", conv_launch), ("replay_step", replay_launch)):
                try:  # every kernel renders (and the edits apply) as the cache builds its first module
                    cache = scratch_cache(decl, shape, config, rows, params, launch)
                except NotApplicable as exc:
                    print(name, label, f"n/a ({exc})", flush=True)
                    break
                batch_dev = mixed_steady_state(cache, rows)
                times[kernel] = time_step(cp, cache, kernel, rows, batch_dev, tokens, out)
                if kernel == "replay_step":
                    times["replay n=0"] = time_step(cp, cache, kernel, rows, batch_dev, tokens, out, fill=0)
                    if label == "base":
                        times["replay n=L-1"] = time_step(cp, cache, kernel, rows, batch_dev, tokens, out,
                                                          fill=config.window - 1)
                    if label == "base" or label in HELD_FILLS:
                        # the fold's share of the mixed steady state: the fills b mod L held (reset before
                        # every step, so the same 1/L of rows fold each time) against the same fills with
                        # the folding rows at L - 2 (no row folds; the mean fill 1/L^2 of a record lower)
                        held = cp.arange(rows, dtype=cp.int32) % config.window
                        times["replay n=b mod L held"] = time_step(cp, cache, kernel, rows, batch_dev, tokens,
                                                                   out, fill=held)
                        times["replay n=b mod L held, no fold"] = time_step(
                            cp, cache, kernel, rows, batch_dev, tokens, out,
                            fill=cp.minimum(held, config.window - 2))
                del cache
                cp.get_default_memory_pool().free_all_blocks()
            if "replay_step" not in times:  # the variant's edits do not apply to this family
                continue
            conv, replay = times["conventional_step"], times["replay_step"]
            extra = "  ".join(f"{k} {v:.5f}" for k, v in times.items() if k.startswith("replay n"))
            table.append((name, f"{label} ({replay_launch.label})", f"conv {conv:.5f} ({conv / copy_ms:.3f} copy)",
                          f"replay {replay:.5f} ({replay / read_ms:.3f} read)", extra))
            print(*table[-1], flush=True)
        cuda_module.render_program = patched_renderer([])
    print("\n| preset | variant | conventional step ms | replay step ms | replay split |")
    print("|---|---|---|---|---|")
    for row in table:
        print("| " + " | ".join(row) + " |")


if __name__ == "__main__":
    main()
