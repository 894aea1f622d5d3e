"""Runtime layer: decode Hugging Face transformers models through the replay cache (torch and
transformers are optional; import this module only where they are installed).

``replay_decoding(model)`` is a context manager: inside it, the decode-time recurrence of every
supported layer runs through a replay cache (the generated CUDA kernels on a GPU, the lowered plans
on the CPU). Prefill runs through the model's own path; at a layer's first decode step its final
state is ``load``-ed as the checkpoint, and from then on the cache holds the truth (the model's own
recurrent state is left as prefill wrote it).

Supported: ``Mamba2ForCausalLM`` (the mixer's ``mamba2_selective_state_update``, vLLM's
conventions, ``z`` gating applied by the model's gated norm). Other models raise ``ValueError``.
"""

from __future__ import annotations

import contextlib

import torch

from replayssm_dsl import ModelShape, ReplayConfig
from replayssm_dsl.variants import mamba2

from .torch_ops import TorchReplayCache

SUPPORTED = ("Mamba2ForCausalLM", "Mamba2Model")


class _Mamba2Layers:
    """One replay cache per Mamba-2 mixer, created at the layer's first decode step."""

    def __init__(self, model, config: ReplayConfig):
        from transformers.models.mamba2 import modeling_mamba2
        self.module, self.config = modeling_mamba2, config
        self.mixers = {m.D.untyped_storage().data_ptr(): m for m in model.modules()
                       if isinstance(m, modeling_mamba2.Mamba2Mixer)}
        self.caches: dict[int, tuple[TorchReplayCache, torch.Tensor]] = {}
        self.original = modeling_mamba2.mamba2_selective_state_update

    def update(self, state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **kwargs):
        mixer = self.mixers.get(D.untyped_storage().data_ptr()) if D is not None else None
        if mixer is None or not dt_softplus:
            return self.original(state, hidden_states, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=dt_softplus,
                                 z=z, **kwargs)
        batch, heads, head_dim = hidden_states.shape
        key = id(mixer)
        if key not in self.caches:
            shape = ModelShape(heads, B.shape[1], head_dim, B.shape[-1])
            params = {"A_log": mixer.A_log.detach().float(), "dt_bias": mixer.dt_bias.detach().float(),
                      "D": mixer.D.detach().float()}
            cache = TorchReplayCache(mamba2(gate=z is not None), shape, self.config, slots=batch, params=params,
                                     device=hidden_states.device)
            slots = torch.arange(batch, dtype=torch.int32, device=hidden_states.device)
            torch.ops.replayssm.load(cache.key, cache.state, slots, slots, state.float().contiguous())
            self.caches[key] = (cache, slots)
        cache, slots = self.caches[key]
        tokens = {"x": hidden_states.float(), "dt": dt[..., 0].float(), "B": B.float(), "C": C.float()}
        if z is not None:
            tokens["z"] = z.float()
        out = torch.ops.replayssm.step(cache.key, cache.state, slots, slots, slots,
                                       [tokens[n].contiguous() for n in cache.token_names])
        return out.to(hidden_states.dtype)


@contextlib.contextmanager
def replay_decoding(model, window: int = 16, max_drafts: int = 8):
    """Route the decode-time recurrence of ``model`` through replay caches while the block runs."""
    name = type(model).__name__
    if name not in SUPPORTED:
        raise ValueError(f"model: {name} is not supported by the replay adapter; supported: {', '.join(SUPPORTED)}")
    layers = _Mamba2Layers(model, ReplayConfig(window=window, max_drafts=max_drafts))
    layers.module.mamba2_selective_state_update = layers.update
    try:
        yield layers
    finally:
        layers.module.mamba2_selective_state_update = layers.original
