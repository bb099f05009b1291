"""Translate sentences with a saved model: one sentence per line in, its translation on the same line out.

    vanilla-transformer translate MODEL_DIR < source.txt > hypotheses.txt
    vanilla-transformer translate MODEL_DIR --input source.txt --output hypotheses.txt \
        --batch_size 64 --num_beams 4 --device cuda
    vanilla-transformer translate MODEL_DIR --dtype bfloat16 --attn_implementation eager < source.txt

bf16 with eager attention translated Multi30k 1.5-1.7x as fast as float32 on a CPU with AVX512-BF16, with the same
BLEU (docs/BENCHMARKS.md); torch's CPU sdpa kernels are slow in bf16, hence eager there.

Line i of the output translates line i of the input, so the output can be scored against references: an empty input
line gives an empty output line (with a warning). The input is read, checked, translated and written --buffer_size
lines at a time, in input order, so memory stays bounded on any file and an interruption (Ctrl-C, an error) keeps
every translation written so far; the output path is checked before the model is loaded. The input is UTF-8 (a
byte-order mark at its start is dropped); undecodable bytes stop the run, naming their line. Lines longer than
--max_source_tokens stop the run, naming them. Decoding follows the model's generation_config.json (the paper: beam
4, length penalty 0.6) with a maximum output length of input length + 50 tokens (section 6.1) unless
--max_new_tokens is given, at most what a learned position table can represent (said once when it cuts).

A model folder may come from anyone: its config.json and generation_config.json are read as plain JSON before any model
is built, and sizes that would allocate without bound are refused, naming the file, the field and the limit (a
position table or embedding matrix over 1 GiB, a beam over 64, an output length over 4096). --num_beams and
--max_new_tokens have the same limits. Started with stdin closed and no --input, the command says so. One translation
per line is written whatever num_return_sequences generation_config.json sets (a note says so).

On a terminal, a progress bar of the lines translated shows on stderr (nothing when stderr is not a terminal, so
pipelines stay clean). Without --trust_remote_code the installed vanilla-transformer code runs: a note names the
folder's code files that differ from it (`vanilla-transformer refresh-code MODEL_DIR` gives the folder that code).
"""

import argparse
import sys
import time
from collections.abc import Sequence
from pathlib import Path

from transformers.utils import logging

from pipeline_vanilla_transformer import MAX_OUTPUT_TOKENS
from vanilla_transformer.commands.flags import command_parser, positive_int
from vanilla_transformer.model.loading import MAX_BEAMS
from vanilla_transformer.serving.translate import (
    BATCH_SIZE,
    DTYPES,
    NO_STDIN,
    CommandLineError,
    OutputFile,
    check_output,
    folder_notes,
    load_model_and_tokenizer,
    name_lines,
    resolve_device,
    translate_stream,
)


def up_to(high: int):
    """An integer type for argparse: whole numbers from 1 to `high` (a beam or output length the machine can hold)."""

    def parse(text: str) -> int:
        value = positive_int(text)
        if value > high:
            raise argparse.ArgumentTypeError(f"must be an integer from 1 to {high}, got {value}")
        return value

    parse.__name__ = f"integer from 1 to {high}"
    return parse


beam_size = up_to(MAX_BEAMS)
output_tokens = up_to(MAX_OUTPUT_TOKENS)


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = command_parser("vanilla-transformer translate", __doc__)
    parser.add_argument("model_dir", help="a saved model folder (config.json, weights, tokenizer)")
    parser.add_argument("--input", help="source sentences, one per line (default: stdin)")
    parser.add_argument("--output", help="where to write the translations (default: stdout)")
    parser.add_argument("--batch_size", type=positive_int, default=BATCH_SIZE, help="sentences per batch")
    parser.add_argument(
        "--buffer_size",
        type=positive_int,
        default=1000,
        help="lines read, sorted by length, translated and written at a time (at least --batch_size)",
    )
    parser.add_argument(
        "--num_beams",
        type=beam_size,
        help=f"beam size, at most {MAX_BEAMS} (default: generation_config.json; paper: 4)",
    )
    parser.add_argument(
        "--max_new_tokens",
        type=output_tokens,
        help=f"output length limit, at most {MAX_OUTPUT_TOKENS} (default: input length + 50)",
    )
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
    progress = {"translated": 0, "written": 0, "empty": []}
    destination, output = args.output or "(stdout)", None
    try:
        if args.input is None and sys.stdin is None:  # started with stdin closed (<&-): said before the model loads
            raise CommandLineError(NO_STDIN)
        if args.output:
            check_output(args.output)
            output = OutputFile.claim(args.output)  # one command per --output file
        device = resolve_device(args.device)
        model_kwargs = {"dtype": DTYPES[args.dtype], "trust_remote_code": args.trust_remote_code}
        if args.attn_implementation:
            model_kwargs["attn_implementation"] = args.attn_implementation
        model, tokenizer = load_model_and_tokenizer(args.model_dir, device, **model_kwargs)
        for note in folder_notes(args.model_dir, args.trust_remote_code):
            print(note, file=sys.stderr)
        started = time.perf_counter()
        translate_stream(
            model,
            tokenizer,
            progress,
            source=args.input,
            destination=output,
            batch_size=args.batch_size,
            buffer_size=args.buffer_size,
            num_beams=args.num_beams,
            max_new_tokens=args.max_new_tokens,
            max_source_tokens=args.max_source_tokens,
            show_progress=sys.stderr is not None and sys.stderr.isatty(),
        )
    except CommandLineError as error:
        print(f"error: {error}", file=sys.stderr)
        if progress["written"]:
            print(f"the translations of lines 1-{progress['written']} are in {destination}", file=sys.stderr)
        return 1
    except KeyboardInterrupt:
        print(f"interrupted: the translations of lines 1-{progress['written']} are in {destination}", file=sys.stderr)
        return 130
    finally:
        if output is not None:
            output.close()
    if progress["empty"]:
        print(
            f"warning: line(s) {name_lines(progress['empty'])} are empty: so are their output lines.", file=sys.stderr
        )
    seconds = time.perf_counter() - started
    print(f"translated {progress['translated']} sentence(s) in {seconds:.1f} s on {device}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
