"""Translation speed and quality of a trained model in float32 and in bf16, on real data.

    python benchmarks/inference_precision.py outputs/runC --data_dir ../shared/data/multi30k --split val

Loads the saved model folder once per variant (float32 + sdpa, bf16 weights + sdpa, bf16 weights + eager
attention), translates the whole split with the model's generation config (the paper's beam 4, length penalty 0.6,
input + 50 tokens) in batches of --batch_size sentences, longest first, and reports sentences and output tokens per
second (after one untimed warm-up batch) with sacreBLEU and chrF. The float32 variant runs first and again last,
so the table shows how much the machine's speed drifted during the run.
"""

import argparse
import sys
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))  # benchmarks/: the shared timing module
sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from timing import timed  # noqa: E402

from vanilla_transformer.data.readers import read_parallel_text  # noqa: E402
from vanilla_transformer.serving.translate import load_model_and_tokenizer, translate_sentences  # noqa: E402
from vanilla_transformer.training.metrics import load_bleu_and_chrf  # noqa: E402

VARIANTS = {  # name: (dtype, attention)
    "float32 + sdpa": (torch.float32, "sdpa"),
    "bf16 + sdpa": (torch.bfloat16, "sdpa"),
    "bf16 + eager": (torch.bfloat16, "eager"),
}


def run_variant(model_dir: str, dtype: torch.dtype, attention: str, sources, references, batch_size, metric):
    model, tokenizer = load_model_and_tokenizer(model_dir, dtype=dtype, attn_implementation=attention)
    translate_sentences(model, tokenizer, sources[:batch_size], batch_size=batch_size)  # warm-up
    hypotheses, seconds = timed(lambda: translate_sentences(model, tokenizer, sources, batch_size=batch_size))
    output_tokens = sum(len(ids) for ids in tokenizer(hypotheses)["input_ids"])
    scores = metric.compute(predictions=hypotheses, references=[[reference] for reference in references])
    return {
        "sentences/s": len(sources) / seconds,
        "tokens/s": output_tokens / seconds,
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("model_dir", help="a saved model folder (train_accelerate.py's output)")
    parser.add_argument("--data_dir", default="../shared/data/multi30k")
    parser.add_argument("--split", default="val")
    parser.add_argument("--source_language", default="en")
    parser.add_argument("--target_language", default="de")
    parser.add_argument("--batch_size", type=int, default=32)
    parser.add_argument("--threads", type=int, default=torch.get_num_threads())
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    data = Path(args.data_dir)
    pairs, _ = read_parallel_text(
        data / f"{args.split}.{args.source_language}.gz", data / f"{args.split}.{args.target_language}.gz"
    )
    sources, references = [source for source, _ in pairs], [target for _, target in pairs]
    metric = load_bleu_and_chrf()
    print(
        f"{args.model_dir}, {args.split} ({len(sources)} sentences), batch {args.batch_size}, {args.threads} threads"
    )
    print("| precision | attention | sentences/s | output tokens/s | BLEU | chrF |\n|---|---|---:|---:|---:|---:|")
    for name in [*VARIANTS, "float32 + sdpa"]:
        dtype, attention = VARIANTS[name]
        result = run_variant(args.model_dir, dtype, attention, sources, references, args.batch_size, metric)
        precision = "float32" if dtype == torch.float32 else "bf16"
        print(
            f"| {precision} | {attention} | {result['sentences/s']:.1f} | {result['tokens/s']:,.0f} "
            f"| {result['bleu']:.2f} | {result['chrf']:.2f} |",
            flush=True,
        )


if __name__ == "__main__":
    main()
