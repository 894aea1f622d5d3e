"""Lowering layer: the replay template (``replay_step``, ``verify``): output from the checkpoint and
the buffer of records, no state write.

Head-level work in shared memory (cumulative decays, decayed queries and keys, the scores of every
draft against every record), then each warp's rows in groups reduced together (one transpose
reduction for a group's outputs and key projections; the lane holding a row's sum finishes the row);
verify takes the drafts one after another. On a flush the step folds its records into the
checkpoint. See docs/design.md for the math.
"""

from __future__ import annotations

from replayssm_dsl.config import STATE_DTYPES
from replayssm_dsl.errors import LoweringError

from .ir import Kernel, Program
from .launch import FRAGMENT_DRAFTS, LaunchConfig, write_record_layout
from .record_inputs import raw_record_inputs
from .render_expr import input_element
from .render_verify_mma import (DRAFT_DECAY_SUMS, decay_in_products, draft_decay_scan, mma_scores, mma_state_loads, mma_verify_rows,
                                record_decay_sum, shared_fragment_copies, shared_fragments_back, shared_fragments_bytes,
                                shared_fragments_refusal, tensor_core_scores, tensor_core_verify)
from .render_blocks import (CHECKPOINT_ROW, DYNAMIC_SHARED, FILL_UNHELD, NEXT_FILL, Facts, decay_between, facts, fields, first_draft_loads,
                            fill_load_lines, flush_rule_lines, fold_keys, fold_rows, guarded, hoistable_inputs, ids, output_store,
                            record_write_store, row_check_lines, row_loads, row_records, rows_reduced_group, shared_decls,
                            shared_page_lines, state_page_lines, store_rows, token_prefetch)
from .record_keys import key_shift, keys_per_key_head
from .render_records import last_record_decays, load_records, record_decay_sums, records_ready
from .render_row_fields import epilogue, register_row_fields, row_field, stage_row_fields
from .render_row_inputs import stage_row_input_copies, staged_row_input_decls, staged_row_inputs


def _cumulate(decl, raw: dict, fragments: bool = False, shift: float | None = None) -> list[str]:
    """G_{n+j} = G_{n-1} + Σ_{j'≤j} g_{j'} (a running sum over the drafts, per element for a decay
    vector; with the decay's raw input in the records, ``raw``, their running sums first); the drafts'
    keys join the records' (sh_key[n + j]); the decayed query and key
    e^{G_{n+j}} ⊙ q_j, e^{G_{n+j}} ⊙ k_j replace the raw ones (each thread rewrites only its elements),
    or with ``fragments`` (verify on tensor cores, whose fields put the keys and raw decay vectors at
    n + j: ``fields(at_fill=True)``) go to ``sh_qd`` / ``sh_kd`` in B-fragment order, the drafts from t
    to FRAGMENT_DRAFTS as zeros (the rows' products read them after the next barrier). With
    decay-scaled keys (``shift``) the drafts' keys join the records' scaled, e^{C − G_{n+j}} ⊙ k_j."""
    if fragments:
        return _cumulate_into_fragments(decl, raw, shift)
    start, step = _running_decay(decl, raw, "sh_qd[x]", "this line")
    body = ["const int x = j * K + e;"] + step + [
        "const float key = sh_kd[x];", f"sh_key[(n + j) * K + e] = key{_key_scale(shift)};",
        "sh_kd[x] = key * dec;", "sh_qd[x] = sh_q[x] * dec;"]
    return (["for (int e = tid; e < K; e += THREADS) {"] + (["    " + start] if start else [])
            + ["    for (int j = 0; j < t; ++j) {"] + ["        " + line for line in body] + ["    }", "}"])


def _running_decay(decl, raw: dict, raw_vector: str, until: str) -> tuple[str, list[str]]:
    """The cumulate's running sum at element e: the C line before the drafts' loop (``start``, empty
    without a decay) and draft j's lines (``step``) that end with ``dec`` = e^{G_{n+j}}; a decay
    vector's raw log-decay of draft j is read from ``raw_vector`` (overwritten no earlier than ``until``)."""
    if decl.decay_form == "vector":  # records of raw decays: widened, not summed, so sum them here first
        start = record_decay_sums("n") if "decay" in raw else "float acc = n ? sh_G[(n - 1) * K + e] : 0.f;"
        return start, [f"acc += {raw_vector};  // the raw log-decay until {until}", "sh_G[(n + j) * K + e] = acc;",
                       "const float dec = expf(acc);"]
    if decl.decay_form == "scalar":
        return "float acc = n ? sh_G[n - 1] : 0.f;", ["acc += sh_g[j];", "if (e == 0) sh_G[n + j] = acc;",
                                                      "const float dec = expf(acc);"]
    return "", ["const float dec = 1.f;"]


def _key_scale(shift: float | None) -> str:
    """The factor a draft's key takes as its record keeps it (``acc`` = G_{n+j}): none, or e^{C − G}."""
    return "" if shift is None else " * expf(KEY_SHIFT - acc)"


def _cumulate_into_fragments(decl, raw: dict, shift: float | None = None) -> list[str]:
    """``_cumulate`` for verify on tensor cores: the same running sums, read and written in place at
    n + j, and the decayed queries (keys) written once, in B-fragment order (``fragment_slot``)."""
    start, step = _running_decay(decl, raw, "sh_G[(n + j) * K + e]", "the next line")
    stores = ([("sh_kd", "sh_key[(n + j) * K + e] * dec")] if decl.is_delta else []) + [("sh_qd", "sh_q[j * K + e] * dec")]
    body = step + ["const int y = fragment_slot(j, e);"] + [f"{a}[y] = {v};" for a, v in stores]
    if shift is not None:  # after the fragments have read it: the key as its record keeps it
        body.append("sh_key[(n + j) * K + e] *= expf(KEY_SHIFT - acc);")
    zeros = ([f"for (int j = t; j < {FRAGMENT_DRAFTS}; ++j) {{  // the columns past the drafts",
              "    const int y = fragment_slot(j, e);"] + [f"    {a}[y] = 0.f;" for a, _ in stores] + ["}"])
    return (["for (int e = tid; e < K; e += THREADS) {"] + (["    " + start] if start else [])
            + ["    for (int j = 0; j < t; ++j) {"] + ["        " + line for line in body] + ["    }"]
            + ["    " + line for line in zeros] + ["}"])


def _scores(decl, per_trip: str = "SCORE_RECORDS", shift: float | None = None) -> list[str]:
    """sq[j][i] = (k_i ⊙ e^{G_{n+j} − G_i})·q_j for every record i ≤ n + j, and for delta rules
    sk[j][i] = (…)·k_{n+j} too (only the delta rule's correction reads it): a warp takes ``per_trip``
    records per trip (the C constant ``SCORE_RECORDS``, or verify's own ``VERIFY_SCORE_RECORDS``), their
    ``PARTS`` · per_trip dot products in one transpose reduction (``warp_sum_spread``), and each lane
    holding a sum scales and stores it. The first warp moves with the draft, so the drafts' last,
    partial trips fall on different warps. With decay-scaled keys (``shift``, record_keys.py) every key
    in ``sh_key`` (the records' and, since the cumulate, the drafts') is k̃_i = e^{C − G_i} ⊙ k_i, and
    draft j's query and key take e^{G_{n+j} − C} once per lane element (``qe``, ``ke``): no
    exponential per record."""
    r = per_trip
    dec = f" * {decay_between(decl, 'n + j', 'rec')}" if decl.decay_form == "vector" and shift is None else ""
    scale = decay_between(decl, "n + j", "rec") if decl.decay_form == "scalar" else "1.f"
    query, key = ("qe[c]", "ke[c]") if shift is not None else ("sh_q[j * K + e]", "sh_key[(n + j) * K + e]")
    if decl.is_delta:
        sums = ["float aq = 0.f, ak = 0.f;"]
        terms = [f"aq += kd * {query};", f"ak += kd * {key};"]
        keep, target = f"dot[u] = aq; dot[{r} + u] = ak;", f"(u < {r} ? sh_sq : sh_sk)"
        lane_sum = f"const int u = lane / SCORE_LANES, rec = i + u % {r};  // u ≥ {r}: a key score"
    else:
        sums, terms, keep, target = ["float aq = 0.f;"], [f"aq += kd * {query};"], "dot[u] = aq;", "sh_sq"
        lane_sum = f"const int u = lane / SCORE_LANES, rec = i + u % {r};"
    dots = (["#pragma unroll", f"for (int u = 0; u < {r}; ++u) {{",
             "    const int rec = min(i + u, n + j);  // past n + j: a copy of the last record, never stored"]
            + ["    " + line for line in sums]
            + ["    #pragma unroll", "    for (int c = 0; c < KE; ++c) {", "        const int e = k_index(c, lane);",
               "        if (e < K) {", f"            const float kd = sh_key[rec * K + e]{dec};"]
            + ["            " + line for line in terms] + ["        }", "    }", "    " + keep, "}"])
    body = ([f"float dot[PARTS * {r}];"] + dots
            + ["const float sum = warp_sum_spread(dot, lane);  // lane l: dot l / SCORE_LANES",
               f"constexpr int SCORE_LANES = 32 / (PARTS * {r});", lane_sum,
               "if (lane % SCORE_LANES == 0 && rec <= n + j)",
               f"    {target}[j * NREC + rec] = sum * {scale};"])
    draft_decay = [] if shift is None else ([
        "    float qe[KE], ke[KE];  // draft j's query and key times e^{G_{n+j} - C}, at the lane's elements"
        if decl.is_delta else "    float qe[KE];  // draft j's query times e^{G_{n+j} - C}, at the lane's elements",
        "    #pragma unroll",
        "    for (int c = 0; c < KE; ++c) {",
        "        const int e = k_index(c, lane);",
        "        const float ej = e < K ? expf(sh_G[(n + j) * K + e] - KEY_SHIFT) : 0.f;",
        "        qe[c] = e < K ? sh_q[j * K + e] * ej : 0.f;"]
        + (["        ke[c] = e < K ? (sh_key[(n + j) * K + e] * ej) * ej : 0.f;  // (its scaled key times e^{G - C} is k_j)"]
           if decl.is_delta else []) + ["    }"])  # a plain write reads no key score
    return ([f"static_assert(32 % (PARTS * {r}) == 0, \"a warp's lanes split evenly between a trip's sums\");",
             "for (int j = 0; j < t; ++j) {"] + draft_decay
            + [f"    for (int i = {r} * ((warp + j) % WARPS); i <= n + j; i += {r} * WARPS) {{"]
            + ["        " + line for line in body] + ["    }", "}"])


def _rows_reduced_together(decl, f: Facts, append_guard, group: str, first: str, end: str, record_lane: str,
                           keep_record: str | None, shared_rows: bool = False, fields_in_registers: bool = False) -> list[str]:
    """One group of ``group`` rows (a C constant: ``ROWS_REDUCED`` or ``VERIFY_ROWS_REDUCED``; rows
    ``first`` + u while below ``end``) for token j, reduced together (``rows_reduced_group``): each
    row's output part (checkpoint and the records before the token) and, for delta rules, its key
    projection, in one pass over the row's registers. Delta rules put output parts in the lower half
    of the values and key projections in the upper, so lane l < 16 gets its row's projection from
    lane l + 16. The token's write then goes to ``record_lane`` of each row's ``wv``, where later
    tokens and the fold read it: always when ``keep_record`` is None, when that C condition holds, or
    never when it is empty. With ``shared_rows`` the rows from RREG on come from shared memory
    (``state_row``), the first RREG from the registers ``s``; with ``fields_in_registers`` the token's
    row fields come from the finishing lane's registers (``register_row_fields``)."""
    value = row_field(decl, "value", fields_in_registers)
    scores = [f"const float sq_lane = lane < {record_lane} ? sh_sq[j * NREC + lane] : 0.f;  // record lane's score, 0 past the records"]
    row = "rs" if shared_rows else "s[r]"
    fill_parts = (["float rs[KE];  // row r: the registers below RREG, shared memory from RREG on",
                   "state_row(s, r, sh_rows + warp * SRPW * K, rs, lane, v0 + warp * RPW + r < V);"] if shared_rows else [])
    fill_parts.append(f"part[u] = row_dot_partial({row}, sh_qd + j * K, lane, wv[r] * sq_lane);")
    if decl.is_delta:
        scores.append(f"const float sk_lane = lane < {record_lane} ? sh_sk[j * NREC + lane] : 0.f;")
        fill_parts.append(f"part[{group} + u] = row_dot_partial({row}, sh_kd + j * K, lane, wv[r] * sk_lane);")
        write = [f"w = sh_beta[j] * ({value} - pk);"]
    else:
        write = [f"w = sh_beta[j] * {value};"]
    finish = (write + [f"float o = sum + w * sh_sq[j * NREC + {record_lane}];"] + epilogue(decl, fields_in_registers)
              + [output_store(f)])
    if append_guard is not None:
        finish += guarded(append_guard, [record_write_store()])
    keep = ["#pragma unroll", f"for (int v = 0; v < {group}; ++v) {{",
            f"    if ({first} + v < {end}) {{  // known at compile time: no shuffle for padding rows",
            "        const float w_row = __shfl_sync(0xffffffffu, w, v * SUM_LANES);",
            f"        if (lane == {record_lane}) wv[{first} + v] = w_row;", "    }", "}"]
    return (rows_reduced_group(decl, group, first, end, fill_parts, finish, head=scores)
            + (keep if keep_record is None else guarded(keep_record, keep) if keep_record else []))


def _replay_rows_drafts(decl, f: Facts, append_guard) -> list[str]:
    """Drafts one after another, the warp's rows inside in groups reduced together
    (``_rows_reduced_together``), ``VPASS`` rows at a time through all drafts
    (``LaunchConfig.verify_rows``: fewer values live, so 16 rows per warp fit without spilling).
    Lane i < n + j of a row's ``wv`` holds record i's write; draft j's goes into lane n + j."""
    group = _rows_reduced_together(decl, f, append_guard, "VERIFY_ROWS_REDUCED", "c", "c_end", "n + j", None)
    return (["#pragma unroll",
             "for (int c0 = 0; c0 < RPW; c0 += VPASS) {  // compile-time row indices after unrolling",
             "    const int c_end = c0 + VPASS < RPW ? c0 + VPASS : RPW;",
             "    for (int j = 0; j < t; ++j) {",
             "        #pragma unroll",
             "        for (int c = c0; c < c_end; c += VERIFY_ROWS_REDUCED) {"]
            + ["            " + line for line in group] + ["        }", "    }", "}"])


def _replay_rows(decl, f: Facts, append_guard, shared_rows: bool, fields_in_registers: bool) -> list[str]:
    """The rows' outputs and write records: one token, or drafts one after another."""
    if f.drafts:
        return _replay_rows_drafts(decl, f, append_guard)
    keep = "flush" if "fold_tokens" in f.stmts else ""  # only the fold reads the token's record
    group = _rows_reduced_together(decl, f, append_guard, "ROWS_REDUCED", "c", "RPW", "n", keep, shared_rows,
                                   fields_in_registers)
    return (["#pragma unroll", "for (int c = 0; c < RPW; c += ROWS_REDUCED) {", "    const int j = 0;  // the one token"]
            + ["    " + line for line in group] + ["}"])


SHARED_ROW = "sh_rows + ((size_t)warp * SRPW + r0 - RREG + r) * K"  # row r0 + r of the warp (r0 ≥ RREG)
SHARED_ROWS_WAIT = "shared_rows_wait(&sh_rows_bar);"


def _fold_shared_rows(decl, last: str, count: str) -> list[str]:
    """The fold of the warp's shared rows (RREG on), FOLD_ROWS at a time: read from shared memory into
    registers, folded as the register rows (``fold_rows``, their writes from ``wv[r0]`` on), stored to
    the checkpoint's ``dst`` page. Unrolled, so ``wv`` stays in registers."""
    rows = row_loads(SHARED_ROW, "FOLD_ROWS", "r0")
    return (["constexpr int FOLD_ROWS = SRPW < 4 ? SRPW : 4;  // shared rows in registers at a time",
             "#pragma unroll", "for (int r0 = RREG; r0 < RPW; r0 += FOLD_ROWS) {"]
            + ["    " + x for x in rows + fold_rows(decl, last, count, rows="FOLD_ROWS", first="r0")
               + store_rows(CHECKPOINT_ROW.format(page="dst"), "FOLD_ROWS", "r0")]
            + ["}"])


def _state_row_bytes(program: Program) -> int:
    return program.shape.k_dim * STATE_DTYPES[program.config.state_dtype]


def _is_replay_step(f: Facts) -> bool:
    """Whether ``f`` is the replay step's (one token), not verify's (drafts): the launch options for
    the step's rows and records change it alone."""
    return f.family == "replay" and not f.drafts


def _takes_shared_rows(f: Facts, launch: LaunchConfig) -> bool:
    """Whether the kernel of ``f`` keeps rows in shared memory at ``launch``: the replay step (verify
    keeps every row in registers)."""
    return bool(launch.shared_rows) and _is_replay_step(f)


def _writes_in_registers(f: Facts, launch: LaunchConfig) -> bool:
    """Whether the kernel of ``f`` loads its write records straight into registers (``wv``) as soon as
    the fill is known, instead of staging them in shared memory, at ``launch`` (``register_writes``):
    the replay step, whose one token needs each warp's own rows only (verify's tensor-core fragments
    gather them from shared memory). Frees NREC · W_PITCH floats of shared memory per CTA (KDA's
    records fill it) for more CTAs or shared rows per SM, at the cost of RPW registers held through
    the head-level work."""
    return launch.register_writes and _is_replay_step(f)


def _fields_in_registers(f: Facts, launch: LaunchConfig) -> bool:
    """Whether the kernel of ``f`` loads its token's row fields into the registers of the lanes that
    finish each row (``register_row_fields``) at ``launch`` (``register_fields``): the replay step, whose
    rows reduce in groups of ROWS_REDUCED. Frees BV floats of static shared memory per field and CTA
    (with ``sh_ed`` in ``sh_q``, the 768 bytes that KDA's ``8x16/r80/s12/w`` needs for 3 CTAs per SM), at
    the cost of RPW / ROWS_REDUCED registers per field."""
    return launch.register_fields and _is_replay_step(f)


def _writes_in_dynamic_shared(f: Facts) -> bool:
    """Whether the kernel of ``f`` keeps its write records in dynamic shared memory: verify, whose
    static arrays and write records pass the 48 KiB a kernel's static shared memory may take at
    128-row CTAs for KDA (the decay vectors' records), so that one CTA can take a whole head there."""
    return f.family == "replay" and not _is_replay_step(f)


def _write_records_bytes(program: Program, launch: LaunchConfig) -> int:
    """Bytes of the write records in shared memory: NREC records, W_PITCH floats apart."""
    _, pitch = write_record_layout(launch.rows_per_warp, launch.rows_per_cta, program.shape.v_dim)
    return (program.config.capacity + 1) * pitch * 4


def shared_rows_refusal(program: Program, launch: LaunchConfig) -> str | None:
    """Why ``launch.shared_rows`` cannot serve ``program`` (None when it can, or is 0): the bulk copies
    move whole 16-byte units, so a state row must be a multiple of 16 bytes."""
    if not launch.shared_rows:
        return None
    row_bytes = _state_row_bytes(program)
    if row_bytes % 16:
        return (f"shared_rows: launch {launch.label} copies state rows in 16-byte units, but a row of K = "
                f"{program.shape.k_dim} {program.config.state_dtype} elements is {row_bytes} bytes (use shared_rows=0)")
    return None


def dynamic_shared_bytes(kernel: Kernel, program: Program, launch: LaunchConfig) -> int:
    """Bytes of dynamic shared memory ``kernel`` launches with: the replay step's shared rows
    (WARPS · SRPW rows of K state elements), verify's write records (NREC · W_PITCH floats) and after
    them, at a 16-byte boundary, its shared fragments (``shared_fragment_copies``), 0 for every other
    kernel."""
    f = facts(kernel)
    if _takes_shared_rows(f, launch):
        return launch.warps * launch.shared_rows * _state_row_bytes(program)
    if _writes_in_dynamic_shared(f):
        if _verify_shared_fragments(f, program, launch):
            return -(-_write_records_bytes(program, launch) // 16) * 16 + shared_fragments_bytes(launch)
        return _write_records_bytes(program, launch)
    return 0


def _verify_shared_fragments(f: Facts, program: Program, launch: LaunchConfig) -> int:
    """The chunks of each lane's fragment row the kernel of ``f`` moves through shared memory at
    ``launch`` (``shared_fragment_copies``): the launch's ``shared_fragments`` where verify's rows run
    on tensor cores, 0 elsewhere (the option changes nothing there)."""
    return launch.shared_fragments if f.drafts and tensor_core_verify(program, launch) else 0


def render_replay(k: Kernel, f: Facts, program: Program, launch: LaunchConfig) -> list[str]:
    decl = program.declaration
    tensor_cores = f.drafts and tensor_core_verify(program, launch)
    fragment_drafts = FRAGMENT_DRAFTS if tensor_cores else None
    decays_in_products = f.drafts and decay_in_products(program, launch)  # no cumulate: the last warp sums the drafts' decays
    shared_rows = _takes_shared_rows(f, launch)  # the step's last rows of each warp in shared memory
    refusal = shared_rows_refusal(program, launch) if shared_rows else None
    if refusal:
        raise LoweringError(refusal)
    writes_in_registers = _writes_in_registers(f, launch)
    fields_in_registers = _fields_in_registers(f, launch)
    raw = raw_record_inputs(decl, program.config)  # record fields kept as the token's raw bf16 input
    shift = key_shift(decl, program.config)  # C of decay-scaled record keys (record_keys.py), or None
    writes = "none" if writes_in_registers else "dynamic" if _writes_in_dynamic_shared(f) else "static"
    assert not (shared_rows and writes == "dynamic"), "one kernel's dynamic shared memory holds one thing"
    # verify on tensor cores copies its row inputs to shared memory before the state rows (render_row_inputs)
    staged = staged_row_inputs(decl, program.shape.v_dim, launch.rows_per_cta) if tensor_cores else {}
    body = ids(f) + shared_decls(decl, f.drafts, replay=True, fragment_drafts=fragment_drafts, writes=writes,
                                  folds="fold_tokens" in f.stmts, row_copies=bool(staged),
                                  fields_in_registers=fields_in_registers, draft_decay_sums=decays_in_products)
    body += staged_row_input_decls(decl, staged)
    if shared_rows:  # dynamic shared memory (dynamic_shared_bytes), so static and dynamic may pass 48 KiB together
        body += [DYNAMIC_SHARED,
                 "STATE_T* const sh_rows = reinterpret_cast<STATE_T*>(dynamic_shared);  // [WARPS, SRPW, K]: each warp's rows RREG..RPW-1",
                 "__shared__ __align__(8) unsigned long long sh_rows_bar;  // their bulk copies' mbarrier"]
    body += token_prefetch(decl, f.drafts, copied=tuple(staged)) + row_check_lines(f) + stage_row_input_copies(decl, staged)
    shared_fragments = _verify_shared_fragments(f, program, launch)
    refusal = shared_fragments_refusal(program, launch) if shared_fragments else None
    if refusal:
        raise LoweringError(refusal)
    assert not shared_fragments or writes == "dynamic", "the shared fragments lie after sh_w in dynamic shared memory"
    loads = (lambda expr: mma_state_loads(expr, shared_fragments)) if tensor_cores else row_loads
    hoisted = hoistable_inputs(decl) if tensor_cores else ()  # (the SIMT rows under a cap have no registers to spare)
    page_waits_on_fill = "load_state:checkpoint:dst" in f.guards
    state = (shared_page_lines(f) if page_waits_on_fill else state_page_lines(f)) + first_draft_loads(decl, hoisted)
    checkpoint_row = CHECKPOINT_ROW.format(page="page")
    if shared_rows:  # the bulk copies first: nothing waits on them until the rows phase
        state += ["if (tid == 0) shared_rows_copy(sh_rows, &sh_rows_bar, checkpoint + ((size_t)page * HV + hv) * V * K, v0);"]
        state += row_loads(checkpoint_row, "RREG")
    else:
        state += loads(checkpoint_row)
    row_fields = (register_row_fields(decl) if fields_in_registers else [] if staged
                  else stage_row_fields(decl, hoisted=hoisted))
    token_fields = (fields(decl, "replay", one_token=not f.drafts, hoisted=hoisted, at_fill=tensor_cores,
                           query_fragments=decays_in_products)
                    + (draft_decay_scan(decl, hoisted) if decays_in_products else []) + row_fields)
    if writes_in_registers:  # lane i: record i's writes at the warp's rows (zeros where no record is loaded)
        state = ["float wv[RPW] = {};"] + state
    # the records' copies start as soon as n is known, so their round trip overlaps the token's fields
    if page_waits_on_fill or "empty_records" in f.stmts:
        # the state rows' loads first: only a shared page waits for the fill to pick src or dst
        # (a row that stops at its fill first waits for the row inputs' copies in flight)
        body += (state if page_waits_on_fill else []) + fill_load_lines(f, copies_in_flight="cp_async_wait();" if staged else "")
        if "empty_records" in f.stmts:
            body += guarded(f.guards["empty_records"], ["n = 0;  // the buffer was folded into dst before this launch"])
        body += ([] if page_waits_on_fill else state)
        body += guarded(f.guards.get("load_records", ""), load_records(decl, raw, "n", writes_in_registers, shift))
        body += shared_fragment_copies(checkpoint_row, shared_fragments) if shared_fragments else []
        body += token_fields
    else:  # the state rows (and with EAGER_RECORDS the whole buffer) fly while the fill arrives
        assert not f.guards.get("load_records"), "staging before the fill is known reads every record"
        assert not tensor_cores, "verify's fields on tensor cores write at the fill: n is known before them"
        # (rows from n on are stale copies, never read: V-tile 0 may be writing row n to global meanwhile)
        moves_fill = "set_fill" in f.stmts
        body += ((_arrive() if moves_fill else []) + state
                 + guarded("EAGER_RECORDS", load_records(decl, raw, "CAPACITY", writes_in_registers, shift, decays=False)))
        # a row that stops here waits for its copies first (thread 0 waits for the bulk copies: it began them)
        stop = "cp_async_wait();" + (f" if (tid == 0) {SHARED_ROWS_WAIT}" if shared_rows else "")
        body += _fill_from_arrival(f, stop) if moves_fill else fill_load_lines(f, copies_in_flight=stop)
        body += guarded("!EAGER_RECORDS", load_records(decl, raw, "n", writes_in_registers, shift))
        if shift is not None:  # the eager copies could not address G_{n-1} before the fill
            body += guarded("EAGER_RECORDS", last_record_decays())
        if writes_in_registers:  # the whole buffer's writes came in: keep the fill's
            body += guarded("EAGER_RECORDS", ["#pragma unroll", "for (int r = 0; r < RPW; ++r) wv[r] = lane < n ? wv[r] : 0.f;"])
        body += token_fields
    assert "set_fill" not in f.stmts or "empty_records" not in f.stmts, "the fill's arrival is on the staging path"
    # (the cumulate sums the records' raw decays; the shared fragments' copy group stays in flight until the products)
    body += records_ready(decl, raw, "n", sum_decays=False, wait="cp_async_wait_all_but_last();  // all but the shared fragments"
                          if shared_fragments else "cp_async_wait();")
    body += stage_row_fields(decl, staged, hoisted) if staged else []  # the fields from the copies, read by the rows two barriers on
    if decays_in_products:  # the fields wrote the queries' fragments: the scores read only what the barrier above covers
        body += DRAFT_DECAY_SUMS
    else:
        body += _cumulate(decl, raw, fragments=tensor_cores, shift=shift) + ["__syncthreads();"]
    if f.drafts and tensor_core_scores(program, launch):
        body += mma_scores(decl, shift, decay_sums=decays_in_products)
    else:  # SIMT: the replay step, verify with a decay vector of plain keys, verify off the tensor cores or at /c
        body += _scores(decl, "VERIFY_SCORE_RECORDS" if f.drafts else "SCORE_RECORDS", shift)
    append_guard = f.guards.get("append")
    # head-level records: one V-tile writes decays, and keys (the first head of a group where they are per key head)
    if append_guard is not None:
        per_group = keys_per_key_head(decl, shift)
        kh_cond = "hv % GROUP == 0" if per_group else "true"
        khead = "hk" if per_group else "hv"
        raw_x = {field: input_element(spec, "x % K", token="x / K") for field, spec in raw.items()}
        rec = ["if (blockIdx.x == 0) {"]
        if decl.decay_form == "scalar":
            G = record_decay_sum("n + j", decays_in_products)
            rec.append(f"    for (int j = tid; j < t; j += THREADS) rec_decay[((size_t)slot * HV + hv) * CAPACITY + n + j] = {G};")
        elif decl.decay_form == "vector":
            rec.append("    for (int x = tid; x < t * K; x += THREADS) rec_decay[(((size_t)slot * HV + hv) * CAPACITY + n) * K + x] = "
                       f"{raw_x.get('decay', 'sh_G[n * K + x]')};")
        rec.append(f"    if ({kh_cond}) for (int x = tid; x < t * K; x += THREADS) "
                   f"rec_key[(((size_t)slot * KEY_HEADS + {khead}) * CAPACITY + n) * K + x] = {raw_x.get('key', 'sh_key[n * K + x]')};")
        rec.append("}")
        body += guarded(append_guard, rec)
    body.append("__syncthreads();")
    if tensor_cores:
        body += (shared_fragments_back(shared_fragments) if shared_fragments else []) + mma_verify_rows(decl, f, append_guard, decays_in_products)
    else:
        body += [SHARED_ROWS_WAIT + "  // the shared rows have landed"] if shared_rows else []
        body += ([] if writes_in_registers else row_records()) + _replay_rows(decl, f, append_guard, shared_rows, fields_in_registers)
    if "fold_tokens" in f.stmts:
        rows = "RREG" if shared_rows else "RPW"
        fold = (fold_keys(decl, "n + t - 1", "n + t", shift) + fold_rows(decl, "n + t - 1", "n + t", rows)
                + store_rows(CHECKPOINT_ROW.format(page="dst"), rows)
                + (_fold_shared_rows(decl, "n + t - 1", "n + t") if shared_rows else []))
        body += guarded(f.guards["fold_tokens"], fold)  # uniform per CTA: the barrier inside is safe
    if "set_fill" in f.stmts:
        body += _last_arrival_moves_fill(f.stmts["set_fill"].attr("value"))
    return body


_FILL_WORD = "reinterpret_cast<unsigned int*>(fill) + slot"  # (rebuilt where used: no pointer held through the step)
# The row's CTAs that read the fill before this one, read from shared memory where used (a register held
# from the first barrier to the end spilled at 80 registers); and the row's CTAs, less one.
_ARRIVAL = "(sh_fill_word >> FILL_BITS)"
_LAST_ARRIVAL = "(gridDim.x * gridDim.y - 1)"


def _arrive() -> list[str]:
    """The fill update inside the step (no second launch): every CTA of the row reads the fill, so only
    the row's last CTA to have read it may write the next. Thread 0 reads it with one atomic that also
    counts the CTA (``arrive_at_fill``: the fill word's high bits count the row's CTAs that have read it
    in this launch, zero between launches), issued before the state rows' loads. The CTA's threads take
    the fill from that read (``_fill_from_arrival``); the arrival that sees V-tiles × heads − 1 earlier
    ones writes the next fill at the end (``_last_arrival_moves_fill``). Every read is an atomic on the
    one word, so the last one follows all others without a fence (with a release fence per CTA the
    step took 1.01-1.06x as long at B = 256, measured side by side). Slots must be unique within a batch (the host checks; device batches must too)."""
    return ["__shared__ unsigned int sh_fill_word;",
            f"if (tid == 0) sh_fill_word = arrive_at_fill({_FILL_WORD});  // read the fill and count this CTA: one atomic"]


def _fill_from_arrival(f: Facts, stop: str) -> list[str]:
    """Thread 0's read of the fill word reaches every thread (a barrier: the staging of the records
    needs ``n``). A word whose fill is out of range, or whose count exceeds the row's CTAs (a high half
    that was not zero at launch), is not one a kernel writes: the CTA takes its arrival back and
    touches nothing (a corrupt high half with a fill in range is one the count cannot tell apart),
    once ``stop`` has waited for its asynchronous copies."""
    return ["__syncthreads();  // thread 0's arrival holds the fill",
            "int n = (int)(sh_fill_word & FILL_MASK);",
            f"if ({FILL_UNHELD} || {_ARRIVAL} > {_LAST_ARRIVAL}) {{",
            f"    if (tid == 0) leave_fill({_FILL_WORD});", f"    {stop}", "    return;", "}"] + flush_rule_lines(f)


def _last_arrival_moves_fill(value: str) -> list[str]:
    return [f"if (tid == 0 && {_ARRIVAL} == {_LAST_ARRIVAL}) set_fill_word({_FILL_WORD}, {NEXT_FILL[value]});"]
