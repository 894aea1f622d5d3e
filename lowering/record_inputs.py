"""Lowering layer: which record fields the buffer keeps as the bf16 token input they are computed from.

A record keeps a key (per key head) and, for a decay vector, its cumulative log-decay (per value
head), float32 by default. With ``ReplayConfig(record_dtype="bfloat16")``, when such a field is computed from exactly one token input, that input
arrives as bf16, is a vector over K and lives at the heads the field is stored at (KDA: the key
``l2norm(k)`` from ``k``, the decay ``−exp(A_log)·softplus(g_raw + dt_bias)`` from ``g_raw``), the
record keeps that input instead, as it arrived: half the bytes, and exact. The kernels that read the
records recompute the field from it (``widen_records``; the decays' running sums in the cumulate
phase or ``prefix_decays``), the kernels that append records copy the token's bits. Half those
fields' bytes and memory; on the H200 the recomputation costs more time than the bytes save
(docs/performance.md), so it is a memory option, not the default.
"""

from __future__ import annotations

RECORD_FIELDS = {"key": "rec_key", "decay": "rec_decay"}


def raw_record_input(decl, field: str):
    """The token input (an ``InputSpec``) whose bf16 bits records may keep for ``field`` (``"key"`` or
    ``"decay"``), or None when they must keep the field itself in float32."""
    ex = decl.expressions()
    if field not in ex or (field == "decay" and decl.decay_form != "vector"):
        return None
    names = {n.arg for n in ex[field].walk() if n.op == "INPUT"}
    if len(names) != 1:
        return None
    spec = decl.input(names.pop())
    stored_level = decl.key_level if field == "key" else "head"
    if spec.dtype != "bfloat16" or spec.size != "K" or spec.level != stored_level:
        return None
    return spec


def raw_record_inputs(decl, config) -> dict:
    """``{field: InputSpec}`` of the record fields kept as raw bf16 inputs: with
    ``config.record_dtype == "bfloat16"``, each field of ``config.raw_record_fields`` that
    ``raw_record_input`` allows; none otherwise."""
    if config.record_dtype != "bfloat16":
        return {}
    found = {field: raw_record_input(decl, field) for field in RECORD_FIELDS if field in config.raw_record_fields}
    return {field: spec for field, spec in found.items() if spec is not None}
