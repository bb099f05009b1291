"""Which checkpoints to average? Scores the kept checkpoints of one training run, alone and averaged, on a split.

    python benchmarks/averaging_study.py OUTPUT_DIR --data_dir ../shared/data/multi30k --split val \
        --last 1 2 3 5 8 --every 1 2

OUTPUT_DIR is a finished `train_accelerate.py` run: its saved model folder (config, tokenizer) and its
`checkpoints/step_<step>/` folders. For every K in --last and every stride E in --every, the script averages
the last K checkpoints taken every E-th one (E=2: the last, the third-last, ...) and reports sacreBLEU, chrF and
the output/reference length ratio of beam search with the model's generation config (the run's beam and length
penalty, input + 50 tokens; `--length_penalty A B ...` decodes once with each), and the per-token negative
log-likelihood of the references (no label smoothing): falling from one checkpoint to the next means under-trained,
rising means over-fitted.

What a shorter budget would have given: the schedule of equation (3) does not depend on the budget, so the first
M minutes of a longer run are an M-minute run. `--until_minutes M` keeps only the checkpoints saved within M
minutes of training (their `elapsed_seconds`); the run must keep them (`--save_total_limit 0`). `--save_averaged
DIR` writes the first averaging scored as a model folder, for `train_accelerate.py --evaluate_only` to score
exactly as a run's final evaluation does:

    python benchmarks/averaging_study.py outputs/run60 --data_dir ../shared/data/multi30k --until_minutes 25 \
        --last 5 --save_averaged outputs/run60-at-25min
"""

import argparse
import sys
from pathlib import Path

import torch
from torch.nn import functional as F

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from vanilla_transformer.data.readers import read_parallel_text  # noqa: E402
from vanilla_transformer.hub.model_folder import save_model_folder  # noqa: E402
from vanilla_transformer.serving.translate import load_model_and_tokenizer, translate_sentences  # noqa: E402
from vanilla_transformer.training.checkpoint_folders import (  # noqa: E402
    average_checkpoints,
    checkpoint_step,
    list_checkpoints,
    trainer_state,
)
from vanilla_transformer.training.metrics import load_bleu_and_chrf  # noqa: E402


@torch.inference_mode()
def reference_nll(model, tokenizer, sources: list[str], references: list[str], batch_size: int) -> float:
    """Per-token negative log-likelihood of the references given the sources (teacher forcing)."""
    total, tokens = 0.0, 0
    for start in range(0, len(sources), batch_size):
        batch = tokenizer(sources[start : start + batch_size], padding=True, return_tensors="pt")
        labels = tokenizer(references[start : start + batch_size], padding=True, return_tensors="pt")
        labels = labels.input_ids.masked_fill(labels.attention_mask == 0, -100)
        logits = model(**batch, labels=labels).logits
        total += F.cross_entropy(logits.transpose(1, 2), labels, ignore_index=-100, reduction="sum").item()
        tokens += int((labels != -100).sum())
    return total / tokens


def parse_args() -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("output_dir")
    parser.add_argument("--data_dir", required=True)
    parser.add_argument("--split", default="val")
    parser.add_argument("--source_lang", default="en")
    parser.add_argument("--target_lang", default="de")
    parser.add_argument("--max_sentences", type=int, help="score only the first N sentences")
    parser.add_argument("--last", type=int, nargs="+", default=[1, 2, 3, 5])
    parser.add_argument("--every", type=int, nargs="+", default=[1])
    parser.add_argument("--batch_size", type=int, default=64)
    parser.add_argument("--until_minutes", type=float, help="only checkpoints saved within this much training time")
    parser.add_argument("--length_penalty", type=float, nargs="+", help="decode with each (default: the run's)")
    parser.add_argument("--save_averaged", help="write the first averaging as a model folder here (must not exist)")
    args = parser.parse_args()
    if args.save_averaged and Path(args.save_averaged).exists():
        parser.error(f"--save_averaged: {args.save_averaged} exists; give a new folder")
    return args


def kept_checkpoints(output_dir: str, until_minutes: float | None) -> list[Path]:
    checkpoints = list_checkpoints(Path(output_dir) / "checkpoints")
    if until_minutes is None:
        return checkpoints
    limit = until_minutes * 60
    return [path for path in checkpoints if trainer_state(path).get("elapsed_seconds", limit + 1) <= limit]


def print_scores(model, tokenizer, metric, sources, references, steps: str, args, length_penalties) -> None:
    """One table row per length penalty for the averaged weights now in `model`."""
    nll = reference_nll(model, tokenizer, sources, references, args.batch_size)
    for length_penalty in length_penalties:
        with torch.inference_mode():
            hypotheses = translate_sentences(
                model, tokenizer, sources, batch_size=args.batch_size, length_penalty=length_penalty
            )
        scores = metric.compute(predictions=hypotheses, references=[[ref] for ref in references])
        ratio = scores["sys_len"] / scores["ref_len"]
        print(
            f"| {steps} | {length_penalty} | {scores['bleu']:.2f} | {scores['chrf']:.2f} | {ratio:.3f} | {nll:.3f} |",
            flush=True,
        )


def main() -> None:
    args = parse_args()
    data_dir = Path(args.data_dir)
    pairs, _ = read_parallel_text(
        data_dir / f"{args.split}.{args.source_lang}.gz", data_dir / f"{args.split}.{args.target_lang}.gz"
    )
    pairs = pairs[: args.max_sentences]
    sources, references = [source for source, _ in pairs], [target for _, target in pairs]
    checkpoints = kept_checkpoints(args.output_dir, args.until_minutes)
    model, tokenizer = load_model_and_tokenizer(args.output_dir, device="cpu")
    metric = load_bleu_and_chrf()
    print(f"{len(checkpoints)} checkpoints: steps {[checkpoint_step(path) for path in checkpoints]}", flush=True)
    length_penalties = args.length_penalty or [model.generation_config.length_penalty]
    print("| averaged steps | length penalty | BLEU | chrF | length ratio | NLL |", flush=True)
    print("|---|---:|---:|---:|---:|---:|", flush=True)
    for every in args.every:
        for last in args.last:
            chosen = checkpoints[::-1][::every][:last]
            if len(chosen) < last:
                continue
            model.load_state_dict(average_checkpoints(chosen), strict=False)
            model.tie_weights()
            steps = ", ".join(str(checkpoint_step(path)) for path in chosen[::-1])
            print_scores(model, tokenizer, metric, sources, references, steps, args, length_penalties)
            if args.save_averaged and not Path(args.save_averaged).exists():
                generation = model.generation_config  # the run's decoding
                decoding = {"num_beams": generation.num_beams, "length_penalty": generation.length_penalty}
                save_model_folder(
                    model, tokenizer, args.save_averaged, {"steps": checkpoint_step(chosen[0])}, decoding
                )
                print(f"saved the average of steps {steps} to {args.save_averaged}", flush=True)


if __name__ == "__main__":
    main()
