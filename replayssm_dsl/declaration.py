"""DSL layer: declaring a linear-recurrence layer, and checking the declaration when it is made.

A declaration says, per head and per token (docs/design.md, "The recurrence")::

    decay   g_t            scalar per head, a vector over K, or none      (log space, g ≤ 0)
    write   w_t = s·v      plain                 or  β·(v − P_t k)        delta-rule correction
    update  S_t = S_{t−1}·e^{g_t} + w_t k_tᵀ
    output  o_t = S_t q_t  [+ skip] [⊙ silu(gate)]

Example (Gated DeltaNet)::

    r = Recurrence("gdn")
    q, k = r.token("q", per="group", size="K"), r.token("k", per="group", size="K")
    v, a, b = r.token("v", size="V"), r.token("a"), r.token("b")
    A_log, dt_bias = r.param("A_log"), r.param("dt_bias")
    gdn = r.build(decay=-ops.exp(A_log) * ops.softplus(a + dt_bias),
                  key=ops.l2norm(k), query=ops.l2norm(q) * r.K ** -0.5,
                  write=delta(value=v, beta=ops.sigmoid(b)))

Imports ``expr``, ``ops`` and ``errors`` only.
"""

from __future__ import annotations

import hashlib
import keyword
from dataclasses import dataclass, field, replace

from .bounds import value_range
from .errors import DeclarationError
from .expr import Expr, as_expr, render_text

PER = {"head": "head", "group": "group"}
TOKEN_DTYPES = ("float32", "bfloat16")  # how a token input arrives; parameters are float32
SIZES = {None: "", "": "", "K": "K", "V": "V"}
# The names of the lowering's own buffers and kernel arguments: the rendered CUDA prefixes every input
# (``tok_q``, ``par_A_log``), but the lowered program and the caches keep inputs beside these buffers under
# their bare names, so an input named ``fill`` or ``out`` would take the buffer's place.
# ``tests/test_reserved_names.py`` checks this list against every lowered program.
RESERVED = frozenset({
    "checkpoint", "state", "snapshots", "initial", "materialized", "out",      # states and outputs
    "rec_decay", "rec_write", "rec_key", "fill",                                # records, fills
    "slot", "slots", "src_page", "dst_page", "drafts", "accepted",             # batch rows
    "rows", "t_tok", "num_slots", "num_pages",                                  # kernel scalars
})


@dataclass(frozen=True)
class InputSpec:
    """A named input: a ``token`` input arrives with every token, a ``param`` is fixed per layer.

    Token inputs have shape ``[B, heads]`` (+ ``[K]`` or ``[V]``) per step and ``[B, T, heads, ...]``
    per verify; params ``[heads]`` (+ ``[K]`` / ``[V]``), where ``heads`` is ``HV`` for
    ``per="head"`` and ``H`` for ``per="group"``.
    """

    name: str
    kind: str  # "token" | "param"
    level: str  # "head" | "group"
    size: str  # "" | "K" | "V"
    sign: str = "any"  # "nonpositive" | "nonnegative" | "any" (checked at run time)
    doc: str = ""
    dtype: str = "float32"  # token inputs: "float32" or "bfloat16" (the kernels read it as it arrives)

    @property
    def node(self) -> Expr:
        return Expr.make("INPUT" if self.kind == "token" else "PARAM", (), self.name,
                         axis=self.size, level=self.level, sign=self.sign)

    def shape_text(self, verify: bool = False) -> str:
        heads = "HV" if self.level == "head" else "H"
        lead = ("B, T, " if verify else "B, ") if self.kind == "token" else ""
        return f"[{lead}{heads}{', ' + self.size if self.size else ''}]"


@dataclass(frozen=True)
class PlainWrite:
    """``w = strength · value`` (Mamba-2: ``Δ · x``; linear attention, GLA, RetNet: ``v``)."""

    value: Expr
    strength: Expr | None = None


@dataclass(frozen=True)
class DeltaWrite:
    """``w = β · (value − P_t k)``, the delta-rule correction (DeltaNet, GDN, KDA)."""

    value: Expr
    beta: Expr


def plain(value, strength=None) -> PlainWrite:
    return PlainWrite(as_expr(value), None if strength is None else as_expr(strength))


def delta(value, beta) -> DeltaWrite:
    return DeltaWrite(as_expr(value), as_expr(beta))


@dataclass(frozen=True)
class Declaration:
    """A validated recurrence: what the lowering takes. Build it with ``Recurrence.build``."""

    name: str
    inputs: tuple[InputSpec, ...]
    key: Expr
    query: Expr
    write: PlainWrite | DeltaWrite
    decay: Expr | None = None
    skip: Expr | None = None
    gate: Expr | None = None
    doc: str = ""
    _fields: tuple = field(default=(), repr=False, compare=False)

    @property
    def decay_form(self) -> str:
        """``"none"``, ``"scalar"`` (one log-decay per head) or ``"vector"`` (one per key channel)."""
        if self.decay is None:
            return "none"
        return "vector" if self.decay.axis == "K" else "scalar"

    @property
    def decay_lower_bound(self) -> float:
        """The lowest log-decay one token can bring (``bounds.value_range``), ``-inf`` where nothing
        bounds it (Kimi's ``−exp(A_log)·softplus(…)``) and 0 without a decay. A bounded gate (FLA's
        safe gate ``lower_bound · sigmoid(…)``) bounds the records' cumulative decays, which lets
        the lowering keep decay-scaled keys (lowering/record_keys.py)."""
        return 0.0 if self.decay is None else value_range(self.decay)[0]

    @property
    def is_delta(self) -> bool:
        return isinstance(self.write, DeltaWrite)

    @property
    def key_level(self) -> str:
        """Keys are stored once per key head (``group``) unless the key depends on a value head."""
        return "group" if self.key.level in ("group", "shared") else "head"

    def expressions(self) -> dict[str, Expr]:
        """Every declared quantity by role, in a fixed order (the order the kernels compute them)."""
        out = {}
        if self.decay is not None:
            out["decay"] = self.decay
        out["key"] = self.key
        out["query"] = self.query
        out["value"] = self.write.value
        if isinstance(self.write, DeltaWrite):
            out["beta"] = self.write.beta
        elif self.write.strength is not None:
            out["strength"] = self.write.strength
        if self.skip is not None:
            out["skip"] = self.skip
        if self.gate is not None:
            out["gate"] = self.gate
        return out

    def input(self, name: str) -> InputSpec:
        for spec in self.inputs:
            if spec.name == name:
                return spec
        raise KeyError(name)

    def describe(self) -> str:
        lines = [f"recurrence {self.name}" + (f"  # {self.doc}" if self.doc else "")]
        for spec in self.inputs:
            sign = f" ({spec.sign})" if spec.sign != "any" else ""
            dtype = f" {spec.dtype}" if spec.dtype != "float32" else ""
            lines.append(f"  {spec.kind:<5} {spec.name:<8} {spec.shape_text()}{dtype}{sign}")
        lines.append(f"  decay form: {self.decay_form}; write: {'delta rule' if self.is_delta else 'plain'}; "
                     f"keys stored per {'key head' if self.key_level == 'group' else 'value head'}")
        for role, node in self.expressions().items():
            lines.append(f"  {role:<8} = {render_text(node)}")
        return "\n".join(lines)

    def with_token_dtype(self, dtype: str, names=None) -> "Declaration":
        """The same recurrence with token inputs ``names`` (default: every token input) arriving as
        ``dtype`` (``TOKEN_DTYPES``): an engine whose activations are bf16 passes them as they are, and
        the kernels widen each element to float32 as they read it."""
        _check_token_dtype("with_token_dtype: dtype", dtype)
        tokens = {spec.name for spec in self.inputs if spec.kind == "token"}
        chosen = tokens if names is None else set(names)
        unknown = sorted(chosen - tokens)
        if unknown:
            raise DeclarationError(f"with_token_dtype: names {unknown} are not token inputs of {self.name!r}; "
                                   f"token inputs: {sorted(tokens)}")
        inputs = tuple(replace(spec, dtype=dtype) if spec.name in chosen else spec for spec in self.inputs)
        return replace(self, inputs=inputs)

    @property
    def fingerprint(self) -> str:
        """sha256 of the declaration's canonical text: the same declaration, the same kernels."""
        return hashlib.sha256(self.describe().encode()).hexdigest()[:16]


def _check_token_dtype(what: str, dtype) -> None:
    if not isinstance(dtype, str) or dtype not in TOKEN_DTYPES:
        raise DeclarationError(f"{what}={dtype!r}; use one of {', '.join(TOKEN_DTYPES)}")


class Recurrence:
    """Builder: declare inputs, then ``build`` the recurrence from expressions of them."""

    def __init__(self, name: str, doc: str = ""):
        if not isinstance(name, str) or not name.replace("_", "").isalnum() or not name[0].isalpha():
            raise DeclarationError(f"name: {name!r} must start with a letter and hold letters, digits, '_'")
        self.name, self.doc = name, doc
        self._inputs: dict[str, InputSpec] = {}
        self.K = Expr.make("DIM", (), "K", axis="", level="shared")
        self.V = Expr.make("DIM", (), "V", axis="", level="shared")

    def _declare(self, name: str, kind: str, per: str, size, sign: str, doc: str, dtype: str = "float32") -> Expr:
        if not name.isidentifier() or keyword.iskeyword(name) or name.startswith("_"):
            raise DeclarationError(f"{kind} {name!r}: not a usable name (need an identifier, not a keyword, "
                                   f"not starting with '_')")
        if name in RESERVED:
            raise DeclarationError(f"{kind} {name!r}: the name of one of the lowering's own buffers or kernel "
                                   f"arguments ({', '.join(sorted(RESERVED))}); pick another")
        if name in self._inputs:
            raise DeclarationError(f"{kind} {name!r}: declared twice")
        if not isinstance(per, str) or per not in PER:
            raise DeclarationError(f"{kind} {name!r}: per={per!r}; use 'head' (one per value head) "
                                   "or 'group' (one per key head, shared by its value heads)")
        if not (size is None or isinstance(size, str)) or size not in SIZES:
            raise DeclarationError(f"{kind} {name!r}: size={size!r}; use None (scalar), 'K' or 'V'")
        if not isinstance(sign, str) or sign not in ("any", "nonpositive", "nonnegative"):
            raise DeclarationError(f"{kind} {name!r}: sign={sign!r}; use 'any', 'nonpositive' or 'nonnegative'")
        _check_token_dtype(f"{kind} {name!r}: dtype", dtype)
        spec = InputSpec(name, kind, PER[per], SIZES[size], sign, doc, dtype)
        self._inputs[name] = spec
        return spec.node

    def token(self, name: str, *, per: str = "head", size=None, sign: str = "any", doc: str = "",
              dtype: str = "float32") -> Expr:
        """An input that arrives with every token, e.g. ``dt`` ``[B, HV]`` or ``k`` ``[B, H, K]``.

        A declared ``sign`` lets the decay's sign be proven; the CPU backend checks it on every call.
        ``dtype``: how it arrives (``"float32"`` or ``"bfloat16"``); the kernels widen bf16 to float32
        as they read it, and the backends round other floats to bf16 on entry.
        """
        return self._declare(name, "token", per, size, sign, doc, dtype)

    def param(self, name: str, *, per: str = "head", size=None, sign: str = "any", doc: str = "") -> Expr:
        """A layer parameter, fixed across tokens (``A_log``, ``dt_bias``, ``D``); ``sign`` is checked at run time."""
        return self._declare(name, "param", per, size, sign, doc)

    def __getitem__(self, name: str) -> Expr:
        if name not in self._inputs:
            raise DeclarationError(f"input {name!r} is not declared in {self.name!r}; declared: "
                                   f"{sorted(self._inputs) or 'none'}")
        return self._inputs[name].node

    def build(self, *, key=None, query=None, write=None, decay=None, skip=None, gate=None) -> Declaration:
        decl = Declaration(
            name=self.name, inputs=tuple(self._inputs.values()),
            key=_required("key", key), query=_required("query", query),
            write=_check_write(write), decay=None if decay is None else as_expr(decay),
            skip=None if skip is None else as_expr(skip), gate=None if gate is None else as_expr(gate),
            doc=self.doc,
        )
        validate(decl, self._inputs)
        return decl


def _required(field_name: str, value) -> Expr:
    if value is None:
        raise DeclarationError(f"{field_name}: missing; every recurrence needs a {field_name} vector over K")
    return as_expr(value)


def _check_write(write):
    if write is None:
        raise DeclarationError("write: missing; use write=plain(value, strength) or write=delta(value, beta)")
    if not isinstance(write, (PlainWrite, DeltaWrite)):
        raise DeclarationError(f"write: expected plain(...) or delta(...), got {type(write).__name__}")
    return write


def _expect_axis(field_name: str, node: Expr, allowed: tuple[str, ...], why: str) -> None:
    if node.axis not in allowed:
        shown = {"": "a scalar per head", "K": "a vector over K", "V": "a vector over V",
                 "VK": "a V×K matrix per head"}
        raise DeclarationError(f"{field_name}: is {shown[node.axis]} ({render_text(node)}); {why}")


# where each function of a decay is defined: its argument's lowest value must be at 0 or above it
_AT_LEAST_0 = ("can be negative", lambda lo: lo >= 0.0,
               "softplus(...), exp(...) or a param declared sign='nonnegative'")
_ABOVE_0 = ("can be 0 or negative", lambda lo: lo > 0.0, "softplus(...) + a positive constant")
_DOMAINS = {"SQRT": _AT_LEAST_0, "POW": _AT_LEAST_0, "RSQRT": _ABOVE_0, "LOG": _ABOVE_0}


def _check_decay_domains(decay: Expr) -> None:
    """A decay must be a number for every input: sqrt, rsqrt, log and fractional powers of an argument
    that can leave their domain give NaN, which the sign proof (g ≤ 0 wherever defined) cannot see."""
    for node in decay.walk():
        if node.op in _DOMAINS and not (node.op == "POW" and float(node.arg).is_integer()):
            why, defined, instead = _DOMAINS[node.op]
            arg = node.src[0]
            if not defined(value_range(arg)[0]):
                raise DeclarationError(f"decay: {render_text(node)} is not a number where {render_text(arg)} {why}; "
                                       f"bound the argument, e.g. {instead}")


def validate(decl: Declaration, declared: dict[str, InputSpec]) -> None:
    """Raise ``DeclarationError`` naming the field when replay cannot serve ``decl``."""
    if decl.decay is not None:
        if decl.decay.axis in ("V", "VK"):
            raise DeclarationError(
                f"decay: varies along V ({render_text(decl.decay)}); replay records would be state-sized "
                "(a full V×K decay per token, as in Mamba-1, cannot be replayed). A decay must be a scalar "
                "per head or a vector over K.")
        _check_decay_domains(decl.decay)
        if decl.decay.sign != "nonpositive" and value_range(decl.decay)[1] > 0.0:
            raise DeclarationError(
                f"decay: cannot show g ≤ 0 for {render_text(decl.decay)} (log-space decay must be ≤ 0 so "
                "that exp(G_n − G_i) cannot overflow); build it from -exp(...)·softplus(...), logsigmoid(...) "
                "or a param declared sign='nonpositive'")
    _expect_axis("key", decl.key, ("K",), "keys must be a vector over K")
    _expect_axis("query", decl.query, ("K",), "queries must be a vector over K")
    _expect_axis("write.value", decl.write.value, ("V",), "the written value must be a vector over V")
    scalar_fields = [("write.beta", decl.write.beta)] if decl.is_delta else [("write.strength", decl.write.strength)]
    for name, node in scalar_fields:
        if node is not None:
            _expect_axis(name, node, ("",), "a write strength is one scalar per head and token")
    if decl.skip is not None:
        _expect_axis("skip", decl.skip, ("V",), "the skip term is added to the output, a vector over V")
    if decl.gate is not None:
        _expect_axis("gate", decl.gate, ("V",), "the gate multiplies the output, a vector over V")
    used = set()
    for role, node in decl.expressions().items():
        for leaf in node.walk():
            if leaf.op in ("INPUT", "PARAM"):
                if leaf.arg not in declared:
                    raise DeclarationError(f"{role}: uses input {leaf.arg!r}, which is not declared in "
                                           f"{decl.name!r} (declared: {sorted(declared)})")
                if declared[leaf.arg].node is not leaf:
                    raise DeclarationError(f"{role}: uses an input {leaf.arg!r} declared by another builder, "
                                           f"with another kind, size, level or sign than {decl.name!r}'s own")
                used.add(leaf.arg)
    if not any(spec.kind == "token" for spec in declared.values()):
        raise DeclarationError(f"inputs: {decl.name!r} declares no token input; a recurrence needs per-token inputs")
    unused = sorted(set(declared) - used)
    if unused:
        raise DeclarationError(f"inputs {unused} are declared but used by no field of {decl.name!r}")
