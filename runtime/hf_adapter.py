"""Runtime layer: decode Hugging Face transformers models through the replay cache (torch and
transformers are optional; import this module only where they are installed).

``replay_decoding(model)`` is a context manager: inside it, the decode-time recurrence of every
supported layer runs through a replay cache (the generated CUDA kernels on a GPU, the lowered plans
on the CPU). Prefill runs through the model's own path; at a layer's first decode step its final
state is ``load``-ed as the checkpoint, and from then on the cache holds the truth (the model's own
recurrent state is left as prefill wrote it).

Supported:
- ``Mamba2ForCausalLM`` (the mixer's ``mamba2_selective_state_update``, vLLM's conventions; the ``z``
  gating stays in the model's gated norm);
- ``Qwen3NextForCausalLM`` and ``KimiLinearForCausalLM``: their decode calls
  (``torch_recurrent_gated_delta_rule``, ``recurrent_kimi_delta_attention``, FLA's conventions) get
  gates ``g`` and ``β`` already computed, so the adapter declares the matching variant itself: the
  delta rule with ``g`` and ``β`` as inputs (a scalar decay per head for GDN, a vector over K for KDA).
Other models raise ``ValueError``.
"""

from __future__ import annotations

import contextlib

import torch

from replayssm_dsl import ModelShape, Recurrence, ReplayConfig, delta, ops
from replayssm_dsl.variants import mamba2

from .torch_ops import TorchReplayCache

SUPPORTED = ("Mamba2ForCausalLM", "Mamba2Model", "Qwen3NextForCausalLM", "KimiLinearForCausalLM")


def delta_rule_from_gates(vector_decay: bool):
    """FLA's ``fused_recurrent_*`` convention: gates computed by the model, q/k normalised in the kernel."""
    r = Recurrence("kda_gates" if vector_decay else "gdn_gates",
                   doc="delta rule with precomputed log-decay g and strength beta (FLA call convention)")
    q, k = r.token("q", per="group", size="K"), r.token("k", per="group", size="K")
    v = r.token("v", size="V")
    g = r.token("g", size="K" if vector_decay else None, sign="nonpositive")
    beta = r.token("beta")
    return r.build(decay=g, key=ops.l2norm(k), query=ops.l2norm(q) * r.K ** -0.5, write=delta(value=v, beta=beta))


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


class _DeltaRuleLayers:
    """One replay cache per linear-attention layer of a Qwen3-Next or Kimi Linear model. Decode calls
    come in layer order, one per layer and token, so the n-th call of a step belongs to layer n."""

    def __init__(self, model, config: ReplayConfig, module, function: str, layer_class: str, vector_decay: bool):
        self.module, self.function, self.config = module, function, config
        self.original = getattr(module, function)
        self.layers = sum(1 for m in model.modules() if type(m).__name__ == layer_class)
        self.decl = delta_rule_from_gates(vector_decay)
        self.caches: dict[int, tuple[TorchReplayCache, torch.Tensor]] = {}
        self.calls = 0

    def update(self, query, key, value, g, beta, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, **kwargs):
        if initial_state is None or query.shape[1] != 1 or not use_qk_l2norm_in_kernel:
            return self.original(query, key, value, g=g, beta=beta, initial_state=initial_state,
                                 output_final_state=output_final_state,
                                 use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
        layer = self.calls % self.layers
        self.calls += 1
        batch, _, key_heads, k_dim = key.shape
        heads, v_dim = value.shape[2], value.shape[3]
        if layer not in self.caches:
            cache = TorchReplayCache(self.decl, ModelShape(heads, key_heads, v_dim, k_dim), self.config, slots=batch,
                                     params={}, device=value.device)
            slots = torch.arange(batch, dtype=torch.int32, device=value.device)
            states = initial_state.float().transpose(-1, -2).contiguous()  # FLA keeps [B, HV, K, V]
            torch.ops.replayssm.load(cache.key, cache.state, slots, slots, states)
            self.caches[layer] = (cache, slots)
        cache, slots = self.caches[layer]
        tokens = {"q": query[:, 0], "k": key[:, 0], "v": value[:, 0], "g": g[:, 0], "beta": beta[:, 0]}
        out = torch.ops.replayssm.step(cache.key, cache.state, slots, slots, slots,
                                       [tokens[n].float().contiguous() for n in cache.token_names])
        return out[:, None].to(query.dtype), initial_state  # the model's own state is not the truth any more


def _layers_for(model, config: ReplayConfig):
    name = type(model).__name__
    if name in ("Mamba2ForCausalLM", "Mamba2Model"):
        return _Mamba2Layers(model, config), "mamba2_selective_state_update"
    if name == "Qwen3NextForCausalLM":
        from transformers.models.qwen3_next import modeling_qwen3_next as module
        return _DeltaRuleLayers(model, config, module, "torch_recurrent_gated_delta_rule",
                                "Qwen3NextGatedDeltaNet", vector_decay=False), "torch_recurrent_gated_delta_rule"
    if name == "KimiLinearForCausalLM":
        from transformers.models.kimi_linear import modeling_kimi_linear as module
        return _DeltaRuleLayers(model, config, module, "recurrent_kimi_delta_attention",
                                "KimiLinearDeltaAttention", vector_decay=True), "recurrent_kimi_delta_attention"
    raise ValueError(f"model: {name} is not supported by the replay adapter; supported: {', '.join(SUPPORTED)}")


@contextlib.contextmanager
def replay_decoding(model, window: int = 16, max_drafts: int = 8):
    """Route the decode-time recurrence of ``model`` through replay caches while the block runs."""
    layers, function = _layers_for(model, ReplayConfig(window=window, max_drafts=max_drafts))
    setattr(layers.module, function, layers.update)
    try:
        yield layers
    finally:
        setattr(layers.module, function, layers.original)
