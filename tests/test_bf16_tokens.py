"""Token inputs declared bfloat16: the declaration, the rounding on entry, the CPU backend against the
float32 declaration fed the same bf16 values, the generated code (NVRTC, no spills) and, marked
``gpu``, the kernels against the float64 plain recurrence with bf16 tokens as floats, raw bits and
torch bf16 tensors.

An engine's activations arrive as bf16; a declaration that says so lets it pass them as they are.
bf16 values are exact in float32, so the recurrence is the same one the oracle computes on them.
"""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from replayssm_dsl import ModelShape, Recurrence, ReplayConfig, delta, ops, variants
from replayssm_dsl.bfloat16 import bfloat16_bits, from_bfloat16_bits, round_to_bfloat16
from replayssm_dsl.config import PRESETS
from replayssm_dsl.errors import DeclarationError, InputError
from replayssm_dsl.lowering import lower
from replayssm_dsl.lowering.launch import choose_launch, kernel_arguments
from replayssm_dsl.lowering.record_inputs import RECORD_FIELDS, raw_record_inputs
from replayssm_dsl.lowering.record_keys import key_shift
from replayssm_dsl.lowering.render_cuda import render_program
from replayssm_dsl.random_inputs import random_params, random_tokens
from replayssm_dsl.runtime.cache_base import ReplayCacheBase
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
from twin import ReplayTwin, to_host

SHAPE, CONFIG = ModelShape(4, 2, 16, 32), ReplayConfig(window=4, max_drafts=3)
RAW = ReplayConfig(window=4, max_drafts=3, record_dtype="bfloat16")  # records keep the bf16 inputs' bits
RAW_KEYS = ReplayConfig(window=4, max_drafts=3, record_dtype="bfloat16", raw_record_fields=("key",))  # float32 decays
RAW_DECAYS = ReplayConfig(window=4, max_drafts=3, record_dtype="bfloat16", raw_record_fields=("decay",))  # float32 keys
BUILTINS = sorted(variants.BUILTINS)


def bf16(name: str, names=None):
    return variants.get(name).with_token_dtype("bfloat16", names)


# --- the declaration ---------------------------------------------------------------------------------
def test_with_token_dtype_changes_the_named_tokens_and_the_fingerprint():
    base = variants.get("kda")
    some = base.with_token_dtype("bfloat16", ["k", "g_raw"])
    assert {s.name: s.dtype for s in some.inputs if s.kind == "token"} == {
        "q": "float32", "k": "bfloat16", "v": "float32", "g_raw": "bfloat16", "b": "float32"}
    assert all(s.dtype == "float32" for s in some.inputs if s.kind == "param")
    assert len({base.fingerprint, some.fingerprint, bf16("kda").fingerprint}) == 3
    assert "k        [B, H, K] bfloat16" in some.describe()


@pytest.mark.parametrize("call,match", [
    (lambda: variants.get("gdn").with_token_dtype("float16"), "dtype='float16'"),
    (lambda: variants.get("gdn").with_token_dtype("bfloat16", ["A_log"]), r"\['A_log'\] are not token inputs"),
])
def test_bad_token_dtypes_are_refused_naming_what_is_wrong(call, match):
    with pytest.raises(DeclarationError, match=match):
        call()


def test_a_token_declared_with_an_unknown_dtype_is_refused():
    from replayssm_dsl import Recurrence
    with pytest.raises(DeclarationError, match=r"token 'k': dtype='int8'"):
        Recurrence("x").token("k", size="K", dtype="int8")


@settings(max_examples=50, deadline=None)
@given(st.lists(st.floats(-2.0**100, 2.0**100, width=32), min_size=1, max_size=64))
def test_rounding_to_bf16_is_to_the_nearest_and_idempotent(values):
    x = np.array(values, np.float32)
    r = round_to_bfloat16(x)
    assert np.array_equal(round_to_bfloat16(r), r)
    assert np.array_equal(from_bfloat16_bits(bfloat16_bits(r)), r)
    step = np.abs(r) * 2.0 ** -8  # a bf16 holds 8 significant bits: within half a unit in the last place
    assert np.all(np.abs(r.astype(np.float64) - x) <= step + 1e-38)


@pytest.mark.parametrize("name", BUILTINS)
def test_random_tokens_of_a_bf16_declaration_hold_bf16_values(name):
    toks = random_tokens(bf16(name), SHAPE, np.random.default_rng(0), (3, 2))
    for value in toks.values():
        assert np.array_equal(round_to_bfloat16(value), value.astype(np.float32))


# --- the CPU backend ---------------------------------------------------------------------------------
@settings(max_examples=20, deadline=None, suppress_health_check=list(HealthCheck))
@given(name=st.sampled_from(BUILTINS), seed=st.integers(0, 2**32 - 1), steps=st.integers(1, 12),
       as_bits=st.booleans(), config=st.sampled_from((CONFIG, RAW, RAW_KEYS, RAW_DECAYS)))
def test_cpu_bf16_tokens_equal_the_float32_declaration_on_the_rounded_values(name, seed, steps, as_bits, config):
    """Floats are rounded on entry (or given as raw bits): the same outputs as the float32 declaration
    given the rounded values, through steps, verify and commit, also where the bf16 one keeps its keys
    (and decay vectors) as the raw inputs and recomputes them (``record_dtype="bfloat16"``: its
    decays' running sums may round apart in the last float64 place). The float32 declaration keeps
    decay-scaled keys (a bounded gate's) exactly where the bf16 one does (``key_shift``; records of raw
    inputs keep plain keys): the two forms round apart by more, e^{C − G} and back, summed with
    cancellation."""
    rng = np.random.default_rng(seed)
    params = random_params(variants.get(name), SHAPE, rng)
    plain_config = replace(CONFIG, scaled_keys=key_shift(bf16(name), config) is not None)
    plain = CpuReplayCache(variants.get(name), SHAPE, plain_config, slots=2, params=params)
    half = CpuReplayCache(bf16(name), SHAPE, config, slots=2, params=params)
    for i in range(steps):
        toks = random_tokens(variants.get(name), SHAPE, rng, (2,) if i % 3 else (2, 3))
        rounded = {k: round_to_bfloat16(v).astype(np.float64) for k, v in toks.items()}
        given_ = {k: bfloat16_bits(v) for k, v in toks.items()} if as_bits else toks
        if i % 3:
            assert np.allclose(half.step([0, 1], given_), plain.step([0, 1], rounded), rtol=1e-12, atol=1e-300)
        else:
            got, want = half.verify([1, 0], given_, [3, 2]), plain.verify([1, 0], rounded, [3, 2])
            assert np.isfinite(got[0]).all() and np.isfinite(got[1, :2]).all()  # row 1's third draft: unwritten
            assert np.allclose(got, want, rtol=1e-12, atol=1e-300, equal_nan=True)
            half.commit([2, 1])
            plain.commit([2, 1])
    assert np.allclose(half.materialize([0, 1]), plain.materialize([0, 1]), rtol=1e-12, atol=1e-300)


def test_bad_bf16_tokens_are_refused_before_any_state_changes():
    decl = bf16("gdn")
    cache = CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=random_params(decl, SHAPE, np.random.default_rng(0)))
    toks = random_tokens(decl, SHAPE, np.random.default_rng(1), (2,))
    bits = dict(toks, k=bfloat16_bits(toks["k"]))
    bits["k"][1, 0, 3] = 0x7FC0  # a NaN's bits
    with pytest.raises(InputError, match=r"tokens\['k'\]: non-finite"):
        cache.step([0, 1], bits)
    with pytest.raises(InputError, match=r"tokens\['a'\]: dtype int32 not accepted"):
        cache.step([0, 1], dict(toks, a=np.zeros((2, SHAPE.heads), np.int32)))
    with pytest.raises(InputError, match=r"tokens\['v'\]: value .* overflows bfloat16"):  # past bf16's range
        cache.step([0, 1], dict(toks, v=np.full((2, SHAPE.heads, SHAPE.v_dim), 3.4e38)))
    assert (cache.fills() == 0).all()


def test_cpu_torch_tensors_of_bf16_values_or_bits_equal_numpy_floats():
    torch = pytest.importorskip("torch")
    decl = bf16("kda")
    params = random_params(decl, SHAPE, np.random.default_rng(0))
    toks = random_tokens(decl, SHAPE, np.random.default_rng(1), (2,))
    forms = {"numpy floats": toks,
             "torch bf16": {k: torch.tensor(v, dtype=torch.float32).to(torch.bfloat16) for k, v in toks.items()},
             "torch int16 bits": {k: torch.tensor(v, dtype=torch.float32).to(torch.bfloat16).view(torch.int16)
                                  for k, v in toks.items()},
             "numpy uint16 bits": {k: bfloat16_bits(v) for k, v in toks.items()}}
    outs = {form: CpuReplayCache(decl, SHAPE, CONFIG, slots=2, params=params).step([0, 1], given_)
            for form, given_ in forms.items()}
    for form, out in outs.items():
        assert np.isfinite(out).all() and np.array_equal(out, outs["numpy floats"]), form


class _BitsBackend(CpuReplayCache):
    """A host cache that takes checked bf16 tokens as raw bits, as the CUDA backend does: the shared
    checks alone (not the CPU backend's conversion to its compute dtype after them)."""
    def _host_bfloat16(self, bits, values):
        return bits

    def _check_tokens(self, tokens, rows, t):
        return ReplayCacheBase._check_tokens(self, tokens, rows, t)


@pytest.mark.parametrize("form", ["float64", "float32", "float16", "uint16", "int16", "int16 reversed view", "list"])
@pytest.mark.parametrize("drafts", [None, 3])
def test_a_backend_that_reads_bits_gets_each_host_bf16_token_rounded_once_as_its_bits(form, drafts):
    """The shared checks hand a backend that reads raw bits (``_host_bfloat16``) the token's bits, in
    its shape (``[B, 1, ...]`` for a step, ``[B, T, ...]`` for verify), C-contiguous, whatever host form
    it came in; the bits equal rounding the values once."""
    decl, shape = variants.get("kda").with_token_dtype("bfloat16"), ModelShape(4, 2, 16, 32)
    rng = np.random.default_rng()
    cache = _BitsBackend(decl, shape, ReplayConfig(window=4, max_drafts=3), slots=2,
                         params=random_params(decl, shape, rng))
    tokens = random_tokens(decl, shape, rng, (2,) if drafts is None else (2, drafts))
    want = {name: bfloat16_bits(value) for name, value in tokens.items()}
    given = {"float64": tokens, "float32": {n: v.astype(np.float32) for n, v in tokens.items()},
             "float16": {n: v.astype(np.float16) for n, v in tokens.items()},
             "uint16": want, "int16": {n: v.view(np.int16) for n, v in want.items()},
             "int16 reversed view": {n: np.ascontiguousarray(v.view(np.int16)[::-1])[::-1] for n, v in want.items()},
             "list": {n: v.tolist() for n, v in tokens.items()}}[form]
    if form == "float16":
        want = {name: bfloat16_bits(value.astype(np.float32)) for name, value in given.items()}
    got = cache._check_tokens(given, 2, drafts)
    for name, bits in want.items():
        bits = bits if drafts is not None else bits[:, None]
        assert got[name].dtype == np.uint16 and got[name].flags.c_contiguous, name
        np.testing.assert_array_equal(got[name], bits, err_msg=name)


def test_raw_bits_are_refused_for_a_float32_token():
    decl = variants.get("gdn")
    cache = CpuReplayCache(decl, SHAPE, CONFIG, slots=1, params=random_params(decl, SHAPE, np.random.default_rng(0)))
    toks = random_tokens(decl, SHAPE, np.random.default_rng(1), (1,))
    with pytest.raises(InputError, match=r"tokens\['k'\]: dtype uint16 not accepted"):
        cache.step([0], dict(toks, k=bfloat16_bits(toks["k"])))


# --- the generated code --------------------------------------------------------------------------------
def test_bf16_tokens_are_raw_bits_widened_where_read():
    decl = bf16("kda", ["k", "g_raw"])
    program = lower(decl, SHAPE, CONFIG)
    types = dict((name, ctype) for ctype, name in kernel_arguments(program))
    assert types["tok_k"] == types["tok_g_raw"] == "const unsigned short*"
    assert types["tok_q"] == types["par_A_log"] == "const float*"
    src = render_program(program)
    assert "bf16_bits_to_f32(tok_k[" in src and "bf16_bits_to_f32(tok_g_raw[" in src
    assert "bf16_bits_to_f32(tok_q[" not in src
    assert "lane * 64 < K) prefetch_l1(tok_k" in src  # 64 bf16 to a 128-byte line
    assert program.buffer("k").dtype == "bfloat16" and program.buffer("q").dtype == "float32"


@pytest.mark.parametrize("name,raw", [("kda", {"key": "k", "decay": "g_raw"}), ("gla", {"key": "k", "decay": "gk"}),
                                      ("gdn", {"key": "k"}), ("mamba2", {"key": "B"}), ("retnet", {"key": "k"})])
def test_records_keep_a_bf16_tokens_bits_where_a_field_is_computed_from_it_alone(name, raw):
    """With ``record_dtype="bfloat16"``, keys and decay vectors computed from one bf16 K-vector token
    input are recorded as its bits (half the bytes, exact) and recomputed where read; a scalar decay,
    a float32 input, or a field that reads two token inputs keeps the float32 field."""
    program = lower(bf16(name), SHAPE, RAW)
    assert {f: s.name for f, s in raw_record_inputs(program.declaration, RAW).items()} == raw
    types = dict((name, ctype) for ctype, name in kernel_arguments(program))
    for field, buffer in RECORD_FIELDS.items():
        if buffer in types:
            want = "bfloat16" if field in raw else "float32"
            assert program.buffer(buffer).dtype == want
            assert types[buffer] == ("unsigned short*" if field in raw else "float*")
    src = render_program(program)
    # staged by the replay step (eagerly and once the fill is known), verify, flush_for_verify, flush, materialize
    assert src.count("stage_bf16_records(sh_") == 6 * len(raw)
    assert ("records kept as raw bf16 inputs, widened" in src) and ("raw_record_element" in src)
    assert raw_record_inputs(variants.get(name), RAW) == {}  # float32 tokens: float32 records
    value = "x" if name == "mamba2" else "v"
    assert raw_record_inputs(bf16(name, [value]), RAW) == {}  # the key's and decay's inputs still float32
    assert raw_record_inputs(bf16(name), CONFIG) == {}  # float32 records unless asked
    assert "stage_bf16_records(sh_" not in render_program(lower(bf16(name), SHAPE, CONFIG))


def _group_level_decay():
    """KDA whose decay vector comes from a bf16 input per key group, stored per value head (H < HV)."""
    r = Recurrence("group_gate")
    q, k = r.token("q", per="group", size="K"), r.token("k", per="group", size="K")
    v, b, g = r.token("v", size="V"), r.token("b"), r.token("g", per="group", size="K", dtype="bfloat16")
    return r.build(decay=ops.logsigmoid(g) / 8.0, key=ops.l2norm(k), query=ops.l2norm(q) * r.K ** -0.5,
                   write=delta(value=v, beta=ops.sigmoid(b)))


def _key_of_two_inputs():
    """A key computed from two bf16 K inputs: no one input's bits make it."""
    r = Recurrence("gated_key")
    q, k = r.token("q", per="group", size="K"), r.token("k", per="group", size="K", dtype="bfloat16")
    z = r.token("z", per="group", size="K", dtype="bfloat16")
    v, a, b = r.token("v", size="V"), r.token("a"), r.token("b")
    return r.build(decay=-ops.softplus(a), key=ops.l2norm(k * ops.sigmoid(z)), query=ops.l2norm(q),
                   write=delta(value=v, beta=ops.sigmoid(b)))


@pytest.mark.parametrize("make", [_group_level_decay, _key_of_two_inputs], ids=["group-level-decay", "key-of-two"])
def test_fields_no_single_input_holds_stay_float32_and_match_the_recurrence(make):
    """A decay input at another level than the records keep it, or a key read from two inputs, cannot
    be recorded as one input's bits: those fields stay float32 with bf16 records asked for, and the
    CPU backend runs the declaration through steps, folds, verify and commit."""
    decl = make()
    assert raw_record_inputs(decl, RAW) == {}
    twin = ReplayTwin(CpuReplayCache, decl, SHAPE, RAW, np.random.default_rng(5), slots=2, tol=1e-9)
    twin.load([0, 1])
    for i in range(10):
        twin.step([0, 1])
        if i % 4 == 3:
            twin.commit([1, 0], twin.verify([1, 0], [3, 2]), [2, 1])
    twin.check_materialize([0, 1])


@pytest.mark.parametrize("fields,raw", [(("key",), {"key": "k"}), (("decay",), {"decay": "g_raw"}),
                                        (("key", "decay"), {"key": "k", "decay": "g_raw"})])
def test_raw_record_fields_choose_which_fields_records_keep_raw(fields, raw):
    """``raw_record_fields=("key",)`` keeps KDA's keys as the bf16 inputs and its cumulative decays in
    float32 (no running sums recomputed where read); each choice renders its own kernels."""
    config = ReplayConfig(window=4, max_drafts=3, record_dtype="bfloat16", raw_record_fields=fields)
    program = lower(bf16("kda"), SHAPE, config)
    assert {f: s.name for f, s in raw_record_inputs(program.declaration, config).items()} == raw
    assert program.buffer("rec_key").dtype == ("bfloat16" if "key" in raw else "float32")
    assert program.buffer("rec_decay").dtype == ("bfloat16" if "decay" in raw else "float32")
    src = render_program(program)
    assert src.count("stage_bf16_records(sh_") == 6 * len(raw)
    assert ("the records' cumulative log-decays" in src) == ("decay" in raw)


@pytest.mark.nvrtc
@pytest.mark.parametrize("batch", [1, 256])
@pytest.mark.parametrize("name,shape", [("kda", PRESETS["kimi-linear"].shape), ("gdn", PRESETS["qwen3.5-4b"].shape),
                                        ("mamba2", PRESETS["nemotron-nano-4b"].shape), ("kda", ModelShape(3, 1, 60, 100)),
                                        ("gla", ModelShape(6, 2, 80, 96)), ("kda", ModelShape(2, 1, 8, 6)),
                                        ("gdn", ModelShape(2, 1, 8, 33))])
def test_bf16_token_kernels_compile_for_sm90_without_spills(name, shape, batch):
    """Raw records of K = 128, 100, 96, 6 and 33 elements (copies of 16, 8, 8, 4 bytes and one element)."""
    from replayssm_dsl.runtime.nvrtc_compile import compile_cubin
    for fields in (("key", "decay"), ("key",), ("decay",)):
        config = ReplayConfig(record_dtype="bfloat16", raw_record_fields=fields)
        result = compile_cubin(render_program(lower(bf16(name), shape, config), choose_launch(shape, batch)))
        assert len(result.resources) == 10 and not result.warnings, result.log
        for kernel, res in result.resources.items():
            assert res.clean, f"{fields} {kernel}: {res}\n{result.log}"


# --- on the GPU ----------------------------------------------------------------------------------------
def cuda_cache():
    from replayssm_dsl.runtime.cuda_cache import CudaReplayCache
    return CudaReplayCache


@pytest.mark.gpu
@pytest.mark.parametrize("record_dtype,fields", [("float32", ("key", "decay")), ("bfloat16", ("key", "decay")),
                                                 ("bfloat16", ("key",))])
@pytest.mark.parametrize("name", ["kda", "gdn", "mamba2", "gla"])
def test_gpu_bf16_tokens_match_the_float64_recurrence(name, record_dtype, fields):
    """Steps (a flush every L), verify and commit of every count, materialize: against the float64
    plain recurrence on the same bf16 values, FP32 state tolerance, with float32 records and with
    records that keep the bf16 inputs' bits (all of them, or the keys only)."""
    config = ReplayConfig(window=8, max_drafts=4, record_dtype=record_dtype, raw_record_fields=fields)
    twin = ReplayTwin(cuda_cache(), bf16(name), ModelShape(4, 2, 80, 96), config,
                      np.random.default_rng(3), slots=3, tol=2e-4)
    twin.load([0, 2])
    for i in range(30):
        twin.step([2, -1, 0] if i % 2 else [0, 2])
        if i % 5 == 0:
            toks = twin.verify([0, 2], [4, 2])
            twin.commit([0, 2], toks, [i % 5, 1])
    twin.check_materialize([0, 2])


@pytest.mark.gpu
@pytest.mark.parametrize("name,fields", [("kda", ("key", "decay")), ("kda", ("key",)), ("gdn", ("key", "decay"))])
def test_gpu_bf16_records_stay_within_tolerance_over_a_long_run(name, fields):
    """400 steps at L = 16 (25 flushes), a verify of 8 drafts with a commit every 7 steps, the
    checkpoints materialised every 50: the raw bf16 records recomputed in the kernels keep every
    output within the FP32 tolerance of the float64 recurrence on the same bf16 inputs."""
    twin = ReplayTwin(cuda_cache(), bf16(name), ModelShape(4, 2, 64, 128),
                      ReplayConfig(window=16, max_drafts=8, record_dtype="bfloat16", raw_record_fields=fields),
                      np.random.default_rng(11), slots=2, tol=2e-4)
    twin.load([0, 1])
    for i in range(400):
        twin.step([0, 1])
        if i % 7 == 3:
            toks = twin.verify([1, 0], [8, 5])
            twin.commit([1, 0], toks, [i % 9, min(5, i % 6)])
        if i % 50 == 49:
            twin.check_materialize([0, 1])
    assert twin.max_err < 2e-4


@pytest.mark.gpu
def test_gpu_bf16_tokens_as_floats_bits_and_torch_tensors_give_the_same_outputs():
    import cupy as cp
    decl = bf16("kda")
    rng = np.random.default_rng(5)
    params = random_params(decl, SHAPE, rng)
    toks = random_tokens(decl, SHAPE, rng, (2,))
    forms = {"host floats": toks,
             "device float32": {k: cp.asarray(v, cp.float32) for k, v in toks.items()},
             "device bits": {k: cp.asarray(bfloat16_bits(v)) for k, v in toks.items()}}
    try:
        import torch
        forms["torch bf16"] = {k: torch.tensor(v, dtype=torch.float32, device="cuda").to(torch.bfloat16)
                               for k, v in toks.items()}
    except ImportError:
        pass
    outs = {}
    for form, given_ in forms.items():
        cache = cuda_cache()(decl, SHAPE, CONFIG, slots=2, params=params)
        outs[form] = to_host(cache.step([0, 1], given_, out=cache.poisoned((2, 1, SHAPE.heads, SHAPE.v_dim))))
        assert np.isfinite(outs[form]).all(), form
    first = next(iter(outs.values()))
    for form, out in outs.items():
        assert np.array_equal(out, first), form


@pytest.mark.gpu
def test_gpu_capturable_launches_take_bf16_bits_and_refuse_float32():
    """``launch_step`` converts nothing (a conversion would allocate inside a captured graph): bf16
    tensors, device bits and host bits give the eager step's outputs; float32 device values raise."""
    import cupy as cp
    decl = bf16("gdn")
    rng = np.random.default_rng(8)
    params = random_params(decl, SHAPE, rng)
    toks = {k: v[:, None] for k, v in random_tokens(decl, SHAPE, rng, (2,)).items()}
    eager = cuda_cache()(decl, SHAPE, CONFIG, slots=2, params=params)
    want = to_host(eager.step([0, 1], {k: v[:, 0] for k, v in toks.items()}))
    batch = {k: cp.asarray(v) for k, v in eager._batch([0, 1]).items()}
    for given_ in ({k: cp.asarray(bfloat16_bits(v)) for k, v in toks.items()}, {k: bfloat16_bits(v) for k, v in toks.items()}):
        cache = cuda_cache()(decl, SHAPE, CONFIG, slots=2, params=params)
        out = cache.poisoned((2, 1, SHAPE.heads, SHAPE.v_dim))
        cache.launch_step(batch, given_, out)
        assert np.array_equal(to_host(out)[:, 0], want)
    cache = cuda_cache()(decl, SHAPE, CONFIG, slots=2, params=params)
    with pytest.raises(InputError, match=r"tokens\['q'\]: declared bfloat16; launch_step"):
        cache.launch_step(batch, {k: cp.asarray(v, cp.float32) for k, v in toks.items()},
                          cache.poisoned((2, 1, SHAPE.heads, SHAPE.v_dim)))
    assert (cache.fills() == 0).all()


@pytest.mark.gpu
def test_gpu_a_bf16_token_of_another_dtype_is_refused_naming_it():
    import cupy as cp
    decl = bf16("gdn")
    cache = cuda_cache()(decl, SHAPE, CONFIG, slots=1, params=random_params(decl, SHAPE, np.random.default_rng(0)))
    toks = {k: cp.asarray(v, cp.float32) for k, v in random_tokens(decl, SHAPE, np.random.default_rng(1), (1,)).items()}
    with pytest.raises(InputError, match=r"tokens\['k'\]: declared bfloat16.*got float64"):
        cache.step([0], dict(toks, k=toks["k"].astype(cp.float64)))
    assert (cache.fills() == 0).all()


# --- the command line ------------------------------------------------------------------------------------
def test_cli_takes_the_token_and_record_dtypes(capsys):
    """``traffic`` shows the smaller records (KDA: 1,024 bytes per value head instead of 1,536) and
    still agrees with docs/design.md's formulas; ``check`` decodes a bf16 declaration against the oracle."""
    from replayssm_dsl.runtime import cli
    assert cli.main(["traffic", "--preset", "kimi-linear", "--token-dtype", "bfloat16", "--record-dtype", "bfloat16"]) == 0
    text = capsys.readouterr().out
    assert "record R=1024 B per value head" in text and "-> agree" in text
    assert cli.main(["traffic", "--preset", "kimi-linear", "--token-dtype", "bfloat16"]) == 0
    assert "record R=1536 B per value head" in capsys.readouterr().out  # bf16 tokens alone: float32 records
    assert cli.main(["traffic", "--preset", "kimi-linear", "--token-dtype", "bfloat16", "--record-dtype", "bfloat16",
                     "--raw-record-fields", "key"]) == 0
    assert "record R=1280 B per value head" in capsys.readouterr().out  # raw keys, float32 cumulative decays
    assert cli.main(["check", "kda", "--backend", "cpu", "--steps", "24", "--token-dtype", "bfloat16",
                     "--record-dtype", "bfloat16"]) == 0
    assert "(ok, tolerance" in capsys.readouterr().out
