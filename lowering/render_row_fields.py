"""Lowering layer: the token's row-level fields (value, skip, silu(gate)) at a CTA's rows.

Which fields a declaration has, their shared arrays ``[tn, BV]``, their staging into them by every
thread, or (the replay step's launch option ``register_fields``) their loads into the registers of
the lanes that finish each row, and the expression the rows and the epilogue read them by. Each
returns lines (or an expression) of C for the templates in ``render_cuda`` and ``render_replay``.
"""

from __future__ import annotations

from .render_expr import ExprRenderer

ROW_FIELDS = ("value", "skip", "gate")


def row_field_roles(decl) -> list[str]:
    """The row-level fields (of ``ROW_FIELDS``) that ``decl`` has."""
    return [role for role in ROW_FIELDS if role in decl.expressions()]


def row_field_decls(decl, tn: str, aligned: bool = False) -> list[str]:
    """The row fields' arrays ``[tn, BV]``; ``aligned``: 16-byte aligned, for copies into them."""
    roles = row_field_roles(decl)
    align = "__align__(16) " if aligned else ""
    return [f"__shared__ {align}float sh_{role}[{tn} * BV];" for role in roles]


def _field_value(role: str, name: str) -> str:
    """A row field from its rendered expression ``name``: the gate's is silu of it."""
    return f"silu_f({name})" if role == "gate" else name


def finishes_row(group: str, first: str, end: str) -> str:
    """The C condition that this lane finishes row ``first`` + u of a group (``rows_reduced_group``)."""
    return f"lane % SUM_LANES == 0 && u < {group} && {first} + u < {end}"


def stage_row_fields(decl, staged: dict | None = None, hoisted: tuple = ()) -> list[str]:
    """Row-level fields (value, skip, silu(gate)) of tokens j < t at the CTA's rows, into shared memory:
    coalesced loads by every thread, so the row loop never waits on a token load. Thread THREADS - 1
    takes element 0 (still coalesced, descending), so the last warps stage these while the first
    ones compute the head-level fields. With ``staged`` (input name -> the shared array its copy
    landed in: ``render_row_inputs``) the fields read the copies instead, and a field that is a copy's
    target is left as it is (the gate's becomes silu of itself: each element read, then written, by
    one thread). ``hoisted``: inputs ``first_draft_loads`` loaded already (verify's)."""
    ex = decl.expressions()
    staged = staged or {}
    r = ExprRenderer(decl, "r", hoisted, staged=staged)
    # a copy's own target is the field, but for the gate: silu(gate) replaces its copy in place
    names = {role: r.render(ex[role], "V") for role in row_field_roles(decl)
             if role == "gate" or f"sh_{role}" not in staged.values()}
    if not names:
        return []
    stores = [f"sh_{role}[x] = {_field_value(role, name)};" for role, name in names.items()]
    zeros = [f"sh_{role}[x] = 0.f;" for role in names]
    first = ("for (int x = tid; x < t * BV; x += THREADS) {  // the row fields from the copied inputs" if staged
             else "for (int x = THREADS - 1 - tid; x < t * BV; x += THREADS) {")
    return ([first, "    const int j = x / BV, row = v0 + x % BV;" + ("  (void)j;" if staged else ""),
             "    if (row < V) {"] + ["        " + line for line in r.lines + stores]
            + ["    } else {", "        " + " ".join(zeros), "    }", "}"])


def register_row_fields(decl) -> list[str]:
    """The replay step's row fields (one token) in registers (launch option ``register_fields``): the
    lane that finishes row c + u of each group of ROWS_REDUCED rows (``rows_reduced_group``) loads that
    row's fields into ``rf_<role>[c / ROWS_REDUCED]``, every other lane holds zeros. Issued where
    ``stage_row_fields`` would run, so the loads fly through the head-level phases as the staging's do,
    and the CTA needs no ``[BV]`` shared array per field."""
    ex = decl.expressions()
    r = ExprRenderer(decl, "r")
    names = {role: r.render(ex[role], "V") for role in row_field_roles(decl)}
    if not names:
        return []
    chunks = "(RPW + ROWS_REDUCED - 1) / ROWS_REDUCED"
    stores = [f"rf_{role}[c / ROWS_REDUCED] = {_field_value(role, name)};" for role, name in names.items()]
    zeros = [f"rf_{role}[c / ROWS_REDUCED] = 0.f;" for role in names]
    return ([f"float rf_{role}[{chunks}];  // this lane's rows' {role}s, by group" for role in names]
            + ["{", "    constexpr int SUM_LANES = 32 / (PARTS * ROWS_REDUCED);", "    const int u = lane / SUM_LANES;",
               "    #pragma unroll", "    for (int c = 0; c < RPW; c += ROWS_REDUCED) {",
               "        const int j = 0, rr = warp * RPW + c + u, row = v0 + rr;  (void)j;",
               f"        if ({finishes_row('ROWS_REDUCED', 'c', 'RPW')} && row < V) {{"]
            + ["            " + line for line in r.lines + stores]
            + ["        } else {", "            " + " ".join(zeros), "        }", "    }", "}"])


def row_field(decl, role: str, in_registers: bool = False) -> str | None:
    """Row ``rr``'s field ``role`` of token j: its shared array, or (``in_registers``, the replay step's
    rows in groups from ``c``) the finishing lane's register (``register_row_fields``)."""
    if role not in decl.expressions():
        return None
    return f"rf_{role}[c / ROWS_REDUCED]" if in_registers else f"sh_{role}[j * BV + rr]"


def epilogue(decl, in_registers: bool = False) -> list[str]:
    lines = []
    if row_field(decl, "skip"):
        lines.append(f"o += {row_field(decl, 'skip', in_registers)};")
    if row_field(decl, "gate"):
        lines.append(f"o *= {row_field(decl, 'gate', in_registers)};")
    return lines
