"""torch.library operators over the replay cache: same results as the cache itself, fake
implementations for torch.compile, a compiled decode function equal to eager; on a GPU, a decode
step captured in a torch CUDA graph replays like eager."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from replayssm_dsl import ModelShape, ReplayConfig, variants  # noqa: E402
from replayssm_dsl.errors import InputError  # noqa: E402
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens  # noqa: E402
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache  # noqa: E402
from replayssm_dsl.runtime.torch_ops import TorchReplayCache  # noqa: E402

DECL, SHAPE, CONFIG = variants.get("gdn"), ModelShape(4, 2, 16, 32), ReplayConfig(window=4, max_drafts=3)


def _pair(device="cpu", seed=0, slots=3):
    rng = np.random.default_rng(seed)
    params = random_params(DECL, SHAPE, rng)
    tc = TorchReplayCache(DECL, SHAPE, CONFIG, slots=slots, params=params, device=device)
    ref = CpuReplayCache(DECL, SHAPE, CONFIG, slots=slots, params=params, precision="float32")
    states = random_state(SHAPE, rng, (slots,)).astype(np.float32)
    idx = torch.arange(slots, dtype=torch.int32, device=device)
    torch.ops.replayssm.load(tc.key, tc.state, idx, idx, torch.tensor(states, device=device))
    ref.load(list(range(slots)), states)
    return tc, ref, rng


def _t(tokens, device="cpu"):
    return {k: torch.tensor(v, dtype=torch.float32, device=device) for k, v in tokens.items()}


def test_operators_match_the_cache():
    tc, ref, rng = _pair()
    slot = torch.tensor([2, 0, -1], dtype=torch.int32)
    for i in range(7):
        toks = random_tokens(DECL, SHAPE, rng, (3,))
        got = torch.ops.replayssm.step(tc.key, tc.state, slot, slot, slot, tc.tokens(_t(toks)))
        want = ref.step(slot.numpy(), toks)
        np.testing.assert_allclose(got[:2].numpy(), want[:2], rtol=1e-6, atol=1e-6)
    drafts = torch.tensor([3, 2, 0], dtype=torch.int32)
    vt = random_tokens(DECL, SHAPE, rng, (3, 3))
    got = torch.ops.replayssm.verify(tc.key, tc.state, slot, slot, slot, drafts, tc.tokens(_t(vt)))
    want = ref.verify(slot.numpy(), vt, drafts.numpy())
    np.testing.assert_allclose(got[0].numpy(), want[0], rtol=1e-6, atol=1e-6)
    torch.ops.replayssm.commit(tc.key, tc.state, slot, drafts, torch.tensor([2, 1, 0], dtype=torch.int32))
    ref.commit([2, 1, 0])
    mat = torch.ops.replayssm.materialize(tc.key, tc.state, slot[:2], slot[:2])
    np.testing.assert_allclose(mat.numpy(), ref.materialize(slot[:2].numpy()), rtol=1e-6, atol=1e-6)
    assert np.array_equal(tc.fills(), ref.fills())


def test_fake_implementations_and_schema():
    tc, _, rng = _pair()
    slot = torch.tensor([1, 0], dtype=torch.int32)
    toks = tc.tokens(_t(random_tokens(DECL, SHAPE, rng, (2,))))
    torch.library.opcheck(torch.ops.replayssm.step.default, (tc.key, tc.state, slot, slot, slot, toks),
                          test_utils=("test_schema", "test_faketensor"))
    from torch._subclasses.fake_tensor import FakeTensorMode
    with FakeTensorMode() as mode:
        fake_state = [mode.from_tensor(s) for s in tc.state]
        out = torch.ops.replayssm.step(tc.key, fake_state, mode.from_tensor(slot), mode.from_tensor(slot),
                                       mode.from_tensor(slot), [mode.from_tensor(t) for t in toks])
        assert tuple(out.shape) == (2, SHAPE.heads, SHAPE.v_dim)


def test_torch_compile_traces_a_decode_loop_like_eager():
    traced, ref, rng = _pair(seed=4)
    eager = TorchReplayCache(DECL, SHAPE, CONFIG, slots=3, params=ref.params)
    idx = torch.arange(3, dtype=torch.int32)
    states = torch.ops.replayssm.materialize(traced.key, traced.state, idx, idx)  # the same start
    torch.ops.replayssm.load(eager.key, eager.state, idx, idx, states)

    def decode(key, state, slot, tokens):
        out = torch.ops.replayssm.step(key, state, slot, slot, slot, tokens)
        return torch.tanh(out) * 2.0

    compiled = torch.compile(decode, fullgraph=True, backend="aot_eager")
    slot = torch.tensor([0, 2, 1], dtype=torch.int32)
    for i in range(6):
        toks = _t(random_tokens(DECL, SHAPE, rng, (3,)))
        a = compiled(traced.key, traced.state, slot, traced.tokens(toks))
        b = decode(eager.key, eager.state, slot, eager.tokens(toks))
        torch.testing.assert_close(a, b)
    assert np.array_equal(traced.fills(), eager.fills()) and traced.fills().any()


@pytest.mark.gpu
def test_cuda_graph_of_a_torch_decode_step_replays_like_eager():
    if not torch.cuda.is_available():
        pytest.skip("torch sees no GPU")
    graphed, _, rng = _pair("cuda", seed=6)
    eager, _, _ = _pair("cuda", seed=6)
    slot = torch.tensor([2, 0, 1], dtype=torch.int32, device="cuda")
    toks = _t(random_tokens(DECL, SHAPE, rng, (3,)), "cuda")
    static = graphed.tokens(toks)
    torch.ops.replayssm.step(graphed.key, graphed.state, slot, slot, slot, static)  # warm: compile and load
    torch.ops.replayssm.step(eager.key, eager.state, slot, slot, slot, eager.tokens(toks))
    graph = torch.cuda.CUDAGraph()
    with torch.cuda.graph(graph):
        out = torch.ops.replayssm.step(graphed.key, graphed.state, slot, slot, slot, static)
    for i in range(9):
        new = _t(random_tokens(DECL, SHAPE, rng, (3,)), "cuda")
        for dst, src in zip(static, graphed.tokens(new)):
            dst.copy_(src)
        graph.replay()
        want = torch.ops.replayssm.step(eager.key, eager.state, slot, slot, slot, eager.tokens(new))
        torch.testing.assert_close(out, want)


def test_state_of_another_cache_is_refused_naming_it():
    """The operators bind a cache to the state tensors they are given: another cache's tensors (all of
    them, or one mixed in), or tensors of the wrong shape, raise naming the argument and change nothing."""
    a, _, rng = _pair(seed=7)
    b, _, _ = _pair(seed=8)
    slot = torch.tensor([0, 1], dtype=torch.int32)
    toks = a.tokens(_t(random_tokens(DECL, SHAPE, rng, (2,))))
    before = [t.clone() for t in b.state]
    with pytest.raises(InputError, match=r"state\[0\]: is 'checkpoint' of replay cache '%s'" % b.key):
        torch.ops.replayssm.step(a.key, b.state, slot, slot, slot, toks)
    mixed = list(a.state)
    mixed[2] = b.state[2]
    with pytest.raises(InputError, match=r"state\[2\]: is '%s' of replay cache '%s', but key '%s'"
                       % (b.names[2], b.key, a.key)):
        torch.ops.replayssm.materialize(a.key, mixed, slot, slot)
    swapped = [a.state[1], a.state[0]] + list(a.state[2:])
    with pytest.raises(InputError, match=r"state\[0\]: is '%s' of replay cache '%s'" % (a.names[1], a.key)):
        torch.ops.replayssm.step(a.key, swapped, slot, slot, slot, toks)
    wrong = [torch.zeros(2, 3)] + list(a.state[1:])
    with pytest.raises(InputError, match=r"state\[0\] \(checkpoint\): expected \[3, 4, 16, 32\] torch.float32"):
        torch.ops.replayssm.step(a.key, wrong, slot, slot, slot, toks)
    with pytest.raises(InputError, match=r"state\[0\] \(checkpoint\): expected \[3, 4, 16, 32\] torch.float32 on cpu, got"):
        torch.ops.replayssm.step(a.key, [a.state[0].double()] + list(a.state[1:]), slot, slot, slot, toks)
    meta = torch.empty_like(a.state[0], device="meta")  # dispatches to the fake implementation
    with pytest.raises(InputError, match=r"state\[0\]: on meta, but slot is on cpu"):
        torch.ops.replayssm.step(a.key, [meta] + list(a.state[1:]), slot, slot, slot, toks)
    with pytest.raises(InputError, match=r"src_page: on meta, but slot is on cpu"):
        torch.ops.replayssm.step(a.key, a.state, slot, slot.to("meta"), slot, toks)
    meta_token = [toks[0].to("meta")] + list(toks[1:])
    with pytest.raises(InputError, match=r"tokens\[0\]: on meta, but slot is on cpu"):
        torch.ops.replayssm.step(a.key, a.state, slot, slot, slot, meta_token)
    with pytest.raises(InputError, match=r"tokens\[0\]: on meta, but slot is on cpu"):
        torch.ops.replayssm.verify(a.key, a.state, slot, slot, slot, torch.ones_like(slot),
                                   [t.unsqueeze(1) for t in meta_token])
    assert a.fills().tolist()[:2] == [0, 0]  # nothing ran, and no verify is pending
    on_meta = [t.to("meta") for t in a.state]  # all on meta (shape inference): shapes only
    out = torch.ops.replayssm.step(a.key, on_meta, slot.to("meta"), slot.to("meta"), slot.to("meta"),
                                   [t.to("meta") for t in toks])
    assert out.device.type == "meta" and tuple(out.shape) == (2, SHAPE.heads, SHAPE.v_dim)
    strided = [torch.zeros(3, 4, 32, 16).transpose(-1, -2)] + list(a.state[1:])  # the right shape, not contiguous
    with pytest.raises(InputError, match=r"state\[0\] \(checkpoint\): must be contiguous"):
        torch.ops.replayssm.step(a.key, strided, slot, slot, slot, toks)
    assert all(torch.equal(x, y) for x, y in zip(before, b.state))


def test_slot_of_a_larger_cache_is_refused():
    small, _, rng = _pair(seed=9, slots=3)
    toks = small.tokens(_t(random_tokens(DECL, SHAPE, rng, (1,))))
    slot = torch.tensor([5], dtype=torch.int32)  # a slot of a cache with more slots
    with pytest.raises(InputError, match=r"slots\[0\] = 5 is out of range \[0, 3\)"):
        torch.ops.replayssm.step(small.key, small.state, slot, slot, slot, toks)
    with pytest.raises(InputError, match=r"slot: expected a 1-D integer tensor on cpu, got \[1\] torch.float32"):
        torch.ops.replayssm.step(small.key, small.state, slot.float(), slot, slot, toks)


@pytest.mark.parametrize("states, message", [
    (torch.zeros(2, 4, 16, 32, dtype=torch.float64), r"got \[2, 4, 16, 32\] torch.float64"),
    (torch.zeros(2, 4, 32, 16), r"got \[2, 4, 32, 16\] torch.float32"),  # FLA's [.., K, V], not [.., V, K]
    (torch.zeros(3, 4, 16, 32), r"got \[3, 4, 16, 32\] torch.float32"),
])
def test_load_refuses_a_state_of_the_wrong_shape_or_dtype(states, message):
    tc, _, _ = _pair(seed=10)
    idx = torch.arange(2, dtype=torch.int32)
    before = tc.state[0].clone()
    with pytest.raises(InputError, match=r"states: expected \[2, 4, 16, 32\] \(\[B, HV, V, K\]\) torch.float32 on "
                                         r"cpu, " + message):
        torch.ops.replayssm.load(tc.key, tc.state, idx, idx, states)
    assert torch.equal(before, tc.state[0])


def test_bf16_token_tensors_go_through_the_operators():
    """A declaration whose tokens arrive as bf16 takes torch bf16 tensors as they are; the outputs equal
    the cache's on the same values (and with records that keep the bf16 inputs)."""
    decl = variants.get("kda").with_token_dtype("bfloat16")
    config = ReplayConfig(window=4, max_drafts=3, record_dtype="bfloat16")
    rng = np.random.default_rng(4)
    params = random_params(decl, SHAPE, rng)
    tc = TorchReplayCache(decl, SHAPE, config, slots=2, params=params)
    ref = CpuReplayCache(decl, SHAPE, config, slots=2, params=params, precision="float32")
    states = random_state(SHAPE, rng, (2,)).astype(np.float32)
    idx = torch.arange(2, dtype=torch.int32)
    torch.ops.replayssm.load(tc.key, tc.state, idx, idx, torch.tensor(states))
    ref.load([0, 1], states)
    for _ in range(6):
        toks = random_tokens(decl, SHAPE, rng, (2,))
        bf = {k: torch.tensor(v, dtype=torch.float32).to(torch.bfloat16) for k, v in toks.items()}
        out = torch.ops.replayssm.step(tc.key, tc.state, idx, idx, idx, tc.tokens(bf))
        want = ref.step([0, 1], toks)
        assert np.isfinite(out.numpy()).all()
        np.testing.assert_array_equal(out.numpy(), want)


@pytest.mark.parametrize("wrong", ["slot", "drafts"])
def test_cpu_commit_refuses_rows_or_draft_counts_its_verify_was_not_given(wrong):
    tc, _, rng = _pair(seed=5)
    slot, drafts = torch.tensor([2, 0, -1], dtype=torch.int32), torch.tensor([3, 2, 1], dtype=torch.int32)
    torch.ops.replayssm.verify(tc.key, tc.state, slot, slot, slot, drafts,
                               tc.tokens(_t(random_tokens(DECL, SHAPE, rng, (3, 3)))))
    fills = tc.fills().copy()
    other_slot = torch.tensor([1, 0, -1], dtype=torch.int32) if wrong == "slot" else slot
    other_drafts = torch.tensor([1, 2, 1], dtype=torch.int32) if wrong == "drafts" else drafts
    with pytest.raises(InputError, match=rf"^{wrong}: .* is not the last verify's"):
        torch.ops.replayssm.commit(tc.key, tc.state, other_slot, other_drafts, torch.tensor([1, 1, 0], dtype=torch.int32))
    assert np.array_equal(tc.fills(), fills), "a refused commit moves no fill"
    torch.ops.replayssm.commit(tc.key, tc.state, slot, torch.tensor([3, 2, 0], dtype=torch.int32),
                               torch.tensor([1, 1, 0], dtype=torch.int32))  # a padded row's count aside
    assert np.array_equal(tc.fills()[[2, 0]], fills[[2, 0]] + 1)


def test_a_collected_cache_is_forgotten_with_its_key():
    """The operators' registry holds no cache alive: once a ``TorchReplayCache`` is collected its key
    names nothing and its tensors' addresses belong to no cache (a new tensor there is not refused)."""
    import gc
    import weakref
    from replayssm_dsl.runtime import torch_ops
    tc, _, _ = _pair(slots=2)
    key, gone = tc.key, weakref.ref(tc)
    addresses = {torch_ops._address(t) for t in tc.state}
    del tc
    gc.collect()
    assert gone() is None, "something still holds the cache"
    assert key not in torch_ops._CACHES
    assert not addresses & set(torch_ops._OWNERS), "a collected cache still owns addresses"
    slot = torch.zeros(1, dtype=torch.int32)
    with pytest.raises(KeyError, match="a collected cache's key is forgotten"):
        torch.ops.replayssm.materialize(key, [], slot, slot)


@pytest.mark.parametrize("count", [0, 4, 6])
def test_step_and_verify_take_one_tensor_per_token_input(count):
    tc, _, rng = _pair(slots=2)
    slot = torch.tensor([0, 1], dtype=torch.int32)
    drafts = torch.tensor([2, 2], dtype=torch.int32)
    step = tc.tokens(_t(random_tokens(DECL, SHAPE, rng, (2,))))
    draft = tc.tokens(_t(random_tokens(DECL, SHAPE, rng, (2, 2))))
    fills = tc.fills()
    for given, call in ((step, lambda t: torch.ops.replayssm.step(tc.key, tc.state, slot, slot, slot, t)),
                        (draft, lambda t: torch.ops.replayssm.verify(tc.key, tc.state, slot, slot, slot, drafts, t))):
        tokens = (given + given)[:count]
        with pytest.raises(InputError, match=rf"tokens: expected 5 tensors \(\['q', 'k', 'v', 'a', 'b'\], in this "
                                             rf"order\), got {count}"):
            call(tokens)
    assert np.array_equal(tc.fills(), fills)
