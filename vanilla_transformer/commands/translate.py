"""Translate a corpus with a saved model: a file, stdin, a document or a dataset, on one process or many.

    vanilla-transformer translate MODEL_DIR < source.txt > hypotheses.txt
    vanilla-transformer translate MODEL_DIR --input source.txt --output hypotheses.txt
    accelerate launch -m vanilla_transformer translate MODEL_DIR --input source.txt --output hypotheses.txt
    vanilla-transformer translate MODEL_DIR --input book.txt --output book.de.txt --split_sentences --paragraphs
    vanilla-transformer translate MODEL_DIR --data_files reviews.parquet --column text --output reviews.de.parquet
    vanilla-transformer translate MODEL_DIR --input source.txt --output hyp.txt --backend ctranslate2 --compute_type int8
    vanilla-transformer translate MODEL_DIR --input source.txt --output hyp.txt --backend onnx --onnx_dir OUT \\
        --onnx_variant q8

Unit i of the output translates unit i of the input: a line (an empty line gives an empty line), a paragraph with
--paragraphs (blank lines kept), or a dataset row (the output is the dataset with a `translation` column). The input
is translated --buffer_size units at a time (a chunk: sorted by length, batched by --max_batch_tokens source tokens x
beams, or by --batch_size sentences), and written in input order.

With --output, every finished chunk is recorded in OUTPUT.partial/ beside it: a run stopped any way (Ctrl-C, SIGTERM,
kill -9, a lost machine) is continued by the same command, never translates a finished chunk again, and writes the
same bytes as an uninterrupted run. A changed input or setting is refused by name; --overwrite starts again (and may
replace an existing --output, which is otherwise refused). Under `accelerate launch` the processes (GPUs, or CPU
processes) share the chunks and the first writes the output; on several machines, --output must be on a filesystem
they share.

A sentence longer than the model takes (--max_piece_tokens, default its positions) is cut at punctuation or spaces
into pieces that fit, said once and counted in the summary. A line (or a dataset's cell) over --max_line_bytes is an
error naming it: a line takes about 200 times its size in memory while it is tokenized and cut, so the flag is at
most 4 MiB (about 1 GB). An input that can be read only once (stdin, a pipe, a FIFO, `<(...)`) is copied into
OUTPUT.partial/ first; an input that changes while the run reads it is an error naming it.
Decoding follows the model's generation_config.json (the paper: beam 4, length penalty 0.6) with a maximum output
length of input length + 50 tokens (section 6.1) unless --max_new_tokens is given.

On a terminal, a progress bar (lines/s, target tokens/s, time left) shows on stderr; elsewhere, a line every
--log_every seconds; at the end, one summary line. A model folder may come from anyone: sizes that would allocate
without bound are refused before a model is built. Without --trust_remote_code the installed vanilla-transformer code
runs (a note names the folder's code files that differ).
"""

import argparse
import os
import signal
import sys
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path

from vanilla_transformer.commands.export_onnx import QUANTIZATIONS as ONNX_VARIANTS
from vanilla_transformer.commands.flags import (
    add_deprecated_alias,
    add_settings_flags,
    at_least,
    command_parser,
    flag_values,
    recorded_flags,
)
from vanilla_transformer.commands.runner import UsageError, command, need
from vanilla_transformer.converters.ctranslate2_types import COMPUTE_TYPES
from vanilla_transformer.mechanics.memory import keep_freed_memory
from vanilla_transformer.serving.corpus import CorpusTranslation, Process, say, translate_to_stream
from vanilla_transformer.serving.corpus_folder import CorpusError
from vanilla_transformer.serving.corpus_output import DATASET_SUFFIXES, check_output, same_file
from vanilla_transformer.serving.settings import (
    BackendSettings,
    CorpusSettings,
    DecodingSettings,
    folder_max_new_tokens,
)
from vanilla_transformer.serving.sources import (
    LINE_BYTES_LIMIT,
    MAX_LINE_BYTES,
    NO_STDIN,
    DatasetSource,
    InputError,
    TextSource,
)


def line_bytes(text: str) -> int:
    """--max_line_bytes: from 1 to LINE_BYTES_LIMIT (a line's memory is about 200 times its size)."""
    value = at_least(1)(text)
    if value > LINE_BYTES_LIMIT:
        raise argparse.ArgumentTypeError(
            f"must be at most {LINE_BYTES_LIMIT:,} (a line takes about 200 times its size in memory), got {value:,}"
        )
    return value


def add_input_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("input and output")
    group.add_argument("--input", help="a UTF-8 text file, a unit a line (default: stdin)")
    group.add_argument("--output", help="where to write (default: stdout); resumable, see above")
    group.add_argument("--overwrite", action="store_true", help="start again: replace --output and its partial run")
    group.add_argument("--paragraphs", action="store_true", help="a unit is a paragraph (lines up to a blank line)")
    add_settings_flags(group, CorpusSettings, ["split_sentences", "language"])
    group.add_argument(
        "--max_line_bytes",
        type=line_bytes,
        default=MAX_LINE_BYTES,
        help=f"longest input line or dataset cell (default {MAX_LINE_BYTES:,}, at most {LINE_BYTES_LIMIT:,}: a line "
        "takes about 200 times its size in memory)",
    )
    group.add_argument("--dataset_name", help="a dataset in the local Hub cache (or a loading script's folder)")
    group.add_argument("--dataset_config", help="the dataset's configuration")
    group.add_argument("--split", default="train", help="the dataset's split (default: train)")
    group.add_argument("--data_files", nargs="+", help="local .parquet, .jsonl or .csv files, read as one dataset")
    group.add_argument("--column", help="the dataset's column to translate")
    group.add_argument("--streaming", action="store_true", help="read the dataset row by row (larger than memory)")


def add_batching_flags(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("batching and decoding")
    add_settings_flags(group, CorpusSettings, ["max_batch_tokens", "batch_size", "buffer_size"])
    add_settings_flags(group, DecodingSettings)
    add_settings_flags(group, CorpusSettings, ["max_piece_tokens", "log_every"])
    add_deprecated_alias(group, "--max_tokens", "--max_batch_tokens")  # until the release after 0.1
    add_deprecated_alias(group, "--max_source_tokens", "--max_piece_tokens")


def add_backend_flags(parser: argparse.ArgumentParser) -> None:
    """The backend's flags (translate's and serve's); their choices from the converters, which settings.py (copied
    into a Space alone) cannot import."""
    group = parser.add_argument_group("backend")
    choices = {"onnx_variant": {"choices": ONNX_VARIANTS}, "compute_type": {"choices": COMPUTE_TYPES}}
    add_settings_flags(group, BackendSettings, **choices)


def check_backend_flags(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Each backend's flags given with that backend only (translate's and serve's)."""
    if args.backend != "ctranslate2" and (args.ctranslate2_dir or args.compute_type):
        parser.error("--ctranslate2_dir and --compute_type are for --backend ctranslate2")
    if (args.backend == "onnx") != bool(args.onnx_dir):
        parser.error("--backend onnx decodes with --onnx_dir, MODEL_DIR's export: give both or neither")
    if args.onnx_variant and args.backend != "onnx":
        parser.error("--onnx_variant is for --backend onnx")


def translate_parser() -> argparse.ArgumentParser:
    parser = command_parser("vanilla-transformer translate", __doc__)
    parser.add_argument("model_dir", help="a saved model folder (config.json, weights, tokenizer)")
    add_input_flags(parser)
    add_batching_flags(parser)
    add_backend_flags(parser)
    return parser


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = translate_parser()
    args = parser.parse_args(argv)
    dataset = args.dataset_name or args.data_files
    if dataset and args.input:
        parser.error("give --input (a text file) or a dataset (--dataset_name, --data_files), not both")
    if dataset and not args.column:
        parser.error("a dataset needs --column, the column to translate")
    if dataset and not args.output:
        parser.error(f"a dataset is written to --output (a {', '.join(DATASET_SUFFIXES)} file, or a folder)")
    if (args.column or args.streaming) and not dataset:
        parser.error("--column and --streaming are for a dataset (--dataset_name or --data_files)")
    check_backend_flags(parser, args)
    if args.output and same_file(args.input, args.output):
        parser.error(f"--output {args.output} is the input file: the translations would replace the sources")
    return args


def corpus_settings(args: argparse.Namespace) -> CorpusSettings:
    return CorpusSettings(**flag_values(CorpusSettings, args))


def corpus_source(args: argparse.Namespace):
    if args.dataset_name or args.data_files:
        return DatasetSource(
            column=args.column,
            name=args.dataset_name,
            config=args.dataset_config,
            split=args.split,
            data_files=tuple(args.data_files or ()),
            streaming=args.streaming,
            max_line_bytes=args.max_line_bytes,
        )
    return TextSource(args.input, paragraphs=args.paragraphs, max_line_bytes=args.max_line_bytes)


def output_settings(args: argparse.Namespace, device: str, model_digest: str, export_digest: str | None) -> dict:
    """What changes the output, as a run's manifest records it (serving/corpus.py): a resumed run must give the same.
    The settings in effect, by their flags (those a field does not mark `recorded: False`): a flag left out and one
    given with the folder's own value are the same setting. A manifest of an earlier release names some otherwise:
    serving/settings.py's `upgraded_record` renames them."""
    source = {
        "--paragraphs": args.paragraphs,
        "--column": args.column,
    }  # what a unit is: TextSource's, DatasetSource's
    record = {name: value for settings in effective_settings(args) for name, value in recorded_flags(settings).items()}
    return {"model": model_digest, "ctranslate2": export_digest, "device": device.split(":")[0], **record, **source}


def effective_settings(args: argparse.Namespace) -> tuple[CorpusSettings, BackendSettings, DecodingSettings]:
    """The settings the run translates with: the flags', else the folder's (generation_config.json, config.json:
    the beam, the output length, the longest piece), else the backends' defaults (None: section 6.1's input + 50)."""
    from vanilla_transformer.model.loading import read_json_file

    folder = Path(args.model_dir)
    generation = read_json_file(folder / "generation_config.json") or {}
    positions = (read_json_file(folder / "config.json") or {}).get("max_position_embeddings")
    max_new_tokens = args.max_new_tokens if args.max_new_tokens is not None else folder_max_new_tokens(generation)
    decoding = DecodingSettings(args.num_beams or generation.get("num_beams") or 1, max_new_tokens)
    corpus = replace(corpus_settings(args), max_piece_tokens=args.max_piece_tokens or positions)
    compute_type = args.compute_type or ("default" if args.backend == "ctranslate2" else None)
    backend = replace(BackendSettings(**flag_values(BackendSettings, args)), compute_type=compute_type)
    return corpus, backend, decoding


def stop_on_sigterm(signum, frame):
    """SIGTERM (a scheduler's stop) ends the command as Ctrl-C does: the finished chunks stay recorded."""
    raise KeyboardInterrupt


def make_backend(args: argparse.Namespace, device: str, ctranslate2_dir: str | None, first: bool):
    """The model (or its CTranslate2 export) that translates, loaded on `device`; the folder's notes said once."""
    import torch

    from vanilla_transformer.model.decoding import ModelBackend
    from vanilla_transformer.serving.translate import DTYPES, folder_notes, load_model_and_tokenizer

    if first:
        for note in folder_notes(args.model_dir, args.trust_remote_code):
            say(note)
    if args.backend == "ctranslate2":
        from vanilla_transformer.data.tokenization import load_tokenizer
        from vanilla_transformer.serving.ctranslate2_backend import CTranslate2Backend

        return CTranslate2Backend(
            args.model_dir,
            load_tokenizer(args.model_dir),
            ctranslate2_dir,
            device=device.split(":")[0],
            compute_type=args.compute_type or "default",
            threads=torch.get_num_threads(),
            num_beams=args.num_beams,
            max_new_tokens=args.max_new_tokens,
        )
    if args.backend == "onnx":
        from vanilla_transformer.serving.onnx_backend import OnnxBackend

        return OnnxBackend(
            args.model_dir,
            args.onnx_dir,
            args.num_beams,
            args.max_new_tokens,
            threads=torch.get_num_threads(),
            variant=args.onnx_variant,
        )
    keep_freed_memory()  # generate()'s large tensors reuse freed memory instead of faulting in new pages (memory.py)
    model_kwargs = {"dtype": DTYPES[args.dtype], "trust_remote_code": args.trust_remote_code}
    if args.attn_implementation:
        model_kwargs["attn_implementation"] = args.attn_implementation
    model, tokenizer = load_model_and_tokenizer(args.model_dir, device, **model_kwargs)
    return ModelBackend(model, tokenizer, args.num_beams, args.max_new_tokens, threads=torch.get_num_threads())


def this_process(args: argparse.Namespace) -> tuple[Process, str]:
    """This process among those `accelerate launch` started (one alone otherwise), and its device."""
    import torch
    from accelerate import PartialState
    from accelerate.utils import broadcast_object_list

    # without an accelerator, `accelerate launch --multi_gpu` (or torchrun) starts CPU processes: gloo needs cpu=True
    has_device = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    state = PartialState(cpu=not has_device or (args.device or "").startswith("cpu"))
    process = Process(state.process_index, state.num_processes)
    if process.count > 1:
        process.broadcast = lambda value: broadcast_object_list([value], from_process=0)[0]
        if not args.output:
            raise CorpusError("several processes write one file: give --output (stdout is one process's)")
        if args.input is None and not (args.dataset_name or args.data_files):
            raise CorpusError("several processes read the input each: give --input FILE (stdin is read once)")
    return process, resolve_device(args.device) if args.device else str(state.device)


def resolve_device(name: str) -> str:
    """--device's value, checked: a device torch knows, and CUDA only where there is one."""
    import torch

    try:
        device = torch.device(name)
    except RuntimeError as error:
        raise UsageError(f"--device {name!r} is not a device: {error}") from error
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UsageError(f"--device {name}: CUDA is not available on this machine; use --device cpu.")
    return name


def translate_to_output(args: argparse.Namespace, source, settings: CorpusSettings, process, device) -> None:
    """A resumable run into --output (see corpus.py): the first process checks and prepares, all translate."""
    from vanilla_transformer.serving.ctranslate2_backend import model_digest

    def record() -> tuple[dict, dict]:
        check_output(args.output, args.overwrite, isinstance(source, DatasetSource), inputs_of(args))
        check_model_folder(args.model_dir)
        digest = model_digest(args.model_dir)
        export = the_export(args, digest)
        export_digest = model_digest(export) if export is not None else None
        return output_settings(args, device, digest, export_digest), {"ctranslate2_dir": export}

    run = CorpusTranslation(source, args.output, settings, process, args.overwrite)
    try:
        shared = run.begin(record)
        backend = make_backend(args, device, shared.get("ctranslate2_dir"), process.is_first)
        run.translate(backend, terminal=is_terminal())
        summary = run.finish()
    finally:
        run.close()
    if summary is not None:
        say(summary.line(unit_name(args)))


def check_model_folder(model_dir: str) -> None:
    folder = Path(model_dir)
    if not (folder / "config.json").is_file():
        raise CorpusError(f"{model_dir} is not a model folder: it has no config.json")


def inputs_of(args: argparse.Namespace) -> list[tuple[str, str]]:
    """What the run reads, as (what, path) pairs: --output may be none of them, nor inside one."""
    inputs = [("the model folder", args.model_dir)]
    inputs += [("the input", args.input)] if args.input else []
    inputs += [("the data file", path) for path in args.data_files or ()]
    if args.dataset_name and Path(args.dataset_name).exists():
        inputs.append(("the dataset's folder", args.dataset_name))
    inputs += [("the CTranslate2 export", args.ctranslate2_dir)] if args.ctranslate2_dir else []
    return inputs


def the_export(args: argparse.Namespace, digest: str | None = None) -> str | None:
    """The CTranslate2 export the run decodes with (--backend ctranslate2): --ctranslate2_dir, checked to be
    MODEL_DIR's, or the one made beside MODEL_DIR; None for the model backend."""
    if args.backend != "ctranslate2":
        return None
    need("ctranslate2", "export", "--backend ctranslate2")
    from vanilla_transformer.serving.ctranslate2_backend import cached_export, check_export

    if args.ctranslate2_dir is None:
        return str(cached_export(args.model_dir, digest))
    check_model_folder(args.model_dir)
    check_export(args.ctranslate2_dir, args.model_dir)
    return args.ctranslate2_dir


def unit_name(args: argparse.Namespace) -> str:
    return "rows" if args.column else "paragraphs and blank lines" if args.paragraphs else "lines"


def is_terminal() -> bool:
    return sys.stderr is not None and sys.stderr.isatty()


class StdoutClosed(Exception):
    """The reader of stdout went away (`| head -1`): the command stops, as `cat` does, without an error."""


def write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except BrokenPipeError:
        raise StdoutClosed from None
    except OSError as error:  # a full disk behind a redirection
        raise CorpusError(f"cannot write the output (stdout): {error}") from error


def run(args: argparse.Namespace) -> None:
    from transformers.utils import logging

    logging.disable_progress_bar()  # stderr is for this command's own messages
    source, settings = corpus_source(args), corpus_settings(args)
    process, device = this_process(args)
    if args.output:
        translate_to_output(args, source, settings, process, device)
    else:
        if args.input is None and sys.stdin is None:  # started with stdin closed (<&-): before the model loads
            raise InputError(NO_STDIN)
        if sys.stdout is None:  # started with stdout closed (>&-)
            raise CorpusError("there is nowhere to write: stdout is closed. Give --output FILE, or redirect stdout.")
        backend = make_backend(args, device, the_export(args), True)
        summary = translate_to_stream(backend, source, settings, write_stdout, is_terminal())
        say(summary.line(unit_name(args)))


@command
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    previous = signal.signal(signal.SIGTERM, stop_on_sigterm)
    try:
        run(args)
    except StdoutClosed:  # nobody reads any more: stop quietly, and let Python's exit flush nothing into the pipe
        os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        return 0
    except KeyboardInterrupt:
        if args.output:
            say(f"stopped: the finished chunks are recorded in {args.output}.partial; the same command continues")
        else:
            say("stopped: the translations written so far are on stdout")
        return 130
    finally:
        signal.signal(signal.SIGTERM, previous)


if __name__ == "__main__":
    sys.exit(main())
