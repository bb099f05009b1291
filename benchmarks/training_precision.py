"""Training speed by precision and attention kernel on this machine: which `--mixed_precision` and
`--attn_implementation` the CPU recipe should use.

    python benchmarks/training_precision.py --data_dir ../shared/data/multi30k
    python benchmarks/training_precision.py --profile bf16 eager     # where one variant's time goes

Real token batches of the recipe (Multi30k EN->DE, the shared BPE vocabulary, `--max_tokens` source and target
tokens, length-sorted) go through forward, label-smoothed loss, backward and an Adam step of the recipe's model
(train mode, dropout), as `train_accelerate.py` does, under each variant:

- float32 with `sdpa` / `eager` attention;
- bf16 autocast (`torch.autocast("cpu", torch.bfloat16)`, what Accelerate's `--mixed_precision bf16` applies)
  with `sdpa` / `eager` attention.

Every repetition runs the variants in alternating order (A B C D, D C B A, ...) over the same batches, after one
untimed warm-up pass; the table reports the median of non-padding
target tokens per second and the ratio to float32 + sdpa. The CPU's bf16 instructions matter: without AVX512-BF16 or
AMX, bf16 is emulated and slower than float32.
"""

import argparse
import statistics
import sys
from functools import partial
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import timed  # noqa: E402

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.data.batching import TokenBatchSampler, TranslationCollator  # noqa: E402
from vanilla_transformer.data.readers import read_parallel_text  # noqa: E402
from vanilla_transformer.data.tokenization import train_shared_tokenizer  # noqa: E402
from vanilla_transformer.training.run_setup import config_for_tokenizer  # noqa: E402
from vanilla_transformer.training.steps import count_target_tokens  # noqa: E402

VARIANTS = [("float32", "sdpa"), ("float32", "eager"), ("bf16", "sdpa"), ("bf16", "eager")]


def recipe_batches(data_dir: Path, pairs_used: int, vocab_size: int, max_tokens: int, count: int):
    pairs, _ = read_parallel_text(data_dir / "train.en.gz", data_dir / "train.de.gz")
    tokenizer = train_shared_tokenizer((text for pair in pairs for text in pair), vocab_size=vocab_size)
    pairs = pairs[:pairs_used]
    sources = tokenizer([source for source, _ in pairs])["input_ids"]
    targets = tokenizer([target for _, target in pairs])["input_ids"]
    sampler = TokenBatchSampler([len(s) for s in sources], [len(t) for t in targets], max_tokens=max_tokens, seed=0)
    collator = TranslationCollator(tokenizer.pad_token_id)
    examples = [{"input_ids": s, "labels": t} for s, t in zip(sources, targets, strict=True)]
    return tokenizer, [collator([examples[i] for i in batch]) for batch in list(sampler)[:count]]


def training_pass(model, optimizer, batches, precision: str) -> int:
    """One optimizer step per batch, as `train_accelerate.train_loop` computes it; returns the target tokens trained on."""
    for batch in batches:
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(**batch).loss  # mean label-smoothed loss over the batch's targets, without logits
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    return sum(count_target_tokens(batch) for batch in batches)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--preset", default="small")
    parser.add_argument("--vocab_size", type=int, default=8000)
    parser.add_argument("--max_tokens", type=int, default=2048)
    parser.add_argument("--batches", type=int, default=12, help="batches per timed pass")
    parser.add_argument("--repetitions", type=int, default=5)
    parser.add_argument(
        "--profile", nargs=2, metavar=("PRECISION", "ATTENTION"), help="torch.profiler table of one variant instead"
    )
    args = parser.parse_args()

    tokenizer, batches = recipe_batches(Path(args.data_dir), 6000, args.vocab_size, args.max_tokens, args.batches)
    config = config_for_tokenizer(args.preset, tokenizer)  # the recipe's model, as train_accelerate.py builds it
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    if args.profile:
        precision, attention = args.profile
        model.set_attn_implementation(attention)
        training_pass(model, optimizer, batches, precision)  # warm-up
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU]) as profiler:
            training_pass(model, optimizer, batches[:6], precision)
        print(profiler.key_averages().table(sort_by="self_cpu_time_total", row_limit=15))
        return

    speeds = {variant: [] for variant in VARIANTS}
    for repetition in range(args.repetitions + 1):
        for precision, attention in VARIANTS if repetition % 2 == 0 else VARIANTS[::-1]:
            model.set_attn_implementation(attention)
            tokens, seconds = timed(partial(training_pass, model, optimizer, batches, precision))
            if repetition > 0:  # the first pass is the untimed warm-up
                speeds[(precision, attention)].append(tokens / seconds)

    print(
        f"preset {args.preset}, vocabulary {len(tokenizer)}, {args.batches} batches of max_tokens {args.max_tokens}, "
        f"{torch.get_num_threads()} threads, median of {args.repetitions}\n"
    )
    print("| precision | attention | target tok/s | vs float32 + sdpa |\n|---|---|---:|---:|")
    reference = statistics.median(speeds[VARIANTS[0]])
    for (precision, attention), values in speeds.items():
        median = statistics.median(values)
        print(f"| {precision} | {attention} | {median:,.0f} | {median / reference:.2f}x |")


if __name__ == "__main__":
    main()
