"""Translating lines on a GPU with the model backend (`translate_texts` over `ModelBackend`, what `vanilla-transformer
translate` runs), by attention kernel: every batch of a corpus has new shapes (its sources' length, its size, each
decoding step's key length), unlike a benchmark that repeats one batch.

Model: the `--preset` with random weights and the tokenizer of a prepared corpus (`--tokenizer`); every translation is
cut at `--max_new_tokens` (a random model rarely ends one), so each variant does the same work. Variants, run one
after the other on the same `--count` lines after a warm-up on 64 others:
- sdpa: as the backend decodes, every scaled_dot_product_attention kernel but cuDNN's (`decoding.DECODING_ATTENTION`);
- sdpa_cudnn_allowed: torch's own choice, cuDNN's kernel included (what the backend did until 2026-11-27);
- eager: the attention written out.

Usage:
    python benchmarks/gpu_translate.py --lines lines.en --tokenizer data-bin/multi30k-en-de/tokenizer
    python benchmarks/gpu_translate.py --device cpu --preset tiny --count 64 --lines ... --tokenizer ...
"""

import argparse
import sys
import time
from pathlib import Path

import torch
from torch.nn.attention import SDPBackend

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from configuration_vanilla_transformer import VanillaTransformerConfig  # noqa: E402
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.data.tokenization import load_tokenizer  # noqa: E402
from vanilla_transformer.model import decoding  # noqa: E402
from vanilla_transformer.serving.batches import translate_texts  # noqa: E402

VARIANTS = ("sdpa", "sdpa_cudnn_allowed", "eager")


def kernels(variant: str) -> list:
    """The kernels the backend lets scaled_dot_product_attention pick for `variant`."""
    if variant == "sdpa_cudnn_allowed":
        return [SDPBackend.CUDNN_ATTENTION, *decoding.DECODING_ATTENTION]
    return decoding.DECODING_ATTENTION


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float32"])
    parser.add_argument("--lines", required=True)
    parser.add_argument("--tokenizer", required=True)
    parser.add_argument("--count", type=int, default=2000)
    parser.add_argument("--max_batch_tokens", type=int, default=16384, help="source tokens x beams a batch")
    parser.add_argument("--num_beams", type=int, default=4)
    parser.add_argument("--max_new_tokens", type=int, default=24)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    args = parser.parse_args()

    tokenizer = load_tokenizer(args.tokenizer)
    lines = Path(args.lines).read_text(encoding="utf-8").splitlines()
    warm_up, lines = lines[-64:], lines[: args.count]
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(args.preset, vocab_size=len(tokenizer))
    model = VanillaTransformerForConditionalGeneration(config).to(args.device, getattr(torch, args.dtype)).eval()
    backend = decoding.ModelBackend(model, tokenizer, args.num_beams, args.max_new_tokens)
    name = torch.cuda.get_device_name() if args.device.startswith("cuda") else "CPU"
    print(f"# {name}; torch {torch.__version__}; {args.preset} (random weights), {args.dtype}, beam {args.num_beams}")
    print(
        f"# {len(lines)} lines, --max_batch_tokens {args.max_batch_tokens}, at most {args.max_new_tokens} new tokens\n"
    )
    print("| attention | seconds | lines/s | target tokens/s |")
    print("|---|---:|---:|---:|")
    shipped = decoding.DECODING_ATTENTION
    for variant in args.variants:
        model.set_attn_implementation("eager" if variant == "eager" else "sdpa")
        decoding.DECODING_ATTENTION = kernels(variant)
        translate_texts(backend, warm_up, max_tokens=args.max_batch_tokens)
        started = time.perf_counter()
        result = translate_texts(backend, lines, max_tokens=args.max_batch_tokens)
        if args.device.startswith("cuda"):
            torch.cuda.synchronize()
        seconds = time.perf_counter() - started
        decoding.DECODING_ATTENTION = shipped
        print(f"| {variant} | {seconds:.1f} | {len(lines) / seconds:,.0f} | {result.target_tokens / seconds:,.0f} |")
        sys.stdout.flush()


if __name__ == "__main__":
    main()
