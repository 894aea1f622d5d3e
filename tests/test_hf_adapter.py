"""A Hugging Face Mamba-2 model (small random config, several layers, grouped heads, a batch of
different prompts) generates the same greedy tokens with its decode recurrence routed through the
replay cache as through its own path, with logits within 1e-4 at every step."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from replayssm_dsl.runtime.hf_adapter import replay_decoding  # noqa: E402


def _model():
    config = transformers.Mamba2Config(vocab_size=96, hidden_size=64, num_hidden_layers=3, num_heads=8, head_dim=16,
                                       state_size=16, n_groups=2, expand=2, conv_kernel=4, chunk_size=16)
    torch.manual_seed(0)
    return transformers.Mamba2ForCausalLM(config).eval()


def _generate(model, prompts, new_tokens):
    with torch.no_grad():
        out = model.generate(prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences, torch.stack(out.logits, 1)


def test_greedy_generation_is_identical_through_the_replay_cache():
    model = _model()
    prompts = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(1))
    want_tokens, want_logits = _generate(model, prompts, 128)
    with replay_decoding(model, window=16) as layers:
        got_tokens, got_logits = _generate(model, prompts, 128)
    assert len(layers.caches) == 3, "every Mamba-2 layer decoded through a replay cache"
    assert torch.equal(got_tokens, want_tokens)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)


def test_unsupported_model_is_refused():
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)
    with pytest.raises(ValueError, match="LlamaForCausalLM is not supported"):
        with replay_decoding(transformers.LlamaForCausalLM(config)):
            pass
