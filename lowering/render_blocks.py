"""Lowering layer: the building blocks the CUDA kernel templates share.

What a template reads off a kernel's statements (``Facts``), the row checks and fill prologue, the
token fields staged in shared memory (the row fields: ``render_row_fields``), record staging, the decay between two records, row
loads and stores, the fold of records into a warp's rows and the shared-memory declarations. Each
returns lines of C; ``render_cuda`` and ``render_replay`` assemble them into kernels.
"""

from __future__ import annotations

from dataclasses import dataclass

from .ir import Kernel
from .launch import FRAGMENT_DRAFTS
from .render_expr import ExprRenderer, input_load
from .render_row_fields import ROW_FIELDS, finishes_row, row_field_decls


# --- the facts a kernel template needs, read off its statements -----------------------------------
@dataclass
class Facts:
    family: str
    guards: dict  # op (or op:buffer) -> C condition guarding it ("" when unguarded)
    stmts: dict  # op -> Stmt (last one seen)
    drafts: bool  # tokens per row from drafts[b] (verify-like) or one


def facts(kernel: Kernel) -> Facts:
    guards, stmts = {}, {}
    for stmt, conds in kernel.statements():
        cond = " && ".join(("!" if neg else "") + c for c, neg in conds)
        key = stmt.op + (":" + stmt.attr("buffer") if stmt.attr("buffer") else "")
        if stmt.op == "load_state":
            key += ":" + (stmt.ins[0] if stmt.ins else "row")
        guards[key] = cond
        stmts[stmt.op] = stmt
    ops = set(stmts)
    family = ("replay" if "replay" in ops else "fill" if "set_fill" in ops else "recur" if "recur" in ops
              else "fold" if "fold" in ops else "copy")
    drafts = "t" in stmts["row"].outs
    return Facts(family, guards, stmts, drafts)


def guarded(cond: str, body: list[str]) -> list[str]:
    if not cond:
        return body
    return [f"if ({cond}) {{"] + ["    " + line for line in body] + ["}"]


# --- pieces shared by the templates ---------------------------------------------------------------
def ids(f: Facts) -> list[str]:
    """Indices and the batch row's metadata loads (issued together: nothing here waits on memory)."""
    return [
        "const int b = blockIdx.z, hv = blockIdx.y, hk = hv / GROUP;",
        "const int warp = threadIdx.x / 32, lane = threadIdx.x % 32, tid = threadIdx.x;",
        "const int v0 = blockIdx.x * BV;",
        "const int slot = slots[b];",
        "const int src = src_page[b], dst = dst_page[b];",
        f"const int t = {'drafts[b]' if f.drafts else '1'};",
        "(void)src; (void)dst; (void)t; (void)hk; (void)v0; (void)tid; (void)warp; (void)lane;",
    ]


# Row checks every kernel makes (C conditions): a row that fails one touches nothing.
OUTSIDE_CACHE = "slot < 0 || slot >= num_slots || src < 0 || src >= num_pages || dst < 0 || dst >= num_pages"
DRAFTS_UNHELD = "t < 1 || t > TMAX || t > t_tok"  # a draft count the buffers or the tokens cannot hold
FILL_UNHELD = "n < 0 || n > CAPACITY"  # a fill no kernel writes
NEXT_FILL = {"zero": "0", "advance": "(n + 1 >= WINDOW) ? 0 : n + 1"}  # set_fill's values (commit: render_cuda)


def token_prefetch(decl, drafts: bool, copied: tuple = ()) -> list[str]:
    """The lines of the token inputs that this CTA reads, asked of L1 before the state rows' loads.
    The fields load the tokens after the rows in program order; without the prefetch those loads
    queue behind the CTA's state bytes, and the first barrier waits for them (the stall sampling of
    the step kernels and of verify: docs/performance.md). Input i's lines go to warp i % WARPS, one
    128-byte line per lane (up to 32: a hint, past that the loads fetch the rest). One token: its
    lines in order. Drafts (all ``t_tok`` of the tensor, as the drafts per row are not known yet):
    each draft's lines on consecutive lanes. Nothing here depends on the fill or the slot, so the
    prefetches go before the row checks. Inputs ``copied`` to shared memory before the rows
    (``render_row_inputs``) are not prefetched; the others keep their warps."""
    lines = []
    for i, spec in enumerate(s for s in decl.inputs if s.kind == "token"):
        if spec.name in copied:
            continue
        heads, head = ("HV", "hv") if spec.level == "head" else ("H", "hk")
        per_line = 64 if spec.dtype == "bfloat16" else 32  # elements per 128-byte line
        if not drafts:
            row, line, live = f"((size_t)b * t_tok * {heads} + {head})", "lane", "lane == 0"  # token j = 0
        elif spec.size == "":  # one line per draft
            row, line, live = f"((size_t)(b * t_tok + lane) * {heads} + {head})", "", "lane < t_tok"
        else:
            per_draft = {"K": f"((K + {per_line - 1}) / {per_line})", "V": f"((BV + {per_line - 1}) / {per_line})"}[spec.size]
            row = f"((size_t)(b * t_tok + lane / {per_draft}) * {heads} + {head})"  # as ExprRenderer indexes token j
            line, live = f"(lane % {per_draft})", f"lane < t_tok * {per_draft}"
        if spec.size == "K":
            start, lanes = f"{row} * K + {line} * {per_line}", f"{line} * {per_line} < K"
        elif spec.size == "V":  # the CTA's rows
            start, lanes = f"{row} * V + v0 + {line} * {per_line}", f"{line} * {per_line} < min(BV, V - v0)"
        else:
            start, lanes = row, live
        if drafts and spec.size:
            lanes = f"{live} && {lanes}"
        lines.append(f"if (warp == {i} % WARPS && {lanes}) prefetch_l1(tok_{spec.name} + {start});")
    return lines


def inputs_read(decl, roles) -> set:
    """The names of the inputs (token inputs and parameters) that the expressions ``roles`` read."""
    ex = decl.expressions()
    return {n.arg for role in roles if role in ex for n in ex[role].walk() if n.op in ("INPUT", "PARAM")}


def hoistable_inputs(decl) -> tuple:
    """The inputs verify loads into registers before the state rows (``first_draft_loads``): the
    K-sized token inputs and parameters that the head-level vector fields (key, query, a decay
    vector) read, the scalar token inputs that the scalar fields (decay, write strength) read, and
    the scalar parameters that any of verify's fields (those and the row fields) read."""
    vectors, scalars = inputs_read(decl, ("key", "query", "decay")), inputs_read(decl, ("decay", "beta", "strength"))
    params = inputs_read(decl, ("key", "query", "decay", "beta", "strength") + ROW_FIELDS)
    def named(kind: str, size: str, among: set) -> tuple:
        return tuple(s.name for s in decl.inputs if s.kind == kind and s.size == size and s.name in among)
    return named("token", "K", vectors) + named("token", "", scalars) + named("param", "K", vectors) + named("param", "", params)


def first_draft_loads(decl, names: tuple) -> list[str]:
    """Before the state rows' loads, each warp loads its first draft's (j = warp) token inputs
    ``names`` into registers (``pre_<name>[KE]`` over K, ``pre_<name>`` a scalar), and its head's
    parameters among ``names`` (the same), so the fields' first loads do not queue behind the rows'
    bytes (GDN's verify T = 4 and 8 3–4 % faster for the K-sized token inputs, side by side, the
    scalars 0.6–4.5 % more: docs/performance.md). The fields read them back through
    ``ExprRenderer``'s ``hoisted``."""
    lines = []
    for name in names:  # the address the fields compute for token j, at j = warp
        spec = decl.input(name)
        token = spec.kind == "token"
        what = f"draft j = warp's {name}" if token else f"the head's {name}"
        if spec.size == "":
            load = input_load(spec, "", token="warp")
            value = f"warp < t ? {load} : 0.f" if token else load
            lines.append(f"const float pre_{name} = {value};  // {what}, loaded before the state rows")
            continue
        live = "warp < t && e < K" if token else "e < K"
        lines += [f"float pre_{name}[KE];  // {what}, loaded before the state rows",
                  "#pragma unroll",
                  "for (int i = 0; i < KE; ++i) {",
                  "    const int e = k_index(i, lane);",
                  f"    pre_{name}[i] = ({live}) ? {input_load(spec, 'e', token='warp')} : 0.f;",
                  "}"]
    return lines


def fill_lines(f: Facts) -> list[str]:
    """Row checks, then the slot's buffer fill and the flush decision."""
    return row_check_lines(f) + fill_load_lines(f)


def row_check_lines(f: Facts) -> list[str]:
    """Null slot; slot, pages or draft count outside what the buffers hold: the row touches nothing."""
    lines = [f"if ({OUTSIDE_CACHE}) return;  // a null slot (padded row), or indices outside this cache"]
    if f.drafts:
        lines.append(f"if ({DRAFTS_UNHELD}) return;")
    return lines


def fill_load_lines(f: Facts, copies_in_flight: str = "") -> list[str]:
    """The slot's buffer fill (a fill no kernel writes: the row touches nothing) and the flush decision;
    with ``copies_in_flight`` (the C lines that wait for them) a row that stops here first waits for
    its asynchronous copies."""
    lines = []
    if "load_fill" in f.stmts:
        stop = f"{{ {copies_in_flight} return; }}" if copies_in_flight else "return;"
        lines += ["int n = fill[slot];", f"if ({FILL_UNHELD}) {stop}"]
    elif f.family != "copy":
        lines.append("const int n = 0;  (void)n;  // no records")
    return lines + flush_rule_lines(f)


def flush_rule_lines(f: Facts) -> list[str]:
    """The flush decision from the fill ``n`` (none when the kernel has no flush rule)."""
    if "flush_rule" not in f.stmts:
        return []
    rule = f.stmts["flush_rule"].attr("rule")
    return ["const bool flush = " + ("n + 1 >= WINDOW;" if rule == "step" else "n + t > CAPACITY;")]


def state_page_lines(f: Facts) -> list[str]:
    lines = ["int page = src;"]
    if f.guards.get("load_state:checkpoint:dst") is not None:
        lines += guarded(f.guards["load_state:checkpoint:dst"], ["page = dst;"])
    return lines


def shared_page_lines(f: Facts) -> list[str]:
    """The page that holds the row's state, before the fill is checked, so the state rows' loads need
    not wait for it: an unshared page (src == dst) holds it whether or not an earlier launch folded the
    buffer into dst; only a shared page reads the fill (an out-of-range fill stops the row after the
    loads are issued, in ``fill_load_lines``)."""
    # (its own load, __ldcg: one merged with the fill load below would make every row's page wait for it)
    pick = ["const int n = __ldcg(fill + slot);"] + flush_rule_lines(f) + guarded(f.guards["load_state:checkpoint:dst"], ["page = dst;"])
    return ["int page = src;", "if (src != dst) {  // a shared page: the fill says which page an earlier flush left the state in"] + [
        "    " + line for line in pick] + ["}"]


def fields(decl, mode: str, one_token: bool = False, hoisted: tuple = (), at_fill: bool = False,
           query_fragments: bool = False) -> list[str]:
    """Head-level fields of tokens j < t (one warp per token) into shared memory, indexed by j (no
    dependence on the fill, so their loads fly with the state's). With ``one_token`` (a step) the
    fields are split across warps instead: the query on warp 0, the key on warp 1, the decay and the
    write strength on warp 2 (modulo WARPS), so no warp runs two normalisations before the barrier.

    ``mode == "replay"``: keys → ``sh_kd``, raw log-decays → ``sh_g`` (scalar) or ``sh_qd`` (vector; the
    cumulate phase replaces both by the decayed key and query). ``mode == "recur"``: keys → ``sh_key``,
    decay factors ``e^g`` → ``sh_g``. ``hoisted``: K-sized token inputs whose first draft per warp
    ``first_draft_loads`` loaded already. ``at_fill`` (verify on tensor cores, the fill ``n`` known): keys
    straight to their records' place ``sh_key[n + j]`` and raw vector log-decays to ``sh_G[n + j]``, so
    ``sh_qd`` and ``sh_kd`` are free for the cumulate's fragments. ``query_fragments`` (verify with its
    decays in the products, ``decay_in_products``): the raw queries go to ``sh_qd`` in B-fragment order
    too (``fragment_slot``), the columns past the drafts as zeros, and no cumulate follows: a scalar
    decay is left out (``draft_decay_scan`` sums the drafts' decays)."""
    assert not query_fragments or at_fill, "the queries' fragments are verify's on tensor cores"
    replay = mode == "replay"
    ex = decl.expressions()
    key_store = "(sh_key + n * K)" if at_fill else "sh_kd" if replay else "sh_key"
    # (renderer prefix, field, shared array[, shared array of B fragments])
    vectors = [("f", "key", key_store), ("f", "query", "sh_q", "sh_qd") if query_fragments else ("f", "query", "sh_q")]
    scalar_lines = []
    decay_vector = None
    if decl.decay_form == "vector":
        decay_vector = ("g", "decay", "(sh_G + n * K)" if at_fill else "sh_qd" if replay else "sh_g")
    elif decl.decay_form == "scalar" and not query_fragments:  # (with query_fragments: draft_decay_scan)
        scalar_lines.append(("g", "decay", "sh_g[j] = {};" if replay else "sh_g[j] = expf({});"))
    strength = "beta" if "beta" in ex else "strength" if "strength" in ex else None
    scalar_lines.append(("s", strength, "sh_beta[j] = {};") if strength else None)  # None: sh_beta[j] = 1
    if not one_token:
        zeros = ([f"for (int x = tid; x < ({FRAGMENT_DRAFTS} - t) * K; x += THREADS)  // the columns past the drafts",
                  "    sh_qd[fragment_slot(t + x / K, x % K)] = 0.f;"] if query_fragments else [])
        return _fields_per_token(decl, vectors + ([decay_vector] if decay_vector else []), scalar_lines, replay, hoisted) + zeros
    groups = [([vectors[1]], []), ([vectors[0]], []), ([decay_vector] if decay_vector else [], scalar_lines)]
    body = []
    for w, (vector_fields, scalar_fields) in enumerate(groups):
        lines = _field_lines(decl, vector_fields, scalar_fields, replay)
        if lines:
            body += [f"if (warp == {w} % WARPS) {{  // the one token's {_field_names(vector_fields, scalar_fields)}",
                     "    const int j = 0;"] + ["    " + x for x in lines] + ["}"]
    return body


def _field_names(vector_fields, scalar_fields) -> str:
    names = [f[1] for f in vector_fields] + [f[1] if f else "strength (1)" for f in scalar_fields]
    return ", ".join(names)


def _field_lines(decl, vector_fields, scalar_fields, replay: bool, hoisted: tuple = ()) -> list[str]:
    """C lines that compute ``vector_fields`` (``(prefix, field, array)``, stored per element of K) and
    ``scalar_fields`` (``(prefix, field, C template)``; None: a strength of 1) of token j."""
    ex = decl.expressions()
    body, stores, scalars, renderers = [], [], [], {}
    for prefix, field, array, *fragments in vector_fields:
        r = renderers.setdefault(prefix, ExprRenderer(decl, prefix, hoisted))
        name = r.render(ex[field], "K")
        value = f"expf({name}[i])" if field == "decay" and not replay else f"{name}[i]"
        stores.append(f"{array}[j * K + e] = {value};")
        stores += [f"{a}[fragment_slot(j, e)] = {value};" for a in fragments]
    for field in scalar_fields:
        if field is None:
            scalars.append("sh_beta[j] = 1.f;")
            continue
        prefix, name, template = field
        r = renderers.setdefault(prefix, ExprRenderer(decl, prefix, hoisted))
        scalars.append(template.format(r.render(ex[name], "")))
    for r in renderers.values():
        body += r.lines
    if stores:
        body += ["#pragma unroll", "for (int i = 0; i < KE; ++i) {", "    const int e = k_index(i, lane);",
                 "    if (e < K) { " + " ".join(stores) + " }", "}"]
    if scalars:
        body.append("if (lane == 0) { " + " ".join(scalars) + " }")
    return body


def _fields_per_token(decl, vector_fields, scalar_fields, replay: bool, hoisted: tuple = ()) -> list[str]:
    lines = _field_lines(decl, vector_fields, scalar_fields, replay, hoisted)
    return ["for (int j = warp; j < t; j += WARPS) {"] + ["    " + x for x in lines] + ["}"]


def decay_between(decl, a: str, b: str, e: str = "e") -> str:
    """``exp(G_a − G_b)`` at element ``e`` (records' cumulative decays in ``sh_G``)."""
    if decl.decay_form == "none":
        return "1.f"
    if decl.decay_form == "scalar":
        return f"expf(sh_G[{a}] - sh_G[{b}])"
    return f"expf(sh_G[({a}) * K + {e}] - sh_G[({b}) * K + {e}])"


def _warp_rows(rows: str, first: str) -> tuple[str, list[str]]:
    """Row r of the warp's ``rows`` rows from ``first`` on: its offset among the warp's RPW rows
    (``first + `` or nothing), and the check that it is one of them (none when the rows are all RPW)."""
    offset = "" if first == "0" else f"{first} + "
    return offset, ([] if rows == "RPW" and first == "0" else [f"{offset}r < RPW"])


def row_loads(state_expr: str, rows: str = "RPW", first: str = "0") -> list[str]:
    """Issue every state-row load of the warp first: they fly while the head-level work runs. Rows past
    V (a partial last tile) hold zeros, so the row loop runs branch-free and only the stores check.
    ``rows`` rows of the warp from its row ``first`` on (``s[rows][KE]``)."""
    offset, within = _warp_rows(rows, first)
    past = "the warp's rows or V" if within else "V"
    return [
        f"float s[{rows}][KE];",
        "#pragma unroll",
        f"for (int r = 0; r < {rows}; ++r) {{",
        f"    const int row = v0 + warp * RPW + {offset}r;",
        f"    if ({' && '.join(within + ['row < V'])}) load_row({state_expr}, s[r], lane);",
        "    else {",
        "        #pragma unroll",
        f"        for (int i = 0; i < KE; ++i) s[r][i] = 0.f;  // past {past}: computed on zeros, never stored",
        "    }",
        "}",
    ]


def row_records(rows: str = "RPW", first: str = "0") -> list[str]:
    """Lane i of a warp holds record i's write at each of the warp's rows (``rows`` of them from
    ``first`` on; 0 past the records and past the warp's rows)."""
    if rows == "RPW" and first == "0":
        return ["float wv[RPW];", "load_record_rows(wv, sh_w, warp, lane, n);"]
    offset, within = _warp_rows(rows, first)
    return [f"float wv[{rows}];",
            "#pragma unroll",
            f"for (int r = 0; r < {rows}; ++r) wv[r] = ({' && '.join(['lane < n'] + within)}) ? "
            f"sh_w[lane * W_PITCH + warp * RPW + {offset}r] : 0.f;"]


def fold_keys(decl, last: str, count: str, shift: float | None = None) -> list[str]:
    """In place: sh_key[m] ← k_m ⊙ e^{G_last − G_m} for m < count; ``sh_ed`` ← e^{G_last} for a vector
    decay (then a barrier). With decay-scaled keys (``shift`` = C, record_keys.py) every key in
    ``sh_key`` (the records' and the tokens') holds k̃_m = e^{C − G_m} ⊙ k_m and takes e^{G_last − C}."""
    if decl.decay_form == "none":
        return []
    factor = decay_between(decl, last, "m") if shift is None else f"expf(sh_G[({last}) * K + e] - KEY_SHIFT)"
    index = ("const int e = x % K;" if shift is not None else  # (the factor is the same for every key)
             "const int m = x / K" + (", e = x % K;" if decl.decay_form == "vector" else ";"))
    lines = [f"for (int x = tid; x < ({count}) * K; x += THREADS) {{",
             "    " + index,
             f"    sh_key[x] *= {factor};",
             "}"]
    if decl.decay_form == "vector":
        lines.append(f"for (int e = tid; e < K; e += THREADS) sh_ed[e] = expf(sh_G[({last}) * K + e]);")
    return lines + ["__syncthreads();"]


def fold_rows(decl, last: str, count: str, rows: str = "RPW", first: str = "0") -> list[str]:
    """s ← s·e^{G_last} + Σ_{m<count} w_m kf_m for the warp's rows (kf from ``fold_keys``): records outer,
    each key fragment read from shared memory once for all of the warp's rows (``rows`` of them in ``s``;
    their writes in ``wv`` from ``wv[first]`` on; past the warp's RPW rows, which a last chunk of
    ``rows`` may reach, 0 without reading ``wv``)."""
    offset = "" if first == "0" else f"{first} + "
    write = "wv[r]" if first == "0" else f"({offset}r < RPW ? wv[{offset}r] : 0.f)"
    scale = {"none": [],
             "scalar": [f"const float a = expf(sh_G[{last}]);", "#pragma unroll", f"for (int r = 0; r < {rows}; ++r)",
                        "    #pragma unroll", "    for (int i = 0; i < KE; ++i) s[r][i] *= a;"],
             "vector": ["#pragma unroll", "for (int i = 0; i < KE; ++i) {", "    const int e = k_index(i, lane);",
                        "    const float a = (e < K) ? sh_ed[e] : 0.f;",
                        "    #pragma unroll", f"    for (int r = 0; r < {rows}; ++r) s[r][i] *= a;", "}"]}
    return scale[decl.decay_form] + [
        f"for (int m = 0; m < {count}; ++m) {{",
        "    float kf[KE];",
        "    #pragma unroll",
        "    for (int i = 0; i < KE; ++i) { const int e = k_index(i, lane); kf[i] = (e < K) ? sh_key[m * K + e] : 0.f; }",
        "    #pragma unroll",
        f"    for (int r = 0; r < {rows}; ++r) {{",
        f"        const float wm = __shfl_sync(0xffffffffu, {write}, m);",
        "        #pragma unroll",
        "        for (int i = 0; i < KE; ++i) s[r][i] += wm * kf[i];",
        "    }",
        "}"]


def rows_reduced_group(decl, group: str, first: str, end: str, parts: list[str], finish: list[str],
                       head: list[str] = ()) -> list[str]:
    """One group of ``group`` rows of token j (a C constant; rows ``first`` + u while below ``end``):
    ``parts`` fill row r's values (``part[u]``, and for delta rules ``part[group + u]``), then one
    transpose reduction of the group's values (``warp_sum_spread``: about one shuffle per value, no
    broadcasts), and the lane holding a row's first sum runs ``finish`` for that row (``sum``, ``u``,
    ``rr``, ``row``, ``w`` = 0 and, for delta rules, ``pk``, the row's second sum, in scope), so a
    group's rows finish in parallel across lanes. ``head``: lines before the parts."""
    return ([f"constexpr int SUM_LANES = 32 / (PARTS * {group});  // lanes holding each value's sum"] + list(head)
            + [f"float part[PARTS * {group}];", "#pragma unroll", f"for (int u = 0; u < PARTS * {group}; ++u) part[u] = 0.f;",
               "#pragma unroll", f"for (int u = 0; u < {group}; ++u) {{", f"    const int r = {first} + u;",
               f"    if (r < {end}) {{  // known at compile time"] + ["        " + line for line in parts]
            + ["    }", "}", "const float sum = warp_sum_spread(part, lane);  // lane l: value l / SUM_LANES"]
            + (["const float pk = __shfl_xor_sync(0xffffffffu, sum, 16);  // lane l < 16: its row's key projection"]
               if decl.is_delta else [])
            + [f"const int u = lane / SUM_LANES, rr = warp * RPW + {first} + u, row = v0 + rr;", "float w = 0.f;",
               f"if ({finishes_row(group, first, end)}) {{  // the lane that finishes row {first} + u"]
            + ["    " + line for line in finish] + ["}"])


def store_rows(target: str, rows: str = "RPW", first: str = "0") -> list[str]:
    """Store the warp's rows in ``s`` (``rows`` of them from ``first`` on) that are below V."""
    offset, within = _warp_rows(rows, first)
    return ["#pragma unroll", f"for (int r = 0; r < {rows}; ++r) {{", f"    const int row = v0 + warp * RPW + {offset}r;",
            f"    if ({' && '.join(within + ['row < V'])}) store_row({target}, s[r], lane);", "}"]


def output_store(f: Facts) -> str:
    """Store row ``row``'s output ``o`` of token ``j`` (of draft ``j`` where the plan stores per draft)."""
    if f.stmts["store_output"].attr("per_draft"):
        return "if (row < V) out[(((size_t)b * t_tok + j) * HV + hv) * V + row] = o;"
    return "if (row < V) out[((size_t)b * t_tok * HV + hv) * V + row] = o;"


def record_write_store() -> str:
    """Append row ``row``'s write ``w`` of token ``j`` to the buffer, as record n + j."""
    return "if (row < V) rec_write[(((size_t)slot * HV + hv) * CAPACITY + n + j) * V + row] = w;"


CHECKPOINT_ROW = "checkpoint + (((size_t){page} * HV + hv) * V + row) * K"
STATE_ROW = "state + (((size_t){page} * HV + hv) * V + row) * K"


DYNAMIC_SHARED = "extern __shared__ __align__(128) unsigned char dynamic_shared[];  // dynamic_shared_bytes"


def shared_decls(decl, drafts: bool, replay: bool, fragment_drafts: int | None = None,
                 writes: str = "static", folds: bool = True, row_copies: bool = False,
                 fields_in_registers: bool = False, draft_decay_sums: bool = False) -> list[str]:
    """Shared arrays of a kernel; ``fragment_drafts``: ``sh_qd`` and ``sh_kd`` hold at least that many
    drafts (verify on tensor cores writes them as fragments of that many columns, ``sh_kd`` for delta
    rules only); ``writes``: the
    write records ``sh_w`` in static shared memory, in ``dynamic`` shared memory (which lets the
    static arrays and them pass 48 KiB together), or ``none`` (they go straight into registers);
    ``folds``: the kernel folds records into rows (a decay vector's e^{G_last}, ``sh_ed``, for ``fold_keys``);
    ``row_copies``: row inputs are copied into the row fields' arrays (``render_row_inputs``);
    ``fields_in_registers``: the row fields live in registers (``register_row_fields``), no arrays;
    ``draft_decay_sums``: the drafts' summed scalar decays ``sh_Gd`` instead of their decays ``sh_g``
    (verify with its decays in the products: ``draft_decay_scan``).
    The replay step's ``sh_ed`` is ``sh_q``: nothing reads the query after the scores' barrier, and the
    fold writes ``sh_ed`` after the rows (KDA's static arrays: 512 bytes less per CTA)."""
    tn = "TMAX" if drafts else "1"
    tq = f"({tn} > {fragment_drafts} ? {tn} : {fragment_drafts})" if fragment_drafts else tn
    keys = "NREC" if replay else tn
    lines = [f"__shared__ __align__(16) float sh_key[{keys} * K];",
             f"__shared__ __align__(16) float sh_q[{tn} * K];",
             f"__shared__ float sh_beta[{tn}];"]
    if replay:
        lines += {"static": ["__shared__ __align__(16) float sh_w[NREC * W_PITCH];"],
                  "dynamic": [DYNAMIC_SHARED, "float* const sh_w = reinterpret_cast<float*>(dynamic_shared);  // [NREC, W_PITCH]"],
                  "none": []}[writes]
        lines += [f"__shared__ __align__(16) float sh_qd[{tq} * K];",
                  f"__shared__ __align__(16) float sh_kd[{tq} * K];" if decl.is_delta or not fragment_drafts else "",
                  f"__shared__ float sh_sq[{tn} * NREC];"]
        if decl.is_delta:  # the scores against the token's key: only the delta rule's correction reads them
            lines.append(f"__shared__ float sh_sk[{tn} * NREC];")
    if decl.decay_form == "scalar":
        lines += ["__shared__ float sh_G[NREC];" if replay else "",
                  f"__shared__ float sh_Gd[{FRAGMENT_DRAFTS}];  // G_{{n+j}} - G_{{n-1}} of the drafts" if draft_decay_sums
                  else f"__shared__ float sh_g[{tn}];"]
    elif decl.decay_form == "vector":
        ed = ("float* const sh_ed = sh_q;  // [K]: the fold's e^{G_last}, after the scores (the last to read sh_q)"
              if not drafts else "__shared__ float sh_ed[K];")
        lines += ["__shared__ __align__(16) float sh_G[NREC * K];", ed if folds else ""] if replay else [
            f"__shared__ __align__(16) float sh_g[{tn} * K];"]
    return [line for line in lines if line] + ([] if fields_in_registers else row_field_decls(decl, tn, aligned=row_copies))
