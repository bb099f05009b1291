"""Translation with a saved model: a folder loaded (checked before any model is built), and `translate_sentences`.

`translate_sentences` is `batches.translate_texts` with the model's backend (`model/decoding.py`'s `ModelBackend`,
which decodes through the model's `generate()`). Decoding follows the model's generation_config.json, with section
6.1's maximum output length, input length + 50, where neither the call nor generation_config.json gives a length.

A model folder may come from anyone: its config.json and generation_config.json are read as plain JSON first, and
sizes that would allocate without bound are refused, naming the file, the field and the limit (a position table or
embedding matrix over 1 GiB, a beam over 64, an output length over 4096); weights that do not fit its config.json are
named with their shapes. `folder_notes` says what a command should know before using a folder: its model code differs
from the installed code that runs, or its generation_config.json asks for more than one translation per line.
"""

from collections.abc import Sequence
from pathlib import Path

import torch
from safetensors import safe_open
from transformers import AutoConfig, AutoModelForSeq2SeqLM, AutoTokenizer, PreTrainedModel, PreTrainedTokenizerBase

import modeling_vanilla_transformer  # registers the model with the Auto classes; its folder holds the installed code
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.names import CODE_FILES, WEIGHTS_NAME
from vanilla_transformer.model.decoding import ModelBackend
from vanilla_transformer.model.loading import (
    MAX_BEAMS,
    ModelFolderError,
    check_folder_sizes,
    load_model_folder,
    read_json_file,
    whole_field,
)
from vanilla_transformer.model.onednn import use_onednn_linears
from vanilla_transformer.model.registration import register_model
from vanilla_transformer.serving.batches import translate_texts
from vanilla_transformer.serving.settings import BATCH_SIZE, DTYPE_NAMES

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}


class ModelLoadError(VanillaTransformerError):
    """A model folder that cannot be loaded, with the reason in one message."""


def translate_sentences(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    sentences: Sequence[str],
    batch_size: int | None = BATCH_SIZE,
    num_beams: int | None = None,
    max_new_tokens: int | None = None,
    max_tokens: int | None = None,
    **generate_kwargs,
) -> list[str]:
    """Translate `sentences` with a loaded model; one translation per sentence, in the input order (`translate_texts`
    with a ModelBackend): batches of `batch_size` sentences, or of `max_tokens` source tokens times the beams; a
    sentence longer than the model's positions is cut into pieces that fit. Without `max_new_tokens`, a batch decodes
    to the length the model's generation config gives, or where it gives none, its longest source (in tokens) + 50
    new tokens; `num_beams` and other generation arguments default to the model's generation config, but for
    `num_return_sequences`, always 1."""
    if batch_size is not None and batch_size < 1:
        raise ValueError(f"batch_size must be at least 1, got {batch_size}.")
    backend = ModelBackend(model, tokenizer, num_beams, max_new_tokens, **generate_kwargs)
    return translate_texts(backend, sentences, batch_size, max_tokens).texts


def load_model_and_tokenizer(
    model_dir: str | Path, device: str = "cpu", **model_kwargs
) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """The model (in eval mode, on `device`) and tokenizer of a saved model folder; ModelLoadError if it is none.

    `model_kwargs` go to `from_pretrained`, e.g. attn_implementation="eager". The folder's sizes are checked first
    (`loading.check_folder_sizes`): a downloaded folder must not make us allocate without bound."""
    folder = Path(model_dir)
    if not folder.is_dir():
        raise ModelLoadError(f"{model_dir} is not a folder: give the folder of a saved model.")
    if not (folder / "config.json").is_file():
        raise ModelLoadError(f"{model_dir} is not a model folder: it has no config.json.")
    try:
        check_folder_sizes(folder)  # before anything is built (load_model_folder checks again)
    except ModelFolderError as error:
        raise ModelLoadError(str(error)) from None
    register_model()  # the folder's tokenizer may be found through its config's model type
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
        raise ModelLoadError(f"cannot load a model and tokenizer from {model_dir}: {why}") from error
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
    if (count := whole_field(path, read_json_file(path), "num_return_sequences", MAX_BEAMS)) not in (None, 1):
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
