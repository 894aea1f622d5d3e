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

This file holds the conventional (``recur``), fold, copy and fill templates and assembles the unit;
the replay template is in ``render_replay.py``, the blocks they share in ``render_blocks.py``.
"""

from __future__ import annotations

from pathlib import Path

from replayssm_dsl.errors import LoweringError

from .ir import Kernel, Program
from .launch import (FILL_THREADS, LaunchConfig, kernel_arguments, key_chunks, row_parts, rows_reduced,
                     write_record_layout)
from .render_blocks import (CHECKPOINT_ROW, DRAFTS_UNHELD, FILL_UNHELD, NEXT_FILL, OUTSIDE_CACHE, STATE_ROW, Facts,
                            facts, fields, fill_lines, fold_keys, fold_rows, ids, row_loads, row_records, rows_reduced_group, shared_decls,
                            store_rows, token_prefetch)
from .record_inputs import raw_record_inputs
from .record_keys import key_shift, record_key_heads
from .render_records import load_records, records_ready
from .render_row_fields import epilogue, row_field, stage_row_fields
from .render_replay import render_replay

COMMON_HEADER = Path(__file__).with_name("cuda") / "replay_common.cuh"
STATE_C_TYPES = {"float32": "float", "float16": "unsigned short", "bfloat16": "unsigned short"}  # 16-bit: raw bits
def _render_recur(k: Kernel, f: Facts, program: Program, launch: LaunchConfig) -> list[str]:
    decl = program.declaration
    body = ids(f) + shared_decls(decl, f.drafts, replay=False) + token_prefetch(decl, f.drafts) + fill_lines(f)
    body += row_loads(STATE_ROW.format(page="src"))
    body += fields(decl, "recur", one_token=not f.drafts) + stage_row_fields(decl)  # n = 0: keys at sh_key[j * K]
    body.append("__syncthreads();")
    decay = {"none": [], "scalar": ["const float a = sh_g[j];",
                                    "#pragma unroll", "for (int i = 0; i < KE; ++i) s[r][i] *= a;"],
             "vector": ["#pragma unroll",
                        "for (int i = 0; i < KE; ++i) { const int e = k_index(i, lane); if (e < K) s[r][i] *= sh_g[j * K + e]; }"]}[decl.decay_form]
    value = row_field(decl, "value")
    # o = (S' + w kᵀ)·q = S'·q + w (k·q) and, for the delta rule, pk = S'·k (S' the decayed state):
    # k·q once per token; a group of rows' dot products in one transpose reduction (as the replay
    # rows: ROWS_REDUCED rows, the lane holding a row's sums finishes it), then each row's write w
    # from its lane by a shuffle, and the rank-one update
    per_token = ["const float kq = warp_sum(vec_dot_partial(sh_key + j * K, sh_q + j * K, lane));  // k·q"]
    dots = ["part[u] = row_dot_partial(s[r], sh_q + j * K, lane);  // S'·q"]
    if decl.is_delta:
        dots += ["part[ROWS_REDUCED + u] = row_dot_partial(s[r], sh_key + j * K, lane);  // S'·k"]
        write = [f"w = sh_beta[j] * ({value} - pk);"]
    else:
        write = [f"w = sh_beta[j] * {value};"]
    snapshots = f.stmts["recur"].attr("snapshots")
    finish = write + ["float o = sum + w * kq;"] + epilogue(decl) + [
        "if (row < V) out[(((size_t)b * t_tok + j) * HV + hv) * V + row] = o;"]
    update = ["const float w_row = __shfl_sync(0xffffffffu, w, v * SUM_LANES);  // row c + v's write",
              "#pragma unroll",
              "for (int i = 0; i < KE; ++i) { const int e = k_index(i, lane); if (e < K) s[r][i] += w_row * sh_key[j * K + e]; }"]
    if snapshots:
        update += ["const int row_r = v0 + warp * RPW + r;",
                   "if (row_r < V) store_row(snapshots + ((((size_t)b * t_tok + j) * HV + hv) * V + row_r) * K, s[r], lane);"]
    group = (rows_reduced_group(decl, "ROWS_REDUCED", "c", "RPW", decay + dots, finish)
             + ["#pragma unroll", "for (int v = 0; v < ROWS_REDUCED; ++v) {", "    const int r = c + v;",
                "    if (r < RPW) {  // known at compile time"] + ["        " + x for x in update] + ["    }", "}"])
    body += (["for (int j = 0; j < t; ++j) {"] + ["    " + x for x in per_token]
             + ["    #pragma unroll", "    for (int c = 0; c < RPW; c += ROWS_REDUCED) {"]
             + ["        " + x for x in group] + ["    }", "}"])
    if not snapshots:
        body += store_rows(STATE_ROW.format(page="dst"))
    return body


def _render_fold(k: Kernel, f: Facts, program: Program, launch: LaunchConfig) -> list[str]:
    decl = program.declaration
    body = ids(f) + fill_lines(f)
    guard = f.guards.get("fold", "")
    if guard:
        body.append(f"if (!({guard})) return;")
    body += ["__shared__ __align__(16) float sh_key[NREC * K];", "__shared__ __align__(16) float sh_w[NREC * W_PITCH];"]
    if decl.decay_form == "scalar":
        body.append("__shared__ float sh_G[NREC];")
    elif decl.decay_form == "vector":
        body += ["__shared__ __align__(16) float sh_G[NREC * K];", "__shared__ float sh_ed[K];"]
    target = ("materialized + (((size_t)b * HV + hv) * V + row) * K" if "store_state:materialized" in f.guards
              else CHECKPOINT_ROW.format(page="dst"))
    raw = raw_record_inputs(decl, program.config)
    shift = key_shift(decl, program.config)
    # flush_for_verify: most rows only check and exit, so the fold keeps few registers; a launch with
    # shared rows has more rows per warp than the registers hold at once (its fold kernels spill whole)
    if guard or launch.shared_rows:
        return body + _chunked_fold(decl, raw, target, shift)
    body += row_loads(CHECKPOINT_ROW.format(page="src"))
    body += load_records(decl, raw, shift=shift) + records_ready(decl, raw)
    body += row_records()
    fold = fold_keys(decl, "n - 1", "n", shift) + fold_rows(decl, "n - 1", "n")
    body += ["if (n > 0) {  // uniform per CTA"] + ["    " + x for x in fold] + ["}"]
    return body + store_rows(target)


def _chunked_fold(decl, raw: dict, target: str, shift: float | None) -> list[str]:
    """The fold a few rows of the warp at a time (``FOLD_ROWS``), for a kernel that most rows leave
    after their checks (``flush_for_verify``: in a speculative steady state a fraction of the rows
    fold before a verify). Holding a warp's RPW rows at once would set the registers, and with them
    how few of its CTAs fit on an SM while they only check and exit (measured as a bound: the
    same checks at 16 registers took 2–3 % off verify T = 8; docs/performance.md). Launches with
    shared rows fold this way too. Rows go to ``target`` (a row's address, ``row`` in scope)."""
    src = CHECKPOINT_ROW.format(page="src")
    return (load_records(decl, raw, shift=shift) + records_ready(decl, raw)
            + ["if (n > 0) {  // uniform per CTA"] + ["    " + x for x in fold_keys(decl, "n - 1", "n", shift)] + ["}"]
            + ["constexpr int FOLD_ROWS = RPW < 4 ? RPW : 4;  // rows of the warp in registers at a time",
               "#pragma unroll 1",
               "for (int r0 = 0; r0 < RPW; r0 += FOLD_ROWS) {"]
            + ["    " + x for x in row_loads(src, "FOLD_ROWS", "r0") + row_records("FOLD_ROWS", "r0")]
            + ["    if (n > 0) {  // uniform per CTA"]
            + ["        " + x for x in fold_rows(decl, "n - 1", "n", rows="FOLD_ROWS")]
            + ["    }"]
            + ["    " + x for x in store_rows(target, "FOLD_ROWS", "r0")]
            + ["}"])


def _render_copy(k: Kernel, f: Facts, program: Program, launch: LaunchConfig) -> list[str]:
    body = ids(f) + fill_lines(f)
    body += ["#pragma unroll", "for (int r = 0; r < RPW; ++r) {", "    const int row = v0 + warp * RPW + r;",
             "    if (row >= V) continue;", "    float s[KE];",
             "    load_row(initial + (((size_t)b * HV + hv) * V + row) * K, s, lane);",
             "    store_row(" + CHECKPOINT_ROW.format(page="dst") + ", s, lane);", "}"]
    return body


def _render_fill(k: Kernel, f: Facts, program: Program, launch: LaunchConfig) -> list[str]:
    value = f.stmts["set_fill"].attr("value")
    update = {
        "zero": [f"fill[slot] = {NEXT_FILL['zero']};"],
        "advance": [f"if ({FILL_UNHELD}) return;", f"fill[slot] = {NEXT_FILL['advance']};"],
        "commit": ["const int t = drafts[b], a = accepted[b];",
                   f"if ({DRAFTS_UNHELD} || a < 0 || a > t || {FILL_UNHELD}) return;  // no fill past capacity",
                   "fill[slot] = ((n + t > CAPACITY) ? 0 : n) + a;"],
    }[value]
    return ["const int b = blockIdx.x * blockDim.x + threadIdx.x;", "if (b >= rows) return;",
            "const int slot = slots[b], src = src_page[b], dst = dst_page[b];",
            f"if ({OUTSIDE_CACHE}) return;  // as the tiled kernels: a row they skip keeps its fill",
            "const int n = fill[slot];", "(void)n;"] + update


TEMPLATES = {"replay": render_replay, "recur": _render_recur, "fold": _render_fold, "copy": _render_copy,
             "fill": _render_fill}


def render_kernel(kernel: Kernel, program: Program, launch: LaunchConfig) -> str:
    f = facts(kernel)
    body = TEMPLATES[f.family](kernel, f, program, launch)
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
    kch = key_chunks(K)
    nrec = cfg.capacity + 1
    if nrec > 32:
        raise LoweringError(f"capacity: window + max_drafts = {cfg.capacity} > 31; the CUDA backend keeps one "
                            "record per lane (use a smaller window or fewer drafts)")
    w_vec, w_pitch = write_record_layout(launch.rows_per_warp, launch.rows_per_cta, shape.v_dim)
    consts = {"HV": shape.heads, "H": shape.key_heads, "GROUP": shape.group_size, "V": shape.v_dim, "K": K,
              "KEY_HEADS": shape.key_heads if record_key_heads(decl, cfg) == "H" else shape.heads,
              "WINDOW": cfg.window, "CAPACITY": cfg.capacity, "TMAX": cfg.max_drafts, "NREC": nrec,
              "VEC": vec, "KCH": kch, "WARPS": launch.warps, "RPW": launch.rows_per_warp,
              "BV": launch.rows_per_cta, "THREADS": launch.threads, "VPASS": launch.verify_rows,
              # the replay step's rows per warp in shared memory (the last SRPW) and in registers
              "SRPW": launch.shared_rows, "RREG": launch.register_rows,
              "PARTS": row_parts(decl.is_delta), "ROWS_REDUCED": rows_reduced(launch.rows_per_warp, decl.is_delta),
              "VERIFY_ROWS_REDUCED": rows_reduced(launch.verify_rows, decl.is_delta),
              # records per warp trip of the scores, their PARTS dot products each in one reduction (a
              # decay vector, recomputed per element, holds more registers per record)
              "SCORE_RECORDS": 2 if decl.decay_form == "vector" else 4,
              # verify's (its drafts' scores take more trips): 4 with a decay vector too where no register
              # cap squeezes them (under a cap ptxas spills verify at 4)
              "VERIFY_SCORE_RECORDS": 2 if decl.decay_form == "vector" and launch.max_registers < 128 else 4,
              "EAGER_RECORDS": int(launch.eager_records),
              # the write records' copies and loads: W_VEC rows at a time; W_PITCH floats between records
              "W_VEC": w_vec, "W_PITCH": w_pitch}
    lines = [f"#define {name} {value}" for name, value in consts.items()]
    shift = key_shift(decl, cfg)
    if shift is not None:  # the records' keys are e^{C - G_i} k_i (record_keys.py)
        lines.append(f"#define KEY_SHIFT ({float(shift)!r}f)")
    return lines


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
