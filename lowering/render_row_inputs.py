"""Lowering layer: verify's per-row token inputs copied to shared memory before the state rows.

The row fields (value; Mamba-2's skip and silu(gate)) read per-row token inputs (``v``; ``x`` and
``z``) at the CTA's rows, ``[t, BV]`` per CTA. Loaded after the state rows in program order, those
loads queue behind the CTA's state bytes, and the first barrier (with it the whole head-level chain)
waits for them. Verify on tensor cores copies them by ``cp.async`` (``stage_token_rows`` in
``replay_common.cuh``) before it issues the rows' loads: no registers held, nothing waits on them
until the first barrier. A row field that is a float32 input itself (``value = v``) is the copy's
target (a gate's copy turns into silu(gate) in place); the others are computed from the copies after
the first barrier (``stage_row_fields`` with the copies; the rows read them two barriers later). The
inputs must start 16-byte aligned (the CUDA backend checks: ``check_aligned``). Each ``sh_in_<name>``
(an input that is no float32 row field by itself: Mamba-2's ``x`` is the value's copy, read for the
skip too; a bf16 input) adds TMAX · BV elements of static shared memory: at a shape where that passes
48 KiB the launch does not build and the runtime takes its next launch shape. Measured side by side on the H200 (``scripts/experiment_verify_bounds.py``, verify
T = 8, B = 256): 0.964× (qwen3.5-4b), 0.970× (kimi), 0.924× (nemotron-nano-4b), 0.963× (super).
"""

from __future__ import annotations

from .render_blocks import inputs_read
from .render_row_fields import ROW_FIELDS

_ELEMENT_BYTES = {"float32": 4, "bfloat16": 2}
_C_TYPES = {"float32": "float", "bfloat16": "unsigned short"}  # bf16 inputs: raw bits, widened where read


def row_inputs(decl) -> list:
    """The V-sized token inputs the row fields read, in declaration order."""
    names = inputs_read(decl, ROW_FIELDS)
    return [s for s in decl.inputs if s.kind == "token" and s.size == "V" and s.name in names]


def staged_row_inputs(decl, v_dim: int, rows_per_cta: int) -> dict:
    """Input name -> the shared array its copy lands in: the row field that is the float32 input itself
    (``sh_value`` for ``value = v``; ``sh_gate`` for ``gate = z``, silu applied in place after the first
    barrier), else ``sh_in_<name>``. Empty (the fields are loaded as before) where
    a 16-byte chunk of some input would straddle V or a tile: V or BV not a multiple of its elements."""
    specs = row_inputs(decl)
    for spec in specs:
        chunk = 16 // _ELEMENT_BYTES[spec.dtype]
        if v_dim % chunk or rows_per_cta % chunk:
            return {}
    ex = decl.expressions()
    targets = {}
    for spec in specs:
        own = [role for role in ROW_FIELDS if role in ex and ex[role].op == "INPUT" and ex[role].arg == spec.name]
        targets[spec.name] = f"sh_{own[0]}" if own and spec.dtype == "float32" else f"sh_in_{spec.name}"
    return targets


def staged_row_input_decls(decl, staged: dict) -> list[str]:
    """The copies' own arrays (``sh_in_<name>``; the row fields' arrays are declared with the fields)."""
    specs = {s.name: s for s in row_inputs(decl)}
    return [f"__shared__ __align__(16) {_C_TYPES[specs[name].dtype]} {array}[TMAX * BV];"
            for name, array in staged.items() if array.startswith("sh_in_")]


def stage_row_input_copies(decl, staged: dict) -> list[str]:
    """The copies of drafts j < t, issued before the state rows' loads (after the row checks)."""
    lines = []
    for spec in (s for s in row_inputs(decl) if s.name in staged):
        heads, head = ("HV", "hv") if spec.level == "head" else ("H", "hk")
        lines.append(f"stage_token_rows({staged[spec.name]}, tok_{spec.name} + ((size_t)b * t_tok * {heads} + {head}) * V, "
                     f"(size_t){heads} * V, t, v0, tid);  // draft j's rows at + j * {heads} * V")
    return lines

