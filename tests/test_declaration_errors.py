"""DSL layer tests: every declaration replay cannot serve is refused when it is built, naming the field.

Bad declarations raise ``DeclarationError``; bad ``ModelShape`` / ``ReplayConfig`` values raise
``ConfigError``; each message names the field and the problem, so the user knows what to change.
Positive side: every built-in builds, its fingerprint is stable, ``describe()`` names every input.

May import: pytest, Hypothesis, ``replayssm_dsl``.
"""

from __future__ import annotations

import re
from contextlib import contextmanager

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from replayssm_dsl import (ConfigError, DeclarationError, ModelShape, Recurrence, ReplayConfig, delta, ops,
                           plain)
from replayssm_dsl.bounds import value_range
from replayssm_dsl.config import DTYPE_BYTES, STATE_DTYPES
from replayssm_dsl.variants import BUILTINS, get


def _qkv(r: Recurrence, per: str = "group"):
    return r.token("q", per=per, size="K"), r.token("k", per=per, size="K"), r.token("v", size="V")


@contextmanager
def raises(exc, *fragments):
    """``pytest.raises`` that also checks every fragment appears in the message (literal text)."""
    with pytest.raises(exc) as info:
        yield info
    text = str(info.value)
    for frag in fragments:
        assert frag in text, f"message {text!r} does not contain {frag!r}"


# -- decay ------------------------------------------------------------------------------------------
def test_decay_varying_along_v_is_refused_as_state_sized_records():
    r = Recurrence("bad_v_decay")
    q, k, x = _qkv(r)
    A_log, dt = r.param("A_log"), r.token("dt")
    with raises(DeclarationError, "decay", "varies along V", "state-sized"):
        r.build(decay=-ops.exp(A_log) * ops.softplus(dt) * x, key=k, query=q, write=plain(x))


def test_mamba1_style_v_by_k_decay_is_refused_as_state_sized_records():
    """Mamba-1: ``A`` is ``[V, K]`` per head and ``Δ`` a vector over V: a full V×K decay per token."""
    r = Recurrence("mamba1")
    x = r.token("x", size="V")
    dt = r.token("dt", size="V")
    B, C = r.token("B", per="group", size="K"), r.token("C", per="group", size="K")
    A_log = r.param("A_log", size="K")
    decay = -ops.exp(A_log) * ops.softplus(dt)
    assert decay.axis == "VK"
    with raises(DeclarationError, "decay", "state-sized", "Mamba-1"):
        r.build(decay=decay, key=B, query=C, write=plain(x))


@pytest.mark.parametrize("make", [
    lambda r: r.token("g"),                                   # a raw token: sign unknown
    lambda r: ops.exp(r.token("g")),                          # ≥ 0: a growth, not a decay
    lambda r: -ops.log(ops.sigmoid(r.token("g"))),            # ≥ 0 again, written the other way
    lambda r: ops.logsigmoid(r.token("g")) + r.token("h"),    # ≤ 0 plus anything
    lambda r: -ops.exp(r.param("A_log")) * r.token("g"),      # Mamba-2 without the softplus
    lambda r: r.param("log_gamma", sign="nonnegative"),       # declared the wrong way round
    lambda r: ops.logsigmoid(r.token("g")) * -1.0,            # sign flipped by a constant
    lambda r: ops.silu(-ops.softplus(r.token("g")) - 2.0) + 0.2,  # silu's sup near 0 from below: up to 0.2
    lambda r: ops.sqrt(ops.sigmoid(r.token("g")) * 0.25) - 0.3,   # sqrt lifts 0.25 to 0.5: up to 0.2
    lambda r: -(r.token("g") ** 3),                           # an odd power keeps the sign it had
    lambda r: ops.log(ops.softplus(r.token("g")) + 1e-3),     # log of a value that may pass 1
    lambda r: 0.5 - ops.sigmoid(r.token("g")),                # a reflected subtraction that may pass 0
], ids=["token", "exp", "neg-log-sigmoid", "sum-with-any", "no-softplus", "nonneg-param", "flipped",
        "silu-shifted", "sqrt-shifted", "odd-power", "log-softplus", "reflected-sub"])
def test_decay_whose_sign_cannot_be_proven_nonpositive(make):
    r = Recurrence("unsigned")
    q, k, v = _qkv(r)
    decay = make(r)
    with raises(DeclarationError, "decay", "cannot show g ≤ 0", "overflow"):
        r.build(decay=decay, key=k, query=q, write=plain(v))


@pytest.mark.parametrize("make", [
    lambda r: ops.logsigmoid(r.token("g")) / 16.0,
    lambda r: -ops.exp(r.param("A_log")) * ops.softplus(r.token("g")),
    lambda r: r.param("log_gamma", sign="nonpositive"),
    lambda r: -ops.softplus(r.token("g")) - ops.sigmoid(r.token("h")),
    lambda r: r.token("g", sign="nonpositive") * ops.sigmoid(r.token("h")),
    lambda r: ops.logsigmoid(r.token("g", size="K")),
    lambda r: 0.0 - ops.softplus(r.token("g")),               # a reflected subtraction, operands in order
    lambda r: -(r.token("g") ** 2),                           # an even power is >= 0
], ids=["gla", "mamba2", "retnet", "sum-of-nonpos", "signed-token", "vector", "reflected-sub", "even-power"])
def test_decays_with_a_provable_sign_build(make):
    r = Recurrence("signed")
    q, k, v = _qkv(r)
    decl = r.build(decay=make(r), key=k, query=q, write=plain(v))
    assert decl.decay.sign == "nonpositive"
    assert decl.decay_form in ("scalar", "vector")


@pytest.mark.parametrize("make", [
    lambda r: -((g := r.token("g")) * g),                         # minus a square
    lambda r: ops.log(ops.sigmoid(r.token("g"))),                 # log of a value in [0, 1]
    lambda r: ops.log(ops.sigmoid(r.token("g", size="K"))) / 4.0,
], ids=["minus-square", "log-sigmoid", "vector-log-sigmoid"])
def test_decays_bounded_by_their_value_range_build(make):
    """Where the sign rules alone say nothing, the interval arithmetic (``bounds.value_range``) may
    still show g ≤ 0; a square is non-negative whatever its factor's sign."""
    r = Recurrence("ranged")
    q, k, v = _qkv(r)
    decl = r.build(decay=make(r), key=k, query=q, write=plain(v))
    assert value_range(decl.decay)[1] <= 0.0


def test_a_product_of_two_different_unsigned_factors_is_no_square():
    r = Recurrence("unsigned")
    q, k, v = _qkv(r)
    with raises(DeclarationError, "decay", "cannot show g ≤ 0"):
        r.build(decay=-(r.token("g") * r.token("h")), key=k, query=q, write=plain(v))


# -- key, query, write ------------------------------------------------------------------------------
@pytest.mark.parametrize("missing", ["key", "query", "write"])
def test_missing_key_query_or_write(missing):
    r = Recurrence("incomplete")
    q, k, v = _qkv(r)
    fields = {"key": k, "query": q, "write": plain(v)}
    del fields[missing]
    with raises(DeclarationError, f"{missing}: missing"):
        r.build(**fields)


def test_key_that_is_a_v_vector():
    r = Recurrence("vkey")
    q, k, v = _qkv(r)
    with raises(DeclarationError, "key:", "vector over V", "keys must be a vector over K"):
        r.build(key=v, query=q, write=plain(v))


def test_query_that_is_a_scalar():
    r = Recurrence("squery")
    q, k, v = _qkv(r)
    s = r.token("s")
    with raises(DeclarationError, "query:", "scalar per head", "queries must be a vector over K"):
        r.build(key=k * q, query=s, write=plain(v))


def test_key_combining_k_and_v_is_a_matrix():
    r = Recurrence("vkkey")
    q, k, v = _qkv(r)
    with raises(DeclarationError, "key:", "V×K matrix"):
        r.build(key=k * v, query=q, write=plain(v))


def test_written_value_over_k():
    r = Recurrence("kvalue")
    q, k, v = _qkv(r)
    with raises(DeclarationError, "write.value:", "vector over K", "vector over V"):
        r.build(key=k, query=q, write=plain(k))


@pytest.mark.parametrize("kind", ["strength-K", "strength-V", "beta-K", "beta-V"])
def test_write_strength_that_is_a_vector(kind):
    r = Recurrence("vector_strength")
    q, k, v = _qkv(r)
    vec = k if kind.endswith("K") else v
    field = "write.strength" if kind.startswith("strength") else "write.beta"
    write = plain(v, strength=vec) if kind.startswith("strength") else delta(v, beta=ops.sigmoid(vec))
    with raises(DeclarationError, f"{field}:", "one scalar per head and token"):
        r.build(key=k, query=q, write=write)


def test_write_that_is_not_plain_or_delta():
    r = Recurrence("raw_write")
    q, k, v = _qkv(r)
    with raises(DeclarationError, "write:", "plain(...) or delta(...)"):
        r.build(key=k, query=q, write=v)


def test_skip_and_gate_must_be_v_vectors():
    r = Recurrence("epilogue")
    q, k, v = _qkv(r)
    D = r.param("D")
    with raises(DeclarationError, "skip:", "vector over V"):
        r.build(key=k, query=q, write=plain(v), skip=D)
    r = Recurrence("epilogue")
    q, k, v = _qkv(r)
    z = r.token("z", size="K")
    with raises(DeclarationError, "gate:", "vector over K"):
        r.build(key=k, query=q, write=plain(v), gate=z)


@pytest.mark.parametrize("size", [None, ""])
def test_l2norm_of_a_scalar(size):
    r = Recurrence("norm")
    b = r.token("b", size=size)
    with raises(DeclarationError, "l2norm needs a vector over K or V", "scalar"):
        ops.l2norm(b)
    with raises(DeclarationError, "l2norm", "scalar"):
        ops.l2norm(2.0)


def test_l2norm_of_a_matrix():
    r = Recurrence("norm")
    q, k, v = _qkv(r)
    with raises(DeclarationError, "l2norm", "'VK'"):
        ops.l2norm(k * v)


# -- inputs -----------------------------------------------------------------------------------------
def test_input_declared_in_another_builder():
    other = Recurrence("other")
    foreign = other.token("foreign", size="K")
    r = Recurrence("mine")
    q, k, v = _qkv(r)
    with raises(DeclarationError, "'foreign'", "not declared in 'mine'", "key"):
        r.build(key=k * foreign, query=q, write=plain(v))


def test_param_declared_in_another_builder_used_in_decay():
    other = Recurrence("other")
    A_log = other.param("A_log")
    r = Recurrence("mine")
    q, k, v = _qkv(r)
    g = r.token("g")
    with raises(DeclarationError, "decay:", "'A_log'", "not declared"):
        r.build(decay=-ops.exp(A_log) * ops.softplus(g), key=k, query=q, write=plain(v))


def test_getitem_of_an_undeclared_name():
    r = Recurrence("lookup")
    r.token("q", size="K")
    assert r["q"] is r["q"]
    with raises(DeclarationError, "'nope'", "not declared in 'lookup'", "['q']"):
        r["nope"]


@pytest.mark.parametrize("kind", ["token", "param"])
def test_unused_declared_input(kind):
    r = Recurrence("unused")
    q, k, v = _qkv(r)
    getattr(r, kind)("spare")
    with raises(DeclarationError, "['spare']", "used by no field"):
        r.build(key=k, query=q, write=plain(v))


@pytest.mark.parametrize("first,second", [("token", "token"), ("token", "param"), ("param", "token")])
def test_duplicate_input_name(first, second):
    r = Recurrence("dup")
    getattr(r, first)("x", size="K")
    with raises(DeclarationError, "'x'", "declared twice"):
        getattr(r, second)("x", size="V")


@pytest.mark.parametrize("name", ["1x", "a-b", "a b", "_hidden", "class", "lambda", "", "é-x"])
def test_bad_input_names(name):
    r = Recurrence("names")
    with raises(DeclarationError, repr(name), "not a usable name"):
        r.token(name)
    with raises(DeclarationError, repr(name), "not a usable name"):
        r.param(name)


@pytest.mark.parametrize("name", ["", "1gdn", "_gdn", "my-gdn", "my gdn", "gdn!", "__"])
def test_bad_recurrence_names(name):
    with raises(DeclarationError, "name:", repr(name)):
        Recurrence(name)


@pytest.mark.parametrize("per", ["value", "key", "Head", "", None, 1])
def test_bad_per(per):
    r = Recurrence("per")
    with raises(DeclarationError, "per=", "'head'", "'group'"):
        r.token("x", per=per, size="K")


@pytest.mark.parametrize("size", ["k", "v", "VK", "KV", 3, "HV"])
def test_bad_size(size):
    r = Recurrence("size")
    with raises(DeclarationError, "size=", "'K' or 'V'"):
        r.param("x", size=size)


@pytest.mark.parametrize("sign", ["negative", "positive", "<=0", "", None])
def test_bad_sign(sign):
    r = Recurrence("sign")
    with raises(DeclarationError, "sign=", "'nonpositive'"):
        r.token("x", sign=sign)


def test_no_token_input():
    r = Recurrence("all_params")
    q, k = r.param("q", per="group", size="K"), r.param("k", per="group", size="K")
    v = r.param("v", size="V")
    with raises(DeclarationError, "inputs:", "no token input"):
        r.build(key=k, query=q, write=plain(v))


# -- expressions ------------------------------------------------------------------------------------
def test_bad_constants_and_operands():
    r = Recurrence("consts")
    k = r.token("k", size="K")
    with raises(DeclarationError, "not finite"):
        k * float("inf")
    with raises(DeclarationError, "not finite"):
        k + float("nan")
    with raises(DeclarationError, "cannot use", "'k'"):
        k * "k"
    with raises(DeclarationError, "cannot use", "bool"):
        k * True
    with raises(DeclarationError, "exponent must be a Python number"):
        k ** k
    with raises(DeclarationError, "no truth value"):
        bool(k)


# -- ModelShape and ReplayConfig --------------------------------------------------------------------
@pytest.mark.parametrize("heads,key_heads", [(6, 4), (8, 3), (1, 2), (5, 10)])
def test_key_heads_that_do_not_divide_heads(heads, key_heads):
    with raises(ConfigError, "key_heads", f"does not divide heads={heads}"):
        ModelShape(heads=heads, key_heads=key_heads, v_dim=8, k_dim=8)


@pytest.mark.parametrize("field", ["heads", "key_heads", "v_dim", "k_dim"])
@pytest.mark.parametrize("value", [0, -1, 2.0, True, "8", None])
def test_shape_fields_must_be_positive_ints(field, value):
    kw = {"heads": 4, "key_heads": 2, "v_dim": 8, "k_dim": 8, field: value}
    with raises(ConfigError, f"{field}:", "positive int"):
        ModelShape(**kw)


@pytest.mark.parametrize("dtype", ["float8_e4m3", "nvfp4"])
def test_state_dtype_that_cannot_carry_the_recurrence(dtype):
    with raises(ConfigError, "state_dtype:", dtype, "cannot carry the recurrence"):
        ReplayConfig(state_dtype=dtype)
    with raises(ConfigError, "record_dtype:", dtype, "cannot carry the recurrence"):
        ReplayConfig(record_dtype=dtype)


@pytest.mark.parametrize("dtype", ["float64", "fp32", "int8", "float8", "", "FLOAT32"])
def test_unknown_state_dtype(dtype):
    with raises(ConfigError, "state_dtype:", "unknown dtype", repr(dtype)):
        ReplayConfig(state_dtype=dtype)


def test_records_are_float32_or_keep_bf16_inputs():
    with raises(ConfigError, "record_dtype:", "'float16'", "float32, or bfloat16"):
        ReplayConfig(record_dtype="float16")
    assert ReplayConfig(record_dtype="bfloat16").record_dtype == "bfloat16"


@pytest.mark.parametrize("fields", [(), ("keys",), ("key", "key"), ["key"], "key", ("decay", "write")])
def test_raw_record_fields_name_distinct_fields_records_may_keep_raw(fields):
    with raises(ConfigError, "raw_record_fields:", "key", "decay"):
        ReplayConfig(record_dtype="bfloat16", raw_record_fields=fields)


def test_raw_record_fields_take_one_order_and_need_bf16_records():
    """Equal choices are equal configs (one order: one tuning-table key); with float32 records a choice
    other than the default would be ignored, so it is refused."""
    a = ReplayConfig(record_dtype="bfloat16", raw_record_fields=("decay", "key"))
    assert a.raw_record_fields == ("key", "decay") and a == ReplayConfig(record_dtype="bfloat16")
    assert ReplayConfig(record_dtype="bfloat16", raw_record_fields=("decay",)).raw_record_fields == ("decay",)
    assert ReplayConfig(raw_record_fields=("decay", "key")) == ReplayConfig()
    with raises(ConfigError, "raw_record_fields:", "('key',)", "record_dtype='bfloat16'"):
        ReplayConfig(raw_record_fields=("key",))


@pytest.mark.parametrize("drafts", [0, 9, -1, 100, 2.0, None, True])
def test_max_drafts_out_of_range(drafts):
    with raises(ConfigError, "max_drafts:", "1..8"):
        ReplayConfig(max_drafts=drafts)


@pytest.mark.parametrize("window", [0, -3, 1.5, None, "16", True])
def test_window_below_one(window):
    with raises(ConfigError, "window:", ">= 1"):
        ReplayConfig(window=window)


@settings(max_examples=60, deadline=None)
@given(window=st.integers(1, 30), max_drafts=st.integers(1, 8), state=st.sampled_from(sorted(STATE_DTYPES)))
def test_valid_configs_build(window, max_drafts, state):
    if window + max_drafts > 31:
        with raises(ConfigError, "window:", f"window + max_drafts = {window + max_drafts} > 31",
                    f"window <= {31 - max_drafts}"):
            ReplayConfig(window=window, max_drafts=max_drafts, state_dtype=state)
        return
    cfg = ReplayConfig(window=window, max_drafts=max_drafts, state_dtype=state)
    assert cfg.capacity == window + max_drafts
    assert DTYPE_BYTES[cfg.state_dtype] in (2, 4)


@pytest.mark.parametrize("window,max_drafts", [(24, 8), (31, 1), (64, 8)])
def test_a_capacity_past_one_warp_of_records_is_refused(window, max_drafts):
    with raises(ConfigError, "window:", "> 31", "one per lane"):
        ReplayConfig(window=window, max_drafts=max_drafts)


# -- the built-ins ----------------------------------------------------------------------------------
@pytest.mark.parametrize("name", sorted(BUILTINS))
def test_builtin_builds_with_stable_fingerprint_and_full_describe(name):
    a, b = BUILTINS[name](), get(name)
    assert a.fingerprint == b.fingerprint
    assert re.fullmatch(r"[0-9a-f]{16}", a.fingerprint)
    assert a.describe() == b.describe()
    text = a.describe()
    assert text.splitlines()[0].startswith(f"recurrence {a.name}")
    assert a.inputs, name
    for spec in a.inputs:
        assert re.search(rf"\b{spec.kind}\s+{re.escape(spec.name)}\s", text), (spec.name, text)
    for role in a.expressions():
        assert re.search(rf"^\s+{role}\s+=", text, re.M), (role, text)
    assert any(s.kind == "token" for s in a.inputs)
    assert a.decay is None or a.decay.sign == "nonpositive"


def test_builtin_fingerprints_are_distinct_and_follow_the_declaration():
    prints = {name: get(name).fingerprint for name in BUILTINS}
    assert len(set(prints.values())) == len(prints), prints
    from replayssm_dsl.variants import mamba2
    variants = {mamba2().fingerprint, mamba2(gate=False).fingerprint, mamba2(dt_softplus=False).fingerprint}
    assert len(variants) == 3


def test_unknown_builtin():
    with raises(DeclarationError, "variant:", "'mamba1'", "gdn"):
        get("mamba1")


@pytest.mark.parametrize("kw", [{"per": ["head"]}, {"size": ["K"]}, {"sign": ["any"]}, {"per": {"head": 1}}])
def test_unhashable_per_size_or_sign(kw):
    """An unhashable value is refused like any other bad value, not with a TypeError."""
    r = Recurrence("unhashable")
    with raises(DeclarationError, f"{next(iter(kw))}="):
        r.token("x", **kw)


# -- inputs are matched by identity, not by name ---------------------------------------------------------
@pytest.mark.parametrize("case", ["size", "sign"])
def test_same_named_input_of_another_builder_with_another_spec(case):
    other = Recurrence("other")
    r = Recurrence("mine")
    q, k, v = _qkv(r)
    if case == "size":
        foreign = other.token("k", per="head", size="V")  # 'mine' declares k per group over K
        with raises(DeclarationError, "gate:", "'k'"):
            r.build(key=k, query=q, write=plain(v), gate=foreign)
    else:
        foreign = other.param("lg", sign="nonpositive")  # proves g <= 0 though 'mine' never checks it
        r.param("lg")
        with raises(DeclarationError, "decay:", "'lg'"):
            r.build(decay=foreign, key=k, query=q, write=plain(v))

