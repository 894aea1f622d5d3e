"""Runtime layer: PyTorch custom operators over a replay cache (torch is optional; import this module
only where it is installed).

``TorchReplayCache`` owns a CPU or CUDA replay cache and exposes its state (checkpoint pages, record
buffers, fills; ``.names`` lists them) as torch tensors that share the cache's memory. The operators
find the cache by its ``key`` while the ``TorchReplayCache`` is alive (keep it, e.g. on the module
that holds its ``.state``); once it is collected its key and tensors are forgotten. The operators

    torch.ops.replayssm.step(key, state, slot, src_page, dst_page, tokens) -> out [B, HV, V]
    torch.ops.replayssm.verify(key, state, slot, src_page, dst_page, drafts, tokens) -> out [B, T, HV, V]
    torch.ops.replayssm.commit(key, state, slot, drafts, accepted) -> ()
    torch.ops.replayssm.load(key, state, slot, dst_page, states) -> ()
    torch.ops.replayssm.materialize(key, state, slot, src_page) -> [B, HV, V, K]

declare the state tensors they change (``mutates_args``) and have fake implementations, so
``torch.compile`` can trace a model that calls them. ``key`` names the cache (a string: operators take
no Python objects); ``tokens`` are the declaration's token inputs in declaration order. Batch arrays
on the GPU go straight to the kernels (no host work: capturable in a CUDA graph); on the CPU they are
checked like any other call.
"""

from __future__ import annotations

import contextlib
import itertools
import weakref

import numpy as np
import torch

from replayssm_dsl.errors import InputError
from .validation import check_aligned

_CACHES = weakref.WeakValueDictionary()  # key -> TorchReplayCache, while the cache is alive
_KEYS = itertools.count()
_OWNERS: dict = {}  # storage address of every live cache's state tensor -> (key, buffer name)


def _forget(key: str, addresses: list) -> None:
    """A collected cache's state addresses, which new tensors may reuse (its key left with it)."""
    for address in addresses:
        if _OWNERS.get(address, (None,))[0] == key:
            del _OWNERS[address]


def _address(tensor: torch.Tensor) -> int:
    return tensor.untyped_storage().data_ptr()


def _numpy(tensor: torch.Tensor) -> np.ndarray:
    return tensor.detach().numpy()


class TorchReplayCache:
    """A replay cache whose buffers are torch tensors (``.state``), driven through ``torch.ops.replayssm``."""

    def __init__(self, decl, shape, config, *, slots: int, params: dict, device="cpu", pages: int | None = None):
        device = torch.device(device)
        # host tensors as they are: the cache reads their values (bf16, requires_grad) and names a meta one
        params = {k: (v.cpu() if isinstance(v, torch.Tensor) and v.is_cuda else v) for k, v in params.items()}
        if device.type == "cuda":
            from .cuda_cache import CudaReplayCache
            self.cache = CudaReplayCache(decl, shape, config, slots=slots, params=params, pages=pages)
            wrap = torch.from_dlpack
        else:
            from .cpu_cache import CpuReplayCache
            self.cache = CpuReplayCache(decl, shape, config, slots=slots, params=params, pages=pages,
                                        precision="float32")
            wrap = torch.from_numpy
        self.key = f"cache{next(_KEYS)}"
        _CACHES[self.key] = self
        self.device = device
        self.names = [b.name for b in self.cache.program.buffers
                      if b.role in ("state", "record", "meta") and b.name in self.cache.buffers]
        self.state = [wrap(self.cache.buffers[name]) for name in self.names]  # shared memory, no copies
        _OWNERS.update({_address(t): (self.key, name) for name, t in zip(self.names, self.state)})
        weakref.finalize(self, _forget, self.key, [_address(t) for t in self.state])
        # The operators bind the cache to whatever state tensors they are given, so the tensors are
        # the truth: keep ``self.state`` (e.g. as module buffers) and pass it to every call.
        self.token_names = [s.name for s in decl.inputs if s.kind == "token"]
        self.shape = shape
        self._verified = None  # the last verify's (src_page, dst_page, T), which its commit is checked against

    def fills(self) -> np.ndarray:
        return self.state[self.names.index("fill")].cpu().numpy().copy()

    def tokens(self, tokens: dict) -> list:
        return [tokens[name] for name in self.token_names]

    def _host_or_device_batch(self, **arrays):
        if self.device.type == "cuda":
            import cupy as cp
            return {k: cp.asarray(v.to(torch.int32).contiguous()) for k, v in arrays.items()}
        return {k: _numpy(v).astype(np.int32) for k, v in arrays.items()}


def _bind(c: TorchReplayCache, state: list) -> None:
    if len(state) != len(c.names):
        raise InputError(f"state: expected {len(c.names)} tensors ({c.names}), got {len(state)}")
    for i, (name, own, given) in enumerate(zip(c.names, c.state, state)):
        owner = _OWNERS.get(_address(given))
        if owner is not None and owner != (c.key, name):
            raise InputError(f"state[{i}]: is {owner[1]!r} of replay cache {owner[0]!r}, but key {c.key!r} needs its "
                             f"own {name!r} (pass each cache's .state with its .key)")
        if given.shape != own.shape or given.dtype != own.dtype or given.device.type != own.device.type:
            raise InputError(f"state[{i}] ({name}): expected {list(own.shape)} {own.dtype} on {own.device.type}, got "
                             f"{list(given.shape)} {given.dtype} on {given.device.type}")
        if not given.is_contiguous():
            raise InputError(f"state[{i}] ({name}): must be contiguous, got strides {list(given.stride())}")
        if given.device.type == "cuda":
            check_aligned(given.data_ptr(), f"state[{i}] ({name})", "the kernels use 16-byte loads")
    if c.device.type == "cuda":
        import cupy as cp
        # __cuda_array_interface__, not DLPack: DLPack's exchange makes CuPy's stream wait on torch's,
        # which a CUDA-graph capture refuses; the kernels run on torch's stream anyway (``_cache``).
        c.cache.buffers.update({n: cp.asarray(t.detach()) for n, t in zip(c.names, state)})
    else:
        c.cache.buffers.update({n: _numpy(t) for n, t in zip(c.names, state)})


def _check_index(c: TorchReplayCache, **tensors) -> None:
    """Batch index tensors: 1-D integers on the cache's device. Their values are checked by the CPU cache;
    on the GPU they go to the kernels with no host sync, and a kernel skips a row whose slot or page is
    outside the cache (it touches no memory and leaves that row's output unwritten)."""
    for name, t in tensors.items():
        if t.ndim != 1 or t.is_floating_point() or t.is_complex() or t.device.type != c.device.type:
            raise InputError(f"{name}: expected a 1-D integer tensor on {c.device.type}, got {list(t.shape)} "
                             f"{t.dtype} on {t.device.type}")


@contextlib.contextmanager
def _cache(key: str, state: list):
    """The cache called ``key`` with its buffers bound to the ``state`` tensors the operator was given
    (under torch.compile these are functionalised copies: the kernels must write to them), bound
    back to the cache's own tensors afterwards."""
    c = _CACHES.get(key)
    if c is None:
        raise KeyError(f"key: no replay cache {key!r} (create a TorchReplayCache first, and keep it while its "
                       "key is used: a collected cache's key is forgotten)")
    with _on_torch_stream(c):
        _bind(c, state)
        try:
            yield c
        finally:
            _bind(c, c.state)


@contextlib.contextmanager
def _on_torch_stream(c: TorchReplayCache):
    """On the GPU, CuPy's current stream is torch's current stream while an operator runs (also while
    capturing a graph): kernels launch there, and DLPack exchanges add no wait on another stream
    (a capture refuses one on the legacy stream)."""
    if c.device.type != "cuda":
        yield
        return
    from .cuda_module import as_cupy_stream
    c.cache.stream = torch.cuda.current_stream(c.device)
    with as_cupy_stream(c.cache.stream):
        yield


def _check_token_list(c: TorchReplayCache, tokens: list) -> None:
    """One tensor per declared token input, in declaration order (``TorchReplayCache.tokens``)."""
    if len(tokens) != len(c.token_names):
        raise InputError(f"tokens: expected {len(c.token_names)} tensors ({c.token_names}, in this order), "
                         f"got {len(tokens)}")


def _named(c: TorchReplayCache, tokens) -> dict:
    """Tokens by name: CUDA tensors as they are (bf16 ones too: the cache reads their bits), CPU ones
    as NumPy (a bf16 tensor as the float32 values of its bf16, which NumPy cannot hold)."""
    def host(t):
        return _numpy(t.float() if t.dtype == torch.bfloat16 else t)
    return {name: t.contiguous() if c.device.type == "cuda" else host(t) for name, t in zip(c.token_names, tokens)}


def _fake_devices_agree(slot: torch.Tensor, state: list, tokens: list = (), **others) -> None:
    """Fake implementations serve torch.compile's fake tensors and the meta device. A real ``slot`` with
    a meta tensor among the state, index or token tensors dispatches here too, and would return an empty
    real tensor as if computed: refuse it, naming the tensor (all on meta, shape inference, is fine). The
    real implementations need these tensors on the cache's device anyway (``_bind``, ``_check_index``)."""
    named = ([(f"state[{i}]", t) for i, t in enumerate(state)] + [(f"tokens[{i}]", t) for i, t in enumerate(tokens)]
             + [(n, t) for n, t in others.items()])
    for name, t in named:
        if t.device.type != slot.device.type:
            raise InputError(f"{name}: on {t.device.type}, but slot is on {slot.device.type}; pass every tensor "
                             "of one call on one device")


@torch.library.custom_op("replayssm::step", mutates_args=("state",))
def step(key: str, state: list[torch.Tensor], slot: torch.Tensor, src_page: torch.Tensor, dst_page: torch.Tensor,
         tokens: list[torch.Tensor]) -> torch.Tensor:
    with _cache(key, state) as c:
        _check_index(c, slot=slot, src_page=src_page, dst_page=dst_page)
        _check_token_list(c, tokens)
        rows = slot.shape[0]
        out = torch.empty((rows, 1, c.shape.heads, c.shape.v_dim), dtype=torch.float32, device=slot.device)
        if c.device.type == "cuda":
            batch = c._host_or_device_batch(slot=slot, src_page=src_page, dst_page=dst_page,
                                            drafts=torch.ones_like(slot), accepted=torch.zeros_like(slot))
            toks = {name: t.unsqueeze(1).contiguous() for name, t in zip(c.token_names, tokens)}
            c.cache.launch_step(batch, toks, out)
        else:
            c.cache.step(_numpy(slot), _named(c, tokens), src_pages=_numpy(src_page), dst_pages=_numpy(dst_page),
                         out=_numpy(out))
        return out[:, 0].clone()


@step.register_fake
def _(key, state, slot, src_page, dst_page, tokens):
    _fake_devices_agree(slot, state, tokens, src_page=src_page, dst_page=dst_page)
    c = _CACHES[key]
    return slot.new_empty((slot.shape[0], c.shape.heads, c.shape.v_dim), dtype=torch.float32)


@torch.library.custom_op("replayssm::verify", mutates_args=("state",))
def verify(key: str, state: list[torch.Tensor], slot: torch.Tensor, src_page: torch.Tensor, dst_page: torch.Tensor,
           drafts: torch.Tensor, tokens: list[torch.Tensor]) -> torch.Tensor:
    with _cache(key, state) as c:
        _check_index(c, slot=slot, src_page=src_page, dst_page=dst_page, drafts=drafts)
        _check_token_list(c, tokens)
        if tokens[0].ndim < 2:
            raise InputError(f"tokens[0] ({c.token_names[0]}): verify tokens are [B, T, ...], got {list(tokens[0].shape)}")
        rows, t = slot.shape[0], tokens[0].shape[1]
        out = torch.empty((rows, t, c.shape.heads, c.shape.v_dim), dtype=torch.float32, device=slot.device)
        if c.device.type == "cuda":
            batch = c._host_or_device_batch(slot=slot, src_page=src_page, dst_page=dst_page, drafts=drafts,
                                            accepted=torch.zeros_like(slot))
            c.cache.launch_verify(batch, {n: x.contiguous() for n, x in zip(c.token_names, tokens)}, out)
            c._verified = (src_page, dst_page, t)
        else:
            c.cache.verify(_numpy(slot), _named(c, tokens), _numpy(drafts), src_pages=_numpy(src_page),
                           dst_pages=_numpy(dst_page), out=_numpy(out))
        return out


@verify.register_fake
def _(key, state, slot, src_page, dst_page, drafts, tokens):
    _fake_devices_agree(slot, state, tokens, src_page=src_page, dst_page=dst_page, drafts=drafts)
    c = _CACHES[key]
    return slot.new_empty((slot.shape[0], tokens[0].shape[1], c.shape.heads, c.shape.v_dim), dtype=torch.float32)


@torch.library.custom_op("replayssm::commit", mutates_args=("state",))
def commit(key: str, state: list[torch.Tensor], slot: torch.Tensor, drafts: torch.Tensor,
           accepted: torch.Tensor) -> None:
    with _cache(key, state) as c:
        _check_index(c, slot=slot, drafts=drafts, accepted=accepted)
        if c.device.type == "cuda":
            # the kernels skip exactly the rows the verify skipped: same pages, same T
            src, dst, t = c._verified if c._verified and c._verified[0].shape == slot.shape else (slot, slot, None)
            batch = c._host_or_device_batch(slot=slot, src_page=src, dst_page=dst, drafts=drafts, accepted=accepted)
            c.cache.launch_commit(batch, t)
        else:
            _check_commit_matches_verify(c.cache, _numpy(slot), _numpy(drafts))
            c.cache.commit(_numpy(accepted))


def _check_commit_matches_verify(cache, slot: np.ndarray, drafts: np.ndarray) -> None:
    """On the CPU the cache commits its last verify's rows: the operator's ``slot`` and ``drafts`` must
    be that verify's (a padded row's draft count aside), as the GPU's kernels assume."""
    verified = cache.pending_verify
    if verified is None:
        return  # commit itself says there is nothing to commit
    if slot.shape != verified["slot"].shape or not np.array_equal(slot, verified["slot"]):
        raise InputError(f"slot: {slot.tolist()} is not the last verify's {verified['slot'].tolist()}; "
                         "commit takes the rows verify was given")
    live = verified["slot"] >= 0
    if drafts.shape != slot.shape or not np.array_equal(drafts[live], verified["drafts"][live]):
        raise InputError(f"drafts: {drafts.tolist()} is not the last verify's {verified['drafts'].tolist()} "
                         "(padded rows aside); commit takes the draft counts verify was given")


@commit.register_fake
def _(key, state, slot, drafts, accepted):
    _fake_devices_agree(slot, state, drafts=drafts, accepted=accepted)
    return None


@torch.library.custom_op("replayssm::load", mutates_args=("state",))
def load(key: str, state: list[torch.Tensor], slot: torch.Tensor, dst_page: torch.Tensor, states: torch.Tensor) -> None:
    with _cache(key, state) as c:
        _check_index(c, slot=slot, dst_page=dst_page)
        s = c.shape
        want = (slot.shape[0], s.heads, s.v_dim, s.k_dim)
        if states.dtype != torch.float32 or tuple(states.shape) != want or states.device.type != c.device.type:
            raise InputError(f"states: expected {list(want)} ([B, HV, V, K]) torch.float32 on {c.device.type}, got "
                             f"{list(states.shape)} {states.dtype} on {states.device.type}")
        value = states.contiguous() if c.device.type == "cuda" else _numpy(states)
        c.cache.load(slot.cpu().numpy(), value, dst_pages=dst_page.cpu().numpy())


@load.register_fake
def _(key, state, slot, dst_page, states):
    _fake_devices_agree(slot, state, dst_page=dst_page, states=states)
    return None


@torch.library.custom_op("replayssm::materialize", mutates_args=())
def materialize(key: str, state: list[torch.Tensor], slot: torch.Tensor, src_page: torch.Tensor) -> torch.Tensor:
    with _cache(key, state) as c:
        _check_index(c, slot=slot, src_page=src_page)
        s = c.shape
        out = torch.empty((slot.shape[0], s.heads, s.v_dim, s.k_dim), dtype=torch.float32, device=slot.device)
        c.cache.materialize(slot.cpu().numpy(), src_pages=src_page.cpu().numpy(),
                            out=out if c.device.type == "cuda" else _numpy(out))
        return out


@materialize.register_fake
def _(key, state, slot, src_page):
    _fake_devices_agree(slot, state, src_page=src_page)
    s = _CACHES[key].shape
    return slot.new_empty((slot.shape[0], s.heads, s.v_dim, s.k_dim), dtype=torch.float32)
