"""DSL layer: bfloat16 values as NumPy holds them (raw ``uint16`` bits, or the float32 values they
stand for), for token inputs declared ``dtype="bfloat16"``.

NumPy has no bfloat16 type, so the backends and tests carry bf16 as its raw bits (the upper half
of a float32) and round other floats to it with round-to-nearest-even, as ``cvt.rn.bf16.f32`` does.
"""

from __future__ import annotations

import numpy as np


def bfloat16_bits(values, xp=np):
    """Raw bf16 bits (``uint16``) of ``values``, rounded to nearest, ties to even; NaN stays NaN.
    ``xp``: the array module that holds ``values`` (NumPy, or CuPy for device arrays)."""
    values = xp.ascontiguousarray(values, dtype=xp.float32)
    bits = values.view(xp.uint32)
    rounded = ((bits + xp.uint32(0x7FFF) + ((bits >> 16) & xp.uint32(1))) >> 16).astype(xp.uint16)
    return xp.where(xp.isnan(values), xp.uint16(0x7FC0), rounded).astype(xp.uint16)


def from_bfloat16_bits(bits) -> np.ndarray:
    """The float32 values of raw bf16 bits (``uint16`` or ``int16``): exact."""
    raw = np.ascontiguousarray(bits).view(np.uint16).astype(np.uint32) << 16
    return raw.view(np.float32)


def round_to_bfloat16(values) -> np.ndarray:
    """``values`` rounded to the nearest bf16, as float32 (exact in float64 too)."""
    return from_bfloat16_bits(bfloat16_bits(values))


def bits_are_finite(bits) -> np.ndarray:
    """Which raw bf16 bits hold a finite value (exponent not all ones)."""
    return (np.asarray(bits).view(np.uint16) & np.uint16(0x7F80)) != np.uint16(0x7F80)
