"""Declare a new member of the family (not built in) in a few lines, see its plans and CUDA, and
decode it against the float64 oracle on the best backend present.

    python examples/custom_variant.py [--tokens 200] [--backend auto|cpu|cuda]
"""

import sys

from replayssm_dsl import ModelShape, Recurrence, ReplayConfig, delta, ops
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.render_cuda import render_program
from replayssm_dsl.runtime.selfcheck import run_example


def gated_delta_with_gate():
    """A delta rule with a per-channel decay from a sigmoid gate, an output gate and a skip."""
    r = Recurrence("gated_delta_gate", doc="example: per-channel decay, delta rule, D skip, silu(z) gate")
    q, k = r.token("q", per="group", size="K"), r.token("k", per="group", size="K")
    v, b, z = r.token("v", size="V"), r.token("b"), r.token("z", size="V")
    gk = r.token("gk", size="K")
    D = r.param("D")
    return r.build(decay=ops.logsigmoid(gk) / 8.0, key=ops.l2norm(k), query=ops.l2norm(q) * r.K ** -0.5,
                   write=delta(value=v, beta=ops.sigmoid(b)), skip=D * v, gate=z)


def main(argv=None) -> int:
    decl = gated_delta_with_gate()
    shape, config = ModelShape(heads=4, key_heads=2, v_dim=64, k_dim=64), ReplayConfig(window=8, max_drafts=4)
    print(decl.describe())
    program = lower(decl, shape, config)
    print(program.kernel("replay_step").pretty())
    print(f"generated CUDA: {len(render_program(program).splitlines())} lines (render_program(program) returns it; "
          "lowering.standalone.write_standalone(program, folder) writes it with launchers and a header)")
    return run_example(decl, shape, config, argv, tokens=200)


if __name__ == "__main__":
    sys.exit(main())
