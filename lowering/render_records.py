"""Lowering layer: the records' blocks of CUDA text: staging the buffer's records into shared memory
(``load_records``), and for records that keep a bf16 token input's bits (``record_inputs.py``)
widening them in place and summing their decays (``records_ready``), so that ``sh_key`` and ``sh_G``
hold float32 keys and cumulative log-decays for every kernel that reads them.
"""

from __future__ import annotations

from .record_keys import keys_per_key_head
from .render_expr import ExprRenderer


def load_records(decl, raw: dict, count: str = "n", writes_in_registers: bool = False,
                 shift: float | None = None, decays: bool = True) -> list[str]:
    """Start the asynchronous copies of the buffer's first ``count`` keys (and decays; ``raw``: the fields
    kept as raw bf16 inputs, ``raw_record_inputs``) and of the write
    records of the CTA's rows into shared memory (``cp_async_wait`` and a barrier complete them); with
    ``writes_in_registers`` the write records go straight into each warp's ``wv`` instead (declared
    before: ``load_record_rows_global``). With decay-scaled keys (``shift``, record_keys.py) the keys are
    per value head and only the newest record's decays are read (``last_record_decays``; left out with
    ``decays=False``, for a caller that stages before the fill is known)."""
    khead = "hk" if keys_per_key_head(decl, shift) else "hv"
    wide = "VEC == 4"
    keys = f"rec_key + ((size_t)slot * KEY_HEADS + {khead}) * CAPACITY * K"
    lines = [f"stage_bf16_records(sh_key, {keys}, {count}, tid);" if "key" in raw
             else f"stage_floats<{wide}>(sh_key, {keys}, {count} * K, tid);"]
    if shift is not None:
        lines += last_record_decays() if decays else []
    elif decl.decay_form == "scalar":
        lines.append(f"stage_floats<false>(sh_G, rec_decay + ((size_t)slot * HV + hv) * CAPACITY, {count}, tid);")
    elif "decay" in raw:
        lines.append(f"stage_bf16_records(sh_G, rec_decay + ((size_t)slot * HV + hv) * CAPACITY * K, {count}, tid);")
    elif decl.decay_form == "vector":
        lines.append(f"stage_floats<{wide}>(sh_G, rec_decay + ((size_t)slot * HV + hv) * CAPACITY * K, {count} * K, tid);")
    head_writes = "rec_write + ((size_t)slot * HV + hv) * CAPACITY * V"
    if writes_in_registers:
        lines.append(f"load_record_rows_global(wv, {head_writes}, v0, warp, lane, {count});")
    else:
        lines.append(f"stage_writes(sh_w, {head_writes}, {count}, v0, tid);")
    return lines


def last_record_decays() -> list[str]:
    """With decay-scaled keys: the copy of G_{n−1} alone, the newest record's cumulative decays, to
    its place in ``sh_G`` (none at n = 0)."""
    return ["if (n > 0)  // decay-scaled keys: the newest record's G_{n-1} is all the kernel reads of the decays",
            "    stage_floats<VEC == 4>(sh_G + (n - 1) * K, rec_decay + (((size_t)slot * HV + hv) * CAPACITY + n - 1) * K, K, tid);"]


RAW_ARRAYS = {"key": "sh_key", "decay": "sh_G"}  # where a record field's raw input is staged, and its floats go


def widen_records(decl, raw: dict, count: str = "n") -> list[str]:
    """Records kept as raw bf16 inputs (``raw_record_inputs``), staged by ``stage_bf16_records``: one
    warp per record reads its raw elements into registers, then (``__syncwarp``: they share the
    record's floats) computes the field from them as the fields do for a token and stores it, the key
    to ``sh_key``, a decay vector's per-record log-decay to ``sh_G`` (the running sums come after a
    barrier: ``prefix_decays``, or the cumulate phase). Nothing when no field is kept raw."""
    if not raw:
        return []
    ex = decl.expressions()
    sources = {spec.name: f"raw_{spec.name}" for spec in raw.values()}
    r = ExprRenderer(decl, "w", sources=sources)
    loads, stores = [], []
    for field, spec in raw.items():
        loads.append(f"float raw_{spec.name}[KE];")
        loads += ["#pragma unroll",
                  f"for (int i = 0; i < KE; ++i) {{ const int e = k_index(i, lane); "
                  f"raw_{spec.name}[i] = e < K ? raw_record_element({RAW_ARRAYS[field]}, m, e) : 0.f; }}"]
    for field in raw:
        name = r.render(ex[field], "K")
        stores.append(f"{RAW_ARRAYS[field]}[m * K + e] = {name}[i];")
    body = loads + ["__syncwarp();  // the record's raw elements are read: its floats may overwrite them"] + r.lines
    body += ["#pragma unroll", "for (int i = 0; i < KE; ++i) {", "    const int e = k_index(i, lane);",
             "    if (e < K) { " + " ".join(stores) + " }", "}"]
    return ([f"for (int m = warp; m < {count}; m += WARPS) {{  // records kept as raw bf16 inputs, widened"]
            + ["    " + x for x in body] + ["}"])


def record_decay_sums(count: str) -> str:
    """At element ``e``: G_m = Σ_{m' ≤ m} g_{m'} in place in ``sh_G`` for the first ``count`` records
    (their widened raw decays), in the order the steps that appended them summed; ``acc`` ends at
    G_{count−1}."""
    return f"float acc = 0.f; for (int m = 0; m < {count}; ++m) {{ acc += sh_G[m * K + e]; sh_G[m * K + e] = acc; }}"


def prefix_decays(raw: dict, count: str = "n") -> list[str]:
    """The records' cumulative decays (``record_decay_sums``) when the records keep the decay's raw
    input, after ``widen_records`` and a barrier."""
    if "decay" not in raw:
        return []
    return ["for (int e = tid; e < K; e += THREADS) {  // the records' cumulative log-decays",
            "    " + record_decay_sums(count), "}"]


def records_ready(decl, raw: dict, count: str = "n", sum_decays: bool = True, wait: str = "cp_async_wait();") -> list[str]:
    """After ``load_records``: wait for the copies (``wait``: all of them by default), and widen the
    records kept raw (then, with ``sum_decays``, their decays' running sums; the replay step's cumulate
    phase sums them itself), each step behind a barrier, so ``sh_key`` and ``sh_G`` hold what the fold
    reads."""
    lines = [wait, "__syncthreads();"]
    widen = widen_records(decl, raw, count)
    if widen:
        lines += widen + ["__syncthreads();"]
    prefix = prefix_decays(raw, count) if sum_decays else []
    if prefix:
        lines += prefix + ["__syncthreads();"]
    return lines
