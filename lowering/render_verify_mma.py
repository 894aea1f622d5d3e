"""Lowering layer: verify's rows on tensor cores (fp32 state, K a multiple of 16, at most 8 drafts).

All drafts at once: a warp's rows times the drafts' decayed queries and keys is a [16, K] x [K, 8]
product per 16 rows (``mma.sync`` m16n8k8, tf32 inputs split in two for fp32 accuracy:
``mma_3xtf32`` in ``replay_common.cuh``), and the buffered records' part a [16, n] x [n, 8] one
(write records against the scores). No warp reductions. Each lane then holds, for rows g and g + 8
of each 16-row tile (g = lane / 4), the sums of drafts 2·(lane % 4) and 2·(lane % 4) + 1; the drafts'
own T×T triangular recurrence (delta rule: draft j's write needs the writes of drafts before it)
runs on those, one shuffle per draft inside each quad of lanes.

State fragments: lane (g, q = lane % 4) loads the float4s q + 4m (m < K / 16) of rows g and g + 8.
The product sums over K in any order, so chunk 2m + c takes elements 2c and 2c + 1 of the lane's
float4 m as the fragment's columns q and q + 4; the queries' and keys' fragments (in shared memory,
in lane order, split at use) use the same element order. For a scalar decay (or none), and for a
decay vector whose records keep decay-scaled keys (record_keys.py), the scores are tensor-core
products too (``mma_scores``), unless the launch asks for them on CUDA cores (``/c``,
``tensor_core_scores``).
"""

from __future__ import annotations

from .launch import FRAGMENT_DRAFTS, verify_fits_tensor_cores
from .record_keys import key_shift
from .render_blocks import Facts, guarded, output_store, record_write_store
from .render_expr import ExprRenderer
from .render_row_fields import epilogue, row_field

LANE_IDS = "const int g = lane >> 2, quad = lane & 3;  // fragment row (and draft column) g, quarter of K quad"


def tensor_core_verify(program, launch) -> bool:
    """Whether verify's rows run on tensor cores: fp32 state, K a multiple of 16, at most 8 drafts
    (``verify_fits_tensor_cores``), and no register cap below 128 (a lane holds K / 2 state values per
    16-row tile however few rows its warp owns: under a cap they spill, and the SIMT rows serve those
    launch shapes) unless the launch moves some of them through shared memory (``shared_fragments``,
    ``shared_fragment_copies``). ``sh_qd`` and ``sh_kd`` then hold ``FRAGMENT_DRAFTS`` drafts' worth of
    fragments."""
    return verify_fits_tensor_cores(program.shape, program.config) and (
        launch.max_registers >= 128 or launch.shared_fragments > 0)


def tensor_core_scores(program, launch) -> bool:
    """Whether verify's scores run on tensor cores (``mma_scores``): its rows do (``tensor_core_verify``),
    the decay factors out of the products (a scalar decay or none, or a decay vector whose records keep
    decay-scaled keys: ``key_shift``), and the launch does not take them on CUDA cores
    (``simt_scores``). One product of 8 draft columns per part costs as much for one draft as for
    eight; the SIMT trips' work follows the drafts' count, so for few drafts they may be faster."""
    decl = program.declaration
    return (tensor_core_verify(program, launch) and not launch.simt_scores
            and (decl.decay_form != "vector" or key_shift(decl, program.config) is not None))


def decay_in_products(program, launch) -> bool:
    """Whether verify applies its drafts' scalar decays to the state products' results instead of to
    their operands: its scores run on tensor cores (``tensor_core_scores``), the decay is one scalar per
    draft, and there is no delta rule. Then S (e^{G_{n+j}} q_j) = e^{G_{n+j}} (S q_j): the fields write
    the raw queries in B-fragment order themselves (``fields(query_fragments=True)``), each lane scales
    its accumulator columns once after the state products (``_products``), and the last warp sums the
    drafts' decays while the others write the fields (``draft_decay_scan``), so the cumulate phase and
    the barrier after it go. Measured on the H200 at B = 256 (docs/performance.md): 2.1–3.5 % off
    Mamba-2's verify T = 8; the same edit put 1.4–1.9 % onto Gated DeltaNet's, whose key fragments
    are scaled too, so delta rules keep the cumulate."""
    decl = program.declaration
    return tensor_core_scores(program, launch) and decl.decay_form == "scalar" and not decl.is_delta


def draft_decay_scan(decl, hoisted: tuple = ()) -> list[str]:
    """``decay_in_products``, at the end of the fields (before their barrier): the last warp computes
    every draft's log-decay on a lane (draft j = lane, read straight from the token inputs) and their
    running sums by a shuffle scan into ``sh_Gd`` (G_{n+j} less the buffer's G_{n-1}), so no cumulate
    phase and no barrier wait for them; the fields leave the decays out. ``hoisted``: as the fields'
    (``first_draft_loads``: draft j = warp's inputs and the head's parameters in registers)."""
    r = ExprRenderer(decl, "d", hoisted)
    decay = r.render(decl.expressions()["decay"], "")
    return (["if (warp == WARPS - 1) {  // every draft's log-decay on a lane, and their running sums",
             "    const int j = lane < t ? lane : 0;  (void)j;  // (a lane past the drafts computes draft 0's and keeps none)"]
            + ["    " + line for line in r.lines]
            + [f"    float acc = lane < t ? {decay} : 0.f;",
               "    #pragma unroll",
               f"    for (int o = 1; o < {FRAGMENT_DRAFTS}; o <<= 1) {{ const float y = __shfl_up_sync(0xffffffffu, acc, o); if (lane >= o) acc += y; }}",
               "    if (lane < t) sh_Gd[lane] = acc;",
               "}"])


def record_decay_sum(x: str, decay_sums: bool) -> str:
    """C text of G (the cumulative log-decay) of record ``x`` in verify: ``sh_G[x]``, which the
    cumulate fills for the drafts too, or with ``decay_sums`` (``decay_in_products``: no cumulate)
    ``G_at(x)`` (``DRAFT_DECAY_SUMS``)."""
    return f"G_at({x})" if decay_sums else f"sh_G[{x}]"


# verify with its decays in the products (``decay_in_products``): G of record x, the buffer's records'
# from sh_G, the drafts' from the buffer's last and the scan's sums (``draft_decay_scan``)
DRAFT_DECAY_SUMS = [
    "const float G_base = n ? sh_G[n - 1] : 0.f;  // G of the buffer's last record",
    "auto G_at = [&](int x) { return x < n ? sh_G[x] : G_base + sh_Gd[x - n]; };  // G of record x",
]


def shared_fragments_refusal(program, launch) -> str | None:
    """Why ``launch.shared_fragments`` cannot serve ``program`` (None when it can, or is 0): a lane
    holds K / 16 chunks of each fragment row, so no more of them can go through shared memory."""
    chunks = program.shape.k_dim // 16
    if launch.shared_fragments > chunks:
        return (f"shared_fragments: launch {launch.label} moves {launch.shared_fragments} chunks of each lane's "
                f"fragment row through shared memory, but at K = {program.shape.k_dim} a lane holds {chunks}")
    return None


def _fragment_chunk(fragment: str) -> str:
    """Chunk m of a fragment row (``fragment``, indexed by element) from the float4 ``x``."""
    f = fragment
    return f"{f}[4 * m] = x.x; {f}[4 * m + 1] = x.y; {f}[4 * m + 2] = x.z; {f}[4 * m + 3] = x.w;"


def _first_shared_chunk(shared: int) -> str:
    """The first of a lane's chunks (of its second fragment row) that go through shared memory: the last ``shared``."""
    return f"K / 16 - {shared}"


def mma_state_loads(state_expr: str, shared: int = 0) -> list[str]:
    """Every state load of the warp first, in fragment order (rows past V or past the warp's rows: zeros),
    but the ``shared`` chunks that ``shared_fragment_copies`` moves through shared memory instead."""
    skip = ([f"            if (mt == MT - 1 && h == 1 && m >= {_first_shared_chunk(shared)}) continue;  // through shared memory"]
            if shared else [])
    return [
        "constexpr int MT = (RPW + 15) / 16;  // 16-row tiles per warp",
        LANE_IDS,
        "float sm[MT][2][K / 4];  // sm[mt][h][4m + u]: row 16 mt + 8 h + g, element 4 (quad + 4 m) + u",
        "#pragma unroll",
        "for (int mt = 0; mt < MT; ++mt) {",
        "    #pragma unroll",
        "    for (int h = 0; h < 2; ++h) {",
        "        const int rw = 16 * mt + 8 * h + g, row = v0 + warp * RPW + rw;",
        "        const bool live = 16 * mt + 8 * h < RPW && rw < RPW && row < V;  // (the first test at compile time)",
        "        #pragma unroll",
        "        for (int m = 0; m < K / 16; ++m) {",
        *skip,
        f"            const float4 x = live ? *reinterpret_cast<const float4*>({state_expr} + 4 * (quad + 4 * m))",
        "                                  : make_float4(0.f, 0.f, 0.f, 0.f);",
        "            " + _fragment_chunk("sm[mt][h]"),
        "        }",
        "    }",
        "}",
    ]


# where verify's shared fragments begin in its dynamic shared memory: after the write records (sh_w's
# NREC · W_PITCH floats), at a 16-byte boundary
SHARED_FRAGMENTS_OFFSET = "(NREC * W_PITCH * sizeof(float) + 15) / 16 * 16"


def shared_fragments_bytes(launch) -> int:
    """Bytes of dynamic shared memory verify's shared fragments take: a float4 per chunk and thread."""
    return launch.shared_fragments * 16 * launch.warps * 32


def shared_fragment_copies(state_expr: str, shared: int) -> list[str]:
    """Verify under a register cap (launch option ``shared_fragments``): each lane's last ``shared``
    float4s of its second row (g + 8) of the warp's last 16-row tile, which ``mma_state_loads`` leaves
    out, copied into ``sh_fragments`` by cp.async (zeros past the warp's rows or V). ``sh_fragments``
    lies in dynamic shared memory after verify's write records (``shared_fragments_bytes``), so that
    the static arrays need not leave room for it under the 48 KiB of static shared memory. The copies before
    are committed as one group and these as another, so the fields' wait
    (``cp_async_wait_all_but_last``) leaves them in flight; ``shared_fragments_back`` waits for them
    before the products. The registers they would hold through the head-level phases are free there,
    where ptxas would spill them (and its spill store would wait for the state load)."""
    return [
        "cp_async_commit();  // the copies so far: complete at the fields' wait",
        f"float4* const sh_fragments = reinterpret_cast<float4*>(dynamic_shared + {SHARED_FRAGMENTS_OFFSET});"
        f"  // [{shared}, THREADS]: after sh_w",
        "{",
        "    const int rw = 16 * (MT - 1) + 8 + g, row = v0 + warp * RPW + rw;",
        "    const bool live = 16 * (MT - 1) + 8 < RPW && rw < RPW && row < V;",
        "    #pragma unroll",
        f"    for (int c = 0; c < {shared}; ++c) {{",
        f"        const int m = {_first_shared_chunk(shared)} + c;",
        f"        cp_async16_zfill(&sh_fragments[c * THREADS + tid], live ? {state_expr} + 4 * (quad + 4 * m) : checkpoint, live);",
        "    }",
        "}",
        "cp_async_commit();  // the shared fragments: in flight until the products",
    ]


def shared_fragments_back(shared: int) -> list[str]:
    """Before the products: this thread's own shared fragments (its copies complete, no barrier) back
    into the state fragments."""
    return [
        "cp_async_wait();  // the shared fragments (this thread's own copies: no barrier needed)",
        "#pragma unroll",
        f"for (int c = 0; c < {shared}; ++c) {{",
        f"    const int m = {_first_shared_chunk(shared)} + c;",
        "    const float4 x = sh_fragments[c * THREADS + tid];",
        "    " + _fragment_chunk("sm[MT - 1][1]"),
        "}",
    ]


def mma_scores(decl, shift: float | None = None, decay_sums: bool = False) -> list[str]:
    """The scores on tensor cores, where e^{G_{n+j} − G_i} factors out of the dot products: for a
    scalar decay or none, keys of records and drafts [32, K] × the drafts' raw queries (keys) [K, 8],
    a warp per 16 keys and part, then scaled; for decay-scaled record keys (``shift`` = C,
    record_keys.py) the keys are k̃_i = e^{C − G_i} ⊙ k_i and draft j's query (key) takes
    e^{G_{n+j} − C} per element as the B fragment is loaded (its key in ``sh_key`` is scaled too, so
    twice), with no scale after. Only i ≤ n + j is stored, as the SIMT scores do. Each lane reads
    float4 m of its rows, elements (0, 1) as chunk 2m's columns and (2, 3) as 2m + 1's. With
    ``decay_sums`` the drafts' G come from ``G_at`` (``DRAFT_DECAY_SUMS``), not from a cumulate."""
    assert decl.decay_form != "vector" or shift is not None, "a decay vector factors only through scaled keys"
    G_draft, G_record = record_decay_sum("n + j", decay_sums), record_decay_sum("rec", decay_sums)
    scale = f" * expf({G_draft} - {G_record})" if decl.decay_form == "scalar" else ""
    target = "(part ? sh_sk : sh_sq)" if decl.is_delta else "sh_sq"  # PARTS = 1 without a delta rule
    zero = "make_float4(0.f, 0.f, 0.f, 0.f)"
    draft = f"g < t ? *reinterpret_cast<const float4*>(col + e) : {zero}"
    if shift is None:
        draft_lines = [f"        const float4 bv = {draft};"]
    else:  # draft g's query (key) times e^{G_{n+g} - C}: its key k̃_g times it twice is k_g e^{G - C}
        scaled = "make_float4(bv.x * ev.x, bv.y * ev.y, bv.z * ev.z, bv.w * ev.w)"
        draft_lines = [
            f"        float4 bv = {draft};",
            f"        const float4 gv = g < t ? *reinterpret_cast<const float4*>(sh_G + (n + g) * K + e) : {zero};",
            "        const float4 ev = make_float4(expf(gv.x - KEY_SHIFT), expf(gv.y - KEY_SHIFT), expf(gv.z - KEY_SHIFT), expf(gv.w - KEY_SHIFT));",
            f"        bv = {scaled};",
            f"        if (part) bv = {scaled};"]
    return [
        "for (int combo = warp; combo < ((NREC + 15) / 16) * PARTS; combo += WARPS) {",
        "    const int part = combo % PARTS, i0 = 16 * (combo / PARTS) + g, i1 = i0 + 8;  // this lane's keys",
        "    const float* col = part ? sh_key + (n + g) * K : sh_q + g * K;  // draft g's key or query",
        "    float c[4] = {0.f, 0.f, 0.f, 0.f};",
        "    #pragma unroll",
        "    for (int m = 0; m < K / 16; ++m) {",
        "        const int e = 16 * m + 4 * quad;",
        f"        const float4 lo = i0 < n + t ? *reinterpret_cast<const float4*>(sh_key + i0 * K + e) : {zero};",
        f"        const float4 hi = i1 < n + t ? *reinterpret_cast<const float4*>(sh_key + i1 * K + e) : {zero};",
        *draft_lines,
        "        mma_3xtf32_floats(c, lo.x, hi.x, lo.y, hi.y, bv.x, bv.y);",
        "        mma_3xtf32_floats(c, lo.z, hi.z, lo.w, hi.w, bv.z, bv.w);",
        "    }",
        "    #pragma unroll",
        "    for (int v = 0; v < 4; ++v) {",
        "        const int rec = v < 2 ? i0 : i1, j = 2 * quad + (v & 1);",
        f"        if (j < t && rec <= n + j) {target}[j * NREC + rec] = c[v]{scale};",
        "    }",
        "}",
    ]


def _decay_columns() -> list[str]:
    """``decay_in_products``: each lane's accumulator columns (drafts 2·quad and 2·quad + 1) times
    e^{G_{n+j}}, after the state products and before the records' (whose scores carry their decays)."""
    return ["{",
            "    const int j0 = 2 * quad, j1 = j0 + 1;  // this lane's draft columns",
            "    const float d0 = j0 < t ? expf(G_at(n + j0)) : 0.f, d1 = j1 < t ? expf(G_at(n + j1)) : 0.f;",
            "    #pragma unroll",
            "    for (int mt = 0; mt < MT; ++mt)",
            "        #pragma unroll",
            "        for (int i = 0; i < 4; ++i) cq[mt][i] *= (i & 1) ? d1 : d0;",
            "}"]


def _products(decl, decay_columns: bool = False) -> list[str]:
    """cq (and ck) += state rows × drafts' queries (keys), then (``decay_columns``: scaled by the
    drafts' decays, ``decay_in_products``) + write records × scores."""
    assert not (decay_columns and decl.is_delta), "decay_in_products: no delta rule"
    delta = decl.is_delta
    acc = "float cq[MT][4], cqs[MT][4]" + (", ck[MT][4], cks[MT][4]" if delta else "") + ";"
    zero = "for (int i = 0; i < 4; ++i) { cq[mt][i] = 0.f; cqs[mt][i] = 0.f;" + (" ck[mt][i] = 0.f; cks[mt][i] = 0.f;" if delta else "") + " }"
    state = ["#pragma unroll", "for (int kc = 0; kc < K / 8; ++kc) {",
             "    const float2 fq = reinterpret_cast<const float2*>(sh_qd)[kc * 32 + lane];", "    const uint4 bq = split_b_fragment(fq.x, fq.y);"]
    if delta:
        state += ["    const float2 fk = reinterpret_cast<const float2*>(sh_kd)[kc * 32 + lane];", "    const uint4 bk = split_b_fragment(fk.x, fk.y);"]
    state += ["    const int i = 4 * (kc >> 1) + 2 * (kc & 1);",
              "    #pragma unroll", "    for (int mt = 0; mt < MT; ++mt) {",
              "        unsigned ab[4], as[4];",
              "        split_a_fragment(sm[mt][0][i], sm[mt][1][i], sm[mt][0][i + 1], sm[mt][1][i + 1], ab, as);",
              "        mma_3xtf32_two(cq[mt], cqs[mt], ab, as, bq);"]
    if delta:
        state.append("        mma_3xtf32_two(ck[mt], cks[mt], ab, as, bk);")
    state += ["    }", "}"]
    state += ["#pragma unroll", "for (int mt = 0; mt < MT; ++mt)", "    #pragma unroll",
              "    for (int i = 0; i < 4; ++i) { cq[mt][i] += cqs[mt][i];" + (" ck[mt][i] += cks[mt][i];" if delta else "") + " }"]
    state += _decay_columns() if decay_columns else []
    rec_b = ["    const uint4 bq = split_b_fragment(i0 < n && g < t ? sh_sq[g * NREC + i0] : 0.f,",
             "                                      i1 < n && g < t ? sh_sq[g * NREC + i1] : 0.f);"]
    if delta:
        rec_b += ["    const uint4 bk = split_b_fragment(i0 < n && g < t ? sh_sk[g * NREC + i0] : 0.f,",
                  "                                      i1 < n && g < t ? sh_sk[g * NREC + i1] : 0.f);"]
    records = (["for (int kr = 0; 8 * kr < n; ++kr) {  // the buffer's records, 8 per product",
                "    const int i0 = 8 * kr + quad, i1 = i0 + 4;  // this lane's records (fragment columns)"]
               + rec_b
               + ["    #pragma unroll", "    for (int mt = 0; mt < MT; ++mt) {",
                  "        const int r0 = 16 * mt + g, r1 = r0 + 8;",
                  "        const float* w = sh_w + warp * RPW;  // record i, warp row r: w[i * W_PITCH + r]",
                  "        unsigned ab[4], as[4];",
                  "        split_a_fragment(i0 < n && r0 < RPW ? w[i0 * W_PITCH + r0] : 0.f,",
                  "                         i0 < n && r1 < RPW ? w[i0 * W_PITCH + r1] : 0.f,",
                  "                         i1 < n && r0 < RPW ? w[i1 * W_PITCH + r0] : 0.f,",
                  "                         i1 < n && r1 < RPW ? w[i1 * W_PITCH + r1] : 0.f, ab, as);",
                  "        mma_3xtf32(cq[mt], ab, as, bq);"]
               + (["        mma_3xtf32(ck[mt], ab, as, bk);"] if delta else [])
               + ["    }", "}"])
    return [acc, "#pragma unroll", "for (int mt = 0; mt < MT; ++mt)", "    #pragma unroll", "    " + zero] + state + records


def _drafts_in_order(decl, f: Facts, append_guard) -> list[str]:
    """Draft j's write w_j from its key projection (delta rule: held by lane 4·(g) + j / 2), shared
    in the quad, stored once, and added to the later drafts' sums with their scores against record
    n + j (outputs from draft j on, key projections after it)."""
    delta = decl.is_delta
    value = row_field(decl, "value")
    append = guarded(append_guard, [record_write_store()]) if append_guard is not None else []
    lines = ["#pragma unroll", "for (int j = 0; j < TMAX; ++j) {", "    if (j >= t) break;",
             "    const int d0 = 2 * quad, d1 = d0 + 1;  // this lane's drafts",
             "    const float q0 = d0 >= j && d0 < t ? sh_sq[d0 * NREC + n + j] : 0.f;",
             "    const float q1 = d1 >= j && d1 < t ? sh_sq[d1 * NREC + n + j] : 0.f;"]
    if delta:
        lines += ["    const float k0 = d0 > j && d0 < t ? sh_sk[d0 * NREC + n + j] : 0.f;",
                  "    const float k1 = d1 > j && d1 < t ? sh_sk[d1 * NREC + n + j] : 0.f;"]
    per_tile = []
    for h in (0, 1):
        per_tile.append("{")
        body = [f"const int rw = 16 * mt + {8 * h} + g, rr = warp * RPW + rw, row = v0 + rr;"]
        if delta:
            body += [f"const float pk = (j & 1) ? ck[mt][{2 * h + 1}] : ck[mt][{2 * h}];  // right in the lane holding draft j",
                     f"float w = rw < RPW ? sh_beta[j] * ({value} - pk) : 0.f;",
                     "w = __shfl_sync(0xffffffffu, w, (lane & ~3) | (j >> 1));",
                     "if (quad == (j >> 1) && rw < RPW) {"]
        else:
            body += [f"const float w = rw < RPW ? sh_beta[j] * {value} : 0.f;", "if (quad == 0 && rw < RPW) {"]
        body += ["    " + x for x in append] + ["}"]
        body += [f"cq[mt][{2 * h}] += w * q0; cq[mt][{2 * h + 1}] += w * q1;"]
        if delta:
            body += [f"ck[mt][{2 * h}] += w * k0; ck[mt][{2 * h + 1}] += w * k1;"]
        per_tile += ["    " + x for x in body] + ["}"]
    lines += ["    #pragma unroll", "    for (int mt = 0; mt < MT; ++mt) {"] + ["        " + x for x in per_tile] + ["    }", "}"]
    return lines


def _outputs(decl, f: Facts) -> list[str]:
    body = (["const int j = 2 * quad + (i & 1), rw = 16 * mt + 8 * (i >> 1) + g, rr = warp * RPW + rw, row = v0 + rr;",
             "if (j < t && rw < RPW) {", "    float o = cq[mt][i];"]
            + ["    " + x for x in epilogue(decl)] + ["    " + output_store(f), "}"])
    return (["#pragma unroll", "for (int mt = 0; mt < MT; ++mt) {", "    #pragma unroll", "    for (int i = 0; i < 4; ++i) {"]
            + ["        " + x for x in body] + ["    }", "}"])


def mma_verify_rows(decl, f: Facts, append_guard, decay_columns: bool = False) -> list[str]:
    """Verify's row work on tensor cores: products (``decay_columns``: ``decay_in_products``), the
    drafts' recurrence, outputs."""
    return _products(decl, decay_columns) + _drafts_in_order(decl, f, append_guard) + _outputs(decl, f)
