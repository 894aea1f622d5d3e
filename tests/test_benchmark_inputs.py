"""Runtime layer, no GPU: the verify inputs the benchmark, the autotuner and the profiling script share
(NumPy stands in for CuPy: the helper uses only calls both provide)."""

from __future__ import annotations

import numpy as np

from replayssm_dsl import ModelShape, variants
from replayssm_dsl.runtime.benchmark import verify_and_commit, verify_inputs


def test_verify_inputs_draft_every_row_and_accept_none():
    decl, shape = variants.get("gdn"), ModelShape(4, 2, 16, 32)
    batch = {"slot": np.arange(3, dtype=np.int32), "src": np.zeros(3, np.int32)}
    tokens, drafted, out = verify_inputs(np, decl, shape, np.random.default_rng(0), batch, 5, sets=2)
    assert len(tokens) == 2 and tokens[0].keys() == tokens[1].keys()
    assert all(v.shape[:2] == (3, 5) and v.dtype == np.float32 for v in tokens[0].values())
    assert not all(np.array_equal(tokens[0][k], tokens[1][k]) for k in tokens[0]), "fresh inputs per set"
    assert drafted["drafts"].tolist() == [5, 5, 5] and drafted["accepted"].tolist() == [0, 0, 0]
    assert drafted["slot"] is batch["slot"] and "drafts" not in batch
    assert out.shape == (3, 5, shape.heads, shape.v_dim) and out.dtype == np.float32


def test_verify_and_commit_launches_verify_then_its_commit():
    calls = []

    class Cache:
        def launch_verify(self, batch, tokens, out):
            calls.append(("verify", batch, tokens, out))

        def launch_commit(self, batch, t_tok=None):
            calls.append(("commit", batch, t_tok))

    verify_and_commit(Cache(), "B", "T", "O", 4)
    assert calls == [("verify", "B", "T", "O"), ("commit", "B", 4)]
