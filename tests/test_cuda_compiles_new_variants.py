"""Lowering tests (NVRTC, no GPU): declarations that combine features no built-in combines compile for
sm_90 with no warning and no spill at their default launches.

The built-ins cover the delta rule with a vector decay and scaled keys (the safe gate) and plain
writes without a bounded decay; a user's variant may mix them. A bounded vector decay with a plain
write once left verify and the replay step a key (``ke``) that nothing read: NVRTC warned.

May import: pytest, ``replayssm_dsl``, ``replayssm_dsl.lowering``, ``replayssm_dsl.runtime.nvrtc_compile``.
"""

from __future__ import annotations

import pytest

from codegen_cases import KERNELS
from replayssm_dsl import ModelShape, Recurrence, ReplayConfig, delta, ops, plain
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import choose_launch
from replayssm_dsl.lowering.render_cuda import render_program


def _declare(decay: str, write: str, extras: bool):
    r = Recurrence(f"{decay}_{write}")
    q, k, v = r.token("q", per="group", size="K"), r.token("k", per="group", size="K"), r.token("v", size="V")
    g, b = r.token("g", per="head", size="K" if decay == "bounded_vector" else None), r.token("b")
    decays = {"bounded_vector": -3.0 * ops.sigmoid(g), "bounded_scalar": -2.0 * ops.sigmoid(g),
              "unbounded_scalar": -ops.softplus(g)}
    writes = {"plain": plain(v, ops.sigmoid(b)), "delta": delta(value=v, beta=ops.sigmoid(b))}
    more = {}
    if extras:
        more = {"skip": r.param("D", size="V") * v, "gate": r.token("z", size="V")}
    return r.build(decay=decays[decay], key=ops.l2norm(k), query=ops.l2norm(q) * r.K ** -0.5, write=writes[write],
                   **more)


@pytest.mark.nvrtc
@pytest.mark.parametrize("batch", [1, 256])
@pytest.mark.parametrize("decay, write, extras", [
    ("bounded_vector", "plain", False), ("bounded_vector", "plain", True), ("bounded_scalar", "plain", False),
    ("bounded_scalar", "delta", False), ("unbounded_scalar", "plain", True),
], ids=["gla-bounded", "gla-bounded-skip-gate", "scalar-bounded-plain", "scalar-bounded-delta", "plain-skip-gate"])
def test_a_new_combination_compiles_clean(decay, write, extras, batch):
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    shape = ModelShape(32, 16, 128, 128)
    program = lower(_declare(decay, write, extras), shape, ReplayConfig())
    result = compile_cubin(render_program(program, choose_launch(shape, batch)), f"{decay}-{write}.cu", "sm_90")
    assert sorted(result.resources) == sorted(KERNELS), result.log
    assert not result.warnings, result.log
    for name, res in result.resources.items():
        assert res.clean, f"{name}: {res} (ptxas report:\n{result.log})"
