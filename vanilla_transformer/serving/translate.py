"""Translation with a saved model, line by line: loading a folder (checked before any model is built), reading,
checking, translating and writing the input a buffer at a time in input order. The command is `vanilla-transformer
translate` (vanilla_transformer/commands/translate.py); the demo and the attention maps load models here too.

Line i of the output translates line i of the input (an empty line gives an empty line); memory stays bounded on any
file, and an interruption keeps every translation written so far. Decoding follows the model's generation_config.json
with section 6.1's maximum output length, input length + 50, unless a length is given. A model folder may come from
anyone: its config.json and generation_config.json are read as plain JSON first, and sizes that would allocate
without bound are refused, naming the file, the field and the limit (a position table or embedding matrix over
1 GiB, a beam over 64, an output length over 4096); weights that do not fit its config.json are named with their
shapes. `folder_notes` says what a command should know before using a folder: its model code differs from the
installed code that runs, or its generation_config.json asks for more than one translation per line.
"""

import codecs
import contextlib
import os
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from tqdm import tqdm
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import modeling_vanilla_transformer  # registers the model with the Auto classes; its folder holds the installed code
from pipeline_vanilla_transformer import output_length
from vanilla_transformer.mechanics.names import CODE_FILES, WEIGHTS_NAME
from vanilla_transformer.model.loading import (
    MAX_BEAMS,
    ModelFolderError,
    check_folder_sizes,
    load_model_folder,
    read_json_file,
    whole_number,
)
from vanilla_transformer.model.onednn import use_onednn_linears

try:
    import fcntl
except ImportError:  # Windows: no flock, so no claim on --output
    fcntl = None

MAX_LINES_NAMED = 10
DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}
# What a model folder (downloaded, so untrusted) may make us allocate before a single sentence is translated; checked
# in its plain JSON before any model is built (`check_folder_sizes`). 1 GiB is 7 times the paper's big model's
# embedding matrix (37000 x 1024 float32, 145 MiB) and 256 times its sinusoidal table at the default 1024 positions.
BATCH_SIZE = 32  # sentences translated together, by default
NO_STDIN = "there is no input: stdin is closed. Pipe the sentences in (< source.txt) or give --input FILE."


class CommandLineError(Exception):
    """A problem with the command's model or input, reported as one message without a traceback."""


def translate_sentences(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    batch_size: int = BATCH_SIZE,
    num_beams: int | None = None,
    max_new_tokens: int | None = None,
    **generate_kwargs,
) -> list[str]:
    """Translate `sentences`; returns one translation per sentence, in the input order.

    Sentences are batched by length (longest first) to waste little padding. Empty or whitespace-only sentences
    give "" without running the model. Without `max_new_tokens`, a batch may generate its longest source (in tokens)
    + 50 new tokens; `num_beams` and other generation arguments default to the model's generation config, but for
    `num_return_sequences`, always 1 (the best translation; a folder's generation_config.json may say otherwise).
    """
    if batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    if generate_kwargs.setdefault("num_return_sequences", 1) != 1:
        raise ValueError(
            f"translate_sentences gives one translation per sentence: num_return_sequences must be 1, got "
            f"{generate_kwargs['num_return_sequences']!r}."
        )
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
        length = output_length(batch["attention_mask"], model.config, max_new_tokens)
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

    `model_kwargs` go to `from_pretrained`, e.g. attn_implementation="eager". The folder's sizes are checked first
    (`loading.check_folder_sizes`): a downloaded folder must not make us allocate without bound."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise CommandLineError(f"{model_dir} is not a folder: give the folder of a saved model.")
    if not (folder / "config.json").is_file():
        raise CommandLineError(f"{model_dir} is not a model folder: it has no config.json.")
    try:
        check_folder_sizes(folder)  # before anything is built (load_model_folder checks again)
    except ModelFolderError as error:
        raise CommandLineError(str(error)) from None
    try:
        tokenizer = AutoTokenizer.from_pretrained(folder, trust_remote_code=model_kwargs.get("trust_remote_code"))
        model = load_model_folder(folder, **model_kwargs).to(device).eval()  # refuses weights missing or unused
        use_onednn_linears(model)  # float32 inference on CPU through oneDNN, where it pays (onednn.py)
    except Exception as error:  # a command-line user gets one line, not the loader's traceback
        why = str(error)
        if "above report" in why:  # transformers logged the details, which a message must not rely on
            why = (
                weights_mismatch(folder, model_kwargs.get("trust_remote_code")) or "its weights do not fit config.json"
            )
        raise CommandLineError(f"cannot load a model and tokenizer from {model_dir}: {why}") from error
    return model, tokenizer


def weights_mismatch(folder: Path, trust_remote_code: bool | None) -> str | None:
    """Which of the folder's saved tensors have another shape than its config.json makes (from the safetensors
    header and a model built on the meta device: nothing is allocated), in words; None if none is found."""
    try:
        config = AutoConfig.from_pretrained(folder, trust_remote_code=trust_remote_code)
        with torch.device("meta"):
            model = AutoModelForSeq2SeqLM.from_config(config, trust_remote_code=trust_remote_code)
        expected = {name: tuple(tensor.shape) for name, tensor in model.state_dict().items()}
        with safe_open(folder / WEIGHTS_NAME, "pt") as weights:
            saved = {name: tuple(weights.get_slice(name).get_shape()) for name in weights.keys()}
    except Exception:  # noqa: BLE001 - the loader's own error is reported then
        return None
    differing = [name for name in saved if name in expected and saved[name] != expected[name]]
    if not differing:
        return None
    shapes = "; ".join(
        f"{name} is {list(saved[name])} in {WEIGHTS_NAME}, {list(expected[name])} by config.json"
        for name in differing[:3]
    )
    more = f" and {len(differing) - 3} more" if len(differing) > 3 else ""
    return (
        f"its {WEIGHTS_NAME} does not fit its config.json ({shapes}{more}): the config's sizes (vocab_size, d_model, "
        "layers, heads, ffn dims) must be those the weights were saved with"
    )


def folder_notes(folder: str | Path, trust_remote_code: bool = False) -> list[str]:
    """What a command says on stderr before it uses a model folder: its own model code, when it differs from the
    installed code that runs (`code_note`), and a num_return_sequences in its generation_config.json, which the
    translator does not follow (one translation per line)."""
    folder = Path(folder)
    notes = [] if trust_remote_code else [note for note in [code_note(folder)] if note]
    path = folder / "generation_config.json"
    if (count := whole_number(path, read_json_file(path), "num_return_sequences", MAX_BEAMS)) not in (None, 1):
        notes.append(
            f"note: {path}: num_return_sequences is {count}; one translation per line is written, the best "
            "(num_return_sequences 1)"
        )
    return notes


def code_note(folder: Path) -> str | None:
    """One line naming the folder's model code files (CODE_FILES) that differ from the installed ones, which are what
    runs without --trust_remote_code, and the two ways to run the same code; None when they match."""
    installed = Path(modeling_vanilla_transformer.__file__).resolve().parent
    differing = [name for name in CODE_FILES if _differs(folder / name, installed / name)]
    if not differing:
        return None
    return (
        f"note: {folder} holds model code that differs from the installed vanilla-transformer's ({', '.join(differing)})"
        ", and the installed code runs: run the folder's own code with --trust_remote_code, or give the folder the "
        f"installed code with `vanilla-transformer refresh-code {folder}`"
    )


def _differs(theirs: Path, ours: Path) -> bool:
    """Whether the folder's file `theirs` (when it has one) is not the installed file `ours`, byte for byte."""
    if not theirs.is_file() or not ours.is_file():
        return False
    return theirs.stat().st_size != ours.stat().st_size or theirs.read_bytes() != ours.read_bytes()


def split_lines(text: str) -> list[str]:
    """The lines of `text` as the translator and the demo both read them: split at "\n" only, each line without a
    trailing "\r" (a Windows line end), a final "\n" ending the last line rather than starting an empty one. Other
    characters that `str.splitlines` breaks at (U+2028, U+0085, \x0c, a lone "\r") stay inside their line."""
    lines = text.split("\n")
    if len(lines) > 1 and not lines[-1]:
        lines.pop()
    return [line.removesuffix("\r") for line in lines]


def decode_line(raw: bytes | str, number: int, name: str) -> str:
    """Line `number` of the input without its line ending (and, on line 1, a byte-order mark); CommandLineError names
    the line and byte of bad UTF-8."""
    if isinstance(raw, str):  # a text stdin without .buffer
        return split_lines(raw.removeprefix("\ufeff") if number == 1 else raw)[0]
    raw = raw.removeprefix(codecs.BOM_UTF8) if number == 1 else raw
    try:
        return split_lines(raw.decode("utf-8"))[0]  # a raw line holds one "\n", at its end
    except UnicodeDecodeError as error:
        raise CommandLineError(
            f"cannot read the input {name}: invalid UTF-8 on line {number} ({error.reason} at byte {error.start + 1} "
            "of the line): the input must be UTF-8 text"
        ) from None


def read_chunks(path: str | None, chunk_lines: int) -> Iterator[tuple[int, list[str]]]:
    """(number of the first line, the lines) of a UTF-8 file, or of stdin when `path` is None, `chunk_lines` at a
    time. Read as bytes split at "\n" only and decoded strictly, so bad bytes are an error naming their line (stdin's
    own decoding would let them through as lone surrogates) and other line-breaking characters stay in their line."""
    name = path or "(stdin)"
    if path is None and sys.stdin is None:
        raise CommandLineError(NO_STDIN)
    try:
        stream = open(path, "rb") if path is not None else getattr(sys.stdin, "buffer", sys.stdin)
    except OSError as error:
        raise CommandLineError(f"cannot read the input {name}: {error}") from error
    first, chunk = 1, []
    try:
        for number, raw in enumerate(stream, start=1):
            chunk.append(decode_line(raw, number, name))
            if len(chunk) == chunk_lines:
                yield first, chunk
                first, chunk = first + len(chunk), []
    except OSError as error:
        raise CommandLineError(f"cannot read the input {name}: {error}") from error
    finally:
        if path is not None:
            stream.close()
    if first == 1 and not chunk:
        raise CommandLineError(f"the input {name} is empty: there is nothing to translate.")
    if chunk:
        yield first, chunk


def read_lines(path: str | None) -> list[str]:
    """Every line of a UTF-8 file, or of stdin when `path` is None, without line endings (see `read_chunks`)."""
    return [line for _, chunk in read_chunks(path, chunk_lines=10_000) for line in chunk]


def check_output(path: str) -> None:
    """Refuse, before anything is loaded or translated, an --output that could not be written."""
    output = Path(path)
    if output.is_dir():
        raise CommandLineError(f"--output {path} is a folder: name the file to write")
    if not output.parent.is_dir():
        raise CommandLineError(f"--output {path}: the folder {output.parent} does not exist")
    if not os.access(output if output.exists() else output.parent, os.W_OK):
        raise CommandLineError(f"--output {path} cannot be written (permission denied)")


def name_lines(numbers: list[int]) -> str:
    named = ", ".join(str(number) for number in numbers[:MAX_LINES_NAMED])
    return named + (f" and {len(numbers) - MAX_LINES_NAMED} more" if len(numbers) > MAX_LINES_NAMED else "")


def check_lines(
    lines: list[str], tokenizer: PreTrainedTokenizerBase, max_source_tokens: int, first_line: int = 1
) -> list[int]:
    """Raise CommandLineError naming the lines longer than `max_source_tokens`; return the empty lines' numbers
    (the first of `lines` is line `first_line`)."""
    empty = [number for number, line in enumerate(lines, start=first_line) if not line.strip()]
    lengths = [len(ids) for ids in tokenizer(lines)["input_ids"]]
    too_long = [number for number, length in enumerate(lengths, start=first_line) if length > max_source_tokens]
    if too_long:
        raise CommandLineError(
            f"line(s) {name_lines(too_long)} have more than {max_source_tokens} source tokens (the longest has "
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


def translate_stream(
    model,
    tokenizer,
    progress: dict,
    *,
    source: str | None,
    destination: "str | OutputFile | None",
    batch_size: int,
    buffer_size: int,
    num_beams: int | None = None,
    max_new_tokens: int | None = None,
    max_source_tokens: int | None = None,
    show_progress: bool = False,
) -> None:
    """Read, check, translate and write the input (`source`, a file, or stdin) `buffer_size` lines at a time, in input
    order, into `destination` (a path or a claimed OutputFile; None: stdout), each buffer written whole or not at all;
    `progress` counts what was translated and written (and the empty lines), for the messages. `show_progress`: a
    progress bar of the lines written, on stderr (for a terminal: a pipeline's stderr stays clean)."""
    max_source_tokens = max_source_tokens or model.config.max_position_embeddings
    output = OutputFile.claim(destination) if isinstance(destination, str) else destination
    bar = tqdm(desc="translating", unit=" lines", file=sys.stderr, disable=not show_progress, dynamic_ncols=True)
    try:
        for first_line, lines in read_chunks(source, max(buffer_size, batch_size)):
            empty = check_lines(lines, tokenizer, max_source_tokens, first_line)
            translations = translate_sentences(model, tokenizer, lines, batch_size, num_beams, max_new_tokens)
            # one translation per line, whatever characters the model produced
            text = "".join(" ".join(translation.splitlines()) + "\n" for translation in translations)
            if output is not None:
                output.write(text)
            else:
                write_stdout(text)
            progress["translated"] += len(lines) - len(empty)
            progress["written"] += len(lines)
            progress["empty"] += empty
            bar.update(len(lines))
        if output is not None:
            output.finish()
    finally:
        bar.close()
        if output is not None and output is not destination:
            output.close()


def write_stdout(text: str) -> None:
    try:
        sys.stdout.write(text)
        sys.stdout.flush()
    except OSError as error:  # a closed pipe, a full disk behind a redirection
        raise CommandLineError(f"cannot write the output (stdout): {error}") from error


class OutputFile:
    """--output, claimed for one command and written a buffer at a time, whole lines only.

    `claim` opens it without changing it and takes an exclusive lock (flock, released by the kernel if the process
    dies): a second command writing the same file is refused before it loads a model. The first `write` empties it;
    a buffer that cannot be written whole (a full disk) is taken back, so the file holds exactly the lines counted as
    written; `close` removes a file that the command created and never wrote."""

    def __init__(self, path: str, descriptor: int, created: bool):
        self.path, self.descriptor, self.created = path, descriptor, created
        self.size = None  # bytes of whole lines written; None until the first write empties the file

    @classmethod
    def claim(cls, path: str) -> "OutputFile":
        created = not os.path.lexists(path)
        try:
            descriptor = os.open(path, os.O_WRONLY | os.O_CREAT, 0o666)
        except OSError as error:
            raise CommandLineError(f"cannot write the output {path}: {error}") from error
        output = cls(path, descriptor, created)
        if fcntl is not None:
            try:
                fcntl.flock(descriptor, fcntl.LOCK_EX | fcntl.LOCK_NB)
            except BlockingIOError:
                output.close()
                raise CommandLineError(
                    f"--output {path} is being written by another command: wait for it to finish, or choose another "
                    "--output"
                ) from None
            except OSError:
                pass  # a filesystem without flock
        return output

    def write(self, text: str) -> None:
        data = memoryview(text.encode("utf-8"))
        try:
            if self.size is None:
                os.ftruncate(self.descriptor, 0)
                self.size = 0
            written = 0
            while written < len(data):
                written += os.pwrite(self.descriptor, data[written:], self.size + written)
        except OSError as error:  # a full disk: the buffer's lines are taken back, no line is cut
            with contextlib.suppress(OSError):
                os.ftruncate(self.descriptor, self.size or 0)
            raise CommandLineError(f"cannot write the output {self.path}: {error}") from error
        self.size += len(data)

    def finish(self) -> None:
        """Make sure what was written is on disk (a network filesystem reports a full disk here); CommandLineError."""
        try:
            os.fsync(self.descriptor)
        except OSError as error:
            raise CommandLineError(f"cannot write the output {self.path}: {error}") from error

    def close(self) -> None:
        if self.descriptor is None:
            return
        with contextlib.suppress(OSError):
            os.close(self.descriptor)
        self.descriptor = None
        if self.created and self.size is None:
            with contextlib.suppress(OSError):
                os.unlink(self.path)
