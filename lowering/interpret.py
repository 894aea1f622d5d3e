"""Lowering layer: the executable meaning of every IR op, in NumPy (the CPU backend's engine).

``run_kernel`` walks a kernel's statements once per batch row, vectorised over value heads and
over the ``V×K`` state, on buffers laid out exactly as on the GPU (``ir.py`` lists them). It is the
reference the CUDA kernels are checked against, so it follows the plan; it does not re-derive the
recurrence (that is ``replayssm_dsl.reference``'s job, and the tests hold the two equal).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from replayssm_dsl.bfloat16 import round_to_bfloat16
from replayssm_dsl.evaluate import evaluate, evaluate_fields

from .buffer_rules import step_flushes, verify_flushes
from .ir import Kernel, Program, When
from .record_inputs import raw_record_inputs
from .record_keys import key_shift, record_key_heads


def round_to_storage(x: np.ndarray, dtype: str, compute: np.dtype) -> np.ndarray:
    """Round values to what a ``dtype`` buffer holds, returned in the compute dtype."""
    if dtype == "float16":
        return x.astype(np.float16).astype(compute)
    if dtype == "bfloat16":
        return round_to_bfloat16(x).astype(compute)
    if dtype == "float32" and compute == np.float32:
        return x.astype(np.float32)
    return x.astype(compute)


@dataclass
class Records:
    """The first ``n`` records of one slot, keys expanded to value heads; ``last`` is ``G_{n−1}``."""

    n: int
    decay: np.ndarray | None  # [HV, n, 1|K] cumulative log-decay, None without decay
    write: np.ndarray  # [HV, n, V]
    key: np.ndarray  # [HV, n, K]
    last: np.ndarray  # [HV, 1|K]


class Interpreter:
    """Runs the kernels of one ``Program`` over NumPy buffers in a compute dtype (float64 or float32)."""

    def __init__(self, program: Program, compute=np.float64):
        self.p, self.decl, self.shape = program, program.declaration, program.shape
        self.compute = np.dtype(compute)
        self.vector_decay = self.decl.decay_form == "vector"
        self.raw = raw_record_inputs(self.decl, program.config)  # record fields kept as the token's raw bf16 input
        self.shift = key_shift(self.decl, program.config)  # C of decay-scaled record keys, or None
        self.record_keys_per_group = record_key_heads(self.decl, program.config) == "H"

    # --- helpers -------------------------------------------------------------------------------------
    def _expand_keys(self, keys: np.ndarray) -> np.ndarray:  # [Hk, ..., K] -> [HV, ..., K]
        if self.record_keys_per_group:
            return np.repeat(keys, self.shape.group_size, axis=0)
        return keys

    def _zeros_decay(self) -> np.ndarray:
        return np.zeros((self.shape.heads, self.shape.k_dim if self.vector_decay else 1), self.compute)

    # --- ops -----------------------------------------------------------------------------------------
    def op_fields(self, bufs, b, env, stmt):
        t = env["t"] if stmt.attr("tokens") == "drafts" else 1
        values = {}
        for spec in self.decl.inputs:
            values[spec.name] = bufs[spec.name][b, :t] if spec.kind == "token" else bufs[spec.name]
        return (evaluate_fields(self.decl, values, self.shape, self.compute),)

    def _from_raw(self, bufs, field: str, raw: np.ndarray) -> np.ndarray:
        """A record field recomputed from its raw input ``[heads, n, K]`` (``raw_record_inputs``), ``[heads, n, K]``."""
        spec = self.raw[field]
        values = {s.name: bufs[s.name] for s in self.decl.inputs if s.kind == "param"}
        values[spec.name] = np.swapaxes(raw, 0, 1).astype(self.compute)  # as tokens: [n, heads, K]
        level = self.decl.key_level if field == "key" else "head"
        return np.swapaxes(evaluate(self.decl.expressions()[field], values, self.shape, level, self.compute), 0, 1)

    def op_load_records(self, bufs, b, env, stmt):
        slot, n = env["slot"], env["n"]
        write = bufs["rec_write"][slot, :, :n].astype(self.compute)
        key = bufs["rec_key"][slot, :, :n]
        key = self._expand_keys(self._from_raw(bufs, "key", key) if "key" in self.raw else key).astype(self.compute)
        if "rec_decay" in bufs:
            dec = bufs["rec_decay"][slot, :, :n].astype(self.compute)
            if "decay" in self.raw:  # per-record log-decays, summed in order as the steps that appended them did
                dec = np.cumsum(self._from_raw(bufs, "decay", dec), axis=1)
            dec = dec if self.vector_decay else dec[..., None]
            last = dec[:, n - 1] if n else self._zeros_decay()
            if self.shift is not None:  # decay-scaled keys e^{C − G_i} k_i: back to k_i
                key = key * np.exp(dec - self.shift)
        else:
            dec, last = None, self._zeros_decay()
        return (Records(n, dec, write, key, last),)

    def op_empty_records(self, bufs, b, env, stmt):
        H, V, K = self.shape.heads, self.shape.v_dim, self.shape.k_dim
        decay = None if "rec_decay" not in bufs else np.zeros((H, 0, K if self.vector_decay else 1), self.compute)
        return (Records(0, decay, np.zeros((H, 0, V), self.compute), np.zeros((H, 0, K), self.compute),
                        self._zeros_decay()),)

    def op_cumulate(self, bufs, b, env, stmt):
        R, F = env["R"], env["F"]
        if "decay" not in F:
            return (np.zeros((F["key"].shape[0],) + R.last.shape, self.compute),)
        return (R.last[None] + np.cumsum(F["decay"], axis=0),)  # [t, HV, 1|K]

    def _all_keys_and_decays(self, R: Records, F, G):
        """Keys ``[HV, n+t, K]`` and cumulative decays ``[HV, n+t, 1|K]`` of records then drafts."""
        keys = np.concatenate([R.key, np.swapaxes(F["key"], 0, 1)], axis=1)
        decs = np.swapaxes(G, 0, 1)
        if R.decay is not None:
            decs = np.concatenate([R.decay, decs], axis=1)
        elif R.n:
            decs = np.concatenate([np.zeros((decs.shape[0], R.n, decs.shape[2]), self.compute), decs], axis=1)
        return keys, decs

    def op_scores(self, bufs, b, env, stmt):
        R, F, G = env["R"], env["F"], env["G"]
        keys, decs = self._all_keys_and_decays(R, F, G)
        t, m = G.shape[0], R.n + G.shape[0]
        sq = np.zeros((t, self.shape.heads, m), self.compute)
        sk = np.zeros_like(sq)
        for j in range(t):
            i = R.n + j + 1  # records and drafts up to and including draft j
            decayed = keys[:, :i] * np.exp(G[j][:, None, :] - decs[:, :i])  # [HV, i, K]
            sq[j, :, :i] = np.einsum("hik,hk->hi", decayed, F["query"][j])
            sk[j, :, :i] = np.einsum("hik,hk->hi", decayed, F["key"][j])
        return ((sq, sk),)

    def _write(self, F, j, predicted):
        """``w_j``: β(v − P k) for the delta rule (``predicted()`` gives P k), else s·v."""
        if self.decl.is_delta:
            return F["beta"][j] * (F["value"][j] - predicted())
        return F["value"][j] * F["strength"][j] if "strength" in F else F["value"][j]

    @staticmethod
    def _epilogue(F, j, o):
        if "skip" in F:
            o = o + F["skip"][j]
        if "gate" in F:
            o = o * F["gate"][j] / (1.0 + np.exp(-F["gate"][j]))
        return o

    def op_replay(self, bufs, b, env, stmt):
        S, R, F, G, (sq, sk) = env["S"], env["R"], env["F"], env["G"], env["SC"]
        t = G.shape[0]
        writes = list(np.swapaxes(R.write, 0, 1))  # [HV, V] per record, drafts appended below
        W, O = [], []
        for j in range(t):
            i = R.n + j
            past = np.stack(writes, axis=1) if writes else np.zeros((self.shape.heads, 0, self.shape.v_dim))
            decay = np.exp(G[j])  # [HV, 1|K]
            w = self._write(F, j, lambda: np.einsum("hvk,hk->hv", S, decay * F["key"][j])
                            + np.einsum("hiv,hi->hv", past, sk[j, :, :i]))
            o = self._epilogue(F, j, np.einsum("hvk,hk->hv", S, decay * F["query"][j])
                               + np.einsum("hiv,hi->hv", past, sq[j, :, :i]) + w * sq[j, :, i:i + 1])
            writes.append(w)
            W.append(w)
            O.append(o)
        return np.stack(W), np.stack(O)

    def _fold(self, S, keys, decs, writes, final):
        decayed = keys * np.exp(final[:, None, :] - decs)  # [HV, m, K]
        return S * np.exp(final)[:, None, :] + np.einsum("hiv,hik->hvk", writes, decayed)

    def op_fold(self, bufs, b, env, stmt):
        S, R = env["S"], env["R"]
        decs = R.decay if R.decay is not None else np.zeros(R.key.shape[:2] + (1,), self.compute)
        return self._fold(S, R.key, decs, R.write, R.last), self.op_empty_records(bufs, b, env, stmt)[0]

    def op_fold_tokens(self, bufs, b, env, stmt):
        S, R, W, F, G = env["S"], env["R"], env["W"], env["F"], env["G"]
        keys, decs = self._all_keys_and_decays(R, F, G)
        writes = np.concatenate([R.write, np.swapaxes(W, 0, 1)], axis=1)
        return (self._fold(S, keys, decs, writes, G[-1]),)

    def op_append(self, bufs, b, env, stmt):
        slot, R, W, F, G = env["slot"], env["R"], env["W"], env["F"], env["G"]
        pos = slice(R.n, R.n + W.shape[0])
        bufs["rec_write"][slot, :, pos] = np.swapaxes(W, 0, 1)
        t = W.shape[0]
        raw = {field: np.swapaxes(bufs[spec.name][b, :t], 0, 1) for field, spec in self.raw.items()}  # the tokens' bits
        if "key" in raw:
            keys = raw["key"]
        elif self.shift is not None:  # per value head, decay-scaled: e^{C − G_j} k_j
            keys = np.swapaxes(F["key"] * np.exp(self.shift - G), 0, 1)
        else:
            keys = np.swapaxes(F["key_stored"], 0, 1)
        bufs["rec_key"][slot, :, pos] = keys
        if "rec_decay" in bufs:
            g = np.swapaxes(G, 0, 1)
            bufs["rec_decay"][slot, :, pos] = raw["decay"] if "decay" in raw else g if self.vector_decay else g[..., 0]
        return ()

    def op_recur(self, bufs, b, env, stmt):
        S, F = env["S"], env["F"]
        states, O = [], []
        for j in range(F["key"].shape[0]):
            P = S * np.exp(F["decay"][j])[:, None, :] if "decay" in F else S
            k = F["key"][j]
            w = self._write(F, j, lambda: np.einsum("hvk,hk->hv", P, k))
            S = P + w[:, :, None] * k[:, None, :]
            o = self._epilogue(F, j, np.einsum("hvk,hk->hv", S, F["query"][j]))
            states.append(S)
            O.append(o)
        return (np.stack(states) if stmt.attr("snapshots") else S), np.stack(O)

    def op_load_state(self, bufs, b, env, stmt):
        name = stmt.attr("buffer")
        src = bufs[name][b] if name == "initial" else bufs[name][env[stmt.ins[0]]]  # the page the plan names
        return (src.astype(self.compute),)

    def op_store_state(self, bufs, b, env, stmt):
        name = stmt.attr("buffer")
        buf = bufs[name]
        dtype = self.p.buffer(name).dtype
        value = round_to_storage(env[stmt.ins[0]], dtype, buf.dtype)
        if stmt.attr("per_draft"):
            buf[b, :value.shape[0]] = value
        elif name == "materialized":
            buf[b] = value
        else:
            buf[env["dst"]] = value
        return ()

    def op_store_output(self, bufs, b, env, stmt):
        O = env["O"]
        bufs["out"][b, :O.shape[0]] = O
        return ()

    def op_row(self, bufs, b, env, stmt):
        vals = [int(bufs["slot"][b]), int(bufs["src_page"][b]), int(bufs["dst_page"][b])]
        if "t" in stmt.outs:
            vals.append(int(bufs["drafts"][b]))
        return tuple(vals)

    def _row_unheld(self, bufs, env, op: str, checks_fill: bool) -> bool:
        """The generated kernels' row checks (render_blocks' OUTSIDE_CACHE, DRAFTS_UNHELD, FILL_UNHELD),
        made after ``row`` and ``load_fill``: a row that fails one touches nothing. ``bufs["t_tok"]``
        is the launch's token count T, as the kernels' ``t_tok`` argument; ``checks_fill`` is False for
        a kernel that zeroes the fill (reset_fill, after flush or load), which does so whatever it was."""
        cfg = self.p.config
        if op == "row":
            slots, pages = bufs["fill"].shape[0], bufs["checkpoint"].shape[0]
            if not (0 <= env["slot"] < slots and 0 <= env["src"] < pages and 0 <= env["dst"] < pages):
                return True
            return "t" in env and not 1 <= env["t"] <= min(cfg.max_drafts, int(bufs.get("t_tok", 1)))
        return op == "load_fill" and checks_fill and not 0 <= env["n"] <= cfg.capacity

    def op_load_fill(self, bufs, b, env, stmt):
        return (int(bufs["fill"][env["slot"]]),)

    def op_flush_rule(self, bufs, b, env, stmt):
        cfg = self.p.config
        if stmt.attr("rule") == "step":
            return (step_flushes(env["n"], cfg.window),)
        return (verify_flushes(env["n"], env["t"], cfg.window, cfg.max_drafts),)

    def op_set_fill(self, bufs, b, env, stmt):
        slot, n, cfg, value = env["slot"], env["n"], self.p.config, stmt.attr("value")
        if value == "zero":
            bufs["fill"][slot] = 0
        elif value == "advance":
            bufs["fill"][slot] = 0 if step_flushes(n, cfg.window) else n + 1
        else:  # commit: the buffer was folded before verify where n + t > capacity
            accepted = int(bufs["accepted"][b])
            if not 0 <= accepted <= env["t"]:
                return ()  # accepted outside [0, drafts]: the fill stays put
            base = 0 if verify_flushes(n, env["t"], cfg.window, cfg.max_drafts) else n
            bufs["fill"][slot] = base + accepted
        return ()

    # --- driver --------------------------------------------------------------------------------------
    def _run_body(self, body, bufs, b, env, checks_fill: bool):
        for stmt in body:
            if isinstance(stmt, When):
                if bool(env[stmt.cond]) != stmt.negate:
                    self._run_body(stmt.body, bufs, b, env, checks_fill)
                continue
            results = getattr(self, f"op_{stmt.op}")(bufs, b, env, stmt)
            env.update(zip(stmt.outs, results))
            if stmt.op in ("row", "load_fill") and self._row_unheld(bufs, env, stmt.op, checks_fill):
                return  # a null slot (padded row), or indices, draft count or fill outside the buffers

    def run(self, kernel: Kernel | str, bufs: dict[str, np.ndarray], rows: int) -> None:
        kernel = self.p.kernel(kernel) if isinstance(kernel, str) else kernel
        checks_fill = not any(s.op == "set_fill" and s.attr("value") == "zero" for s, _ in kernel.statements())
        for b in range(rows):
            self._run_body(kernel.body, bufs, b, {}, checks_fill)
