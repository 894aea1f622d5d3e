"""Generate with a small random Hugging Face model through its own decode path, then with its recurrence
routed through the replay cache (one token per step), then with speculative rounds through the replay
cache (verify T tokens, commit the accepted prefix, roll the conv states back), and print the agreement
(needs torch and transformers; the generated CUDA on a GPU, the lowered plans on the CPU).

    python examples/hf/generate.py --family mamba2|qwen3_next|kimi_linear [--tokens 128] [--drafts 4] [--device cpu|cuda]

Speculative drafts come from two sources: the model's own greedy tokens with 30% of them replaced by
other tokens (so rejections happen at random places), and prompt lookup (n-grams of the sequence so
far). Exits 1 unless every run gives the model's own greedy tokens with logits within 1e-4.
"""

import argparse
import sys

import torch

from replayssm_dsl.runtime.hf_adapter import NgramDrafter, PerturbedDrafter, replay_decoding, speculative_generate
from replayssm_dsl.runtime.hf_small_models import MODELS, suppressed  # the configurations the tests use


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(MODELS), default="mamba2")
    parser.add_argument("--tokens", type=int, default=128)
    parser.add_argument("--drafts", type=int, default=4, help="tokens verified per speculative round")
    parser.add_argument("--device", default="cuda" if torch.cuda.is_available() else "cpu")
    args = parser.parse_args(argv)
    model, _ = MODELS[args.family]()
    model = model.to(args.device)
    prompts = torch.randint(1, 96, (3, 12), generator=torch.Generator().manual_seed(1)).to(args.device)

    def generate():
        with torch.no_grad():
            out = model.generate(prompts, max_new_tokens=args.tokens, min_new_tokens=args.tokens, do_sample=False,
                                 output_logits=True, return_dict_in_generate=True, pad_token_id=0)
        return out.sequences, torch.stack(out.logits, 1)

    own_tokens, own_logits = generate()
    with replay_decoding(model) as layers:
        replay_tokens, replay_logits = generate()
    same = bool(torch.equal(own_tokens, replay_tokens))
    diff = float((own_logits - replay_logits).abs().max())
    ok = same and diff <= 1e-4
    print(f"{args.family} on {args.device}: {len(layers.caches)} recurrent layers through replay caches; "
          f"{args.tokens} greedy tokens x 3 prompts identical: {same}; largest logit difference {diff:.2e}")

    drafters = {"own greedy tokens, 30% replaced": PerturbedDrafter(own_tokens, wrong=0.3, seed=0,
                                                                   vocab_size=model.config.vocab_size),
                "prompt lookup (3-grams)": NgramDrafter(3)}
    for name, drafter in drafters.items():
        got = speculative_generate(model, prompts, drafter, args.tokens, drafts=args.drafts,
                                   suppress_tokens=suppressed(model))
        same = bool(torch.equal(got.sequences, own_tokens))
        diff = float((got.logits - own_logits).abs().max())
        ok = ok and same and diff <= 1e-4
        print(f"  speculative, T = {args.drafts}, drafts from {name}: {got.rounds} rounds for {args.tokens} tokens; "
              f"{got.accepted} of {got.drafted} drafts accepted ({got.accept_rate:.0%}); tokens identical: {same}; "
              f"largest logit difference {diff:.2e}")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
