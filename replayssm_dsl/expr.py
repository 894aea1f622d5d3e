"""DSL layer: the expression node for per-token input transforms (decay, write strength, keys, ...).

One frozen node type, ``Expr(op, src, arg)``; equal nodes are the same object (interned), so the
structural hash is a cache key and a shared sub-expression (Mamba-2's ``Δ``, used by both the
decay and the write) is evaluated once. Imports nothing from the project but ``errors``.

Every node knows three static facts, inferred when it is built:

- ``axis``:  ``""`` (a scalar per head), ``"K"`` (a vector over the key axis), ``"V"`` (a vector over
  the value axis) or ``"VK"`` (a matrix per head: replay refuses it as a decay);
- ``level``: ``"head"`` (one value per value head), ``"group"`` (one per key head, shared by the
  ``HV / H`` value heads of a group) or ``"shared"`` (constants and sizes);
- ``sign``:  ``"nonpositive"``, ``"nonnegative"`` or ``"any"``, used to prove that a decay is ≤ 0 in
  log space (so ``exp(G_n − G_i)`` never overflows).

Ops (``arg`` in brackets):
  INPUT[name]  PARAM[name]  CONST[value]  DIM["K"|"V"]
  ADD SUB MUL DIV NEG POW[exponent]
  EXP LOG SQRT RSQRT SOFTPLUS SIGMOID LOGSIGMOID SILU
  L2NORM[eps]  (normalise a K or V vector along its axis; the lowering renders it over K only)
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

from .errors import DeclarationError

AXES = ("", "K", "V", "VK")
LEVELS = ("shared", "group", "head")
UNARY_OPS = ("NEG", "EXP", "LOG", "SQRT", "RSQRT", "SOFTPLUS", "SIGMOID", "LOGSIGMOID", "SILU")
BINARY_OPS = ("ADD", "SUB", "MUL", "DIV")
LEAF_OPS = ("INPUT", "PARAM", "CONST", "DIM")

_UNARY_SIGN = {
    "EXP": "nonnegative", "SQRT": "nonnegative", "RSQRT": "nonnegative", "SOFTPLUS": "nonnegative",
    "SIGMOID": "nonnegative", "LOGSIGMOID": "nonpositive", "LOG": "any", "SILU": "any",
}


def _join_axis(a: str, b: str) -> str:
    if a == b or not b:
        return a
    if not a:
        return b
    return "VK"  # a K vector combined with a V vector: a matrix per head


def _join_level(a: str, b: str) -> str:
    return max(a, b, key=LEVELS.index)


def _flip(sign: str) -> str:
    return {"nonpositive": "nonnegative", "nonnegative": "nonpositive"}.get(sign, "any")


def _product_sign(a: str, b: str) -> str:
    if "any" in (a, b):
        return "any"
    return "nonnegative" if a == b else "nonpositive"


def _sum_sign(a: str, b: str) -> str:
    return a if a == b else "any"


@dataclass(frozen=True, eq=False)
class Expr:
    """An interned expression node. Build with the functions of ``replayssm_dsl.ops`` and operators."""

    op: str
    src: tuple["Expr", ...]
    arg: Any
    axis: str
    level: str
    sign: str
    _cache: ClassVar[dict] = {}

    @staticmethod
    def make(op: str, src: tuple["Expr", ...] = (), arg: Any = None, *, axis: str | None = None,
             level: str | None = None, sign: str | None = None) -> "Expr":
        key = (op, tuple(id(s) for s in src), arg, axis, level, sign)
        hit = Expr._cache.get(key)
        if hit is not None:
            return hit
        if axis is None:
            axis = ""
            for s in src:
                axis = _join_axis(axis, s.axis)
        if level is None:
            level = "shared"
            for s in src:
                level = _join_level(level, s.level)
        if sign is None:
            sign = _infer_sign(op, src, arg)
        node = Expr(op, tuple(src), arg, axis, level, sign)
        Expr._cache[key] = node
        return node

    # --- operators -------------------------------------------------------------------------------
    def __add__(self, other): return Expr.make("ADD", (self, as_expr(other)))
    def __radd__(self, other): return Expr.make("ADD", (as_expr(other), self))
    def __sub__(self, other): return Expr.make("SUB", (self, as_expr(other)))
    def __rsub__(self, other): return Expr.make("SUB", (as_expr(other), self))
    def __mul__(self, other): return Expr.make("MUL", (self, as_expr(other)))
    def __rmul__(self, other): return Expr.make("MUL", (as_expr(other), self))
    def __truediv__(self, other): return Expr.make("DIV", (self, as_expr(other)))
    def __rtruediv__(self, other): return Expr.make("DIV", (as_expr(other), self))
    def __neg__(self): return Expr.make("NEG", (self,))

    def __pow__(self, exponent):
        if not isinstance(exponent, (int, float)):
            raise DeclarationError(f"** exponent must be a Python number, got {type(exponent).__name__}")
        sign = "nonnegative" if self.sign == "nonnegative" or float(exponent) % 2 == 0 else "any"
        return Expr.make("POW", (self,), float(exponent), sign=sign)

    def __bool__(self):
        raise DeclarationError("an expression has no truth value: conditions are not part of the DSL")

    def _no_comparison(self, other):
        raise DeclarationError("expressions cannot be compared (<, <=, >, >=): conditions are not part of the "
                               "DSL; bound a value with sigmoid, softplus, exp or a declared sign instead")

    __lt__ = __le__ = __gt__ = __ge__ = _no_comparison

    __hash__ = object.__hash__

    # --- inspection --------------------------------------------------------------------------------
    def walk(self):
        """Every node of the DAG once, operands before users (topological order)."""
        seen, order = set(), []

        def visit(node):
            if id(node) in seen:
                return
            seen.add(id(node))
            for s in node.src:
                visit(s)
            order.append(node)

        visit(self)
        return order

    def leaves(self, op: str) -> list["Expr"]:
        return [n for n in self.walk() if n.op == op]

    def __repr__(self) -> str:
        return render_text(self)


def _infer_sign(op: str, src, arg) -> str:
    if op == "CONST":
        return "nonpositive" if arg <= 0 else "nonnegative"
    if op == "DIM":
        return "nonnegative"
    if op in ("INPUT", "PARAM"):
        return "any"
    if op == "NEG":
        return _flip(src[0].sign)
    if op in _UNARY_SIGN:
        return _UNARY_SIGN[op]
    if op == "MUL" and src[0] is src[1]:  # a square (interned nodes: the same expression is the same node)
        return "nonnegative"
    if op in ("MUL", "DIV"):
        return _product_sign(src[0].sign, src[1].sign)
    if op == "ADD":
        return _sum_sign(src[0].sign, src[1].sign)
    if op == "SUB":
        return _sum_sign(src[0].sign, _flip(src[1].sign))
    return "any"


def as_expr(value) -> Expr:
    if isinstance(value, Expr):
        return value
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise DeclarationError(f"cannot use {value!r} ({type(value).__name__}) in an expression; "
                               "use inputs, parameters, ops.* functions and Python numbers")
    if not math.isfinite(value):
        raise DeclarationError(f"constant {value!r} is not finite")
    return Expr.make("CONST", (), float(value), axis="", level="shared")


_TEXT = {"ADD": "+", "SUB": "-", "MUL": "*", "DIV": "/"}


def render_text(node: Expr) -> str:
    """A readable one-line form of an expression, used by ``replayssm show`` and error messages."""
    if node.op in ("INPUT", "PARAM"):
        return node.arg
    if node.op == "CONST":
        return repr(node.arg)
    if node.op == "DIM":
        return node.arg
    if node.op in _TEXT:
        return f"({render_text(node.src[0])} {_TEXT[node.op]} {render_text(node.src[1])})"
    if node.op == "NEG":
        return f"-{render_text(node.src[0])}"
    if node.op == "POW":
        return f"{render_text(node.src[0])}**{node.arg:g}"
    if node.op == "L2NORM":
        return f"l2norm({render_text(node.src[0])})"
    return f"{node.op.lower()}({render_text(node.src[0])})"
