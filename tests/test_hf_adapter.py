"""Hugging Face models (small random configs, several layers, grouped heads, a batch of different
prompts) generate the same greedy tokens with their decode recurrence routed through the replay
cache as through their own path, with logits within 1e-4 at every step: Mamba-2, Qwen3-Next (GDN)
and Kimi Linear (KDA); the same tokens again with speculative rounds (verify, commit, conv-state
rollback); wrong use raises naming the argument."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
transformers = pytest.importorskip("transformers")

from replayssm_dsl.runtime.hf_adapter import (  # noqa: E402
    NgramDrafter, PerturbedDrafter, replay_decoding, speculative_generate)
from replayssm_dsl.runtime.hf_small_models import MODELS, suppressed  # noqa: E402


@pytest.fixture(autouse=True, scope="module")
def one_thread():
    """One intra-op thread: as fast for these tiny models, and several times faster than two when
    another process shares the machine's two cores."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def prompts():
    return torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(1))


def _generate(model, prompts, new_tokens):
    with torch.no_grad():
        out = model.generate(prompts, max_new_tokens=new_tokens, min_new_tokens=new_tokens, do_sample=False,
                             output_logits=True, return_dict_in_generate=True, pad_token_id=0)
    return out.sequences, torch.stack(out.logits, 1)


@pytest.mark.parametrize("family", sorted(MODELS))
def test_greedy_generation_is_identical_through_the_replay_cache(family):
    model, recurrent_layers = MODELS[family]()
    want_tokens, want_logits = _generate(model, prompts(), 128)
    with replay_decoding(model, window=16) as layers:
        got_tokens, got_logits = _generate(model, prompts(), 128)
    assert len(layers.caches) == recurrent_layers, "every recurrent layer decoded through a replay cache"
    assert torch.equal(got_tokens, want_tokens)
    torch.testing.assert_close(got_logits, want_logits, rtol=1e-4, atol=1e-4)


def test_unsupported_model_is_refused():
    config = transformers.LlamaConfig(vocab_size=32, hidden_size=16, intermediate_size=32, num_hidden_layers=1,
                                      num_attention_heads=2, num_key_value_heads=2)
    with pytest.raises(ValueError, match="LlamaForCausalLM is not supported"):
        with replay_decoding(transformers.LlamaForCausalLM(config)):
            pass


@pytest.mark.parametrize("family", ["mamba2", "qwen3_next"])
def test_a_second_generate_in_the_block_loads_its_own_prefill(family):
    """A new prefill drops the replay caches: the next decode step loads the new prompts' states."""
    model, _ = MODELS[family]()
    other = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(5))
    want = [_generate(model, p, 24)[0] for p in (prompts(), other)]
    with replay_decoding(model):
        got = [_generate(model, p, 24)[0] for p in (prompts(), other)]
    assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


@pytest.mark.parametrize("family", sorted(MODELS))
def test_speculative_generation_gives_the_greedy_tokens(family):
    """128 new tokens per row in rounds of 4 verified tokens (replay verify, then commit of each row's
    accepted prefix and rollback of the conv states; masked KV entries on the attention layers). Drafts
    are the model's own greedy tokens with 30% replaced, so every acceptance count occurs: the tokens
    are the non-speculative greedy tokens, the logits within 1e-4."""
    model, recurrent_layers = MODELS[family]()
    want_tokens, want_logits = _generate(model, prompts(), 128)
    drafter = PerturbedDrafter(want_tokens, wrong=0.3, seed=2, vocab_size=96)
    got = speculative_generate(model, prompts(), drafter, 128, drafts=4, suppress_tokens=suppressed(model))
    assert got.recurrent_layers == recurrent_layers
    assert torch.equal(got.sequences, want_tokens)
    torch.testing.assert_close(got.logits, want_logits, rtol=1e-4, atol=1e-4)
    kept = got.kept  # [rounds, rows]: tokens each row kept per round
    assert got.rounds == kept.shape[0] < 64, "speculation saved forwards"
    assert set(kept.unique().tolist()) == {1, 2, 3, 4}, "every draft rejected, some, and none"
    assert (kept != kept[:, :1]).any(), "rows accepted different counts in one round"
    assert got.accepted == int((kept - 1).sum()) and got.drafted == 3 * 3 * got.rounds
    assert 0.3 < got.accept_rate < 0.7
    assert (kept.sum(0) > 16 + 8).all(), "more tokens than the buffer's capacity: verify folded"


@pytest.mark.parametrize("family", sorted(MODELS))
def test_speculative_generation_with_ngram_drafts(family):
    """A drafter that knows nothing of the model (prompt lookup): same greedy tokens."""
    model, _ = MODELS[family]()
    want_tokens, want_logits = _generate(model, prompts(), 64)
    got = speculative_generate(model, prompts(), NgramDrafter(3), 64, drafts=4, suppress_tokens=suppressed(model))
    assert torch.equal(got.sequences, want_tokens)
    torch.testing.assert_close(got.logits, want_logits, rtol=1e-4, atol=1e-4)
    assert got.drafted == 9 * got.rounds and got.accepted == int((got.kept - 1).sum())


def test_speculative_generation_refuses_wrong_use():
    model, _ = MODELS["mamba2"]()
    ids = prompts()
    with pytest.raises(ValueError, match="drafts: tokens verified per round must be an int in 2..max_drafts=8"):
        speculative_generate(model, ids, NgramDrafter(), 8, drafts=1)
    with pytest.raises(ValueError, match="drafts: .* got 9"):
        speculative_generate(model, ids, NgramDrafter(), 8, drafts=9)
    with pytest.raises(ValueError, match=r"drafter: returned \[3, 2\] torch.int64, expected \[3, 3\] token ids"):
        speculative_generate(model, ids, lambda history, k: torch.zeros(3, 2, dtype=torch.long), 8)
    with pytest.raises(ValueError, match=r"drafter: proposed a token id outside \[0, 96\)"):
        speculative_generate(model, ids, lambda history, k: torch.full((3, k), 96), 8)
    with pytest.raises(ValueError, match="model: speculative_generate needs a ...ForCausalLM"):
        speculative_generate(model.backbone, ids, NgramDrafter(), 8)
    with pytest.raises(ValueError, match=r"input_ids: expected \[B, P\] integer token ids"):
        speculative_generate(model, ids.float(), NgramDrafter(), 8)
    for empty in (ids[:0], ids[:, :0]):
        with pytest.raises(ValueError, match=r"input_ids: expected at least one row and one prompt token"):
            speculative_generate(model, empty, NgramDrafter(), 8)
    for outside in (ids + 96, ids - ids.max() - 1):
        with pytest.raises(ValueError, match=r"input_ids: holds a token id outside the model's vocabulary \[0, 96\)"):
            speculative_generate(model, outside, NgramDrafter(), 8)
    for bad in (96, -1, True, 2.0):
        with pytest.raises(ValueError, match=r"suppress_tokens\[1\]: expected a token id in \[0, 96\), got %r" % bad):
            speculative_generate(model, ids, NgramDrafter(), 8, suppress_tokens=[0, bad])
    with pytest.raises(ValueError, match=r"suppress_tokens\[1\]: expected a token id in \[0, 96\), got 96"):
        speculative_generate(model, ids, NgramDrafter(), 8, suppress_tokens=(t for t in [0, 96]))  # a generator
    with pytest.raises(ValueError, match="suppress_tokens: suppresses all 96 token ids"):
        speculative_generate(model, ids, NgramDrafter(), 8, suppress_tokens=range(96))
    with pytest.raises(ValueError, match="max_new_tokens: must be a positive int, got True"):
        speculative_generate(model, ids, NgramDrafter(), True)
    with pytest.raises(ValueError, match="drafts: .* got True"):
        speculative_generate(model, ids, NgramDrafter(), 8, drafts=True)
    with replay_decoding(model):
        with pytest.raises(RuntimeError, match="already runs through a replay cache"):
            speculative_generate(model, ids, NgramDrafter(), 8)


def test_a_round_that_bypasses_verify_is_refused_and_forgotten():
    """``end_verify`` after a round in which no recurrent layer went through the replay verify (the
    model took another path) raises naming the count, and drops the round, so the next one can start."""
    model, _ = MODELS["mamba2"]()
    with replay_decoding(model) as layers:
        assert layers.recurrent_layers > 0
        layers.begin_verify(4)
        with pytest.raises(RuntimeError, match=f"verify: 0 of {layers.recurrent_layers} recurrent layers"):
            layers.end_verify()
        assert layers.pending == [] and layers.verifying == 0
        layers.begin_verify(4)  # not refused as an uncommitted round
        assert layers.verifying == 4


def test_a_missing_function_of_the_model_module_is_named(monkeypatch):
    from transformers.models.qwen3_next import modeling_qwen3_next
    model, _ = MODELS["qwen3_next"]()
    monkeypatch.delattr(modeling_qwen3_next, "torch_chunk_gated_delta_rule")
    with pytest.raises(RuntimeError, match=r"modeling_qwen3_next.torch_chunk_gated_delta_rule not found in "
                                           r"transformers 5\."):
        with replay_decoding(model):
            pass


@pytest.mark.parametrize("family", sorted(MODELS))
def test_the_example_of_each_family_prints_the_agreement(family, monkeypatch, capsys):
    import runpy
    import sys
    from pathlib import Path
    path = Path(__file__).resolve().parents[1] / "examples" / "hf" / f"{family}.py"
    monkeypatch.setattr(sys, "argv", [str(path), "--tokens", "16", "--device", "cpu"])
    with pytest.raises(SystemExit) as done:
        runpy.run_path(str(path), run_name="__main__")
    out = capsys.readouterr().out
    assert done.value.code == 0, out
    assert out.count("identical: True") == 3 and out.count("drafts accepted") == 2, out
