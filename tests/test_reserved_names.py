"""DSL and lowering tests: input names that the lowering uses for its own buffers are refused.

The lowered program and the caches keep a declaration's inputs beside the checkpoint, records, batch
rows and outputs under their bare names: a param named ``fill`` would be given the fill buffer's
shape, and a token named ``out`` silently made every output NaN. ``RESERVED`` lists those names; the
list is checked here against every built-in lowered under every record and state option.

May import: pytest, ``replayssm_dsl``, ``replayssm_dsl.lowering``.
"""

from __future__ import annotations

import pytest

from replayssm_dsl import ModelShape, Recurrence, ReplayConfig, delta, ops, variants
from replayssm_dsl.declaration import RESERVED
from replayssm_dsl.errors import DeclarationError
from replayssm_dsl.lowering.launch import kernel_arguments
from replayssm_dsl.lowering.lower import lower
from replayssm_dsl.variants import BUILTINS

CONFIGS = [ReplayConfig(), ReplayConfig(record_dtype="bfloat16"),
           ReplayConfig(record_dtype="bfloat16", raw_record_fields=("key",)), ReplayConfig(state_dtype="bfloat16"),
           ReplayConfig(scaled_keys=False)]


@pytest.mark.parametrize("config", CONFIGS, ids=lambda c: f"{c.record_dtype}-{c.state_dtype}-{c.scaled_keys}")
@pytest.mark.parametrize("variant", sorted(BUILTINS))
def test_every_name_the_lowering_uses_is_reserved(variant, config):
    decl = variants.get(variant)
    program = lower(decl, ModelShape(4, 2, 16, 16), config)
    inputs = {spec.name for spec in decl.inputs}
    own = {b.name for b in program.buffers if b.name not in inputs}
    own |= {name for _, name in kernel_arguments(program) if not name.startswith(("tok_", "par_"))}
    assert own <= RESERVED, f"not reserved: {sorted(own - RESERVED)}"


@pytest.mark.parametrize("name", sorted(RESERVED))
@pytest.mark.parametrize("kind", ["token", "param"])
def test_an_input_named_like_a_buffer_is_refused(kind, name):
    r = Recurrence("clash")
    with pytest.raises(DeclarationError, match=rf"{kind} '{name}': the name of one of the lowering's own buffers"):
        getattr(r, kind)(name)


def test_names_that_only_look_internal_are_served():
    """Names near the reserved ones (and C words the rendering prefixes) still declare and lower."""
    r = Recurrence("near_names")
    k, v = r.token("keys", per="group", size="K"), r.token("outs", size="V")
    a, b, fill_rate = r.token("int"), r.token("lane"), r.param("fill_rate")
    decl = r.build(decay=-ops.softplus(a) * ops.exp(fill_rate), key=ops.l2norm(k), query=ops.l2norm(k),
                   write=delta(value=v, beta=ops.sigmoid(b)))
    assert {s.name for s in decl.inputs} == {"keys", "outs", "int", "lane", "fill_rate"}
    lower(decl, ModelShape(4, 2, 16, 16), ReplayConfig())
