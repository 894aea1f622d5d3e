"""Lowering layer: the IR of kernel plans, written down in one place.

Grammar (every node is a frozen dataclass; ``Program.pretty()`` prints it)::

    Program  := Program(declaration, fingerprint, shape, config, buffers: Buffer*, kernels: Kernel*)
    Buffer   := Buffer(name, role, dtype, dims: dim*)        role ∈ state | record | meta | batch |
                                                                      token | param | output
    dim      := int | "B" | "T" | "slots" | "pages" | "cap" | "HV" | "H" | "V" | "K"
    Kernel   := Kernel(name, grid: dim*, body: Stmt*)        grid is (V-tiles, HV, B) or (B,)
    Stmt     := Stmt(op, outs: name*, ins: name*, attrs)     a named value is defined once
              | When(cond: name, body: Stmt*)                 body runs where cond is true

A kernel runs once per batch row ``b`` (and, on the GPU, per value head and V-tile; every op below
is local to the rows ``[v0, v0+BV)`` of one head except where it says "head-level"). Values:
``idx`` an int per row, ``flag`` a bool per row, ``scal`` a float per head, ``kvec`` a vector over
K per head, ``vvec`` over V, ``mat`` a ``V×K`` state, ``recs`` the first n records, ``fields`` the
declared per-token quantities. Ops (ins → outs):

    row              → slot, src, dst [, t]      batch row's slot and pages; null slot (< 0) skips
    load_fill  slot  → n                          records committed in the slot's buffer
    flush_rule n, t  → flush                      attrs rule="step" (n+1 ≥ L) | "verify" (n+t > cap)
    fields     t     → F                          head-level: decay, key, query, value, β|strength,
                                                  skip, gate of t tokens (the declaration's expressions)
    load_state src   → S                          attrs buffer: one state read (E elements per head)
    load_records n   → R                          G_i, k_i (head-level) and w_i (rows) for i < n
    empty_records    → R                          no records (n = 0, G_{−1} = 0)
    fold       S,R   → S                          S·e^{G_{n-1}} + Σ_i w_i (k_i ⊙ e^{G_{n-1}−G_i})ᵀ
    cumulate   R,F   → G                          G_j = G_{n−1} + Σ_{m≤j} g_m, j < t (head-level)
    scores     R,F,G → SC                         (k_i ⊙ e^{G_j−G_i})·q_j and ·k_j, i < n+j (head-level)
    replay     S,R,F,G,SC → W, O                  per row: S(e^{G_j} ⊙ q_j) + Σ_i w_i·sc, the
                                                  delta-rule triangular recurrence over drafts, epilogue
    recur      S,F   → S, O                       the plain recurrence over t tokens (baselines)
    store_output O                                attrs per_draft
    store_state  S, dst                           attrs buffer [, per_draft]: one state write
    append     n,W,F,G                            write t records at n..n+t−1 (G_j, w_j, k_j)
    fold_tokens S,R,W,F,G → S                     fold the buffer and the t new tokens (flushing step)
    set_fill   slot, value                        attrs value="zero" | "advance" | "commit"; in a tiled
                                                  kernel, made once per row after all its CTAs read n

Both backends give every op the same meaning: ``interpret.py`` in NumPy, ``render_cuda.py`` (with ``render_replay.py`` and ``render_blocks.py``) in CUDA.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

ROLES = ("state", "record", "meta", "batch", "token", "param", "output")
OPS = ("row", "load_fill", "flush_rule", "fields", "load_state", "load_records", "fold",
       "cumulate", "scores", "replay", "recur", "store_output", "store_state", "append", "fold_tokens",
       "set_fill", "empty_records")


@dataclass(frozen=True)
class Buffer:
    name: str
    role: str
    dtype: str
    dims: tuple
    doc: str = ""

    def __post_init__(self):
        assert self.role in ROLES, self.role

    def pretty(self) -> str:
        return f"{self.role:<7} {self.name:<12} {self.dtype:<8} [{', '.join(map(str, self.dims))}]"


@dataclass(frozen=True)
class Stmt:
    op: str
    outs: tuple[str, ...] = ()
    ins: tuple[str, ...] = ()
    attrs: tuple[tuple[str, Any], ...] = ()

    def __post_init__(self):
        assert self.op in OPS, self.op

    def attr(self, key: str, default=None):
        return dict(self.attrs).get(key, default)

    def pretty(self, indent: str = "") -> str:
        lhs = ", ".join(self.outs)
        attrs = " ".join(f"{k}={v}" for k, v in self.attrs)
        return f"{indent}{lhs + ' = ' if lhs else ''}{self.op}({', '.join(self.ins)}){' ' + attrs if attrs else ''}"


@dataclass(frozen=True)
class When:
    cond: str
    body: tuple
    negate: bool = False

    def pretty(self, indent: str = "") -> str:
        head = f"{indent}when {'not ' if self.negate else ''}{self.cond}:"
        return "\n".join([head] + [s.pretty(indent + "  ") for s in self.body])


@dataclass(frozen=True)
class Kernel:
    name: str
    grid: tuple
    body: tuple
    doc: str = ""

    def statements(self):
        """Every Stmt, flattening ``When`` blocks, with the condition stack that guards it."""
        def walk(body, guards):
            for s in body:
                if isinstance(s, When):
                    yield from walk(s.body, guards + ((s.cond, s.negate),))
                else:
                    yield s, guards
        return list(walk(self.body, ()))

    def pretty(self) -> str:
        lines = [f"kernel {self.name} grid=({', '.join(map(str, self.grid))})" + (f"  # {self.doc}" if self.doc else "")]
        lines += [s.pretty("  ") for s in self.body]
        return "\n".join(lines)


@dataclass(frozen=True)
class Program:
    declaration: Any  # replayssm_dsl.Declaration
    shape: Any  # ModelShape
    config: Any  # ReplayConfig
    buffers: tuple[Buffer, ...]
    kernels: tuple[Kernel, ...]
    sizes: dict = field(default_factory=dict)

    def kernel(self, name: str) -> Kernel:
        for k in self.kernels:
            if k.name == name:
                return k
        raise KeyError(f"no kernel {name!r}; kernels: {[k.name for k in self.kernels]}")

    def buffer(self, name: str) -> Buffer:
        for b in self.buffers:
            if b.name == name:
                return b
        raise KeyError(name)

    def buffers_of(self, role: str) -> list[Buffer]:
        return [b for b in self.buffers if b.role == role]

    def pretty(self) -> str:
        d = self.declaration
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        lines = [f"program {d.name} ({d.fingerprint})  {sizes}", "buffers:"]
        lines += ["  " + b.pretty() for b in self.buffers]
        lines += [k.pretty() for k in self.kernels]
        return "\n".join(lines)
