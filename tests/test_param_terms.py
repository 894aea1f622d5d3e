"""Runtime layer tests: finite parameters whose parameter-only terms are not finite in float32 (the
kernels' arithmetic) are refused when a cache is built, naming the parameters, the term and the index.

May import: NumPy, pytest, ``replayssm_dsl``, ``replayssm_dsl.runtime`` (CPU parts).
"""

from __future__ import annotations

import re

import numpy as np
import pytest

from replayssm_dsl import ModelShape, Recurrence, ReplayConfig, delta, ops, variants
from replayssm_dsl.errors import InputError
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache

SHAPE, CONFIG = ModelShape(4, 2, 8, 8), ReplayConfig(window=4, max_drafts=3)


@pytest.mark.parametrize("precision", ["float64", "float32"])
@pytest.mark.parametrize("variant", ["gdn", "mamba2", "kda"])
def test_an_a_log_whose_exp_overflows_float32_is_refused(variant, precision):
    """``exp(A_log)`` is inf in float32 from A_log ≈ 88.73: such a head would make every sequence's
    state NaN. A random head is pushed over; the float64 twin refuses it as the kernels' float32 would
    fail, and 88 (whose exp is finite) still builds."""
    decl, rng = variants.get(variant), np.random.default_rng()
    params = random_params(decl, SHAPE, rng)
    head = int(rng.integers(SHAPE.heads))
    params["A_log"] = np.array(params["A_log"], dtype=np.float64)
    params["A_log"][head] = 88.0
    CpuReplayCache(decl, SHAPE, CONFIG, slots=1, params=params, precision=precision)
    params["A_log"][head] = rng.uniform(88.8, 1e3)
    with pytest.raises(InputError, match=re.escape(f"params['A_log']: exp(A_log) = inf at index [{head}], "
                                                   "a term of the decay that the kernels compute in float32")):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=1, params=params, precision=precision)


def _declaration():
    """A decay of a token times a term of two parameters, and a write strength of one parameter."""
    r = Recurrence("param_terms")
    k, v, a, b = r.token("k", per="group", size="K"), r.token("v", size="V"), r.token("a"), r.token("b")
    scale, shift, width = r.param("scale"), r.param("shift"), r.param("width", size="K")
    return r.build(decay=-ops.softplus(a) * ops.exp(scale - shift), key=ops.l2norm(k) / ops.sqrt(width),
                   query=ops.l2norm(k), write=delta(value=v, beta=ops.sigmoid(b)))


@pytest.mark.parametrize("name, value, message", [
    ("scale", 200.0, "params['scale', 'shift']: exp((scale - shift)) = inf at index [{head}], "
                     "a term of the decay"),
    ("width", -1.0, "params['width']: sqrt(width) = nan at index [{head}, {i}], a term of the key"),
])
def test_the_first_term_that_fails_is_named_with_its_parameters(name, value, message):
    decl, rng = _declaration(), np.random.default_rng()
    params = random_params(decl, SHAPE, rng)
    params["shift"] = np.zeros(SHAPE.heads)
    params["width"] = rng.uniform(0.5, 2.0, size=(SHAPE.heads, SHAPE.k_dim))
    cache = CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=params)  # finite terms: built, and it runs
    out = cache.step([0, 1], random_tokens(decl, SHAPE, rng, (2,)))
    assert np.isfinite(out).all()
    head, i = int(rng.integers(SHAPE.heads)), int(rng.integers(SHAPE.k_dim))
    params[name] = np.array(params[name], dtype=np.float64)
    params[name][(head, i) if params[name].ndim == 2 else head] = value
    with pytest.raises(InputError, match=re.escape(message.format(head=head, i=i))):
        CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=params)


@pytest.mark.filterwarnings("ignore::RuntimeWarning")  # the NaN it shows
def test_the_refused_parameters_would_have_made_the_state_nan():
    """Why the check exists: past it (the check bypassed), the float32 twin's state goes NaN."""
    decl, rng = variants.get("gdn"), np.random.default_rng()
    params = random_params(decl, SHAPE, rng)
    params["A_log"] = np.full(SHAPE.heads, 100.0)
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("replayssm_dsl.runtime.cache_base.check_parameter_terms", lambda *args: None)
        cache = CpuReplayCache(decl, SHAPE, CONFIG, slots=1, params=params, precision="float32")
    cache.load([0], random_state(SHAPE, rng, (1,)))
    for _ in range(CONFIG.window + 1):
        cache.step([0], random_tokens(decl, SHAPE, rng, (1,)))
    assert not np.isfinite(cache.materialize([0])).all()
