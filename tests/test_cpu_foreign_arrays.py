"""Runtime layer tests: arrays the CPU cache cannot read as host arrays (a GPU array, a torch tensor on
the meta device) are refused naming the argument, before any kernel runs; a CPU torch tensor that
records gradients is read by its values.

The verify case matters most: verify folds a full buffer (``flush_for_verify``) before the kernel
that reads the tokens, so a token that fails only when read would leave the fold done and the fill
unmoved, counting those records twice. ``refused`` checks every buffer bit for bit.
"""

from __future__ import annotations

import numpy as np
import pytest

from busy_cache import SHAPE, Busy, refused
from replayssm_dsl.errors import InputError
from replayssm_dsl.random_inputs import random_params
from replayssm_dsl.runtime.cpu_cache import CpuReplayCache


class LooksLikeAGpuArray:
    """What a CuPy array or torch CUDA tensor shows the checks: shape, dtype, a CUDA device, the CUDA
    array interface; reading it on the host fails, as CuPy's implicit conversion does."""

    def __init__(self, host: np.ndarray):
        self.shape, self.dtype, self.device = host.shape, host.dtype, "cuda:0"
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": host.dtype.str, "data": (0, False),
                                         "version": 3}

    def __array__(self, *args, **kwargs):
        raise TypeError("Implicit conversion to a NumPy array is not allowed")


class SharesGpuMemoryOnly:
    """An array known only by its CUDA array interface (no ``device`` attribute), as Numba's are."""

    def __init__(self, host: np.ndarray):
        self.shape, self.dtype = host.shape, host.dtype
        self.__cuda_array_interface__ = {"shape": host.shape, "typestr": host.dtype.str, "data": (0, False),
                                         "version": 3}


@pytest.fixture
def busy():
    return Busy()


def _to_a_folding_fill(busy, slot: int = 3):
    """Slot 3 from fill 3 to 6 by a verify of 3 committed whole: a verify of 3 more must fold first."""
    toks = busy.tokens(1, 3)
    busy.cache.verify([slot], toks, [3])
    busy.cache.commit([3])
    assert busy.cache.fills()[slot] == 6 and 6 + 3 > busy.config.capacity


@pytest.mark.parametrize("name", ["q", "v", "a"])
def test_a_gpu_token_given_to_verify_is_refused_before_its_fold(busy, name):
    _to_a_folding_fill(busy)
    toks = busy.tokens(2, 3)
    toks[name] = LooksLikeAGpuArray(toks[name])
    with refused(busy.cache, InputError, f"tokens[{name!r}]", "is on cuda, expected cpu", exact=True):
        busy.cache.verify([3, 0], toks, [3, 2])


@pytest.mark.parametrize("kind", [LooksLikeAGpuArray, SharesGpuMemoryOnly])
@pytest.mark.parametrize("op", ["step", "conventional_step"])
def test_a_gpu_token_given_to_a_step_is_refused(busy, op, kind):
    toks = busy.tokens(2)
    toks["k"] = kind(toks["k"])
    with refused(busy.cache, InputError, "tokens['k']", "expected cpu", exact=True):
        getattr(busy.cache, op)([0, 1], toks)


@pytest.mark.parametrize("op", ["load", "load_conventional"])
def test_gpu_states_are_refused(busy, op):
    states = LooksLikeAGpuArray(np.zeros((1, SHAPE.heads, SHAPE.v_dim, SHAPE.k_dim)))
    with refused(busy.cache, InputError, "states", "expected cpu", exact=True):
        getattr(busy.cache, op)([2], states)


def test_a_gpu_param_is_refused_at_construction(busy):
    params = random_params(busy.decl, SHAPE, np.random.default_rng(1))
    params["A_log"] = LooksLikeAGpuArray(np.asarray(params["A_log"]))
    with pytest.raises(InputError, match=r"params\['A_log'\]: is on cuda, expected cpu"):
        CpuReplayCache(busy.decl, SHAPE, busy.config, slots=2, params=params)


def test_torch_tensors_on_the_meta_device_are_refused(busy):
    torch = pytest.importorskip("torch")
    _to_a_folding_fill(busy)
    toks = busy.tokens(1, 3)
    toks["k"] = torch.empty(toks["k"].shape, device="meta")
    with refused(busy.cache, InputError, "tokens['k']", "is on meta, expected cpu", exact=True):
        busy.cache.verify([3], toks, [3])
    with refused(busy.cache, InputError, "states", "is on meta", exact=True):
        busy.cache.load([1], torch.empty((1, SHAPE.heads, SHAPE.v_dim, SHAPE.k_dim), device="meta"))


def test_torch_tensors_that_record_gradients_are_read_by_their_values():
    torch = pytest.importorskip("torch")
    one, other = Busy(seed=4), Busy(seed=4)  # the same caches and the same random stream
    for busy in (one, other):
        _to_a_folding_fill(busy)
    toks = one.tokens(2, 3)
    assert np.array_equal(toks["q"], other.tokens(2, 3)["q"])
    want = other.cache.verify([3, 1], toks, [3, 1])
    given = {k: torch.tensor(v, dtype=torch.float64, requires_grad=True) for k, v in toks.items()}
    got = one.cache.verify([3, 1], given, [3, 1])
    np.testing.assert_array_equal(got, want)
    one.cache.commit([2, 1])
    other.cache.commit([2, 1])
    np.testing.assert_array_equal(one.cache.materialize([0, 1, 2, 3]), other.cache.materialize([0, 1, 2, 3]))


@pytest.mark.parametrize("as_tensor", [
    lambda torch, v: torch.tensor(v, dtype=torch.float64, requires_grad=True),
    lambda torch, v: torch.tensor(v, dtype=torch.bfloat16),
], ids=["requires_grad", "bfloat16"])
def test_torch_params_are_read_by_their_values(as_tensor):
    """Params given as CPU torch tensors (recording gradients, or bf16, which NumPy cannot hold) build
    the cache that their values, as NumPy float64, build: the same outputs bit for bit. One on the
    meta device is refused naming it."""
    torch = pytest.importorskip("torch")
    busy = Busy(seed=5)
    given = {k: as_tensor(torch, v) for k, v in busy.params.items()}
    values = {k: t.detach().double().numpy() for k, t in given.items()}
    one, other = (CpuReplayCache(busy.decl, SHAPE, busy.config, slots=2, params=p) for p in (given, values))
    toks = busy.tokens(2)
    np.testing.assert_array_equal(one.step([0, 1], toks), other.step([0, 1], toks))
    meta = {**given, "A_log": torch.empty(given["A_log"].shape, device="meta")}
    with pytest.raises(InputError, match=r"params\['A_log'\]: its values cannot be read on the host"):
        CpuReplayCache(busy.decl, SHAPE, busy.config, slots=2, params=meta)
