"""Lowering layer: a ``Program``'s kernel plans → one CUDA C++ translation unit.

Every kernel of a program renders from its IR statements: the ``row``/``load_fill``/``flush_rule``
prologue, the head-level statements (``fields``, ``load_records``, ``cumulate``, ``scores``) into
shared memory, the row-level statements (``load_state``, ``replay``/``recur``/``fold``,
``store_*``) in a loop over the rows a warp owns, and the records a plan appends. ``When``
statements become ``if`` guards around what they hold. Sizes and dtypes are compile-time
constants, so each (declaration, shape, config, launch) pair is its own module.

Thread layout of a tiled kernel: grid ``(V / BV, HV, B)``, ``WARPS`` warps; warp ``w`` owns rows
``v0 + w·RPW + r``; a lane owns K elements with 16-byte accesses (``replay_common.cuh``). All
kernels share one argument list (``kernel_arguments``), so a launcher passes the same pointers to any.
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path

from replayssm_dsl.errors import LoweringError

from .ir import Kernel, Program
from .launch import FILL_THREADS, LaunchConfig, kernel_arguments
from .render_expr import ExprRenderer

COMMON_HEADER = Path(__file__).with_name("cuda") / "replay_common.cuh"
STATE_C_TYPES = {"float32": "float", "float16": "unsigned short", "bfloat16": "unsigned short"}  # 16-bit: raw bits


# --- the facts a kernel template needs, read off its statements -----------------------------------
@dataclass
class Facts:
    family: str
    guards: dict  # op (or op:buffer) -> C condition guarding it ("" when unguarded)
    stmts: dict  # op -> Stmt (last one seen)
    drafts: bool  # tokens per row from drafts[b] (verify-like) or one


def _facts(kernel: Kernel) -> Facts:
    guards, stmts = {}, {}
    for stmt, conds in kernel.statements():
        cond = " && ".join(("!" if neg else "") + c for c, neg in conds)
        key = stmt.op + (":" + stmt.attr("buffer") if stmt.attr("buffer") else "")
        if stmt.op == "load_state":
            key += ":" + (stmt.ins[0] if stmt.ins else "row")
        guards[key] = cond
        stmts[stmt.op] = stmt
    ops = set(stmts)
    family = ("fill" if "set_fill" in ops else "replay" if "replay" in ops else "recur" if "recur" in ops
              else "fold" if "fold" in ops else "copy")
    drafts = "t" in stmts["row"].outs
    return Facts(family, guards, stmts, drafts)


def _guarded(cond: str, body: list[str]) -> list[str]:
    if not cond:
        return body
    return [f"if ({cond}) {{"] + ["    " + line for line in body] + ["}"]


# --- pieces shared by the templates ---------------------------------------------------------------
def _ids(f: Facts) -> list[str]:
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


def _fill_lines(f: Facts) -> list[str]:
    """Row checks (null slot; slot, pages, draft count or fill outside what the buffers hold: the row
    touches nothing), then the slot's buffer fill and the flush decision."""
    lines = [f"if ({OUTSIDE_CACHE}) return;  // a null slot (padded row), or indices outside this cache"]
    if f.drafts:
        lines.append(f"if ({DRAFTS_UNHELD}) return;")
    if "load_fill" in f.stmts:
        lines += ["int n = fill[slot];", f"if ({FILL_UNHELD}) return;"]
    elif f.family != "copy":
        lines.append("const int n = 0;")
    if "flush_rule" in f.stmts:
        rule = f.stmts["flush_rule"].attr("rule")
        lines.append("const bool flush = " + ("n + 1 >= WINDOW;" if rule == "step" else "n + t > CAPACITY;"))
    return lines


def _state_page_lines(f: Facts) -> list[str]:
    lines = ["int page = src;"]
    if f.guards.get("load_state:checkpoint:dst") is not None:
        lines += _guarded(f.guards["load_state:checkpoint:dst"], ["page = dst;"])
    return lines


def _fields(decl, mode: str) -> list[str]:
    """Head-level fields of tokens j < t (one warp per token) into shared memory, indexed by j (no
    dependence on the fill, so their loads fly with the state's).

    ``mode == "replay"``: keys → ``sh_kd``, raw log-decays → ``sh_g`` (scalar) or ``sh_qd`` (vector; the
    cumulate phase replaces both by the decayed key and query). ``mode == "recur"``: keys → ``sh_key``,
    decay factors ``e^g`` → ``sh_g``."""
    replay = mode == "replay"
    r = ExprRenderer(decl, "f")
    ex = decl.expressions()
    key = r.render(ex["key"], "K")
    query = r.render(ex["query"], "K")
    body = list(r.lines)
    stores = f"if (e < K) {{ {'sh_kd' if replay else 'sh_key'}[j * K + e] = {key}[i]; sh_q[j * K + e] = {query}[i];"
    scalar_lines = []
    if decl.decay_form == "vector":
        rv = ExprRenderer(decl, "g")
        g = rv.render(ex["decay"], "K")
        body += rv.lines
        stores += f" sh_qd[j * K + e] = {g}[i];" if replay else f" sh_g[j * K + e] = expf({g}[i]);"
    elif decl.decay_form == "scalar":
        rs = ExprRenderer(decl, "g")
        g = rs.render(ex["decay"], "")
        body += rs.lines
        scalar_lines.append(f"sh_g[j] = {g};" if replay else f"sh_g[j] = expf({g});")
    strength = ex.get("beta", ex.get("strength"))
    if strength is not None:
        rb = ExprRenderer(decl, "s")
        s_name = rb.render(strength, "")
        body += rb.lines
        scalar_lines.append(f"sh_beta[j] = {s_name};")
    else:
        scalar_lines.append("sh_beta[j] = 1.f;")
    stores += " }"
    return (["for (int j = warp; j < t; j += WARPS) {"] + ["    " + x for x in body]
            + ["    #pragma unroll", "    for (int i = 0; i < KE; ++i) {", "        const int e = k_index(i, lane);",
               "        " + stores, "    }", "    if (lane == 0) { " + " ".join(scalar_lines) + " }", "}"])


ROW_FIELDS = ("value", "skip", "gate")


def _row_field_decls(decl, tn: str) -> list[str]:
    roles = [role for role in ROW_FIELDS if role in decl.expressions()]
    return [f"__shared__ float sh_{role}[{tn} * BV];" for role in roles]


def _stage_row_fields(decl) -> list[str]:
    """Row-level fields (value, skip, silu(gate)) of tokens j < t at the CTA's rows, into shared memory:
    coalesced loads by every thread, so the row loop never waits on a token load."""
    ex = decl.expressions()
    r = ExprRenderer(decl, "r")
    names = {role: r.render(ex[role], "V") for role in ROW_FIELDS if role in ex}
    stores = [f"sh_{role}[x] = {'silu_f(' + name + ')' if role == 'gate' else name};" for role, name in names.items()]
    zeros = [f"sh_{role}[x] = 0.f;" for role in names]
    return (["for (int x = tid; x < t * BV; x += THREADS) {", "    const int j = x / BV, row = v0 + x % BV;",
             "    if (row < V) {"] + ["        " + line for line in r.lines + stores]
            + ["    } else {", "        " + " ".join(zeros), "    }", "}"])


def _row_field(decl, role: str) -> str | None:
    return f"sh_{role}[j * BV + rr]" if role in decl.expressions() else None


def _epilogue(decl) -> list[str]:
    lines = []
    if _row_field(decl, "skip"):
        lines.append(f"o += {_row_field(decl, 'skip')};")
    if _row_field(decl, "gate"):
        lines.append(f"o *= {_row_field(decl, 'gate')};")
    return lines


def _load_records(decl) -> list[str]:
    """Start the asynchronous copies of the buffer's keys (and decays) and of the write records of the
    CTA's rows into shared memory (``cp_async_wait`` and a barrier complete them)."""
    khead = "hk" if decl.key_level == "group" else "hv"
    wide = "VEC == 4"
    lines = [f"stage_floats<{wide}>(sh_key, rec_key + ((size_t)slot * KEY_HEADS + {khead}) * CAPACITY * K, n * K, tid);"]
    if decl.decay_form == "scalar":
        lines.append("stage_floats<false>(sh_G, rec_decay + ((size_t)slot * HV + hv) * CAPACITY, n, tid);")
    elif decl.decay_form == "vector":
        lines.append(f"stage_floats<{wide}>(sh_G, rec_decay + ((size_t)slot * HV + hv) * CAPACITY * K, n * K, tid);")
    lines.append("stage_writes(sh_w, rec_write + ((size_t)slot * HV + hv) * CAPACITY * V, n, v0, tid);")
    return lines


def _decay_between(decl, a: str, b: str, e: str = "e") -> str:
    """``exp(G_a − G_b)`` at element ``e`` (records' cumulative decays in ``sh_G``)."""
    if decl.decay_form == "none":
        return "1.f"
    if decl.decay_form == "scalar":
        return f"expf(sh_G[{a}] - sh_G[{b}])"
    return f"expf(sh_G[({a}) * K + {e}] - sh_G[({b}) * K + {e}])"


def _row_loads(state_expr: str) -> list[str]:
    """Issue every state-row load of the warp first: they fly while the head-level work runs. Rows past
    V (a partial last tile) hold zeros, so the row loop runs branch-free and only the stores check."""
    return [
        "float s[RPW][KE];",
        "#pragma unroll",
        "for (int r = 0; r < RPW; ++r) {",
        "    const int row = v0 + warp * RPW + r;",
        f"    if (row < V) load_row({state_expr}, s[r], lane);",
        "    else {",
        "        #pragma unroll",
        "        for (int i = 0; i < KE; ++i) s[r][i] = 0.f;  // past V: computed on zeros, never stored",
        "    }",
        "}",
    ]


def _row_records() -> list[str]:
    """Lane i of a warp holds record i's write at each of the warp's rows."""
    return ["float wv[RPW];",
            "#pragma unroll",
            "for (int r = 0; r < RPW; ++r) wv[r] = (lane < n) ? sh_w[lane * (BV + 1) + warp * RPW + r] : 0.f;"]


def _fold_keys(decl, last: str, count: str) -> list[str]:
    """In place: sh_key[m] ← k_m ⊙ e^{G_last − G_m} for m < count; ``sh_ed`` ← e^{G_last} for a vector
    decay (then a barrier)."""
    if decl.decay_form == "none":
        return []
    lines = [f"for (int x = tid; x < ({count}) * K; x += THREADS) {{",
             "    const int m = x / K, e = x % K;",
             f"    sh_key[x] *= {_decay_between(decl, last, 'm')};",
             "}"]
    if decl.decay_form == "vector":
        lines.append(f"for (int e = tid; e < K; e += THREADS) sh_ed[e] = expf(sh_G[({last}) * K + e]);")
    return lines + ["__syncthreads();"]


def _fold_rows(decl, last: str, count: str) -> list[str]:
    """s ← s·e^{G_last} + Σ_{m<count} w_m kf_m for the warp's rows (kf from ``_fold_keys``): records outer,
    each key fragment read from shared memory once for all of the warp's rows."""
    scale = {"none": [],
             "scalar": [f"const float a = expf(sh_G[{last}]);", "#pragma unroll", "for (int r = 0; r < RPW; ++r)",
                        "    #pragma unroll", "    for (int i = 0; i < KE; ++i) s[r][i] *= a;"],
             "vector": ["#pragma unroll", "for (int i = 0; i < KE; ++i) {", "    const int e = k_index(i, lane);",
                        "    const float a = (e < K) ? sh_ed[e] : 0.f;",
                        "    #pragma unroll", "    for (int r = 0; r < RPW; ++r) s[r][i] *= a;", "}"]}
    return scale[decl.decay_form] + [
        f"for (int m = 0; m < {count}; ++m) {{",
        "    float kf[KE];",
        "    #pragma unroll",
        "    for (int i = 0; i < KE; ++i) { const int e = k_index(i, lane); kf[i] = (e < K) ? sh_key[m * K + e] : 0.f; }",
        "    #pragma unroll",
        "    for (int r = 0; r < RPW; ++r) {",
        "        const float wm = __shfl_sync(0xffffffffu, wv[r], m);",
        "        #pragma unroll",
        "        for (int i = 0; i < KE; ++i) s[r][i] += wm * kf[i];",
        "    }",
        "}"]


def _draft_row_loop(inner: list[str], chunk: int | None = None) -> list[str]:
    """Drafts outside (sequential), the warp's rows inside: unrolled and branch-free, so the rows'
    shuffle reductions interleave (stores to rows past V are skipped by ``row < V`` in ``inner``).
    With ``chunk``, the rows go ``chunk`` at a time through all drafts (rows are independent): fewer
    reductions in flight, so more rows per warp fit in the register cap without spilling."""
    if chunk is None:
        return (["for (int j = 0; j < t; ++j) {", "    #pragma unroll", "    for (int r = 0; r < RPW; ++r) {",
                 "        const int rr = warp * RPW + r, row = v0 + rr;"]
                + ["        " + x for x in inner] + ["    }", "}"])
    return (["#pragma unroll", f"for (int c = 0; c < RPW; c += {chunk}) {{  // compile-time row indices after unrolling",
             "    for (int j = 0; j < t; ++j) {", "        #pragma unroll",
             f"        for (int r = c; r < c + {chunk} && r < RPW; ++r) {{",
             "            const int rr = warp * RPW + r, row = v0 + rr;"]
            + ["            " + x for x in inner] + ["        }", "    }", "}"])


def _store_rows(target: str) -> list[str]:
    return ["#pragma unroll", "for (int r = 0; r < RPW; ++r) {", "    const int row = v0 + warp * RPW + r;",
            f"    if (row < V) store_row({target}, s[r], lane);", "}"]


CHECKPOINT_ROW = "checkpoint + (((size_t){page} * HV + hv) * V + row) * K"
STATE_ROW = "state + (((size_t){page} * HV + hv) * V + row) * K"


# --- templates ------------------------------------------------------------------------------------
def _shared_decls(decl, drafts: bool, replay: bool) -> list[str]:
    tn = "TMAX" if drafts else "1"
    keys = "NREC" if replay else tn
    lines = [f"__shared__ __align__(16) float sh_key[{keys} * K];",
             f"__shared__ __align__(16) float sh_q[{tn} * K];",
             f"__shared__ float sh_beta[{tn}];"]
    if replay:
        lines += ["__shared__ float sh_w[NREC * (BV + 1)];",
                  f"__shared__ __align__(16) float sh_qd[{tn} * K];",
                  f"__shared__ __align__(16) float sh_kd[{tn} * K];",
                  f"__shared__ float sh_sq[{tn} * NREC];",
                  f"__shared__ float sh_sk[{tn} * NREC];"]
    if decl.decay_form == "scalar":
        lines += ["__shared__ float sh_G[NREC];" if replay else "", f"__shared__ float sh_g[{tn}];"]
    elif decl.decay_form == "vector":
        lines += ["__shared__ __align__(16) float sh_G[NREC * K];", "__shared__ float sh_ed[K];"] if replay else [
            f"__shared__ __align__(16) float sh_g[{tn} * K];"]
    return [line for line in lines if line] + _row_field_decls(decl, tn)


def _cumulate(decl) -> list[str]:
    """G_{n+j} = G_{n-1} + Σ_{j'≤j} g_{j'}; the drafts' keys join the records' (sh_key[n + j]); the
    decayed query and key e^{G_{n+j}} ⊙ q_j, e^{G_{n+j}} ⊙ k_j replace the raw ones (each thread
    rewrites only the elements it reads)."""
    if decl.decay_form == "vector":
        return ["for (int e = tid; e < K; e += THREADS) {",
                "    float acc = n ? sh_G[(n - 1) * K + e] : 0.f;",
                "    for (int j = 0; j < t; ++j) {",
                "        const int x = j * K + e;",
                "        acc += sh_qd[x];  // the raw log-decay until this line",
                "        sh_G[(n + j) * K + e] = acc;",
                "        const float dec = expf(acc), key = sh_kd[x];",
                "        sh_key[(n + j) * K + e] = key;",
                "        sh_kd[x] = key * dec;",
                "        sh_qd[x] = sh_q[x] * dec;",
                "    }",
                "}"]
    decay = {"none": ["const float dec = 1.f;"],
             "scalar": ["float acc = n ? sh_G[n - 1] : 0.f;", "for (int jj = 0; jj <= j; ++jj) acc += sh_g[jj];",
                        "if (e == 0) sh_G[n + j] = acc;", "const float dec = expf(acc);"]}[decl.decay_form]
    return (["for (int x = tid; x < t * K; x += THREADS) {", "    const int j = x / K, e = x % K;"]
            + ["    " + line for line in decay]
            + ["    const float key = sh_kd[x];", "    sh_key[(n + j) * K + e] = key;",
               "    sh_kd[x] = key * dec;", "    sh_qd[x] = sh_q[x] * dec;", "}"])


def _scores(decl) -> list[str]:
    """sq[j][i] = (k_i ⊙ e^{G_{n+j} − G_i})·q_j and sk[j][i] = (…)·k_{n+j} for every record i ≤ n + j:
    a warp takes two records per trip so their four shuffle reductions interleave."""
    def dots(i: str, suffix: str) -> list[str]:
        dec = f" * {_decay_between(decl, 'n + j', i)}" if decl.decay_form == "vector" else ""
        return ["#pragma unroll", "for (int c = 0; c < KE; ++c) {", "    const int e = k_index(c, lane);", "    if (e < K) {",
                f"        const float kd = sh_key[{i} * K + e]{dec};",
                f"        aq{suffix} += kd * sh_q[j * K + e];", f"        ak{suffix} += kd * sh_key[(n + j) * K + e];",
                "    }", "}"]
    scale = (lambda i: _decay_between(decl, "n + j", i)) if decl.decay_form == "scalar" else (lambda i: "1.f")
    body = (["const int i0 = i, i1 = min(i + 1, n + j);  // i1 == i0 on the last odd record: computed twice, stored once",
             "float aq0 = 0.f, ak0 = 0.f, aq1 = 0.f, ak1 = 0.f;"] + dots("i0", "0") + dots("i1", "1")
            + [f"aq0 = warp_sum(aq0) * {scale('i0')}; ak0 = warp_sum(ak0) * {scale('i0')};",
               f"aq1 = warp_sum(aq1) * {scale('i1')}; ak1 = warp_sum(ak1) * {scale('i1')};",
               "if (lane == 0) {", "    sh_sq[j * NREC + i0] = aq0; sh_sk[j * NREC + i0] = ak0;",
               "    sh_sq[j * NREC + i1] = aq1; sh_sk[j * NREC + i1] = ak1;", "}"])
    return (["for (int j = 0; j < t; ++j) {", "    for (int i = 2 * warp; i <= n + j; i += 2 * WARPS) {"]
            + ["        " + line for line in body] + ["    }", "}"])


def _padded_parts(m: int) -> int:
    """Register array length for ``m`` per-row partial sums: a power of two up to 32, else a multiple of 32."""
    return 1 << (m - 1).bit_length() if m <= 32 else -(-m // 32) * 32


def _replay_rows(decl, f: Facts, program: Program, append_guard) -> list[str]:
    """The rows' outputs and write records: one token (``_replay_rows_one``) or drafts one after another
    (``_replay_rows_drafts``)."""
    if f.drafts:
        return _replay_rows_drafts(decl, f, append_guard)
    return _replay_rows_one(decl, f, append_guard)


def _per_draft_store(f: Facts) -> str:
    if f.stmts["store_output"].attr("per_draft"):
        return "if (lane == 0 && row < V) out[(((size_t)b * t_tok + j) * HV + hv) * V + row] = o;"
    return "if (lane == 0 && row < V) out[((size_t)b * t_tok * HV + hv) * V + row] = o;"


VERIFY_ROW_CHUNK = 8  # verify's rows per pass through the drafts (16 rows per warp spill for some declarations)
REC_WRITE_STORE = "if (lane == 0 && row < V) rec_write[(((size_t)slot * HV + hv) * CAPACITY + n + j) * V + row] = w;"


def _replay_rows_drafts(decl, f: Facts, append_guard) -> list[str]:
    """Drafts one after another, the warp's rows inside: draft j's key projection and output each take
    one warp reduction over the row's registers and the records before it (lane i < n + j holds record
    i's write, draft j's written into lane n + j). Measured faster for verify than one reduction of all
    drafts' parts per row (whose cost does not shrink with t and whose unrolled code is large)."""
    value = _row_field(decl, "value")
    if decl.is_delta:
        write = ["const float pk = warp_sum(row_dot_partial(s[r], sh_kd + j * K, lane)"
                 " + (lane < n + j ? wv[r] * sh_sk[j * NREC + lane] : 0.f));",
                 f"const float w = sh_beta[j] * ({value} - pk);"]
    else:
        write = [f"const float w = sh_beta[j] * {value};"]
    inner = write + [
        "float o = warp_sum(row_dot_partial(s[r], sh_qd + j * K, lane) + (lane < n + j ? wv[r] * sh_sq[j * NREC + lane] : 0.f))"
        " + w * sh_sq[j * NREC + n + j];",
    ] + _epilogue(decl) + [_per_draft_store(f), "if (lane == n + j) wv[r] = w;  // later drafts and the fold read it here"]
    if append_guard is not None:
        inner += _guarded(append_guard, [REC_WRITE_STORE])
    return _draft_row_loop(inner, chunk=VERIFY_ROW_CHUNK)


def _replay_rows_one(decl, f: Facts, append_guard) -> list[str]:
    """Per row: the checkpoint and committed-record parts of the token's output (and delta-rule key
    projection) in one pass over the row's registers and one multi-value warp reduction."""
    tn = 1
    parts = _padded_parts(tn * (2 if decl.is_delta else 1))
    value = _row_field(decl, "value")
    fill_parts = ["part[j] = row_dot_partial(s[r], sh_qd + j * K, lane) + (lane < n ? wv[r] * sh_sq[j * NREC + lane] : 0.f);"]
    if decl.is_delta:
        fill_parts.append(f"part[{tn} + j] = row_dot_partial(s[r], sh_kd + j * K, lane) + (lane < n ? wv[r] * sh_sk[j * NREC + lane] : 0.f);")
        write = [f"float pk = part[{tn} + j];", "#pragma unroll", "for (int i = 0; i < j; ++i) pk += wd[i] * sh_sk[j * NREC + n + i];",
                 f"const float w = sh_beta[j] * ({value} - pk);"]
    else:
        write = [f"const float w = sh_beta[j] * {value};"]
    per_token = write + [
        "wd[j] = w;",
        "float o = part[j] + w * sh_sq[j * NREC + n + j];",
        "#pragma unroll", "for (int i = 0; i < j; ++i) o += wd[i] * sh_sq[j * NREC + n + i];",
    ] + _epilogue(decl) + [_per_draft_store(f), "if (lane == n + j) wv[r] = w;  // the fold reads the token's record from lane n"]
    if append_guard is not None:
        per_token += _guarded(append_guard, [REC_WRITE_STORE])
    return (["#pragma unroll", "for (int r = 0; r < RPW; ++r) {", "    const int rr = warp * RPW + r, row = v0 + rr;",
             f"    float part[{parts}];", "    #pragma unroll", f"    for (int j = 0; j < {parts}; ++j) part[j] = 0.f;",
             "    #pragma unroll", f"    for (int j = 0; j < {tn}; ++j) {{", "        if (j < t) {"]
            + ["            " + line for line in fill_parts] + ["        }", "    }", "    warp_sum_all(part, lane);",
                                                                  f"    float wd[{tn}];", "    #pragma unroll",
                                                                  f"    for (int j = 0; j < {tn}; ++j) {{", "        if (j < t) {"]
            + ["            " + line for line in per_token] + ["        }", "    }", "}"])


def _render_replay(k: Kernel, f: Facts, program: Program) -> list[str]:
    decl = program.declaration
    body = _ids(f) + _shared_decls(decl, f.drafts, replay=True) + _fill_lines(f)
    if "empty_records" in f.stmts:
        body += _guarded(f.guards["empty_records"], ["n = 0;  // the buffer was folded into dst before this launch"])
    body += _state_page_lines(f)
    body += _row_loads(CHECKPOINT_ROW.format(page="page"))
    body += _fields(decl, "replay") + _stage_row_fields(decl)
    body += _guarded(f.guards.get("load_records", ""), _load_records(decl))
    body += ["cp_async_wait();", "__syncthreads();"]
    body += _cumulate(decl)
    body.append("__syncthreads();")
    body += _scores(decl)
    append_guard = f.guards.get("append")
    # head-level records: one V-tile writes decays, the first head of a group writes keys
    if append_guard is not None:
        kh_cond = "hv % GROUP == 0" if decl.key_level == "group" else "true"
        khead = "hk" if decl.key_level == "group" else "hv"
        rec = ["if (blockIdx.x == 0) {"]
        if decl.decay_form == "scalar":
            rec.append("    for (int j = tid; j < t; j += THREADS) rec_decay[((size_t)slot * HV + hv) * CAPACITY + n + j] = sh_G[n + j];")
        elif decl.decay_form == "vector":
            rec.append("    for (int x = tid; x < t * K; x += THREADS) rec_decay[(((size_t)slot * HV + hv) * CAPACITY + n) * K + x] = sh_G[n * K + x];")
        rec.append(f"    if ({kh_cond}) for (int x = tid; x < t * K; x += THREADS) "
                   f"rec_key[(((size_t)slot * KEY_HEADS + {khead}) * CAPACITY + n) * K + x] = sh_key[n * K + x];")
        rec.append("}")
        body += _guarded(append_guard, rec)
    body.append("__syncthreads();")
    body += _row_records() + _replay_rows(decl, f, program, append_guard)
    if "fold_tokens" in f.stmts:
        fold = (_fold_keys(decl, "n + t - 1", "n + t") + _fold_rows(decl, "n + t - 1", "n + t")
                + _store_rows(CHECKPOINT_ROW.format(page="dst")))
        body += _guarded(f.guards["fold_tokens"], fold)  # uniform per CTA: the barrier inside is safe
    return body


def _render_recur(k: Kernel, f: Facts, program: Program) -> list[str]:
    decl = program.declaration
    body = _ids(f) + _shared_decls(decl, f.drafts, replay=False) + _fill_lines(f)
    body += _row_loads(STATE_ROW.format(page="src"))
    body += _fields(decl, "recur") + _stage_row_fields(decl)  # n = 0: keys at sh_key[j * K]
    body.append("__syncthreads();")
    decay = {"none": [], "scalar": ["const float a = sh_g[j];",
                                    "#pragma unroll", "for (int i = 0; i < KE; ++i) s[r][i] *= a;"],
             "vector": ["#pragma unroll",
                        "for (int i = 0; i < KE; ++i) { const int e = k_index(i, lane); if (e < K) s[r][i] *= sh_g[j * K + e]; }"]}[decl.decay_form]
    value = _row_field(decl, "value")
    write = (["const float pk = warp_sum(row_dot_partial(s[r], sh_key + j * K, lane));",
              f"const float w = sh_beta[j] * ({value} - pk);"] if decl.is_delta
             else [f"const float w = sh_beta[j] * {value};"])
    snapshots = f.stmts["recur"].attr("snapshots")
    inner = decay + write + [
        "#pragma unroll",
        "for (int i = 0; i < KE; ++i) { const int e = k_index(i, lane); if (e < K) s[r][i] += w * sh_key[j * K + e]; }",
        "float o = warp_sum(row_dot_partial(s[r], sh_q + j * K, lane));",
    ] + _epilogue(decl) + [
        "if (lane == 0 && row < V) out[(((size_t)b * t_tok + j) * HV + hv) * V + row] = o;",
    ]
    if snapshots:
        inner.append("if (row < V) store_row(snapshots + ((((size_t)b * t_tok + j) * HV + hv) * V + row) * K, s[r], lane);")
    body += _draft_row_loop(inner)
    if not snapshots:
        body += _store_rows(STATE_ROW.format(page="dst"))
    return body


def _render_fold(k: Kernel, f: Facts, program: Program) -> list[str]:
    decl = program.declaration
    body = _ids(f) + _fill_lines(f)
    guard = f.guards.get("fold", "")
    if guard:
        body.append(f"if (!({guard})) return;")
    body += ["__shared__ __align__(16) float sh_key[NREC * K];", "__shared__ float sh_w[NREC * (BV + 1)];"]
    if decl.decay_form == "scalar":
        body.append("__shared__ float sh_G[NREC];")
    elif decl.decay_form == "vector":
        body += ["__shared__ __align__(16) float sh_G[NREC * K];", "__shared__ float sh_ed[K];"]
    body += _row_loads(CHECKPOINT_ROW.format(page="src"))
    body += _load_records(decl) + ["cp_async_wait();", "__syncthreads();"]
    body += _row_records()
    fold = _fold_keys(decl, "n - 1", "n") + _fold_rows(decl, "n - 1", "n")
    body += ["if (n > 0) {  // uniform per CTA"] + ["    " + x for x in fold] + ["}"]
    if "store_state:materialized" in f.guards:
        body += _store_rows("materialized + (((size_t)b * HV + hv) * V + row) * K")
    else:
        body += _store_rows(CHECKPOINT_ROW.format(page="dst"))
    return body


def _render_copy(k: Kernel, f: Facts, program: Program) -> list[str]:
    body = _ids(f) + _fill_lines(f)
    body += ["#pragma unroll", "for (int r = 0; r < RPW; ++r) {", "    const int row = v0 + warp * RPW + r;",
             "    if (row >= V) continue;", "    float s[KE];",
             "    load_row(initial + (((size_t)b * HV + hv) * V + row) * K, s, lane);",
             "    store_row(" + CHECKPOINT_ROW.format(page="dst") + ", s, lane);", "}"]
    return body


def _render_fill(k: Kernel, f: Facts, program: Program) -> list[str]:
    value = f.stmts["set_fill"].attr("value")
    update = {
        "zero": ["fill[slot] = 0;"],
        "advance": [f"if ({FILL_UNHELD}) return;", "fill[slot] = (n + 1 >= WINDOW) ? 0 : n + 1;"],
        "commit": ["const int t = drafts[b], a = accepted[b];",
                   f"if ({DRAFTS_UNHELD} || a < 0 || a > t || {FILL_UNHELD}) return;  // no fill past capacity",
                   "fill[slot] = ((n + t > CAPACITY) ? 0 : n) + a;"],
    }[value]
    return ["const int b = blockIdx.x * blockDim.x + threadIdx.x;", "if (b >= rows) return;",
            "const int slot = slots[b], src = src_page[b], dst = dst_page[b];",
            f"if ({OUTSIDE_CACHE}) return;  // as the tiled kernels: a row they skip keeps its fill",
            "const int n = fill[slot];", "(void)n;"] + update


TEMPLATES = {"replay": _render_replay, "recur": _render_recur, "fold": _render_fold, "copy": _render_copy,
             "fill": _render_fill}


def render_kernel(kernel: Kernel, program: Program, launch: LaunchConfig) -> str:
    f = _facts(kernel)
    body = TEMPLATES[f.family](kernel, f, program)
    args = ",\n    ".join(f"{ctype} __restrict__ {name}" if "*" in ctype else f"{ctype} {name}"
                          for ctype, name in kernel_arguments(program))
    bounds = (f"__launch_bounds__({FILL_THREADS})" if f.family == "fill"
              else f"__launch_bounds__({launch.threads}, {launch.min_blocks})")
    plan = "\n".join("// " + line for line in kernel.pretty().splitlines())
    return (f"{plan}\nextern \"C\" __global__ void {bounds} {kernel.name}(\n    {args})\n{{\n"
            + "\n".join("    " + line for line in body) + "\n}\n")


def _constants(program: Program, launch: LaunchConfig) -> list[str]:
    shape, cfg, decl = program.shape, program.config, program.declaration
    K = shape.k_dim
    vec = 4 if K % 4 == 0 else 1
    kch = -(-K // (32 * vec))
    nrec = cfg.capacity + 1
    if nrec > 32:
        raise LoweringError(f"capacity: window + max_drafts = {cfg.capacity} > 31; the CUDA backend keeps one "
                            "record per lane (use a smaller window or fewer drafts)")
    consts = {"HV": shape.heads, "H": shape.key_heads, "GROUP": shape.group_size, "V": shape.v_dim, "K": K,
              "KEY_HEADS": shape.key_heads if decl.key_level == "group" else shape.heads,
              "WINDOW": cfg.window, "CAPACITY": cfg.capacity, "TMAX": cfg.max_drafts, "NREC": nrec,
              "VEC": vec, "KCH": kch, "WARPS": launch.warps, "RPW": launch.rows_per_warp,
              "BV": launch.rows_per_cta, "THREADS": launch.threads}
    return [f"#define {name} {value}" for name, value in consts.items()]


def render_program(program: Program, launch: LaunchConfig | None = None, kernels=None) -> str:
    """The whole CUDA source of ``program`` (or of the named ``kernels``), deterministic."""
    launch = launch or LaunchConfig()
    decl, shape, cfg = program.declaration, program.shape, program.config
    state_t = STATE_C_TYPES[cfg.state_dtype]
    header = [
        f"// Generated by replayssm-dsl: ReplaySSM decode kernels for recurrence {decl.name!r}",
        f"// declaration fingerprint {decl.fingerprint}",
        f"// shape: HV={shape.heads} H={shape.key_heads} V={shape.v_dim} K={shape.k_dim}; "
        f"window L={cfg.window}, max drafts T={cfg.max_drafts}, state {cfg.state_dtype}; "
        f"launch {launch.warps} warps x {launch.rows_per_warp} rows",
        "//",
    ] + ["// " + line for line in decl.describe().splitlines()] + [""]
    includes = []
    if cfg.state_dtype == "float16":
        includes = ["#define REPLAY_HALF_STATE 1"]
    elif cfg.state_dtype == "bfloat16":
        includes = ["#define REPLAY_BF16_STATE 1"]
    parts = header + includes + _constants(program, launch) + [f"typedef {state_t} STATE_T;", "",
                                                               COMMON_HEADER.read_text().replace("#pragma once\n", ""), ""]
    for kernel in program.kernels:
        if kernels is None or kernel.name in kernels:
            parts.append(render_kernel(kernel, program, launch))
    return "\n".join(parts)
