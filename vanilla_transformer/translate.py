"""Translate sentences with a saved model: one sentence per line in, its translation on the same line out.

    python -m vanilla_transformer.translate MODEL_DIR < source.txt > hypotheses.txt
    python -m vanilla_transformer.translate MODEL_DIR --input source.txt --output hypotheses.txt \
        --batch_size 64 --num_beams 4 --device cuda
    python -m vanilla_transformer.translate MODEL_DIR --dtype bfloat16 --attn_implementation eager < source.txt

bf16 with eager attention translated Multi30k 1.5-1.7x as fast as float32 on a CPU with AVX512-BF16, with the same
BLEU (docs/BENCHMARKS.md); torch's CPU sdpa kernels are slow in bf16, hence eager there.

Line i of the output translates line i of the input, so the output can be scored against references: an empty input
line gives an empty output line (with a warning). The input is UTF-8 (a byte-order mark at its start is dropped);
undecodable bytes stop the run, naming their line. Lines longer than --max_source_tokens stop the run, naming them.
Decoding follows the model's generation_config.json (the paper: beam 4, length penalty 0.6) with a maximum output
length of input length + 50 tokens (section 6.1) unless --max_new_tokens is given.
"""

import argparse
import codecs
import sys
import time
from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase
from transformers.utils import logging

import modeling_vanilla_transformer  # noqa: F401  (registers the model with the Auto classes)
from pipeline_vanilla_transformer import paper_max_new_tokens
from vanilla_transformer.cli import positive_int

MAX_LINES_NAMED = 10
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


class CommandLineError(Exception):
    """A problem with the command's model or input, reported as one message without a traceback."""


def translate_sentences(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    batch_size: int = 32,
    num_beams: int | None = None,
    max_new_tokens: int | None = None,
    **generate_kwargs,
) -> list[str]:
    """Translate `sentences`; returns one translation per sentence, in the input order.

    Sentences are batched by length (longest first) to waste little padding. Empty or whitespace-only sentences
    give "" without running the model. Without `max_new_tokens`, a batch may generate its longest source (in tokens)
    + 50 new tokens; `num_beams` and other generation arguments default to the model's generation config.
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    if num_beams is not None:
        generate_kwargs["num_beams"] = num_beams
    translations = [""] * len(sentences)
    to_translate = [index for index, sentence in enumerate(sentences) if sentence.strip()]
    if not to_translate:
        return translations
    lengths = [len(ids) for ids in tokenizer([sentences[index] for index in to_translate])["input_ids"]]
    longest_first = [to_translate[k] for k in sorted(range(len(lengths)), key=lengths.__getitem__, reverse=True)]

    model.eval()
    for start in range(0, len(longest_first), batch_size):
        indices = longest_first[start : start + batch_size]
        batch = tokenizer([sentences[index] for index in indices], padding=True, return_tensors="pt")
        batch = {name: batch[name].to(model.device) for name in ("input_ids", "attention_mask")}
        length = max_new_tokens if max_new_tokens is not None else paper_max_new_tokens(batch["attention_mask"])
        with torch.inference_mode():
            output_ids = model.generate(**batch, max_new_tokens=length, **generate_kwargs)
        texts = tokenizer.batch_decode(output_ids, skip_special_tokens=True)
        for index, text in zip(indices, texts, strict=True):
            translations[index] = text
    return translations


def load_model_and_tokenizer(
    model_dir: str | Path, device: str = "cpu", **model_kwargs
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (in eval mode, on `device`) and tokenizer of a saved model folder; CommandLineError if it is none.

    `model_kwargs` go to `from_pretrained`, e.g. attn_implementation="eager"."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise CommandLineError(f"{model_dir} is not a folder: give the folder of a saved model.")
    if not (folder / "config.json").is_file():
        raise CommandLineError(f"{model_dir} is not a model folder: it has no config.json.")
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=model_kwargs.get("trust_remote_code"))
        model = AutoModelForSeq2SeqLM.from_pretrained(folder, **model_kwargs).to(device).eval()
    except Exception as error:  # a command-line user gets one line, not the loader's traceback
        raise CommandLineError(f"cannot load a model and tokenizer from {model_dir}: {error}") from error
    return model, tokenizer


def decode_input(content: bytes, name: str) -> str:
    """`content` decoded as UTF-8 without a leading byte-order mark; CommandLineError names the line of bad bytes."""
    content = content.removeprefix(codecs.BOM_UTF8)
    try:
        return content.decode("utf-8")
    except UnicodeDecodeError as error:
        line = content.count(b"\n", 0, error.start) + 1
        column = error.start - content.rfind(b"\n", 0, error.start)  # 1-based byte of the line
        raise CommandLineError(
            f"cannot read the input {name}: invalid UTF-8 on line {line} ({error.reason} at byte {column} of the "
            "line): the input must be UTF-8 text"
        ) from None


def read_lines(path: str | None) -> list[str]:
    """The lines of a UTF-8 file, or of stdin when `path` is None, without their line endings.

    Both are read as bytes and decoded strictly, so that bad bytes are an error naming their line (stdin's own
    decoding would let them through as lone surrogates, which the tokenizer rejects with a traceback)."""
    name = path or "(stdin)"
    try:
        content = getattr(sys.stdin, "buffer", sys.stdin).read() if path is None else Path(path).read_bytes()
    except OSError as error:
        raise CommandLineError(f"cannot read the input {name}: {error}") from error
    text = decode_input(content, name) if isinstance(content, bytes) else content  # a text stdin without .buffer
    lines = text.split("\n") if text else []  # not splitlines(): it splits on characters other tools keep in a line
    if text.endswith("\n"):
        lines.pop()
    if not lines:
        raise CommandLineError(f"the input {path or '(stdin)'} is empty: there is nothing to translate.")
    return [line.removesuffix("\r") for line in lines]


def _name_lines(numbers: list[int]) -> str:
    named = ", ".join(str(number) for number in numbers[:MAX_LINES_NAMED])
    return named + (f" and {len(numbers) - MAX_LINES_NAMED} more" if len(numbers) > MAX_LINES_NAMED else "")


def check_lines(lines: list[str], tokenizer: PreTrainedTokenizerBase, max_source_tokens: int) -> list[int]:
    """Raise CommandLineError naming the lines longer than `max_source_tokens`; return the empty lines' numbers."""
    empty = [number for number, line in enumerate(lines, start=1) if not line.strip()]
    lengths = [len(ids) for ids in tokenizer(lines)["input_ids"]]
    too_long = [number for number, length in enumerate(lengths, start=1) if length > max_source_tokens]
    if too_long:
        raise CommandLineError(
            f"line(s) {_name_lines(too_long)} have more than {max_source_tokens} source tokens (the longest has "
            f"{max(lengths)}): split them, or allow longer input with --max_source_tokens."
        )
    return empty


def resolve_device(name: str | None) -> str:
    if name is None:
        return "cuda" if torch.cuda.is_available() else "cpu"
    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise CommandLineError(f"--device {name!r} is not a device: {error}") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise CommandLineError(f"--device {name}: CUDA is not available on this machine; use --device cpu.")
    return name


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir", help="a saved model folder (config.json, weights, tokenizer)")
    parser.add_argument("--input", help="source sentences, one per line (default: stdin)")
    parser.add_argument("--output", help="where to write the translations (default: stdout)")
    parser.add_argument("--batch_size", type=positive_int, default=32, help="sentences per batch")
    parser.add_argument("--num_beams", type=positive_int, help="beam size (default: generation_config.json; paper: 4)")
    parser.add_argument("--max_new_tokens", type=positive_int, help="output length limit (default: input length + 50)")
    parser.add_argument(
        "--max_source_tokens", type=positive_int, help="longest input line (default: max_position_embeddings)"
    )
    parser.add_argument("--device", help="cpu, cuda, cuda:1, ... (default: cuda if available)")
    parser.add_argument("--dtype", choices=sorted(DTYPES), default="float32", help="weights and computation")
    parser.add_argument("--attn_implementation", choices=["sdpa", "eager"], help="attention (default: the model's)")
    parser.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="run the folder's own model code (Hub models); by default the installed vanilla-transformer code runs",
    )
    args = parser.parse_args(argv)
    if args.input and args.output and Path(args.input).resolve() == Path(args.output).resolve():
        parser.error(f"--output {args.output} is the --input file: the translations would replace the sources")
    return args


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    logging.disable_progress_bar()  # stderr is for this command's own messages
    try:
        device = resolve_device(args.device)
        model_kwargs = {"dtype": DTYPES[args.dtype], "trust_remote_code": args.trust_remote_code}
        if args.attn_implementation:
            model_kwargs["attn_implementation"] = args.attn_implementation
        model, tokenizer = load_model_and_tokenizer(args.model_dir, device, **model_kwargs)
        lines = read_lines(args.input)
        max_source_tokens = args.max_source_tokens or model.config.max_position_embeddings
        empty = check_lines(lines, tokenizer, max_source_tokens)
        if empty:
            print(f"warning: line(s) {_name_lines(empty)} are empty: so are their output lines.", file=sys.stderr)
        started = time.perf_counter()
        translations = translate_sentences(
            model, tokenizer, lines, args.batch_size, args.num_beams, args.max_new_tokens
        )
        # one translation per line, whatever characters the model produced
        text = "".join(" ".join(translation.splitlines()) + "\n" for translation in translations)
        if args.output is None:
            sys.stdout.write(text)
        else:
            try:
                Path(args.output).write_text(text, encoding="utf-8")
            except OSError as error:
                raise CommandLineError(f"cannot write the output {args.output}: {error}") from error
    except CommandLineError as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    seconds = time.perf_counter() - started
    print(f"translated {len(lines) - len(empty)} sentence(s) in {seconds:.1f} s on {device}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
