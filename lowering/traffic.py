"""Lowering layer: the traffic model, derived by walking a kernel plan's memory statements.

Bytes are counted per batch row and value head, for a given buffer fill ``n`` and draft count ``t``,
taking each ``When`` branch as the plan's flush rule decides. Only state and record traffic count
towards the traffic model of docs/design.md; the token inputs read and the outputs written are listed
apart (``token_read``, ``output_write``, together ``io``; fills and batch indices are not counted). Keys
and tokens stored once per key head are charged ``1 / (HV / H)`` to each value head.
"""

from __future__ import annotations

from dataclasses import dataclass

from replayssm_dsl.config import DTYPE_BYTES

from .buffer_rules import step_flushes, verify_flushes
from .ir import Kernel, Program, When
from .record_keys import key_shift


@dataclass(frozen=True)
class Traffic:
    state_read: float = 0.0
    state_write: float = 0.0
    record_read: float = 0.0
    record_write: float = 0.0
    token_read: float = 0.0
    output_write: float = 0.0

    @property
    def total(self) -> float:
        """State and record bytes: what docs/design.md's traffic model counts."""
        return self.state_read + self.state_write + self.record_read + self.record_write

    @property
    def io(self) -> float:
        """The token inputs read and the outputs written."""
        return self.token_read + self.output_write

    def __add__(self, other: "Traffic") -> "Traffic":
        return Traffic(*(a + b for a, b in zip(self._tuple(), other._tuple())))

    def scale(self, factor: float) -> "Traffic":
        return Traffic(*(a * factor for a in self._tuple()))

    def _tuple(self):
        return (self.state_read, self.state_write, self.record_read, self.record_write, self.token_read,
                self.output_write)


def record_bytes(program: Program, names: tuple = ("rec_decay", "rec_write", "rec_key")) -> float:
    """``R``: bytes of one record per value head (cumulative decay, write, key share; or of the
    record buffers ``names`` only)."""
    p, total = program, 0.0
    for b in p.buffers_of("record"):
        if b.name not in names:
            continue
        elems = {"rec_decay": p.shape.k_dim if "K" in b.dims[3:] else 1,
                 "rec_write": p.shape.v_dim, "rec_key": p.shape.k_dim}[b.name]
        share = p.shape.group_size if b.dims[1] == "H" else 1
        total += elems * DTYPE_BYTES[b.dtype] / share
    return total


def _token_bytes(program: Program, t: int) -> float:
    p, total = program, 0.0
    for b in p.buffers_of("token"):
        elems = {"": 1, "K": p.shape.k_dim, "V": p.shape.v_dim}[b.dims[3] if len(b.dims) > 3 else ""]
        share = p.shape.group_size if b.dims[2] == "H" else 1
        total += t * elems * DTYPE_BYTES[b.dtype] / share
    return total


def _records_read(program: Program, n: int, R: float) -> float:
    """Bytes of ``n`` records a kernel reads: all of each, or with decay-scaled keys
    (record_keys.py) their keys and writes and the newest record's decays alone."""
    if key_shift(program.declaration, program.config) is None:
        return n * R
    decays = record_bytes(program, ("rec_decay",))
    return n * (R - decays) + (decays if n else 0.0)


def kernel_traffic(program: Program, kernel: Kernel | str, fill: int, drafts: int = 1) -> Traffic:
    """Bytes one (batch row, value head) of ``kernel`` moves at buffer fill ``fill``."""
    p = program
    kernel = p.kernel(kernel) if isinstance(kernel, str) else kernel
    E, R = p.shape.state_elements, record_bytes(p)
    cfg = p.config
    env = {"n": fill, "t": drafts,
           "flush": (step_flushes(fill, cfg.window) if kernel.name == "replay_step"
                     else verify_flushes(fill, drafts, cfg.window, cfg.max_drafts))}
    t = drafts if any(s.op == "row" and "t" in s.outs for s, _ in kernel.statements()) else 1
    acc = Traffic()

    def walk(body, n):
        nonlocal acc
        for s in body:
            if isinstance(s, When):
                if bool(env[s.cond]) != s.negate:
                    n = walk(s.body, n)
                continue
            if s.op == "load_state":
                acc += Traffic(state_read=E * DTYPE_BYTES[p.buffer(s.attr("buffer")).dtype])
            elif s.op == "store_state":
                per = t if s.attr("per_draft") else 1
                acc += Traffic(state_write=per * E * DTYPE_BYTES[p.buffer(s.attr("buffer")).dtype])
            elif s.op == "load_records":
                acc += Traffic(record_read=_records_read(p, n, R))
            elif s.op in ("fold", "empty_records"):
                n = 0
            elif s.op == "append":
                acc += Traffic(record_write=t * R)
            elif s.op == "fields":
                acc += Traffic(token_read=_token_bytes(p, t if s.attr("tokens") == "drafts" else 1))
            elif s.op == "store_output":
                acc += Traffic(output_write=(t if s.attr("per_draft") else 1) * p.shape.v_dim * 4)
        return n

    walk(kernel.body, fill)
    return acc


def replay_step_amortized(program: Program) -> Traffic:
    """The replay step averaged over the ``L`` fills of the steady state (one flush in ``L`` steps)."""
    L = program.config.window
    total = Traffic()
    for n in range(L):
        total += kernel_traffic(program, "replay_step", n)
    return total.scale(1.0 / L)


def verify_mixed(program: Program, drafts: int) -> Traffic:
    """Verify of ``drafts`` tokens with the fold launched before it (``flush_for_verify``), averaged
    over the ``L`` fills of the mixed steady state (row ``b`` at fill ``b mod L``), as the benchmark
    times it. Its floor counts the tokens and outputs too (``io``): at T = 8 they are a tenth or more
    of its bytes, where the replay step's one token is noise."""
    L = program.config.window
    total = Traffic()
    for n in range(L):
        total += kernel_traffic(program, "flush_for_verify", n, drafts) + kernel_traffic(program, "verify", n, drafts)
    return total.scale(1.0 / L)


def design_formulas(program: Program) -> dict[str, float]:
    """The hand formulas of docs/design.md ("Traffic model") (no low-precision copy: ``s_lp = s_hp``), for cross-checking."""
    p = program
    E, s, R, L = p.shape.state_elements, DTYPE_BYTES[p.config.state_dtype], record_bytes(p), p.config.window
    D = record_bytes(p, ("rec_decay",)) if key_shift(p.declaration, p.config) is not None else 0.0
    read = [n * (R - D) + (D if n else 0.0) for n in range(L)]  # D: decays only the newest record's are read
    non_flush = [E * s + read[n] + R for n in range(L - 1)]
    flush = E * s + read[L - 1] + E * s
    return {"conventional": 2 * E * s, "replay_amortized": (sum(non_flush) + flush) / L,
            "replay_non_flush_n0": non_flush[0] if non_flush else flush, "replay_flush": flush}
