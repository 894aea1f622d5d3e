"""Engine-style runs: requests join, fork, decode, speculate and leave through ``ReplayEngine``
(the Cython slot pool + a replay cache); every request must get exactly the outputs of decoding it
alone with the float64 oracle, and the pool's host mirror must equal the device fills throughout."""

from __future__ import annotations

import re

import numpy as np
import pytest

from replayssm_dsl import ModelShape, ReplayConfig, variants
from replayssm_dsl.errors import InputError
from replayssm_dsl.random_inputs import random_params, random_state, random_tokens
from replayssm_dsl.reference import plain_recurrence
from replayssm_dsl.runtime.bookkeeping import PySlotPool, SlotPool
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache
from replayssm_dsl.runtime.engine import ReplayEngine
from twin import assert_close


def _cuda_cache():
    from replayssm_dsl.runtime.cuda_cache import CudaReplayCache
    return CudaReplayCache


BACKENDS = [pytest.param("cpu", 1e-9, id="cpu"), pytest.param("cuda", 2e-4, id="cuda", marks=pytest.mark.gpu)]


def pool_view(engine) -> tuple:
    """What the pool holds: live slots, their pages and fills, the free counts."""
    pool = engine.pool
    live = [int(s) for s in pool.live_slots()]
    return (live, [pool.page_of(s) for s in live], [pool.fill_of(s) for s in live],
            pool.free_slot_count(), pool.free_page_count())


def refuse_one(engine, decl, shape, config, rng, live) -> str:
    """A bad call of a random kind: the engine raises InputError naming it and the pool and the cache
    are as they were, so the next good call is served (``run_engine`` checks its outputs)."""
    before, fills = pool_view(engine), engine.cache.fills()
    kind = str(rng.choice(["nan_state", "nan_token", "nan_draft", "short_tokens", "float_requests"]))
    n = len(live)
    toks = random_tokens(decl, shape, rng, (n,))
    drafts_toks = random_tokens(decl, shape, rng, (n, config.max_drafts))
    name = next(s.name for s in decl.inputs if s.kind == "token")
    calls = {
        "nan_state": (lambda: engine.add(np.full((shape.heads, shape.v_dim, shape.k_dim), np.nan)), "states"),
        "nan_token": (lambda: engine.step(live, {**toks, name: np.full_like(toks[name], np.nan)},
                                          batch_size=n + 1), f"tokens[{name!r}]"),
        "nan_draft": (lambda: engine.verify(live, {**drafts_toks, name: drafts_toks[name] * np.inf}, [1] * n),
                      f"tokens[{name!r}]"),
        "short_tokens": (lambda: engine.step(live, {k: v[:n - 1] for k, v in toks.items()}, batch_size=n + 2),
                         "expected shape"),
        "float_requests": (lambda: engine.step(np.array(live, float), toks), "requests"),
    }
    call, fragment = calls[kind]
    if (n == 0 and kind != "nan_state") or (kind == "nan_state" and engine.pool.free_slot_count() == 0):
        return "skipped"
    with pytest.raises(InputError, match=re.escape(fragment)):
        call()
    assert pool_view(engine) == before and np.array_equal(engine.cache.fills(), fills), f"{kind} changed the pool"
    return kind


def run_engine(backend, tol, pool_cls, variant, seed, rounds, slots=8, refusals=False):
    decl, shape = variants.get(variant), ModelShape(4, 2, 24, 32)
    config = ReplayConfig(window=4, max_drafts=3)
    rng = np.random.default_rng(seed)
    params = random_params(decl, shape, rng)
    cache_cls = CpuReplayCache if backend == "cpu" else _cuda_cache()
    engine = ReplayEngine(cache_cls, decl, shape, config, slots=slots, params=params, pool_cls=pool_cls)
    oracle = {}  # slot -> float64 state of the request living there

    def oracle_run(slot, toks):
        return plain_recurrence(decl, shape, toks, params, oracle[slot])

    for r in range(rounds):
        live = [int(s) for s in engine.pool.live_slots()]
        if refusals and rng.integers(0, 3) == 0:
            refuse_one(engine, decl, shape, config, rng, live)
        action = rng.choice(["add", "fork", "finish", "step", "step", "step", "verify"])
        if action == "add" and engine.pool.free_slot_count() > 0:
            state = random_state(shape, rng)
            oracle[engine.add(state.astype(np.float32) if backend == "cuda" else state)] = state
        elif action == "fork" and live and engine.pool.free_slot_count() > 0:
            parent = int(rng.choice(live))
            oracle[engine.fork(parent)] = oracle[parent].copy()
        elif action == "finish" and len(live) > 2:
            slot = int(rng.choice(live))
            engine.finish(slot)
            del oracle[slot]
        elif action == "step" and live:
            req = list(rng.permutation(live))
            toks = random_tokens(decl, shape, rng, (len(req),))
            out = engine.step(req, toks, batch_size=len(req) + int(rng.integers(0, 3)))
            for i, slot in enumerate(req):
                o, oracle[slot] = oracle_run(slot, {k: v[i:i + 1] for k, v in toks.items()})
                assert_close(out[i], o[0], tol, f"round {r} step slot {slot}")
        elif action == "verify" and live:
            req = list(rng.permutation(live))
            drafts = rng.integers(1, config.max_drafts + 1, len(req))
            toks = random_tokens(decl, shape, rng, (len(req), config.max_drafts))
            out = engine.verify(req, toks, drafts, batch_size=len(req) + 1)
            accepted = [int(rng.integers(0, d + 1)) for d in drafts]
            for i, slot in enumerate(req):
                o, _ = oracle_run(slot, {k: v[i, :drafts[i]] for k, v in toks.items()})
                assert_close(out[i, :drafts[i]], o, tol, f"round {r} verify slot {slot}")
            engine.accept(accepted)
            for i, slot in enumerate(req):
                if accepted[i]:
                    _, oracle[slot] = oracle_run(slot, {k: v[i, :accepted[i]] for k, v in toks.items()})
        live = [int(s) for s in engine.pool.live_slots()]
        fills = engine.cache.fills()
        assert [engine.pool.fill_of(s) for s in live] == [int(fills[s]) for s in live], "host mirror != device fills"
    live = [int(s) for s in engine.pool.live_slots()]
    got = engine.materialize(live[::-1])
    for i, slot in enumerate(live[::-1]):
        assert_close(got[i], oracle[slot], tol, f"final state slot {slot}")


@pytest.mark.parametrize("backend,tol", BACKENDS)
@pytest.mark.parametrize("variant", ["gdn", "mamba2", "kda"])
def test_engine_run_matches_each_request_decoded_alone(backend, tol, variant):
    run_engine(backend, tol, SlotPool, variant, seed=sum(map(ord, variant)), rounds=150 if backend == "cpu" else 400)


@pytest.mark.parametrize("pool_cls", [SlotPool, PySlotPool], ids=["cython", "python"])
def test_engine_runs_with_either_pool(pool_cls):
    run_engine("cpu", 1e-9, pool_cls, "gla", seed=3, rounds=120)


@pytest.mark.parametrize("pool_cls", [SlotPool, PySlotPool], ids=["cython", "python"])
def test_refused_calls_leave_the_engine_serving_every_request(pool_cls):
    """Bad states, NaN tokens and drafts, tokens for fewer rows than requests, float requests: each is
    refused by the cache or the engine before any kernel runs, the pool drops what it had built, and
    every later output and final state still equals the oracle's."""
    run_engine("cpu", 1e-9, pool_cls, "gdn", seed=11, rounds=120, refusals=True)


@pytest.mark.parametrize("backend,tol", BACKENDS)
def test_materialize_reads_each_request_from_its_own_page_after_copy_on_write(backend, tol):
    """A parent and its fork share a page until the parent's flush moves it to a fresh one: the
    engine's materialize reads each request from the page the pool has for it (the cache's own default,
    page = slot, would read the parent's new page for the fork)."""
    decl, shape, config = variants.get("gdn"), ModelShape(4, 2, 16, 32), ReplayConfig(window=4, max_drafts=3)
    rng = np.random.default_rng(5)
    params = random_params(decl, shape, rng)
    cache_cls = CpuReplayCache if backend == "cpu" else _cuda_cache()
    engine = ReplayEngine(cache_cls, decl, shape, config, slots=2, params=params)
    state = random_state(shape, rng).astype(np.float32)
    parent = engine.add(state)
    child = engine.fork(parent)
    oracle = {parent: state.astype(np.float64), child: state.astype(np.float64)}
    for _ in range(config.window):  # the parent's buffer fills and flushes into a fresh page
        toks = random_tokens(decl, shape, rng, (1,))
        engine.step([parent], toks)
        _, oracle[parent] = plain_recurrence(decl, shape, toks, params, oracle[parent])
    assert engine.pool.page_of(parent) != engine.pool.page_of(child) != child  # page = slot would misread the fork
    got = engine.materialize([child, parent])
    assert_close(got[0], oracle[child], tol, "the fork's state")
    assert_close(got[1], oracle[parent], tol, "the parent's state, from its new page")


@pytest.mark.parametrize("call, fragment", [
    (lambda e, s, toks: e.step([s], toks, batch_size=0), "batch_size: expected an int >= 1"),
    (lambda e, s, toks: e.step([s], toks, batch_size=1.5), "batch_size"),
    (lambda e, s, toks: e.step([], toks), "requests: empty batch"),
    (lambda e, s, toks: e.materialize([s, s + 1]), f"requests[1] = 1 is not an allocated slot"),
    (lambda e, s, toks: e.materialize([]), "requests: empty batch"),
    (lambda e, s, toks: e.materialize([s, s]), "requests: slot 0 appears twice"),
    (lambda e, s, toks: e.materialize([s, 9]), "requests[1] = 9 is not an allocated slot"),
    (lambda e, s, toks: e.materialize([-1]), "requests[0] = -1 is not an allocated slot"),
    (lambda e, s, toks: e.add(np.zeros((4, 8, 9))), "state: expected shape [4, 8, 8], got [4, 8, 9]"),
    (lambda e, s, toks: e.add(np.zeros((1, 4, 8, 8))), "state: expected shape [4, 8, 8], got [1, 4, 8, 8]"),
    (lambda e, s, toks: e.add([[0.0]]), "state: expected an array (NumPy, CuPy or torch) of shape [4, 8, 8], got list"),
])
def test_engine_refuses_a_bad_batch_naming_its_argument(call, fragment):
    decl, shape, config = variants.get("gdn"), ModelShape(4, 2, 8, 8), ReplayConfig(window=4, max_drafts=3)
    rng = np.random.default_rng(2)
    engine = ReplayEngine(CpuReplayCache, decl, shape, config, slots=2, params=random_params(decl, shape, rng))
    slot = engine.add(random_state(shape, rng))
    before, fills = pool_view(engine), engine.cache.fills()
    with pytest.raises(InputError, match=re.escape(fragment)):
        call(engine, slot, random_tokens(decl, shape, rng, (1,)))
    assert pool_view(engine) == before and np.array_equal(engine.cache.fills(), fills)


@pytest.mark.parametrize("pool_cls", [SlotPool, PySlotPool], ids=["cython", "python"])
def test_a_fork_whose_copy_is_refused_gives_the_child_back(pool_cls, monkeypatch):
    """``fork`` takes a child slot from the pool, then has the cache copy the parent's records: if the
    cache refuses, the child and its share of the parent's page go back (no slot leaks, no page stays
    shared), and the engine forks as before afterwards."""
    decl, shape, config = variants.get("gdn"), ModelShape(4, 2, 8, 8), ReplayConfig(window=4, max_drafts=3)
    rng = np.random.default_rng(6)
    engine = ReplayEngine(CpuReplayCache, decl, shape, config, slots=3, params=random_params(decl, shape, rng),
                          pool_cls=pool_cls)
    parent = engine.add(random_state(shape, rng))
    engine.step([parent], random_tokens(decl, shape, rng, (1,)))
    before, refcount = pool_view(engine), engine.pool.refcount_of(engine.pool.page_of(parent))

    def refuse(parent, child):
        raise InputError("child: refused")
    with monkeypatch.context() as patch:
        patch.setattr(engine.cache, "copy_records", refuse)
        with pytest.raises(InputError, match="child: refused"):
            engine.fork(parent)
    assert pool_view(engine) == before
    assert engine.pool.refcount_of(engine.pool.page_of(parent)) == refcount
    child = engine.fork(parent)
    got = engine.materialize([parent, child])
    assert np.array_equal(got[0], got[1])

def test_cpu_torch_tokens_are_padded_like_numpy_ones():
    """With ``batch_size`` above the requests, host tokens are padded to the batch: CPU torch tensors
    (host arrays too) as NumPy ones, with the same outputs."""
    torch = pytest.importorskip("torch")
    decl, shape, config = variants.get("gdn"), ModelShape(4, 2, 8, 8), ReplayConfig(window=4, max_drafts=3)
    rng = np.random.default_rng(8)
    params, state = random_params(decl, shape, rng), random_state(shape, rng)
    engines = [ReplayEngine(CpuReplayCache, decl, shape, config, slots=2, params=params) for _ in range(2)]
    slots = [engine.add(state) for engine in engines]
    for _ in range(config.window + 1):  # through a flush
        toks = random_tokens(decl, shape, rng, (1,))
        want = engines[0].step([slots[0]], toks, batch_size=2)
        got = engines[1].step([slots[1]], {k: torch.tensor(v) for k, v in toks.items()}, batch_size=2)
        np.testing.assert_array_equal(got, want)

def test_accept_checks_its_count_and_takes_one_verify_once():
    """``accept`` with more counts than the verify had requests, or with no verify pending, is refused
    naming it; the engine then accepts the right count as if nothing had happened."""
    decl, shape, config = variants.get("gdn"), ModelShape(4, 2, 8, 8), ReplayConfig(window=4, max_drafts=3)
    rng = np.random.default_rng(4)
    engine = ReplayEngine(CpuReplayCache, decl, shape, config, slots=2, params=random_params(decl, shape, rng))
    slots = [engine.add(random_state(shape, rng)) for _ in range(2)]
    with pytest.raises(InputError, match="accept: no verify to accept"):
        engine.accept([0, 0])
    engine.verify(slots, random_tokens(decl, shape, rng, (2, 2)), [2, 2])
    before, fills = pool_view(engine), engine.cache.fills()
    with pytest.raises(InputError, match=r"accepted: length 3"):
        engine.accept([0, 0, 0])
    assert pool_view(engine) == before and np.array_equal(engine.cache.fills(), fills)
    engine.accept([1, 2])
    assert engine.cache.fills()[slots].tolist() == [1, 2]
    with pytest.raises(InputError, match="accept: no verify to accept"):
        engine.accept([1, 2])
