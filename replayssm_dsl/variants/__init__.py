"""DSL layer: the built-in variants, by name (``mamba2``, ``gdn``, ``kda``, ``kda_safe_gate``, ``gla``,
``retnet``, ``deltanet``), and the user's own by ``module:attribute`` or ``file.py:attribute``."""

from __future__ import annotations

from ..declaration import Declaration
from ..errors import DeclarationError
from .family import deltanet, gated_linear_attention, retnet
from .gated_deltanet import gated_deltanet
from .kimi_delta import kda_safe_gate, kimi_delta_attention
from .loading import load_declaration
from .mamba2 import mamba2

BUILTINS = {
    "mamba2": mamba2,
    "gdn": gated_deltanet,
    "kda": kimi_delta_attention,
    "kda_safe_gate": kda_safe_gate,
    "gla": gated_linear_attention,
    "retnet": retnet,
    "deltanet": deltanet,
}


def get(name: str) -> Declaration:
    """The built-in declaration called ``name``, or one of your own named ``module:attribute`` or
    ``path/to/file.py:attribute`` (``loading.load_declaration``)."""
    if name in BUILTINS:
        return BUILTINS[name]()
    if ":" in name:
        return load_declaration(name)
    raise DeclarationError(f"variant: unknown {name!r}; built-in: {', '.join(BUILTINS)}; or one of your own as "
                           "module:attribute or path/to/file.py:attribute")


__all__ = ["BUILTINS", "get", "load_declaration", "mamba2", "gated_deltanet", "kimi_delta_attention", "kda_safe_gate",
           "gated_linear_attention", "retnet", "deltanet"]
