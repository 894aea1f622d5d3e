"""Lowering layer: records with decay-scaled keys, for decay vectors whose gate is bounded below.

Every use of a past record i at token j needs ``(k_i ⊙ e^{G_j − G_i})`` channel by channel
(docs/design.md, "The recurrence"). That factors as ``(e^{C − G_i} ⊙ k_i) ⊙ e^{G_j − C}``, so a
record may keep the scaled key ``k̃_i = e^{C − G_i} ⊙ k_i`` (one per value head): a kernel then
reads the records' keys and only the newest record's cumulative decay ``G_{n−1}``, not every
record's (the records still store each ``G_i``, so a commit of any draft count finds its own), and
a score is ``k̃_i · (e^{G_j − C} ⊙ q_j)`` with no exponential per record and channel. The fold is
``S·e^{G_n} + Σ_i w_i (k̃_i ⊙ e^{G_n − C})ᵀ``.

This is exact in float32 only while the exponents stay in range: ``G_i`` lies in
``[capacity · g_min, 0]`` when each token's log-decay is at least ``g_min``
(``Declaration.decay_lower_bound``), so with the shift ``C = capacity · g_min / 2`` both factors'
exponents lie within ``±|C|``. The records keep scaled keys only where ``|C| ≤ SHIFT_LIMIT``
(e^{±64} leaves float32 24 decades of headroom on each side), the gate is bounded (FLA's safe gate:
``g_min = −5``, ``C = −60`` at ``capacity = 24``), the records are float32 and
``ReplayConfig.scaled_keys`` is on. An unbounded gate (Kimi's ``−exp(A_log)·softplus(…)``) keeps
plain keys and every record's decays.
"""

from __future__ import annotations

from .record_inputs import raw_record_inputs

SHIFT_LIMIT = 64.0


def key_shift(decl, config) -> float | None:
    """``C``, the shift of the records' scaled keys ``k̃_i = e^{C − G_i} ⊙ k_i``, or None where the
    records keep plain keys (no decay vector, an unbounded gate, too wide a range, records of raw
    bf16 inputs, or ``config.scaled_keys`` off)."""
    if decl.decay_form != "vector" or not config.scaled_keys or raw_record_inputs(decl, config):
        return None
    shift = config.capacity * decl.decay_lower_bound / 2
    return shift if shift >= -SHIFT_LIMIT else None  # -inf (unbounded) fails too


def keys_per_key_head(decl, shift: float | None) -> bool:
    """Whether the records keep one key per key head (shared by its group's value heads): not for
    scaled keys (``shift``, from ``key_shift``: the decays are per value head), nor for keys that
    depend on the value head."""
    return decl.key_level == "group" and shift is None


def record_key_heads(decl, config) -> str:
    """The heads the record keys are stored at: ``"H"`` (once per key head) or ``"HV"``."""
    return "H" if keys_per_key_head(decl, key_shift(decl, config)) else "HV"
