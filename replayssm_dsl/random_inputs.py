"""DSL layer: random inputs of the right shapes for a declaration (tests, examples, ``replayssm check``).

Token values are drawn so the recurrences stay in their working range: keys and queries of unit
scale, gate logits around 0, ``A_log`` and ``dt_bias`` as the models initialise them.
"""

from __future__ import annotations

import numpy as np

from .bfloat16 import round_to_bfloat16
from .config import ModelShape
from .declaration import Declaration, InputSpec


def _draw(rng: np.random.Generator, spec: InputSpec, shape: tuple) -> np.ndarray:
    if spec.sign == "nonpositive":
        return -rng.uniform(0.01, 0.5, shape)
    if spec.sign == "nonnegative":
        return rng.uniform(0.0, 1.0, shape)
    if spec.name == "A_log":
        return rng.uniform(-1.0, 1.0, shape)
    return rng.standard_normal(shape)


def input_shape(spec: InputSpec, shape: ModelShape, lead: tuple = ()) -> tuple:
    heads = shape.heads if spec.level == "head" else shape.key_heads
    tail = {"": (), "K": (shape.k_dim,), "V": (shape.v_dim,)}[spec.size]
    return (lead if spec.kind == "token" else ()) + (heads,) + tail


def random_params(decl: Declaration, shape: ModelShape, rng: np.random.Generator) -> dict[str, np.ndarray]:
    return {s.name: _draw(rng, s, input_shape(s, shape)) for s in decl.inputs if s.kind == "param"}


def random_tokens(decl: Declaration, shape: ModelShape, rng: np.random.Generator, lead: tuple) -> dict[str, np.ndarray]:
    """Token inputs with leading axes ``lead`` (``(T,)`` for one sequence, ``(B,)``, ``(B, T)``); those
    declared bf16 hold bf16 values (float64 arrays), so an oracle sees exactly what the kernels read."""
    tokens = {}
    for s in decl.inputs:
        if s.kind == "token":
            value = _draw(rng, s, input_shape(s, shape, lead))
            tokens[s.name] = round_to_bfloat16(value).astype(np.float64) if s.dtype == "bfloat16" else value
    return tokens


def random_state(shape: ModelShape, rng: np.random.Generator, lead: tuple = (), scale: float = 0.5) -> np.ndarray:
    return scale * rng.standard_normal(lead + (shape.heads, shape.v_dim, shape.k_dim))
