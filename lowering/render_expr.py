"""Lowering layer: declaration expressions → CUDA C statements (a table of op → C text).

Three contexts, by what one warp holds while it evaluates:
- ``"K"``: a vector over K, a lane holding ``KE`` elements (``e = k_index(i, lane)``);
- ``"V"``: one state row, ``e = row`` (every lane holds the same value);
- ``""``: scalars per head.
A scalar node renders as ``float``; a K-vector node as ``float x[KE]``. ``L2NORM`` over K reduces
with ``warp_sum``. Inputs read the token buffers ``[B, T, heads(, size)]`` at token ``j`` and the
parameter buffers ``[heads(, size)]``; group-level inputs index the key head ``hk``; a bf16 token input is widened as it is read (``bf16_bits_to_f32``). A ``hoisted``
token input (over K or a scalar) takes token ``j == warp`` from ``pre_<name>``, a hoisted parameter is
``pre_<name>`` (``first_draft_loads``); a ``sources``
input is read from a register array (a record's raw input: ``widen_records``); a ``staged`` V-sized input
from its copy in shared memory at ``x`` (``render_row_inputs``).
"""

from __future__ import annotations

from replayssm_dsl.expr import Expr

from replayssm_dsl.errors import LoweringError

C_UNARY = {
    "NEG": "(-{0})", "EXP": "expf({0})", "LOG": "logf({0})", "SQRT": "sqrtf({0})", "RSQRT": "rsqrtf({0})",
    "SOFTPLUS": "softplus_f({0})", "SIGMOID": "sigmoid_f({0})", "LOGSIGMOID": "logsigmoid_f({0})",
    "SILU": "silu_f({0})",
}
C_BINARY = {"ADD": "({0} + {1})", "SUB": "({0} - {1})", "MUL": "({0} * {1})", "DIV": "({0} / {1})"}


def c_float(value: float) -> str:
    text = repr(float(value))
    return f"{text}f" if ("." in text or "e" in text) else f"{text}.0f"


def input_element(spec, index: str, token: str = "j") -> str:
    """C text of input ``spec``'s element ``index`` (of K or V; ignored for a scalar input) as stored
    (raw bits for a bf16 token): a token input at token ``token`` of row ``b``, a parameter per head;
    group-level inputs index the key head ``hk``."""
    heads, head = ("HV", "hv") if spec.level == "head" else ("H", "hk")
    if spec.kind == "token":
        base, buf = f"((size_t)(b * t_tok + {token}) * {heads} + {head})", f"tok_{spec.name}"
    else:
        base, buf = f"(size_t){head}", f"par_{spec.name}"
    return f"{buf}[{base}]" if not spec.size else f"{buf}[{base} * {spec.size} + {index}]"


def input_load(spec, index: str, token: str = "j") -> str:
    """C text reading input ``spec`` at element ``index`` as a float (``input_element``, widened)."""
    element = input_element(spec, index, token)
    return f"bf16_bits_to_f32({element})" if spec.dtype == "bfloat16" else element


class ExprRenderer:
    """Renders expressions of one declaration; ``prefix`` keeps variable names unique per use."""

    def __init__(self, declaration, prefix: str, hoisted: tuple = (), sources: dict | None = None,
                 staged: dict | None = None):
        self.decl, self.prefix = declaration, prefix
        self.hoisted = hoisted  # inputs in registers already (first_draft_loads): draft j = warp's, a head's parameter
        self.sources = sources or {}  # K-sized token inputs read from a register array instead: name -> array
        self.staged = staged or {}  # V-sized token inputs copied to shared memory [t, BV], read at x: name -> array
        self.names: dict[int, str] = {}
        self.lines: list[str] = []

    def _leaf(self, node: Expr, index: str) -> str:
        spec = self.decl.input(node.arg)
        if spec.name in self.sources and spec.size == "K" and index == "e":
            return f"{self.sources[spec.name]}[i]"
        if spec.name in self.staged and spec.size == "V":
            element = f"{self.staged[spec.name]}[x]"
            return f"bf16_bits_to_f32({element})" if spec.dtype == "bfloat16" else element
        load = input_load(spec, index)
        if spec.name not in self.hoisted:
            return load
        if spec.size == "":  # a draft's scalar (the first draft of the warp) or the head's parameter
            return f"(j == warp ? pre_{spec.name} : {load})" if spec.kind == "token" else f"pre_{spec.name}"
        if index != "e":  # (registers over K serve the K context only)
            return load
        return f"(j == warp ? pre_{spec.name}[i] : {load})" if spec.kind == "token" else f"pre_{spec.name}[i]"

    def render(self, node: Expr, ctx: str) -> str:
        """Emit statements computing ``node`` in context ``ctx``; return the C name of its value."""
        for n in node.walk():
            if id(n) in self.names:
                continue
            name = f"{self.prefix}{len(self.names)}"
            self.names[id(n)] = name
            vector = ctx == "K" and n.axis == "K"
            if n.axis not in ("", ctx):
                raise LoweringError(f"cannot render {n!r} (axis {n.axis}) in a {ctx or 'scalar'} context")
            if vector and n.op == "L2NORM":
                x = self.names[id(n.src[0])]
                self.lines += [
                    f"float {name}[KE];",
                    "{",
                    "    float ss = 0.f;",
                    "    #pragma unroll",
                    f"    for (int i = 0; i < KE; ++i) ss += (k_index(i, lane) < K) ? {x}[i] * {x}[i] : 0.f;",
                    f"    const float inv = rsqrtf(warp_sum(ss) + {c_float(n.arg)});",
                    "    #pragma unroll",
                    f"    for (int i = 0; i < KE; ++i) {name}[i] = {x}[i] * inv;",
                    "}",
                ]
                continue
            if n.op == "L2NORM":
                raise LoweringError(f"{n!r}: the CUDA backend normalises vectors over K only")
            expr = self._expr(n, "e" if ctx == "K" else "row", vector)
            if vector:
                self.lines += [f"float {name}[KE];", "#pragma unroll",
                               f"for (int i = 0; i < KE; ++i) {{ const int e = k_index(i, lane); "
                               f"{name}[i] = (e < K) ? {expr} : 0.f; }}"]
            else:
                self.lines.append(f"const float {name} = {expr};")
        return self.names[id(node)]

    def _operand(self, node: Expr, vector: bool) -> str:
        name = self.names[id(node)]
        return f"{name}[i]" if vector and node.axis == "K" else name

    def _expr(self, n: Expr, index: str, vector: bool) -> str:
        if n.op in ("INPUT", "PARAM"):
            return self._leaf(n, index)
        if n.op == "CONST":
            return c_float(n.arg)
        if n.op == "DIM":
            return f"((float){n.arg})"
        args = [self._operand(s, vector) for s in n.src]
        if n.op in C_UNARY:
            return C_UNARY[n.op].format(*args)
        if n.op in C_BINARY:
            return C_BINARY[n.op].format(*args)
        if n.op == "POW":
            return f"powf({args[0]}, {c_float(n.arg)})"
        raise LoweringError(f"no CUDA rendering for op {n.op}")
