"""Hugging Face models (small random configs, several layers, grouped heads, a batch of different
prompts) generate the same greedy tokens with their decode recurrence routed through the replay
cache as through their own path, with logits within 1e-4 at every step: Mamba-2, Qwen3-Next (GDN)
and Kimi Linear (KDA)."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from replayssm_dsl.runtime.hf_adapter import replay_decoding  # noqa: E402


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


def _generate(model, prompts, new_tokens):
    with torch.no_grad():
        out = model.generate(prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences, torch.stack(out.logits, 1)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_greedy_generation_is_identical_through_the_replay_cache(family):
    model, recurrent_layers = MODELS[family]()
    prompts = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(1))
    want_tokens, want_logits = _generate(model, prompts, 128)
    with replay_decoding(model, window=16) as layers:
        got_tokens, got_logits = _generate(model, prompts, 128)
    assert len(layers.caches) == recurrent_layers, "every recurrent layer decoded through a replay cache"
    assert torch.equal(got_tokens, want_tokens)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)


def test_unsupported_model_is_refused():
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)
    with pytest.raises(ValueError, match="LlamaForCausalLM is not supported"):
        with replay_decoding(transformers.LlamaForCausalLM(config)):
            pass
