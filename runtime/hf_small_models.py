"""Runtime layer: small random configurations of the model families the transformers adapter supports
(several layers, grouped heads), for smoke tests, the examples and the adapter's own tests. Needs
torch and transformers (the ``hf`` extra).

``MODELS[family]()`` returns ``(model, recurrent_layers)``: a freshly initialised model (seeded, eval
mode, CPU) and how many of its layers decode through replay caches.
"""

from __future__ import annotations

import torch
import transformers


def mamba2_model():
    config = transformers.Mamba2Config(vocab_size=96, hidden_size=64, num_hidden_layers=3, num_heads=8, head_dim=16,
                                       state_size=16, n_groups=2, expand=2, conv_kernel=4, chunk_size=16)
    torch.manual_seed(0)
    return transformers.Mamba2ForCausalLM(config).eval(), 3


def qwen3_next_model():
    config = transformers.Qwen3NextConfig(
        vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=4, num_attention_heads=4,
        num_key_value_heads=2, head_dim=16, linear_num_value_heads=4, linear_num_key_heads=2, linear_key_head_dim=16,
        linear_value_head_dim=16, linear_conv_kernel_dim=4, num_experts=4, num_experts_per_tok=2,
        moe_intermediate_size=32, shared_expert_intermediate_size=32,
        layer_types=["linear_attention", "linear_attention", "linear_attention", "full_attention"])
    torch.manual_seed(0)
    return transformers.Qwen3NextForCausalLM(config).eval(), 3


def kimi_linear_model():
    config = transformers.KimiLinearConfig(
        vocab_size=96, hidden_size=64, intermediate_size=64, num_hidden_layers=3, num_attention_heads=4,
        num_key_value_heads=4, head_dim=16, linear_attn_config={"full_attn_layers": [3], "kda_layers": [1, 2],
                                                                "num_heads": 4, "head_dim": 16, "short_conv_kernel_size": 4},
        num_experts=4, num_experts_per_token=2, moe_intermediate_size=32, pad_token_id=0, bos_token_id=1,
        eos_token_id=2)
    torch.manual_seed(0)
    return transformers.KimiLinearForCausalLM(config).eval(), 2


MODELS = {"mamba2": mamba2_model, "qwen3_next": qwen3_next_model, "kimi_linear": kimi_linear_model}


def suppressed(model) -> list:
    """The tokens ``generate(min_new_tokens=N)`` never picks in the first N tokens (end of sequence)."""
    eos = model.generation_config.eos_token_id
    return [] if eos is None else [eos] if isinstance(eos, int) else list(eos)
