"""Bounds on verify's time: verify T = 8 as generated, beside copies that leave one of its parts out.

A measurement script for the GPU machine (not part of the library): where verify's time goes, as
time rather than stall samples. (It answered two questions: the state rows' and records' DRAM
traffic cost verify 5–11 %, so a verify overlapping one tile's loads with another's work is not
worth building; its head-level phases cost 27–53 %: docs/performance.md.) For each preset at one
batch size it times, with CUDA graphs and medians as ``replayssm bench`` does (verify with its
commit, accepting none):

* ``base``: the generated verify;
* ``rows from cache (bound)``: every CTA reads its rows from the first rows of the buffer (the same
  few KiB for all, so L1 and L2 serve them), so the time is everything but the rows' DRAM bytes and
  latency: what the kernel's own work costs when the rows are free, at the same registers and
  occupancy;
* ``records not staged (bound)``: the buffer's records are not copied to shared memory;
* ``rows from cache, records not staged (bound)``;
* each phase left out in turn (the drafts' fields, the cumulate, the scores, the drafts' recurrence,
  and the first three together): what each phase costs in time, where stall sampling gives shares of
  samples;
* ``key-group work left out (bound)``: what the value heads of one key group could share (the drafts'
  key and query fields, the records' keys, the scores), left out of every CTA: verify with that work
  done once per key group and nothing else changed, as a bound (GDN and Mamba-2; at ``75b1f5a``);
* correct kernels that change an order or save work, timed before the generator adopts them (at
  ``8fa44e7`` none of those still here was faster: the fill loaded before the rows, the scores of the
  key blocks in use only, the drafts' queries split for 3xTF32 once by the cumulate; at ``b69cb6d`` and
  ``ea41175`` neither the drafts past the warps' count loaded before the rows nor the fill and the
  records' copies moved before them);
* ``flush_for_verify: checks only (bound)``: the fold launched before verify keeps its checks and
  early exits (no row folds in this benchmark) but drops the fold's registers and shared memory, so
  more of its CTAs fit on an SM; and ``flush_for_verify not launched (bound)``;

and the read floor, with verify's state bytes (one state-sized read) for scale. The bounds are not
correct kernels: they only say where the time goes.

Usage: ``python scripts/experiment_verify_bounds.py --presets qwen3.5-4b,nemotron-nano-4b,kimi-linear``
(launch shapes: ``--launch PRESET=LABEL`` or ``PRESET=WARPS,ROWS[,REGS]``, default the ones tuned in the latest headline;
``--tensor-cores-under-cap`` renders verify's rows on tensor cores under a register cap too, where the
generator's rule, ``tensor_core_verify``, takes the SIMT rows; ``--speculative`` also times the base
as ``replayssm bench``'s spec8, with commits that accept, so the fills move and some rows fold first).
"""

from __future__ import annotations

import argparse
import re

from experiment_variants import NotApplicable, in_kernel, patched_renderer, scratch_cache  # this folder's script
import verify_decay_in_products  # this folder's too
from replayssm_dsl.lowering import render_replay
from replayssm_dsl.lowering.launch import LaunchConfig
from replayssm_dsl.lowering.render_verify_mma import verify_fits_tensor_cores
from replayssm_dsl.runtime import cuda_module
from replayssm_dsl.runtime.benchmark import (_floors, capture_graphs, mixed_steady_state, preset_setup, time_graphs,
                                             time_speculative, verify_and_commit, verify_inputs)

TUNED = {name: LaunchConfig.from_label(label) for name, label in {  # verify's launch shapes at B = 256, 6a3caed headline
    "nemotron-nano-4b": "5x16/r96/f4", "nemotron-super-120b": "4x16/r96/f4",
    "qwen3.5-4b": "8x16/r80/f6", "qwen3.5-122b": "8x16/r80/f6", "kimi-linear": "8x16"}.items()}
ROW_ADDRESS = "checkpoint + (((size_t)page * HV + hv) * V + row) * K + 4 * (quad + 4 * m)"
RECORD_STAGE = "    if (!flush) {\n        stage_floats"


def _replace(old: str, new: str, label: str, kernel: str = "verify"):
    def edit(text: str) -> str:
        if old not in text:
            raise NotApplicable(label)
        return text.replace(old, new, 1)
    return in_kernel(kernel, edit)


def _light_flush_check(text: str) -> str:
    """flush_for_verify with its checks only: the fold after ``if (!(flush)) return;`` becomes one store
    that no row reaches in this benchmark (no fill reaches n + t > capacity), so the kernel keeps its
    loads and early exits but needs few registers and no shared memory."""
    check = "if (!(flush)) return;\n"
    if check not in text or "\n}\n" not in text[text.index(check):]:
        raise NotApplicable("flush_for_verify: checks only")
    start = text.index(check) + len(check)
    return text[:start] + "    checkpoint[0] = 0.f;  // a bound: never reached here" + text[text.index("\n}\n", start):]


CACHED_ROWS = _replace(ROW_ADDRESS, "checkpoint + (size_t)rw * K + 4 * (quad + 4 * m)", "rows from cache")
NO_RECORDS = _replace(RECORD_STAGE, "    if (!flush && t < 0) {\n        stage_floats", "records not staged")
NO_FIELDS = _replace("for (int j = warp; j < t; j += WARPS) {", "for (int j = warp; j < 0; j += WARPS) {", "no fields")
# (verify with its scalar decays in the products, lowering's decay_in_products, has no cumulate: its
# drafts' decay sums on the last warp are what it leaves out)
NO_CUMULATE = [_replace("for (int e = tid; e < K; e += THREADS) {\n        float acc", "for (int e = tid; e < 0; e += THREADS) {\n        float acc",
                        "no cumulate"),
               _replace("if (warp == WARPS - 1) {  // every draft's log-decay", "if (warp == WARPS - 1 && t < 0) {  // every draft's log-decay",
                        "no drafts' decay sums")]
NO_SCORES = [_replace("for (int combo = warp; combo < ((NREC", "for (int combo = warp; combo < 0 * ((NREC", "no scores (tensor cores)"),
             _replace("for (int j = 0; j < t; ++j) {\n        for (int i = VERIFY_SCORE_RECORDS",
                      "for (int j = 0; j < 0; ++j) {\n        for (int i = VERIFY_SCORE_RECORDS", "no scores (SIMT)")]
# What the value heads of one key group could share (the drafts' keys and queries, the records' keys, the
# scores' products), left out of every CTA: a bound on verify with that work done once per key group (GDN's
# 2 or 4 heads, Mamba-2's 12 or 16; KDA has none). The cumulate, which decays the keys and queries per
# value head, stays, and so do the scalar fields (decay, beta); the scores' decay factors go with them.
_KEY_GROUP_STORE = re.compile(r"            if \(e < K\) \{ \(sh_key \+ n \* K\)\[j \* K \+ e\] = [^;]+; sh_q\[j \* K \+ e\] = [^;]+; \}\n")


def _no_key_group_fields(text: str) -> str:
    """The drafts' key and query fields (their loads, norms and stores to shared memory) left out: the
    stores go, the norms' warp sums become lane sums (a shuffle whose result is unused is not dropped),
    and the compiler drops the work whose only use they were."""
    start = text.find(RECORDS_END)
    end = text.find("    cp_async_wait();\n", start)
    fields = text[start:end]
    if "#define GROUP 1\n" in text or start < 0 or len(_KEY_GROUP_STORE.findall(fields)) != 1:
        raise NotApplicable("no key-group fields (a key per value head, or no such store)")
    fields = _KEY_GROUP_STORE.sub("", fields, count=1).replace("rsqrtf(warp_sum(ss) + ", "rsqrtf(ss + ")
    return text[:start] + fields + text[end:]


NO_KEY_GROUP_FIELDS = in_kernel("verify", _no_key_group_fields)
NO_RECORD_KEYS = _replace("        stage_floats<VEC == 4>(sh_key, rec_key", "        if (t < 0) stage_floats<VEC == 4>(sh_key, rec_key",
                          "records' keys not staged")
NO_RECURRENCE = _replace("        if (j >= t) break;", "        if (j >= 0) break;", "no drafts' recurrence")
LIGHT_FLUSH_CHECK = in_kernel("flush_for_verify", _light_flush_check)
ROWS_START = "    constexpr int MT = (RPW + 15) / 16;  // 16-row tiles per warp\n"
FILL_LOAD = "    int n = fill[slot];\n"


def _before_rows(lines: str, label: str):
    """``lines`` put before the state rows' loads (the fields' and the cumulate's inputs then no
    longer queue behind the rows' bytes)."""
    return _replace(ROWS_START, lines + ROWS_START, label)


# correct kernels, in a different order or with less work: candidates for the generator
FILL_FIRST = [_replace(FILL_LOAD, "", "fill before the rows"), _before_rows(FILL_LOAD, "fill before the rows")]
USED_SCORES = _replace("for (int combo = warp; combo < ((NREC + 15) / 16) * PARTS; combo += WARPS) {",
                       "for (int combo = warp; combo < ((n + t + 15) / 16) * PARTS; combo += WARPS) {", "scores of used keys only")


def _queries_split_once(text: str) -> str:
    """The cumulate stores the drafts' decayed queries split for 3xTF32 (uint4 B fragments), so the
    products read them without splitting (keys still split at use: splitting both spills at 128
    registers). Scalar decays or none (a decay vector's static arrays leave no room for them)."""
    if "sh_G[NREC * K]" in text:
        raise NotApplicable("queries split once (decay vector)")
    edits = [("    __shared__ float sh_sq[", "    __shared__ __align__(16) uint4 sh_qs[4 * K];  // split B fragments\n    __shared__ float sh_sq["),
             ("sh_qd[y] = sh_q[j * K + e] * dec;", "split_into(sh_qs, y, sh_q[j * K + e] * dec);"),
             ("sh_qd[y] = 0.f;", "split_into(sh_qs, y, 0.f);"),
             ("const float2 fq = reinterpret_cast<const float2*>(sh_qd)[kc * 32 + lane];\n        const uint4 bq = split_b_fragment(fq.x, fq.y);",
              "const uint4 bq = sh_qs[kc * 32 + lane];"),
             ("    const int b = blockIdx.z,", "    auto split_into = [](uint4* f, int y, float x) {\n"
              "        unsigned big, small; split_tf32(x, big, small);\n"
              "        unsigned* w = reinterpret_cast<unsigned*>(f + (y >> 1)) + (y & 1); w[0] = big; w[2] = small; };\n"
              "    const int b = blockIdx.z,")]
    for old, new in edits:
        if old not in text:
            raise NotApplicable(f"queries split once: {old[:40]!r}")
        text = text.replace(old, new, 1)
    return text


QUERIES_SPLIT_ONCE = in_kernel("verify", _queries_split_once)
_FIRST_VECTOR = re.compile(r"    pre_(\w+)\[i\] = \(warp < t && e < K\) \? (.*) : 0\.f;\n")
_FIRST_SCALAR = re.compile(r"    const float pre_(\w+) = warp < t \? (.*) : 0\.f;  //.*\n")
SECOND = "(b * t_tok + warp + WARPS)"


def _second_drafts_before_rows(text: str) -> str:
    """Where a warp runs two drafts (fewer warps than drafts: nano's and super's verify at T = 8),
    its second draft's (j = warp + WARPS) token inputs are loaded into registers before the rows
    too, as ``first_draft_loads`` loads the first's."""
    vectors, scalars = _FIRST_VECTOR.findall(text), _FIRST_SCALAR.findall(text)
    if ROWS_START not in text or not vectors:
        raise NotApplicable("second drafts before the rows")
    loads = "".join(f"    float pre2_{n}[KE];\n    #pragma unroll\n    for (int i = 0; i < KE; ++i) {{ const int e = k_index(i, lane); "
                    f"pre2_{n}[i] = (warp + WARPS < t && e < K) ? {load.replace('(b * t_tok + warp)', SECOND)} : 0.f; }}\n"
                    for n, load in vectors)
    loads += "".join(f"    const float pre2_{n} = warp + WARPS < t ? {load.replace('(b * t_tok + warp)', SECOND)} : 0.f;\n"
                     for n, load in scalars)
    head, tail = text.split(ROWS_START, 1)
    for n, _ in vectors:
        tail = tail.replace(f"(j == warp ? pre_{n}[i] : ", f"(j == warp ? pre_{n}[i] : j == warp + WARPS ? pre2_{n}[i] : ")
    for n, _ in scalars:
        tail = tail.replace(f"(j == warp ? pre_{n} : ", f"(j == warp ? pre_{n} : j == warp + WARPS ? pre2_{n} : ")
    return head + loads + ROWS_START + tail


SECOND_DRAFTS = in_kernel("verify", _second_drafts_before_rows)
RECORDS_END = "    for (int j = warp; j < t; j += WARPS) {\n"
PAGE_START = "    int page = src;\n"


def _records_before(place: str, label: str):
    """The fill, its check and the records' copies (``stage_floats``, ``stage_writes``: cp.async) moved
    before ``place``, so the records' bytes are asked for before the state rows' (the rows then wait
    for the fill's round trip)."""
    def edit(text: str) -> str:
        if FILL_LOAD not in text or place not in text:
            raise NotApplicable(label)
        start, end = text.index(FILL_LOAD), text.index(RECORDS_END)
        block, text = text[start:end], text[:start] + text[end:]
        return text.replace(place, block + place, 1)
    return in_kernel("verify", edit)


CUMULATE_LOOP = re.compile(
    r"    for \(int e = tid; e < K; e \+= THREADS\) \{\n"
    r"        float acc = n \? sh_G\[n - 1\] : 0\.f;\n"
    r"        for \(int j = 0; j < t; \+\+j\) \{\n"
    r"            acc \+= sh_g\[j\];\n"
    r"            if \(e == 0\) sh_G\[n \+ j\] = acc;\n"
    r"            const float dec = expf\(acc\);\n"
    r"            const int y = fragment_slot\(j, e\);\n"
    r"(?P<stores>(?:            .*\n)+?)        \}\n"
    r"        for \(int j = t; j < 8; \+\+j\) \{  // the columns past the drafts\n"
    r"            const int y = fragment_slot\(j, e\);\n"
    r"(?P<zeros>(?:            .*\n)+?)        \}\n    \}\n")


def _cumulate_every_thread(text: str) -> str:
    """A correct kernel (scalar decays): the cumulate's (draft column, element) pairs spread over all of
    the CTA's threads, one pair a trip, where only K of them ran, each over the t drafts in turn; each
    pair sums its draft's decays from the last record's in the same order as before (the same bits)."""
    m = CUMULATE_LOOP.search(text)
    if m is None:
        raise NotApplicable("cumulate over every thread")
    loop = ("    for (int x = tid; x < 8 * K; x += THREADS) {  // one (draft column, element) pair a trip\n"
            "        const int j = x / K, e = x % K, y = fragment_slot(j, e);\n"
            "        if (j < t) {\n"
            "            float acc = n ? sh_G[n - 1] : 0.f;\n"
            "            for (int i = 0; i <= j; ++i) acc += sh_g[i];  // the same sums, in the same order\n"
            "            if (e == 0) sh_G[n + j] = acc;\n"
            "            const float dec = expf(acc);\n"
            + m.group("stores") + "        } else {\n" + m.group("zeros") + "        }\n    }\n")
    return text[:m.start()] + loop + text[m.end():]


CUMULATE_EVERY_THREAD = in_kernel("verify", _cumulate_every_thread)
PREFIX_FROM_SHARED = "            for (int i = 0; i <= j; ++i) acc += sh_g[i];  // the same sums, in the same order\n"
PREFIX_FROM_REGISTERS = ("            #pragma unroll\n"
                         "            for (int i = 0; i < 8; ++i) acc += i <= j ? gd[i] : 0.f;  // the same sums (+ 0 past j)\n")


def _cumulate_every_thread_registers(text: str) -> str:
    """The same, each thread's draft decays read into registers once before its pairs (8 independent
    shared loads), so a pair's sum is no chain of dependent shared loads."""
    text = _cumulate_every_thread(text)
    head = "    for (int x = tid; x < 8 * K; x += THREADS) {  // one (draft column, element) pair a trip\n"
    loads = ("    float gd[8];  // the drafts' decays, 0 past t\n    #pragma unroll\n"
             "    for (int i = 0; i < 8; ++i) gd[i] = i < t ? sh_g[i] : 0.f;\n")
    return text.replace(head, loads + head, 1).replace(PREFIX_FROM_SHARED, PREFIX_FROM_REGISTERS, 1)


CUMULATE_EVERY_THREAD_REGISTERS = in_kernel("verify", _cumulate_every_thread_registers)
RECORDS_BEFORE_ROWS = _records_before(ROWS_START, "fill and records before the rows")
RECORDS_FIRST = _records_before(PAGE_START, "fill and records first")
VARIANTS = {"base": [], "rows from cache (bound)": [CACHED_ROWS], "records not staged (bound)": [NO_RECORDS],
            "rows from cache, records not staged (bound)": [CACHED_ROWS, NO_RECORDS],
            # each phase of verify left out (results wrong, time right): what each costs
            "no drafts' fields (bound)": [NO_FIELDS], "no cumulate (bound)": [NO_CUMULATE],
            "no scores (bound)": [NO_SCORES], "no drafts' recurrence (bound)": [NO_RECURRENCE],
            "fields, cumulate, scores left out (bound)": [NO_FIELDS, NO_CUMULATE, NO_SCORES],
            # the work a key group's value heads could share, left out (scalar decays, a key shared by heads)
            "key-group work left out (bound)": [NO_KEY_GROUP_FIELDS, NO_RECORD_KEYS, NO_SCORES],
            # the fold launched before verify: its early exits at low resources, or not launched at all
            "flush_for_verify: checks only (bound)": [LIGHT_FLUSH_CHECK],
            "flush_for_verify not launched (bound)": "skip flush_for_verify",
            # correct kernels, measured at 8fa44e7 and not adopted (no faster): kept to re-measure
            "fill before the rows": FILL_FIRST, "scores of used keys only": [USED_SCORES],
            "queries split once": [QUERIES_SPLIT_ONCE],
            # correct kernels, measured at b69cb6d / ea41175 and not adopted (0.992-1.000; 1.004-1.028)
            "second drafts before the rows": [SECOND_DRAFTS],
            "fill and records before the rows": [RECORDS_BEFORE_ROWS], "fill and records first": [RECORDS_FIRST],
            # a correct kernel, timed at 1d9e0bd's stop (scalar decays only)
            "cumulate over every thread": [CUMULATE_EVERY_THREAD],
            "cumulate over every thread, decays in registers": [CUMULATE_EVERY_THREAD_REGISTERS],
            # a correct kernel, timed on 2026-12-04 (scalar decays, verify on tensor cores); the generator's
            # own without a delta rule since e28b4d5 (decay_in_products), so it edits GDN's only
            **verify_decay_in_products.VARIANTS}
# (variants "values by cp.async before the rows" and "row inputs first", measured at 8fa44e7 and 4ab3644,
# are the generator's own since 959b8a9: lowering/render_row_inputs.py; "scalars before the rows",
# measured at ec03904, is ``first_draft_loads``'s since TUNING_VERSION 19)
# variants whose edits find nothing to change in some families (they print n/a there): under a decay
# vector (KDA) the scores run on SIMT lanes and the static arrays leave no room for split fragments, and
# its keys are per value head (no key group to share)
FAMILY_SPECIFIC = ("key-group work left out (bound)", *verify_decay_in_products.VARIANTS, "scores of used keys only", "queries split once", "cumulate over every thread",
                   "cumulate over every thread, decays in registers")
# (a variant "drafts' key and query loaded before the rows", measured at 2c851b8, is the generator's
# own since 8d0cc0b: ``first_draft_loads`` in lowering/render_blocks.py)


def _either(edits):
    """The first of ``edits`` (alternatives for the families) that applies."""
    def apply(source: str) -> str:
        for edit in edits:
            try:
                return edit(source)
            except NotApplicable:
                continue
        raise NotApplicable("none of the alternatives")
    return apply


def variant_edits(label: str) -> tuple[list, bool]:
    """Variant ``label``'s source edits (alternatives resolved per family) and whether it skips
    ``flush_for_verify``."""
    edits = VARIANTS[label]
    if edits == "skip flush_for_verify":
        return [], True
    return [_either(e) if isinstance(e, list) else e for e in edits], False


def _launches(cache, drafted, tokens, out, t: int, skip_flush: bool) -> None:
    if skip_flush:
        cache._launch("verify", int(drafted["slot"].shape[0]), drafted, tokens, out=out)
        cache.launch_commit(drafted, t)
    else:
        verify_and_commit(cache, drafted, tokens, out, t)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--presets", default="qwen3.5-4b,nemotron-nano-4b,kimi-linear")
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--drafts", type=int, default=8)
    parser.add_argument("--variant", action="append", default=[], help="a label to time (repeatable; default: all)")
    parser.add_argument("--launch", action="append", default=[],
                        help="PRESET=LABEL (8x16/r80/f6) or PRESET=WARPS,ROWS[,REGS] (repeatable)")
    parser.add_argument("--tensor-cores-under-cap", action="store_true",
                        help="verify's rows on tensor cores at any register cap (the generator: only uncapped)")
    parser.add_argument("--speculative", action="store_true",
                        help="also time the base as `replayssm bench`'s spec8: commits that accept (row b accepts "
                             "b mod (T + 1)), so the fills move and some rows fold first")
    args = parser.parse_args()
    if args.tensor_cores_under_cap:
        render_replay.tensor_core_verify = lambda program, launch: verify_fits_tensor_cores(program.shape, program.config)
    unknown = [label for label in args.variant if label not in VARIANTS]
    if unknown:
        parser.error(f"--variant: unknown {unknown}; known: {list(VARIANTS)}")
    import cupy as cp

    launches = dict(TUNED)
    for item in args.launch:
        name, shape = item.split("=")
        launches[name] = LaunchConfig(*map(int, shape.split(","))) if "," in shape else LaunchConfig.from_label(shape)
    rows, t = args.batch, args.drafts
    table = []
    for name in args.presets.split(","):
        decl, shape, config, rng, params = preset_setup(name)
        _, read_ms = _floors(cp, rows * shape.heads * shape.v_dim * shape.k_dim * 4, 60)
        for label in VARIANTS:
            if args.variant and label not in args.variant:
                continue
            edits, skip_flush = variant_edits(label)
            cuda_module.render_program = patched_renderer(edits)
            try:  # every kernel renders (and the edits apply) as the cache builds its first module
                cache = scratch_cache(decl, shape, config, rows, params, launches[name])
            except NotApplicable as exc:
                print(name, label, f"n/a ({exc})", flush=True)
                continue
            batch = mixed_steady_state(cache, rows)
            tokens, drafted, out = verify_inputs(cp, decl, shape, rng, batch, t, sets=2)
            stream, graphs = capture_graphs(cp, lambda i: _launches(cache, drafted, tokens[i], out, t, skip_flush), 2)
            ms = time_graphs(cp, stream, graphs, 60)
            table.append((name, launches[name].label, label, f"{ms:.4f}", f"{ms / read_ms:.2f}"))
            print(*table[-1], flush=True)
            if args.speculative and label == "base":
                ms, _ = time_speculative(cp, cache, drafted, tokens, out, t, 60)
                table.append((name, launches[name].label, f"{label}, speculative (spec{t})", f"{ms:.4f}", f"{ms / read_ms:.2f}"))
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
