"""Speed of a converted OPUS-MT model (`vanilla-transformer convert`) against the MarianMTModel it came from, and
through its CTranslate2 export.

The source is an OPUS-MT-sized MarianMTModel (d_model 512, 6+6 layers, 8 heads, FFN 2048, swish, a vocabulary of
58,101 tokens like Helsinki-NLP/opus-mt-en-de's; transformers' random initialisation and a random final_logits_bias),
saved with a MarianTokenizer (a small SentencePiece model trained here; vocab.json padded to the vocabulary size with
placeholder pieces), then converted by `vanilla_transformer.converters.convert.convert` exactly as a user's folder is. The script
checks that both give the same greedy tokens before timing anything.

Engines: "marian" (transformers' MarianMTModel), "ours" (the converted folder), "ct2_float32" and "ct2_int8" (the
converted folder exported with `vanilla_transformer.converters.export_ctranslate2`, run in a worker process of their own:
CTranslate2 in the PyTorch engines' process changes their speed, docs/BENCHMARKS.md).
Work: greedy and beam 4, batch 1 and 32, sources of 16-24 tokens, exactly 24 new tokens per sentence (no end token:
`eos_token_id=None`, CTranslate2 `end_token=[]`, so every engine does the same work); tokens/s counts batch x 24.
Each row runs its engines interleaved in alternating order after one untimed warm-up each; the median of 3.

Usage:
    python benchmarks/converted_speed.py                 # the OPUS-MT size (a few minutes on 2 cores)
    python benchmarks/converted_speed.py --tiny          # a tiny model: checks that the script runs (seconds)
    python benchmarks/converted_speed.py --no-ctranslate2 --threads 1 --output results.json
"""

import argparse
import io
import json
import os
import sys
import tempfile
from collections.abc import Callable
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from common import WorkerProcess, describe_machine, fix_malloc_thresholds, machine  # noqa: E402
from timing import median_seconds  # noqa: E402

SIZES = {
    "opus-mt": dict(vocab_size=58101, d_model=512, layers=6, heads=8, ffn_dim=2048),
    "tiny": dict(vocab_size=1000, d_model=32, layers=2, heads=4, ffn_dim=64),
}
NEW_TOKENS = 24
SOURCE_LENGTHS = (16, 24)
REPETITIONS = 3
ROWS = [(num_beams, batch) for num_beams in (1, 4) for batch in (1, 32)]
CT2_ENGINES = ("ct2_float32", "ct2_int8")


def opus_mt_folder(folder: Path, size: dict) -> Path:
    """A MarianMTModel folder of OPUS-MT's layout and `size`, random weights, with a MarianTokenizer."""
    import sentencepiece
    from transformers import MarianConfig, MarianMTModel

    from vanilla_transformer.data.toy_task import synthetic_translation_pairs

    folder.mkdir(parents=True)
    texts = [text for pair in synthetic_translation_pairs(300) for text in pair]
    model_file = io.BytesIO()
    with open(os.devnull, "w") as quiet:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model_file,
            vocab_size=200,
            hard_vocab_limit=False,
            logstream=quiet,
        )
    for name in ("source.spm", "target.spm"):
        (folder / name).write_bytes(model_file.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_file=str(folder / "source.spm"))
    vocabulary = {"</s>": 0, "<unk>": 1}
    for piece in (processor.id_to_piece(index) for index in range(processor.get_piece_size())):
        vocabulary.setdefault(piece, len(vocabulary))
    for index in range(len(vocabulary), size["vocab_size"] - 1):
        vocabulary[f"▁placeholder{index}"] = index
    vocabulary["<pad>"] = size["vocab_size"] - 1
    (folder / "vocab.json").write_text(json.dumps(vocabulary, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    pad = size["vocab_size"] - 1
    config = MarianConfig(
        vocab_size=size["vocab_size"],
        d_model=size["d_model"],
        encoder_layers=size["layers"],
        decoder_layers=size["layers"],
        encoder_attention_heads=size["heads"],
        decoder_attention_heads=size["heads"],
        encoder_ffn_dim=size["ffn_dim"],
        decoder_ffn_dim=size["ffn_dim"],
        activation_function="swish",
        max_position_embeddings=512,
        scale_embedding=True,
        pad_token_id=pad,
        decoder_start_token_id=pad,
        eos_token_id=0,
        forced_eos_token_id=0,
        bos_token_id=0,
    )
    torch.manual_seed(0)
    model = MarianMTModel(config)
    model.final_logits_bias.normal_(0, 0.1)
    model.save_pretrained(folder)
    return folder


def source_batch(vocab_size: int, batch: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Seeded right-padded sources of 16-24 tokens in Marian's ids: ordinary tokens, </s> (0) last, <pad> after."""
    generator = torch.Generator().manual_seed(seed)
    lengths = torch.randint(SOURCE_LENGTHS[0], SOURCE_LENGTHS[1] + 1, (batch,), generator=generator)
    positions = torch.arange(int(lengths.max()))
    input_ids = torch.randint(2, vocab_size - 1, (batch, len(positions)), generator=generator)
    input_ids[positions == lengths[:, None] - 1] = 0
    attention_mask = (positions < lengths[:, None]).long()
    return input_ids.masked_fill(attention_mask == 0, vocab_size - 1), attention_mask


def generation(model, batch, num_beams: int) -> Callable[[], torch.Tensor]:
    """A callable that generates exactly NEW_TOKENS tokens per source (no end token, nothing forced)."""
    input_ids, attention_mask = batch

    def generate() -> torch.Tensor:
        with torch.inference_mode():
            output = model.generate(
                input_ids,
                attention_mask=attention_mask,
                num_beams=num_beams,
                do_sample=False,
                max_new_tokens=NEW_TOKENS,
                eos_token_id=None,
                forced_eos_token_id=None,
                length_penalty=1.0,
            )
        assert output.shape == (input_ids.shape[0], 1 + NEW_TOKENS), output.shape
        return output

    return generate


def ct2_vocabulary(ct2_dir: Path) -> list[str]:
    """The token strings of a CTranslate2 export, by id."""
    if (ct2_dir / "shared_vocabulary.json").is_file():
        return json.loads((ct2_dir / "shared_vocabulary.json").read_text(encoding="utf-8"))
    return (ct2_dir / "shared_vocabulary.txt").read_text(encoding="utf-8").splitlines()


def ct2_worker(ct2_dir: str, vocab_size: int, threads: int) -> None:
    """Runs in its own process: loads the CTranslate2 engines, then does one row's work per line of stdin."""
    import ctranslate2

    translators = {
        name: ctranslate2.Translator(ct2_dir, compute_type=name.removeprefix("ct2_"), intra_threads=threads)
        for name in CT2_ENGINES
    }
    tokens = ct2_vocabulary(Path(ct2_dir))
    print("ready", flush=True)
    for line in sys.stdin:
        name, num_beams, batch = json.loads(line)
        input_ids, attention_mask = source_batch(vocab_size, batch, seed=batch)
        sources = [
            [tokens[i] for i in row[mask].tolist()] for row, mask in zip(input_ids, attention_mask.bool(), strict=True)
        ]
        results = translators[name].translate_batch(
            sources, beam_size=num_beams, max_decoding_length=NEW_TOKENS, end_token=[]
        )
        assert all(len(result.hypotheses[0]) == NEW_TOKENS for result in results)
        print("done", flush=True)


def build_engines(work_dir: Path, size: dict, ctranslate2: bool, threads: int):
    """The source Marian model, the converted model and (optionally) the CTranslate2 worker; the first two are checked
    to generate the same tokens."""
    from transformers import MarianMTModel

    from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
    from vanilla_transformer.converters.convert import convert

    source = opus_mt_folder(work_dir / "opus-mt", size)
    converted = convert(source, work_dir / "converted")
    models = {
        "marian": MarianMTModel.from_pretrained(source).eval(),
        "ours": VanillaTransformerForConditionalGeneration.from_pretrained(converted).eval(),
    }
    batch = source_batch(size["vocab_size"], 4, seed=0)
    expected = generation(models["marian"], batch, 1)()
    if not torch.equal(generation(models["ours"], batch, 1)(), expected):
        raise SystemExit("the converted model does not generate the source's tokens: nothing timed")
    worker = None
    if ctranslate2:
        from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2

        ct2_dir = Path(convert_to_ctranslate2(converted, work_dir / "ct2"))
        arguments = ["--ct2-worker", str(ct2_dir), "--vocab-size", str(size["vocab_size"]), "--threads", str(threads)]
        worker = WorkerProcess(__file__, arguments)  # the CTranslate2 engines, away from PyTorch's
    return models, worker


def measure(models: dict, worker, vocab_size: int) -> list[dict]:
    """One result per row: tokens/s of every engine."""
    results = []
    for num_beams, batch in ROWS:
        data = source_batch(vocab_size, batch, seed=batch)
        runs = {name: generation(model, data, num_beams) for name, model in models.items()}
        if worker is not None:
            runs |= {name: worker.work(name, num_beams, batch) for name in CT2_ENGINES}
        seconds = median_seconds(runs, REPETITIONS)
        tokens = {name: batch * NEW_TOKENS / value for name, value in seconds.items()}
        results.append({"num_beams": num_beams, "batch": batch, "tokens_per_second": tokens})
        print(f"beam {num_beams} batch {batch}: " + ", ".join(f"{n} {t:,.0f} tok/s" for n, t in tokens.items()))
    return results


def table(results: list[dict]) -> str:
    """The results as a markdown table: tokens/s per engine, and ours against Marian and CTranslate2 float32."""
    engines = list(results[0]["tokens_per_second"])
    header = "| work | batch | " + " | ".join(f"{name} tok/s" for name in engines) + " | ours/marian |"
    header += " ours/ct2_float32 |" if "ct2_float32" in engines else ""
    lines = [header, "|---|---:|" + "---:|" * (len(engines) + 1 + ("ct2_float32" in engines))]
    for result in results:
        speed = result["tokens_per_second"]
        cells = [f"{speed[name]:,.0f}" for name in engines] + [f"{speed['ours'] / speed['marian']:.2f}x"]
        cells += [f"{speed['ours'] / speed['ct2_float32']:.2f}x"] if "ct2_float32" in speed else []
        work = "greedy" if result["num_beams"] == 1 else f"beam{result['num_beams']}"
        lines.append(f"| {work} | {result['batch']} | " + " | ".join(cells) + " |")
    return "\n".join(lines)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tiny", action="store_true", help="a tiny model: checks that the script runs")
    parser.add_argument("--no-ctranslate2", action="store_true", help="leave out the CTranslate2 engines")
    parser.add_argument("--threads", type=int, default=2, help="threads for torch and for CTranslate2")
    parser.add_argument("--output", help="also write the results (and the machine) to this JSON file")
    parser.add_argument("--ct2-worker", help=argparse.SUPPRESS)
    parser.add_argument("--vocab-size", type=int, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.ct2_worker:
        ct2_worker(args.ct2_worker, args.vocab_size, args.threads)
        return
    torch.set_num_threads(args.threads)
    fix_malloc_thresholds()
    size = SIZES["tiny" if args.tiny else "opus-mt"]
    with tempfile.TemporaryDirectory(prefix="converted-speed-") as work_dir:
        models, worker = build_engines(Path(work_dir), size, not args.no_ctranslate2, args.threads)
        try:
            results = measure(models, worker, size["vocab_size"])
        finally:
            if worker is not None:
                worker.close()
    info = machine()
    print(f"\n{describe_machine(info)}; size {size}\n\n{table(results)}")
    if args.output:
        Path(args.output).write_text(json.dumps({"machine": info, "size": size, "results": results}, indent=2) + "\n")


if __name__ == "__main__":
    main()
