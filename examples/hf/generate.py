"""Generate with a small random Hugging Face model, once through the model's own decode path and once
with its recurrence routed through the replay cache, and print the agreement (needs torch and
transformers; the generated CUDA on a GPU, the lowered plans on the CPU).

    python examples/hf/generate.py --family mamba2|qwen3_next|kimi_linear [--tokens 128] [--device cpu|cuda]
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "tests"))
from test_hf_adapter import MODELS  # noqa: E402  (the same small configurations the tests use)

from replayssm_dsl.runtime.hf_adapter import replay_decoding  # noqa: E402


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--family", choices=sorted(MODELS), default="mamba2")
    parser.add_argument("--tokens", type=int, default=128)
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
    print(f"{args.family} on {args.device}: {len(layers.caches)} recurrent layers through replay caches; "
          f"{args.tokens} greedy tokens x 3 prompts identical: {same}; largest logit difference {diff:.2e}")
    return 0 if same and diff <= 1e-4 else 1


if __name__ == "__main__":
    sys.exit(main())
