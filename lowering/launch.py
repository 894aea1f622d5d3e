"""Lowering layer: how generated kernels are launched: thread shape, grid, argument order.

A tiled kernel runs on a grid ``(V-tiles, HV, B)`` with ``warps`` warps per CTA, each owning
``rows_per_warp`` state rows; fill kernels run one thread per batch row. Every kernel takes the same
arguments, in ``kernel_arguments`` order, so a launcher passes the same pointers to any of them.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, replace

from .ir import Kernel, Program

FILL_THREADS = 128
SMS_H200 = 132


_LABEL = re.compile(r"([1-9][0-9]*)x([1-9][0-9]*)(?:/r([1-9][0-9]*))?(/e)?(?:/p([1-9][0-9]*))?(?:/s([1-9][0-9]*))?(/w)?(/v)?(?:/f([1-9][0-9]*))?(/c)?",
                    re.ASCII)


@dataclass(frozen=True)
class LaunchConfig:
    """Threads of a tiled kernel: ``warps`` per CTA, ``rows_per_warp`` state rows per warp; ``max_registers``
    per thread (under 128, more CTAs share an SM if the kernels fit: 80 lets 6 CTAs of 4 warps, 64 lets 8)."""

    warps: int = 4
    rows_per_warp: int = 4
    max_registers: int = 128
    eager_records: bool = False  # the step stages the whole buffer before its fill arrives (latency over bytes)
    verify_rows_per_pass: int = 0  # verify's rows per pass through the drafts (0: the default, see verify_rows)
    shared_rows: int = 0  # the replay step's last rows of each warp held in shared memory, not registers
    register_writes: bool = False  # the replay step loads its write records into registers, not shared memory
    # the replay step loads its token's row fields (value, skip, gate) into the registers of the lanes that
    # finish each row, not into shared arrays: BV floats per field less static shared memory per CTA
    register_fields: bool = False
    # verify on tensor cores under a register cap: each lane's last ``shared_fragments`` 16-byte chunks of its
    # second fragment row come through shared memory (cp.async), not registers (render_verify_mma)
    shared_fragments: int = 0
    # verify on tensor cores computes its scores on CUDA cores, in SIMT trips whose work follows the drafts'
    # count, not in one 8-column product per part that costs the same for 1 draft as for 8 (mma_scores)
    simt_scores: bool = False

    def __post_init__(self):
        for name in ("warps", "rows_per_warp", "max_registers"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 1:
                raise ValueError(f"{name}: expected a positive int, got {value!r}")
        if not isinstance(self.verify_rows_per_pass, int) or self.verify_rows_per_pass < 0:
            raise ValueError(f"verify_rows_per_pass: expected an int >= 0 (0: the default), got {self.verify_rows_per_pass!r}")
        if not isinstance(self.shared_rows, int) or not 0 <= self.shared_rows < self.rows_per_warp:
            raise ValueError(f"shared_rows: expected an int in [0, rows_per_warp = {self.rows_per_warp}) "
                             f"(a warp keeps at least one row in registers), got {self.shared_rows!r}")
        if not isinstance(self.shared_fragments, int) or self.shared_fragments < 0:
            raise ValueError(f"shared_fragments: expected an int >= 0, got {self.shared_fragments!r}")

    @property
    def threads(self) -> int:
        return 32 * self.warps

    @property
    def min_blocks(self) -> int:
        """CTAs per SM the register allocation must allow: caps registers at ``max_registers`` per thread."""
        return max(1, 65536 // (self.max_registers * self.threads))

    @property
    def label(self) -> str:
        """``4x8`` (warps × rows per warp), with ``/r64`` when the register cap is not 128, ``/e`` for
        eager records, ``/p10`` for verify's rows per pass, ``/s8`` for shared rows, ``/w`` for write
        records in registers, ``/v`` for the token's row fields in registers, ``/f3`` for verify's
        shared fragments and ``/c`` for verify's scores on CUDA cores when set."""
        return (f"{self.warps}x{self.rows_per_warp}" + ("" if self.max_registers == 128 else f"/r{self.max_registers}")
                + ("/e" if self.eager_records else "")
                + (f"/p{self.verify_rows_per_pass}" if self.verify_rows_per_pass else "")
                + (f"/s{self.shared_rows}" if self.shared_rows else "")
                + ("/w" if self.register_writes else "")
                + ("/v" if self.register_fields else "")
                + (f"/f{self.shared_fragments}" if self.shared_fragments else "")
                + ("/c" if self.simt_scores else ""))

    @classmethod
    def from_label(cls, label: str) -> "LaunchConfig":
        """The launch that ``label`` names (``8x8/r64/p4``, ``4x4/e``, ``8x16/r80/s10/w``): the inverse of ``label``, which
        it must match exactly (options in its order, no cap written as ``/r128``)."""
        match = _LABEL.fullmatch(label)
        try:
            if match is None:
                raise ValueError("expected WARPSxROWS, then /rN, /e, /pN, /sN, /w, /v, /fN, /c in that order")
            warps, rows, cap, eager, passes, shared, writes, fields, fragments, scores = match.groups()
            launch = cls(int(warps), int(rows), int(cap) if cap else 128, eager_records=bool(eager),
                         verify_rows_per_pass=int(passes) if passes else 0, shared_rows=int(shared) if shared else 0,
                         register_writes=bool(writes), register_fields=bool(fields), shared_fragments=int(fragments) if fragments else 0,
                         simt_scores=bool(scores))
            if launch.label != label:
                raise ValueError(f"it reads as {launch.label!r}")
        except ValueError as exc:
            raise ValueError(f"launch label {label!r}: {exc}") from None
        return launch

    @property
    def verify_rows(self) -> int:
        """Verify's rows per pass through the drafts: ``verify_rows_per_pass``, or by default 8 (all of
        a warp's rows in one pass spill at 16 rows for some declarations, at 10 for some shapes)."""
        return min(self.verify_rows_per_pass or 8, self.rows_per_warp)

    @property
    def register_rows(self) -> int:
        """The replay step's rows per warp held in registers: the first ``rows_per_warp - shared_rows``."""
        return self.rows_per_warp - self.shared_rows

    @property
    def rows_per_cta(self) -> int:
        return self.warps * self.rows_per_warp


FRAGMENT_DRAFTS = 8  # columns of a tensor-core B fragment: verify on tensor cores takes at most 8 drafts


def verify_fits_tensor_cores(shape, config) -> bool:
    """Whether verify's rows can run on tensor cores (at a launch without a register cap below 128):
    fp32 state, K a multiple of 16, at most ``FRAGMENT_DRAFTS`` drafts."""
    return config.state_dtype == "float32" and shape.k_dim % 16 == 0 and config.max_drafts <= FRAGMENT_DRAFTS


def choose_launch(shape, rows: int, family: str = "replay", config=None) -> LaunchConfig:
    """Launch shape for ``rows`` batch rows when the autotuner has no entry, from the H200 runs in
    docs/performance.md: 16-row CTAs while that leaves fewer than two CTAs per SM (small batches);
    otherwise, for the verify family on tensor cores (``config`` given and
    ``verify_fits_tensor_cores``), a whole head per CTA in 16-row tiles (``8x16`` at V = 128, ``5x16``
    at 80, ``4x16`` at 64; at most 8 warps), which the tuner picks for every preset from B = 8 on, so
    each head's head-level work runs once; for the others the largest CTA of 4 warps that wastes no rows past V (64, 40 or 32 rows: the most state
    in flight per SM; 40 for V = 80), else 16-row CTAs under a 64-register cap (8 per SM). A lane
    holds ``key_chunks`` pieces of each of its rows along K, so past K = 128 a warp takes
    ``16 // key_chunks`` rows at most (``8`` at K = 144–256), where 16 would spill."""
    most_rows = max(1, 16 // key_chunks(shape.k_dim))
    if rows * shape.heads * -(-shape.v_dim // 16) < 2 * SMS_H200:
        return LaunchConfig(warps=4, rows_per_warp=min(4, most_rows))
    if family == "verify" and config is not None and verify_fits_tensor_cores(shape, config):
        return LaunchConfig(warps=min(8, -(-shape.v_dim // most_rows)), rows_per_warp=most_rows)
    for rows_per_warp in (16, 10, 8):
        if rows_per_warp <= most_rows and shape.v_dim % (4 * rows_per_warp) == 0:
            return LaunchConfig(warps=4, rows_per_warp=rows_per_warp)
    if most_rows < 16:
        return LaunchConfig(warps=4, rows_per_warp=min(4, most_rows))
    return LaunchConfig(warps=4, rows_per_warp=4, max_registers=64)


def fallback_launches(shape, rows: int, family: str = "replay", config=None) -> list[LaunchConfig]:
    """The launch shapes a runtime tries, in order, for ``family``'s kernels when no tuned entry exists:
    ``choose_launch``'s, then the same warps' rows in a CTA of half as many warps (a declaration with
    more per-token fields than the built-ins, e.g. a vector decay with the delta rule, a skip and a
    gate, passes 48 KiB of static shared memory at verify's whole-head ``8x16``; ``4x16`` keeps its
    16-row tiles), then ``4x4``, ``4x2`` and ``2x2``. No shape repeats."""
    first = choose_launch(shape, rows, family, config)
    halved = [replace(first, warps=first.warps // 2)] if first.warps > 1 else []
    return list(dict.fromkeys([first, *halved, LaunchConfig(4, 4), LaunchConfig(4, 2), LaunchConfig(2, 2)]))


def key_chunks(k_dim: int) -> int:
    """Pieces of a row along K that one lane holds: K in chunks of 32 lanes × VEC elements (VEC = 4,
    16-byte loads, where K allows; else 1)."""
    vec = 4 if k_dim % 4 == 0 else 1
    return -(-k_dim // (32 * vec))


def row_parts(delta: bool) -> int:
    """Values per row the replay rows reduce: the output part, and for delta rules the key projection."""
    return 2 if delta else 1


def rows_reduced(rows: int, delta: bool) -> int:
    """Rows whose parts the replay rows reduce together, out of ``rows`` (the step: a warp's rows;
    verify: its rows per pass): a power of two, at most 16 values (``row_parts`` per row) in one
    reduction."""
    return min(16 // row_parts(delta), 1 << (rows - 1).bit_length())


def write_record_layout(rows_per_warp: int, rows_per_cta: int, v_dim: int) -> tuple[int, int]:
    """The write records' layout: rows per copy and per load (4, 2 or 1: the widest that divides a
    warp's rows and V, so chunks stay aligned and never straddle V; also the width of the replay
    step's loads from global memory at ``/w``), and the floats from one record to the next in shared
    memory: the CTA's rows plus one or two chunks, so that the pitch in chunks is odd and a warp's
    loads (a record per lane, a chunk each) fall in distinct banks."""
    vec = next(w for w in (4, 2, 1) if rows_per_warp % w == 0 and v_dim % w == 0)
    return vec, rows_per_cta + (vec if (rows_per_cta // vec) % 2 == 0 else 2 * vec)


INPUT_C_TYPES = {"float32": "const float*", "bfloat16": "const unsigned short*"}  # bf16: raw bits
RECORD_C_TYPES = {"float32": "float*", "bfloat16": "unsigned short*"}  # records kept as raw bf16 inputs


def kernel_arguments(program: Program) -> list[tuple[str, str]]:
    """``(C type, name)`` of every kernel argument, in order; the runtime passes them in this order."""
    st = "STATE_T*"
    record = {b.name: RECORD_C_TYPES[b.dtype] for b in program.buffers if b.role == "record"}
    args = [(st, "checkpoint"), (st, "state"), (st, "snapshots"), ("const float*", "initial"),
            ("float*", "materialized"), (record.get("rec_decay", "float*"), "rec_decay"), ("float*", "rec_write"),
            (record["rec_key"], "rec_key"),
            ("int*", "fill"), ("const int*", "slots"), ("const int*", "src_page"), ("const int*", "dst_page"),
            ("const int*", "drafts"), ("const int*", "accepted")]
    for spec in program.declaration.inputs:
        args.append((INPUT_C_TYPES[spec.dtype], ("tok_" if spec.kind == "token" else "par_") + spec.name))
    args += [("float*", "out"), ("int", "rows"), ("int", "t_tok"), ("int", "num_slots"), ("int", "num_pages")]
    return args


def v_tiles(program: Program, launch: LaunchConfig) -> int:
    """CTAs along V per (value head, batch row) of a tiled kernel: the grid's x."""
    return -(-program.shape.v_dim // launch.rows_per_cta)


def grid_of(kernel: Kernel, program: Program, launch: LaunchConfig, rows: int) -> tuple[tuple, tuple]:
    """(grid, block) for ``rows`` batch rows."""
    if kernel.grid == ("B",):
        return ((rows + FILL_THREADS - 1) // FILL_THREADS, 1, 1), (FILL_THREADS, 1, 1)
    return (v_tiles(program, launch), program.shape.heads, rows), (launch.threads, 1, 1)


