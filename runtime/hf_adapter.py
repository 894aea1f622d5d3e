"""Runtime layer: decode Hugging Face transformers models through the replay cache (torch and
transformers are optional; import this module only where they are installed).

``replay_decoding(model)`` is a context manager: inside it, the decode-time recurrence of every
supported layer runs through a replay cache (the generated CUDA kernels on a GPU, the lowered plans
on the CPU). Prefill runs through the model's own path; at a layer's first decode step its final
state is ``load``-ed as the checkpoint, and from then on the cache holds the truth (the model's own
recurrent state is left as prefill wrote it). A new prefill inside the block (a second ``generate``)
drops the caches, so the next decode step loads the new state.

``speculative_generate(model, input_ids, drafter, max_new_tokens, drafts=4)`` decodes greedily with
speculative rounds: each round runs ``drafts`` tokens (the last certain token and ``drafts - 1``
drafted ones) through the model in one forward, with every recurrent layer in ``verify`` (outputs per
draft, no state write), accepts the longest prefix of drafts that matches the model's own greedy
choices (per batch row), ``commit``-s that prefix (a pointer move) and rolls the model's short
convolution states back to it. Attention layers (Qwen3-Next, Kimi Linear) keep the rejected entries in
their KV cache, masked out of every later query; positions count accepted tokens only. The tokens are
the model's greedy tokens, whatever the drafter proposes.

Supported:
- ``Mamba2ForCausalLM`` (the mixer's ``mamba2_selective_state_update`` / ``mamba2_chunk_scan``, vLLM's
  conventions; the ``z`` gating stays in the model's gated norm);
- ``Qwen3NextForCausalLM`` and ``KimiLinearForCausalLM``: their recurrent calls
  (``torch_recurrent_gated_delta_rule`` / ``torch_chunk_gated_delta_rule``,
  ``recurrent_kimi_delta_attention`` / ``chunk_kimi_delta_attention``, FLA's conventions) get gates
  ``g`` and ``β`` already computed, so the adapter declares the matching variant itself: the delta rule
  with ``g`` and ``β`` as inputs (a scalar decay per head for GDN, a vector over K for KDA).
Other models raise ``ValueError``. The adapter replaces functions of the model's module while it runs;
a transformers version that lacks one of them raises ``RuntimeError`` naming it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import inspect

import numpy as np
import torch

from replayssm_dsl import ModelShape, Recurrence, ReplayConfig, delta, ops
from replayssm_dsl.variants import mamba2

from .torch_ops import TorchReplayCache
from .validation import as_index

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


def _transformers_version() -> str:
    import transformers
    return transformers.__version__


def _require(module, name: str):
    """The function ``module.name`` the adapter replaces; a clear error where this transformers lacks it."""
    if not callable(getattr(module, name, None)):
        raise RuntimeError(f"{module.__name__}.{name} not found in transformers {_transformers_version()}: the replay "
                           "adapter replaces it (written against transformers 5.17 to 5.24)")
    return getattr(module, name)


class _ReplayLayers:
    """The replay caches of one model and the functions of its module they stand in for.

    Subclasses set ``self.module`` and ``self.patches`` (function name -> replacement) and route the
    model's recurrent calls: ``step`` on a decode step, ``verify`` while ``self.verifying`` holds the
    number of tokens of a speculative round (the driver commits them afterwards)."""

    recurrent_layers = 0

    def __init__(self, config: ReplayConfig):
        self.config = config
        self.caches: dict = {}
        self.verifying = 0
        self.pending: list[tuple[TorchReplayCache, torch.Tensor]] = []
        self.originals: dict = {}

    def install(self) -> None:
        for name in self.patches:
            current = _require(self.module, name)
            if isinstance(getattr(current, "__self__", None), _ReplayLayers):
                raise RuntimeError(f"{self.module.__name__}.{name} already runs through a replay cache: "
                                   "replay_decoding and speculative_generate do not nest")
            self.originals[name] = current
        for name, replacement in self.patches.items():
            setattr(self.module, name, replacement)

    def uninstall(self) -> None:
        for name, original in self.originals.items():
            setattr(self.module, name, original)

    def _cache(self, key, decl, shape: ModelShape, params: dict, states: torch.Tensor):
        """The replay cache of layer ``key`` (created and loaded with ``states`` [B, HV, V, K] at its first
        decode or verify call after a prefill)."""
        batch = states.shape[0]
        if key not in self.caches or self.caches[key][1].shape[0] != batch:
            cache = TorchReplayCache(decl, shape, self.config, slots=batch, params=params, device=states.device)
            slots = torch.arange(batch, dtype=torch.int32, device=states.device)
            torch.ops.replayssm.load(cache.key, cache.state, slots, slots, states.float().contiguous())
            self.caches[key] = (cache, slots)
        return self.caches[key]

    def _verify(self, cache, slots, tokens: dict) -> torch.Tensor:
        if self.pending and any(c is cache for c, _ in self.pending):
            raise RuntimeError("verify: a recurrent layer was called twice in one speculative round")
        drafts = torch.full_like(slots, self.verifying)
        out = torch.ops.replayssm.verify(cache.key, cache.state, slots, slots, slots, drafts,
                                         [tokens[n].float().contiguous() for n in cache.token_names])
        self.pending.append((cache, slots))
        return out

    # --- the speculative driver's side ------------------------------------------------------------
    def begin_verify(self, tokens: int) -> None:
        if self.pending:
            raise RuntimeError("verify: the last speculative round is not committed")
        self.verifying = self.round_tokens = tokens

    def end_verify(self) -> None:
        """After the round's forward: every recurrent layer must have gone through ``verify``."""
        self.verifying = 0
        if len(self.pending) != self.recurrent_layers:
            done = len(self.pending)
            self.pending = []
            raise RuntimeError(f"verify: {done} of {self.recurrent_layers} recurrent layers went through the replay "
                               "verify in this round (the model took another path for a multi-token forward)")

    def commit(self, kept: torch.Tensor) -> None:
        """Keep ``kept[b]`` of the round's tokens in every layer's cache (a pointer move)."""
        for cache, slots in self.pending:
            torch.ops.replayssm.commit(cache.key, cache.state, slots, torch.full_like(slots, self.round_tokens),
                                       kept.to(device=slots.device, dtype=torch.int32))
        self.pending = []


class _Mamba2Layers(_ReplayLayers):
    """One replay cache per Mamba-2 mixer (a mixer is recognised by its ``D`` parameter)."""

    def __init__(self, model, config: ReplayConfig):
        super().__init__(config)
        from transformers.models.mamba2 import modeling_mamba2
        self.module = modeling_mamba2
        self.mixers = {m.D.untyped_storage().data_ptr(): m for m in model.modules()
                       if isinstance(m, modeling_mamba2.Mamba2Mixer)}
        self.recurrent_layers = len(self.mixers)
        self.patches = {"mamba2_selective_state_update": self.update, "mamba2_chunk_scan": self.chunk}

    def _mixer_cache(self, mixer, state, heads, groups, head_dim, state_size, gate: bool):
        params = {"A_log": mixer.A_log.detach().float(), "dt_bias": mixer.dt_bias.detach().float(),
                  "D": mixer.D.detach().float()}
        return self._cache(id(mixer), mamba2(gate=gate), ModelShape(heads, groups, head_dim, state_size), params, state)

    def update(self, state, hidden_states, dt, A, B, C, D=None, dt_bias=None, dt_softplus=False, z=None, **kwargs):
        mixer = self.mixers.get(D.untyped_storage().data_ptr()) if D is not None else None
        if mixer is None or not dt_softplus:
            return self.originals["mamba2_selective_state_update"](
                state, hidden_states, dt, A, B, C, D, dt_bias=dt_bias, dt_softplus=dt_softplus, z=z, **kwargs)
        batch, heads, head_dim = hidden_states.shape
        cache, slots = self._mixer_cache(mixer, state, heads, B.shape[1], head_dim, B.shape[-1], z is not None)
        tokens = {"x": hidden_states.float(), "dt": dt[..., 0].float(), "B": B.float(), "C": C.float()}
        if z is not None:
            tokens["z"] = z.float()
        out = torch.ops.replayssm.step(cache.key, cache.state, slots, slots, slots,
                                       [tokens[n].contiguous() for n in cache.token_names])
        return out.to(hidden_states.dtype)

    def chunk(self, hidden_states, dt, A, B, C, chunk_size=256, D=None, dt_bias=None, initial_states=None,
              dt_softplus=False, return_final_states=False, **kwargs):
        mixer = self.mixers.get(D.untyped_storage().data_ptr()) if D is not None else None
        if not self.verifying:  # a prefill: the model's own scan; the next decode step reloads the cache
            if mixer is not None:
                self.caches.pop(id(mixer), None)
            return self.originals["mamba2_chunk_scan"](
                hidden_states, dt, A, B, C, chunk_size=chunk_size, D=D, dt_bias=dt_bias,
                initial_states=initial_states, dt_softplus=dt_softplus, return_final_states=return_final_states,
                **kwargs)
        if mixer is None or not dt_softplus or initial_states is None or kwargs.get("z") is not None:
            raise RuntimeError("verify: a Mamba-2 scan without a prefilled state, dt_softplus or D reached the "
                               "speculative round; the adapter cannot verify it")
        batch, t, heads, head_dim = hidden_states.shape
        cache, slots = self._mixer_cache(mixer, initial_states, heads, B.shape[2], head_dim, B.shape[-1], False)
        out = self._verify(cache, slots, {"x": hidden_states, "dt": dt, "B": B, "C": C})
        out = out.to(hidden_states.dtype)
        return (out, initial_states) if return_final_states else out


class _DeltaRuleLayers(_ReplayLayers):
    """One replay cache per linear-attention layer of a Qwen3-Next or Kimi Linear model. Decode and
    verify calls come in layer order, one per layer and forward, so the n-th call after a prefill
    belongs to layer n mod (number of layers)."""

    def __init__(self, model, config: ReplayConfig, module, recurrent: str, chunked: str, layer_class: str,
                 vector_decay: bool):
        super().__init__(config)
        self.module, self.recurrent, self.chunked = module, recurrent, chunked
        self.recurrent_layers = sum(1 for m in model.modules() if type(m).__name__ == layer_class)
        if self.recurrent_layers == 0:
            raise RuntimeError(f"model: no {layer_class} layer found (transformers {_transformers_version()})")
        self.decl = delta_rule_from_gates(vector_decay)
        self.calls = 0
        self.patches = {recurrent: self.update, chunked: self.chunk}

    def _layer_cache(self, query, key, value, initial_state):
        layer = self.calls % self.recurrent_layers
        self.calls += 1
        key_heads, k_dim = key.shape[2], key.shape[3]
        heads, v_dim = value.shape[2], value.shape[3]
        states = initial_state.float().transpose(-1, -2)  # FLA keeps [B, HV, K, V]
        return self._cache(layer, self.decl, ModelShape(heads, key_heads, v_dim, k_dim), {}, states)

    def update(self, query, key, value, g, beta, initial_state=None, output_final_state=False,
               use_qk_l2norm_in_kernel=False, **kwargs):
        if initial_state is None or query.shape[1] != 1 or not use_qk_l2norm_in_kernel:
            return self.originals[self.recurrent](query, key, value, g=g, beta=beta, initial_state=initial_state,
                                                  output_final_state=output_final_state,
                                                  use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
        cache, slots = self._layer_cache(query, key, value, initial_state)
        tokens = {"q": query[:, 0], "k": key[:, 0], "v": value[:, 0], "g": g[:, 0], "beta": beta[:, 0]}
        out = torch.ops.replayssm.step(cache.key, cache.state, slots, slots, slots,
                                       [tokens[n].float().contiguous() for n in cache.token_names])
        return out[:, None].to(query.dtype), initial_state  # the model's own state is not the truth any more

    def chunk(self, query, key, value, g, beta, chunk_size=64, initial_state=None, output_final_state=False,
              use_qk_l2norm_in_kernel=False, **kwargs):
        if not self.verifying:  # a prefill: the model's own kernel; the next decode step reloads every cache
            self.caches.clear()
            self.calls = 0
            return self.originals[self.chunked](query, key, value, g=g, beta=beta, chunk_size=chunk_size,
                                                initial_state=initial_state, output_final_state=output_final_state,
                                                use_qk_l2norm_in_kernel=use_qk_l2norm_in_kernel, **kwargs)
        if initial_state is None or not use_qk_l2norm_in_kernel:
            raise RuntimeError("verify: a delta-rule call without a prefilled state or in-kernel q/k "
                               "normalisation reached the speculative round; the adapter cannot verify it")
        cache, slots = self._layer_cache(query, key, value, initial_state)
        out = self._verify(cache, slots, {"q": query, "k": key, "v": value, "g": g, "beta": beta})
        return out.to(query.dtype), (initial_state if output_final_state else None)


def _layers_for(model, config: ReplayConfig) -> _ReplayLayers:
    name = type(model).__name__
    if name in ("Mamba2ForCausalLM", "Mamba2Model"):
        return _Mamba2Layers(model, config)
    if name == "Qwen3NextForCausalLM":
        from transformers.models.qwen3_next import modeling_qwen3_next as module
        return _DeltaRuleLayers(model, config, module, "torch_recurrent_gated_delta_rule",
                                "torch_chunk_gated_delta_rule", "Qwen3NextGatedDeltaNet", vector_decay=False)
    if name == "KimiLinearForCausalLM":
        from transformers.models.kimi_linear import modeling_kimi_linear as module
        return _DeltaRuleLayers(model, config, module, "recurrent_kimi_delta_attention",
                                "chunk_kimi_delta_attention", "KimiLinearDeltaAttention", vector_decay=True)
    raise ValueError(f"model: {name} is not supported by the replay adapter; supported: {', '.join(SUPPORTED)}")


@contextlib.contextmanager
def replay_decoding(model, window: int = 16, max_drafts: int = 8):
    """Route the decode-time recurrence of ``model`` through replay caches while the block runs."""
    layers = _layers_for(model, ReplayConfig(window=window, max_drafts=max_drafts))
    layers.install()
    try:
        yield layers
    finally:
        layers.uninstall()


# --- speculative decoding ------------------------------------------------------------------------------

class NgramDrafter:
    """Prompt lookup: propose what followed the latest earlier occurrence of the sequence's last ``n``
    tokens (then ``n - 1``, ..., 1); repeat the last token where nothing matches."""

    def __init__(self, n: int = 3):
        self.n = n

    def __call__(self, history: list[list[int]], k: int) -> torch.Tensor:
        return torch.tensor([self._row(seq, k) for seq in history], dtype=torch.long)

    def _row(self, seq: list[int], k: int) -> list[int]:
        for n in range(min(self.n, len(seq) - 1), 0, -1):
            tail = seq[-n:]
            for start in range(len(seq) - n - 1, -1, -1):
                if seq[start:start + n] == tail:
                    follow = seq[start + n:start + n + k]
                    return (follow + [follow[-1]] * k)[:k]
        return [seq[-1]] * k


class PerturbedDrafter:
    """Drafts from known continuations (e.g. the model's own greedy output, ``sequences [B, L]``), each
    draft replaced by a different random token with probability ``wrong``: rejections at random places."""

    def __init__(self, sequences: torch.Tensor, wrong: float = 0.25, seed: int = 0, vocab_size: int | None = None):
        self.sequences = sequences.detach().cpu().long()
        self.wrong = wrong
        self.vocab = int(vocab_size or int(self.sequences.max()) + 1)
        self.rng = np.random.default_rng(seed)

    def __call__(self, history: list[list[int]], k: int) -> torch.Tensor:
        out = torch.zeros((len(history), k), dtype=torch.long)
        for b, seq in enumerate(history):
            for i in range(k):
                p = len(seq) + i
                token = int(self.sequences[b, p]) if p < self.sequences.shape[1] else 0
                if self.rng.random() < self.wrong:
                    token = (token + 1 + int(self.rng.integers(self.vocab - 1))) % self.vocab
                out[b, i] = token
        return out


@dataclasses.dataclass
class SpeculativeResult:
    sequences: torch.Tensor  # [B, prompt + max_new_tokens]
    logits: torch.Tensor  # [B, max_new_tokens, vocab]: the logits each new token is the argmax of
    rounds: int  # speculative rounds (model forwards after prefill)
    drafted: int  # draft tokens proposed (drafts - 1 per row and round)
    accepted: int  # draft tokens accepted
    kept: torch.Tensor  # [rounds, B]: tokens each row committed per round (accepted + 1)
    recurrent_layers: int  # layers whose recurrence ran through replay caches

    @property
    def accept_rate(self) -> float:
        return self.accepted / max(self.drafted, 1)


def _cache_argument(model) -> str:
    params = inspect.signature(model.forward).parameters
    for name in ("cache", "past_key_values", "cache_params"):
        if name in params:
            return name
    raise RuntimeError(f"model: {type(model).__name__}.forward takes no cache argument (cache, past_key_values or "
                       f"cache_params) in transformers {_transformers_version()}")


class _ConvRollback:
    """Records, during a speculative round, the full convolution input each recurrent layer sees
    (its state followed by the round's tokens, from ``cache.update_conv_state``), and afterwards sets
    each row's convolution state to the window that ends after the tokens it keeps."""

    def __init__(self, cache, layers: int):
        if not callable(getattr(cache, "update_conv_state", None)) or not hasattr(cache, "layers"):
            raise RuntimeError(f"{type(cache).__name__} has no update_conv_state/layers in transformers "
                               f"{_transformers_version()}: the speculative driver rolls the conv states back there")
        self.cache, self.layers, self.full = cache, layers, {}

    @contextlib.contextmanager
    def capture(self):
        original = self.cache.update_conv_state

        def update_conv_state(conv_states, layer_idx, *args, **kwargs):
            full = original(conv_states, layer_idx, *args, **kwargs)
            self.full[layer_idx] = full
            return full

        shadowed = vars(self.cache).get("update_conv_state")
        self.cache.update_conv_state = update_conv_state
        try:
            yield
        finally:
            if shadowed is None:
                del self.cache.update_conv_state  # the class's method again
            else:
                self.cache.update_conv_state = shadowed

    def rollback(self, kept: torch.Tensor, tokens: int) -> None:
        full, self.full = self.full, {}
        if len(full) != self.layers:
            raise RuntimeError(f"verify: {len(full)} of {self.layers} convolution states were updated in this round")
        for layer_idx, seen in full.items():
            state = self.cache.layers[layer_idx].conv_states[0]
            width = state.shape[-1]
            if seen.shape[-1] != width + tokens or tuple(seen.shape[:-1]) != tuple(state.shape[:-1]):
                raise RuntimeError(f"verify: layer {layer_idx} convolution input is {list(seen.shape)}, expected its "
                                   f"state {list(state.shape)} followed by {tokens} tokens")
            index = kept.to(seen.device)[:, None] + torch.arange(width, device=seen.device)  # [B, width]
            state.copy_(seen.gather(-1, index[:, None, :].expand(-1, seen.shape[1], -1)))


def _is_int(value) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _check_generate_args(vocab: int, input_ids, max_new_tokens, drafts, max_drafts, suppress_tokens) -> list:
    """``speculative_generate``'s arguments, each refused naming it; the suppressed ids as a list."""
    if not _is_int(drafts) or not 2 <= drafts <= max_drafts:
        raise ValueError(f"drafts: tokens verified per round must be an int in 2..max_drafts={max_drafts} "
                         f"(the certain token and at least one draft), got {drafts!r}")
    if not _is_int(max_new_tokens) or max_new_tokens < 1:
        raise ValueError(f"max_new_tokens: must be a positive int, got {max_new_tokens!r}")
    if input_ids.ndim != 2 or input_ids.dtype not in (torch.int32, torch.int64):
        raise ValueError(f"input_ids: expected [B, P] integer token ids, got {list(input_ids.shape)} {input_ids.dtype}")
    if 0 in input_ids.shape:
        raise ValueError(f"input_ids: expected at least one row and one prompt token, got {list(input_ids.shape)}")
    if ((input_ids < 0) | (input_ids >= vocab)).any():
        raise ValueError(f"input_ids: holds a token id outside the model's vocabulary [0, {vocab})")
    given = list(suppress_tokens)  # a generator is read once
    suppress = [as_index(token) for token in given]
    for i, token in enumerate(suppress):
        if token is None or not 0 <= token < vocab:
            raise ValueError(f"suppress_tokens[{i}]: expected a token id in [0, {vocab}), got {given[i]!r}")
    if len(set(suppress)) == vocab:
        raise ValueError(f"suppress_tokens: suppresses all {vocab} token ids, leaving none to choose")
    return suppress


def speculative_generate(model, input_ids: torch.Tensor, drafter, max_new_tokens: int, drafts: int = 4,
                         window: int = 16, max_drafts: int = 8, suppress_tokens=()) -> SpeculativeResult:
    """Greedy generation of ``max_new_tokens`` per row with speculative rounds through replay caches.

    ``drafter(history, k)`` gets, per row, the tokens so far (prompt and generated, a list of ints) and
    returns ``k = drafts - 1`` proposed next tokens per row (``[B, k]``). Each round verifies ``drafts``
    tokens per row; rows accept different counts. ``suppress_tokens`` are never chosen (their logits
    count as -inf: what ``generate(min_new_tokens=...)`` does to the end-of-sequence token). Prompts are
    ``[B, P]`` without padding. Returns the sequences, the logits behind every new token and the counts
    of drafted and accepted tokens."""
    name = type(model).__name__
    if not name.endswith("ForCausalLM"):
        raise ValueError(f"model: speculative_generate needs a ...ForCausalLM (logits); got {name}")
    suppress_tokens = _check_generate_args(model.config.vocab_size, input_ids, max_new_tokens, drafts, max_drafts,
                                           suppress_tokens)
    from transformers import DynamicCache

    device = input_ids.device
    batch, prompt = input_ids.shape
    vocab = model.config.vocab_size
    cache = DynamicCache(config=model.config)
    cache_arg = _cache_argument(model)
    attention = not name.startswith("Mamba2")  # hybrids: rejected KV entries are masked, positions given
    suppress = torch.tensor(suppress_tokens, dtype=torch.long, device=device)

    def greedy(logits):
        logits = logits.float()
        if not torch.isfinite(logits).all():
            raise FloatingPointError("logits: non-finite values in a speculative round")
        return logits.index_fill(-1, suppress, float("-inf")).argmax(-1) if suppress.numel() else logits.argmax(-1)

    with replay_decoding(model, window=window, max_drafts=max_drafts) as layers, torch.no_grad():
        rollback = _ConvRollback(cache, layers.recurrent_layers)
        out = model(input_ids, use_cache=True, **{cache_arg: cache})  # prefill: the model's own path
        last = out.logits[:, -1].float()
        pending = greedy(last)
        new_tokens = [[int(pending[b])] for b in range(batch)]
        new_logits = [[last[b]] for b in range(batch)]
        valid = torch.ones((batch, prompt), dtype=torch.bool, device=device)  # KV entries later tokens see
        kept_rounds, accepted = [], 0
        while min(len(t) for t in new_tokens) < max_new_tokens:
            history = [input_ids[b].tolist() + new_tokens[b] for b in range(batch)]
            proposal = torch.as_tensor(drafter(history, drafts - 1)).to(device)
            if tuple(proposal.shape) != (batch, drafts - 1) or proposal.is_floating_point():
                raise ValueError(f"drafter: returned {list(proposal.shape)} {proposal.dtype}, expected "
                                 f"[{batch}, {drafts - 1}] token ids")
            if ((proposal < 0) | (proposal >= vocab)).any():
                raise ValueError(f"drafter: proposed a token id outside [0, {vocab})")
            tokens = torch.cat([pending[:, None], proposal.long()], 1)
            kwargs = {cache_arg: cache}
            if attention:
                kwargs["attention_mask"] = torch.cat([valid, torch.ones_like(tokens, dtype=torch.bool)], 1).long()
                kwargs["position_ids"] = valid.sum(1, keepdim=True) + torch.arange(drafts, device=device)
            layers.begin_verify(drafts)
            try:
                with rollback.capture():
                    logits = model(tokens, use_cache=True, **kwargs).logits.float()
            finally:
                layers.verifying = 0
            layers.end_verify()
            choice = greedy(logits)  # [B, T]: the model's token after each verified one
            agree = (choice[:, :-1] == proposal).long().cumprod(1).sum(1)  # accepted drafts per row
            kept = agree + 1
            layers.commit(kept)
            rollback.rollback(kept, drafts)
            valid = torch.cat([valid, torch.arange(drafts, device=device)[None] < kept[:, None]], 1)
            for b in range(batch):
                a = int(agree[b])
                new_tokens[b] += choice[b, :a + 1].tolist()
                new_logits[b] += list(logits[b, :a + 1])
            pending = choice.gather(1, agree[:, None])[:, 0]
            kept_rounds.append(kept.cpu())
            accepted += int(agree.sum())
        rounds = len(kept_rounds)
        sequences = torch.cat([input_ids, torch.tensor([t[:max_new_tokens] for t in new_tokens], device=device,
                                                       dtype=input_ids.dtype)], 1)
        logits = torch.stack([torch.stack(rows[:max_new_tokens]) for rows in new_logits])
        return SpeculativeResult(sequences, logits, rounds, rounds * batch * (drafts - 1), accepted,
                                 torch.stack(kept_rounds) if kept_rounds else torch.zeros((0, batch), dtype=torch.long),
                                 len(layers.caches))
