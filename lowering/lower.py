"""Lowering layer: declaration + shape + replay settings → a ``Program`` of kernel plans.

The kernels (docs/design.md, "Kernels and buffer rules"):

- ``conventional_step``  baseline: read S, update, write S, output (what vLLM/FLA do today)
- ``snapshot_verify``    baseline: T drafts, writes T states (vLLM's speculative path)
- ``replay_step``        per sequence: append one record and read, or fold and flush, and move the
                         fill (n+1, or 0 where it flushed): one launch
- ``flush_for_verify``   before ``verify``: fold the buffer where ``n + t > capacity``
- ``verify``             T drafts from checkpoint + buffer; writes T records, no state
- ``commit``             fill ← (0 if it was folded for verify, else n) + accepted: the pointer move
- ``flush`` + ``reset_fill``  fold the buffer into the checkpoint
- ``load`` + ``reset_fill``   checkpoint ← a given state (prefill hand-off)
- ``materialize``        S = checkpoint folded with the buffer, written to an output array

Every CTA of a slot reads the fill first, so the step's fill update is made by the slot's last CTA
to have read it (an arrival counter per slot); commit, reset_fill are tiny kernels of their own. For the
same reason a verify that needs room folds the buffer in a launch of its own (other V-tiles still
read the old records' keys and decays) and then reads the folded checkpoint from ``dst``.
"""

from __future__ import annotations

from replayssm_dsl.config import ModelShape, ReplayConfig
from replayssm_dsl.declaration import Declaration
from replayssm_dsl.errors import LoweringError
from replayssm_dsl.expr import render_text

from .ir import Buffer, Kernel, Program, Stmt, When
from .record_inputs import raw_record_inputs
from .record_keys import key_shift, record_key_heads

TILED = ("VT", "HV", "B")  # grid of a per-row kernel: V-tiles × value heads × batch rows
PER_ROW = ("B",)


def _buffers(decl: Declaration, shape: ModelShape, config: ReplayConfig) -> tuple[Buffer, ...]:
    sd = config.state_dtype
    key_heads = record_key_heads(decl, config)
    shift = key_shift(decl, config)
    bufs = [
        Buffer("checkpoint", "state", sd, ("pages", "HV", "V", "K"), "replay checkpoint C, K contiguous"),
        Buffer("state", "state", sd, ("pages", "HV", "V", "K"), "conventional state S (baselines)"),
        Buffer("snapshots", "state", sd, ("B", "T", "HV", "V", "K"), "snapshot-verify states per draft"),
        Buffer("initial", "state", "float32", ("B", "HV", "V", "K"), "states handed to load"),
        Buffer("materialized", "output", "float32", ("B", "HV", "V", "K"), "materialize's states"),
    ]
    raw = raw_record_inputs(decl, config)
    if decl.decay_form == "scalar":
        bufs.append(Buffer("rec_decay", "record", "float32", ("slots", "HV", "cap"), "cumulative log-decay G_i"))
    elif "decay" in raw:
        bufs.append(Buffer("rec_decay", "record", "bfloat16", ("slots", "HV", "cap", "K"),
                           f"the decay's input {raw['decay'].name!r} per record, as it arrived (G_i recomputed)"))
    elif decl.decay_form == "vector":
        bufs.append(Buffer("rec_decay", "record", "float32", ("slots", "HV", "cap", "K"), "cumulative log-decay G_i"))
    key_doc = (f"the key's input {raw['key'].name!r} per record, as it arrived (k_i recomputed), once per key head"
               if "key" in raw else f"decay-scaled keys e^(C - G_i) k_i, C = {shift:g} (record_keys.py), per value head"
               if shift is not None else "keys k_i, once per key head")
    bufs += [
        Buffer("rec_write", "record", "float32", ("slots", "HV", "cap", "V"), "writes w_i (corrections for the delta rule)"),
        Buffer("rec_key", "record", "bfloat16" if "key" in raw else "float32", ("slots", key_heads, "cap", "K"), key_doc),
        Buffer("fill", "meta", "int32", ("slots",), "records committed per slot (the device-side truth; during a "
               "replay_step launch its high 16 bits count the slot's CTAs that have read it, zero again at the end)"),
        Buffer("slot", "batch", "int32", ("B",), "slot per batch row; < 0 is the null slot (padding)"),
        Buffer("src_page", "batch", "int32", ("B",), "checkpoint page read"),
        Buffer("dst_page", "batch", "int32", ("B",), "checkpoint page written by a flush or load"),
        Buffer("drafts", "batch", "int32", ("B",), "drafts per row for verify/commit (1..T)"),
        Buffer("accepted", "batch", "int32", ("B",), "accepted drafts per row for commit (0..drafts)"),
    ]
    for spec in decl.inputs:
        heads = "HV" if spec.level == "head" else "H"
        tail = (spec.size,) if spec.size else ()
        if spec.kind == "token":
            bufs.append(Buffer(spec.name, "token", spec.dtype, ("B", "T", heads) + tail, spec.doc))
        else:
            bufs.append(Buffer(spec.name, "param", "float32", (heads,) + tail, spec.doc))
    bufs.append(Buffer("out", "output", "float32", ("B", "T", "HV", "V"), "outputs o"))
    return tuple(bufs)


def _fill_kernel(name: str, value: str, doc: str) -> Kernel:
    ins = ("slot", "n") + (("t",) if value == "commit" else ())
    outs = ("slot", "src", "dst") + (("t",) if value == "commit" else ())
    return Kernel(name, PER_ROW, (
        Stmt("row", outs),
        Stmt("load_fill", ("n",), ("slot",)),
        Stmt("set_fill", (), ins, (("value", value),)),
    ), doc)


def _kernels() -> tuple[Kernel, ...]:
    S = Stmt
    conventional = Kernel("conventional_step", TILED, (
        S("row", ("slot", "src", "dst")),
        S("fields", ("F",), (), (("tokens", "one"),)),
        S("load_state", ("S",), ("src",), (("buffer", "state"),)),
        S("recur", ("S", "O"), ("S", "F")),
        S("store_state", (), ("S", "dst"), (("buffer", "state"),)),
        S("store_output", (), ("O",)),
    ), "baseline: read S, update, write S, output")
    snapshot = Kernel("snapshot_verify", TILED, (
        S("row", ("slot", "src", "dst", "t")),
        S("fields", ("F",), ("t",), (("tokens", "drafts"),)),
        S("load_state", ("S",), ("src",), (("buffer", "state"),)),
        S("recur", ("SS", "O"), ("S", "F"), (("snapshots", True),)),
        S("store_state", (), ("SS",), (("buffer", "snapshots"), ("per_draft", True))),
        S("store_output", (), ("O",), (("per_draft", True),)),
    ), "baseline: T drafts, one state written per draft")
    step = Kernel("replay_step", TILED, (
        S("row", ("slot", "src", "dst")),
        S("load_fill", ("n",), ("slot",)),
        S("flush_rule", ("flush",), ("n",), (("rule", "step"),)),
        S("fields", ("F",), (), (("tokens", "one"),)),
        S("load_records", ("R",), ("slot", "n")),
        S("load_state", ("S",), ("src",), (("buffer", "checkpoint"),)),
        S("cumulate", ("G",), ("R", "F")),
        S("scores", ("SC",), ("R", "F", "G")),
        S("replay", ("W", "O"), ("S", "R", "F", "G", "SC")),
        S("store_output", (), ("O",)),
        When("flush", (
            S("fold_tokens", ("S",), ("S", "R", "W", "F", "G")),
            S("store_state", (), ("S", "dst"), (("buffer", "checkpoint"),)),
        )),
        When("flush", (S("append", (), ("R", "W", "F", "G")),), negate=True),
        S("set_fill", (), ("slot", "n"), (("value", "advance"),)),
    ), "append one record and read the state, or fold and flush when the buffer is full; fill ← n+1, or 0")
    flush_for_verify = Kernel("flush_for_verify", TILED, (
        S("row", ("slot", "src", "dst", "t")),
        S("load_fill", ("n",), ("slot",)),
        S("flush_rule", ("flush",), ("n", "t"), (("rule", "verify"),)),
        When("flush", (
            S("load_records", ("R",), ("slot", "n")),
            S("load_state", ("S",), ("src",), (("buffer", "checkpoint"),)),
            S("fold", ("S", "R"), ("S", "R")),
            S("store_state", (), ("S", "dst"), (("buffer", "checkpoint"),)),
        )),
    ), "before verify: fold the buffer where n + t > capacity (the fill moves at commit)")
    verify = Kernel("verify", TILED, (
        S("row", ("slot", "src", "dst", "t")),
        S("load_fill", ("n",), ("slot",)),
        S("flush_rule", ("flush",), ("n", "t"), (("rule", "verify"),)),
        S("fields", ("F",), ("t",), (("tokens", "drafts"),)),
        When("flush", (
            S("empty_records", ("R",)),
            S("load_state", ("S",), ("dst",), (("buffer", "checkpoint"),)),
        )),
        When("flush", (
            S("load_records", ("R",), ("slot", "n")),
            S("load_state", ("S",), ("src",), (("buffer", "checkpoint"),)),
        ), negate=True),
        S("cumulate", ("G",), ("R", "F")),
        S("scores", ("SC",), ("R", "F", "G")),
        S("replay", ("W", "O"), ("S", "R", "F", "G", "SC")),
        S("store_output", (), ("O",), (("per_draft", True),)),
        S("append", (), ("R", "W", "F", "G")),
    ), "outputs of t drafts; their records written after the committed ones; no state write")
    flush = Kernel("flush", TILED, (
        S("row", ("slot", "src", "dst")),
        S("load_fill", ("n",), ("slot",)),
        S("load_records", ("R",), ("slot", "n")),
        S("load_state", ("S",), ("src",), (("buffer", "checkpoint"),)),
        S("fold", ("S", "R"), ("S", "R")),
        S("store_state", (), ("S", "dst"), (("buffer", "checkpoint"),)),
    ), "fold every record into the checkpoint")
    load = Kernel("load", TILED, (
        S("row", ("slot", "src", "dst")),
        S("load_state", ("S",), (), (("buffer", "initial"),)),
        S("store_state", (), ("S", "dst"), (("buffer", "checkpoint"),)),
    ), "checkpoint ← a given state")
    materialize = Kernel("materialize", TILED, (
        S("row", ("slot", "src", "dst")),
        S("load_fill", ("n",), ("slot",)),
        S("load_records", ("R",), ("slot", "n")),
        S("load_state", ("S",), ("src",), (("buffer", "checkpoint"),)),
        S("fold", ("S", "R"), ("S", "R")),
        S("store_state", (), ("S",), (("buffer", "materialized"),)),
    ), "the plain state: checkpoint folded with the buffer, checkpoint untouched")
    return (
        conventional, snapshot, step,
        flush_for_verify, verify,
        _fill_kernel("commit", "commit", "fill ← (0 if verify flushed first else n) + accepted"),
        flush, load,
        _fill_kernel("reset_fill", "zero", "after flush or load: the buffer is empty"),
        materialize,
    )


def _check_renderable(decl: Declaration) -> None:
    """What the CUDA rendering cannot do is refused here, for every backend, so that a declaration the
    CPU twin runs (``replayssm check``) is one whose kernels can be emitted: the kernels normalise
    vectors over K only (a lane's slice of a row along K is reduced across the warp)."""
    for field, root in decl.expressions().items():
        for node in root.walk():
            if node.op == "L2NORM" and node.axis != "K":
                raise LoweringError(f"{field}: {render_text(node)}: the CUDA backend normalises vectors over K "
                                    "only (l2norm of a V vector is not rendered)")


def lower(decl: Declaration, shape: ModelShape, config: ReplayConfig | None = None) -> Program:
    """Lower ``decl`` for ``shape`` and ``config`` into its kernel plans."""
    config = config or ReplayConfig()
    _check_renderable(decl)
    sizes = {"HV": shape.heads, "H": shape.key_heads, "V": shape.v_dim, "K": shape.k_dim,
             "L": config.window, "T": config.max_drafts, "cap": config.capacity}
    return Program(decl, shape, config, _buffers(decl, shape, config), _kernels(), sizes)
