"""Reading a source's files, none of them trusted: each read with a size limit, and sizes checked before any model is
built.

A Hub repository is downloaded with only the files a conversion reads. Config files, dictionaries, codes and tokenizer
files are read with size limits (`read_bytes`; config files with `loading.read_json_file`); a config's sizes are
checked before anything is allocated (`check_sizes`); Hub and folder weights load through transformers (safetensors,
or torch.load with weights_only=True; `loading.load_model_folder` refuses weights that do not cover the config),
fairseq checkpoints as fairseq.py says (torch.load with weights_only=True and only `argparse.Namespace` allowed).
Nothing is ever unpickled beyond that, and no remote code runs.
"""

import inspect
import os
import re
from pathlib import Path
from typing import Any

import yaml

from vanilla_transformer.converters.core import SOURCE_TOKENIZER_FILES, ConversionError, Problems
from vanilla_transformer.model.loading import MAX_CONFIG_BYTES, MAX_LAYERS, ModelFolderError, check_model_sizes

MAX_TEXT_BYTES = 64 * 2**20  # a dictionary, BPE codes, vocabulary or SentencePiece model: OPUS-MT's are ~1 MB
MAX_CHECKPOINT_BYTES = 32 * 2**30  # a fairseq checkpoint with its optimizer state; the big WMT models are ~2 GB
SIZE_LIMITS = {
    "vocab_size": 2**20,
    "d_model": 2**14,
    "encoder_layers": MAX_LAYERS,  # the loader's limit: a folder the converter writes is one the loader accepts
    "decoder_layers": MAX_LAYERS,
    "encoder_attention_heads": 1024,
    "decoder_attention_heads": 1024,
    "encoder_ffn_dim": 2**18,
    "decoder_ffn_dim": 2**18,
    "max_position_embeddings": 2**20,
}
HUB_FILES = ("config.json", "generation_config.json", "README.md", *SOURCE_TOKENIZER_FILES)
CACHED_WEIGHTS = (
    "*.safetensors",
    "model.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
)


def read_bytes(path: Path, limit: int = MAX_TEXT_BYTES) -> bytes:
    """A file's bytes, refused (ConversionError naming it) when missing or over `limit` bytes."""
    if not path.is_file():
        raise ConversionError(f"{path} is missing")
    if (size := path.stat().st_size) > limit:
        raise ConversionError(f"{path} is {size:,} bytes, over the {limit:,} this kind of file ever needs")
    return path.read_bytes()


def read_text(path: Path, limit: int = MAX_TEXT_BYTES) -> str:
    """A text file (a dictionary, BPE codes) as `read_bytes` reads it, refused naming it when it is not UTF-8."""
    try:
        return read_bytes(path, limit).decode("utf-8")
    except UnicodeDecodeError as error:
        raise ConversionError(f"{path} is not UTF-8 text (byte {error.start}): give the text file itself") from None


def card_license(readme: Path) -> str | None:
    """The `license` of a model card's YAML front matter, if the card has one."""
    if not readme.is_file() or readme.stat().st_size > MAX_CONFIG_BYTES:
        return None
    parts = readme.read_text(encoding="utf-8", errors="replace").split("---\n", 2)
    if len(parts) < 3 or parts[0]:
        return None
    try:
        metadata = yaml.safe_load(parts[1])
    except yaml.YAMLError:
        return None
    value = metadata.get("license") if isinstance(metadata, dict) else None
    return str(value) if isinstance(value, (str, int, float)) else None


def check_sizes(sizes: dict[str, Any], where: str, problems: Problems) -> None:
    """A problem for each size no model of the paper's architecture has, found before anything is allocated: each a
    whole number up to SIZE_LIMITS (a `decoder_vocab_size`, for separate vocabularies, as `vocab_size`), then the
    loader's own bounds (`loading.check_model_sizes`: each position table at its peak, each embedding matrix, every
    weight), so that a folder the converter writes is one every command loads. A size left out of `sizes` is the
    caller's problem to name; the totals are checked only when every size is there and valid."""
    valid = True
    target = sizes.get("decoder_vocab_size")
    if target is not None and (not isinstance(target, int) or isinstance(target, bool) or not 1 <= target <= 2**20):
        problems.add(
            f"{where}: decoder_vocab_size is {target!r}; this converter takes a whole number from 1 to {2**20:,}"
        )
        valid = False
    for name, limit in SIZE_LIMITS.items():
        value = sizes.get(name)
        if name not in sizes or not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            valid = False
            if name in sizes:
                problems.add(f"{where}: {name} is {value!r}; this converter takes a whole number from 1 to {limit:,}")
    if not valid:
        return
    try:
        check_model_sizes(Path(where), {**sizes, "share_encoder_decoder_embeddings": target is None})
    except ModelFolderError as error:
        problems.add(str(error))


def hub_patterns(files: list[str]) -> list[str]:
    """What to download of a Hub repository holding `files`: configs, card, tokenizer files, and the weights as
    safetensors where it has them, else as pytorch_model.bin (never both; never the TF, Flax or Rust weights)."""
    safetensors = [name for name in files if name.endswith(".safetensors") or name == "model.safetensors.index.json"]
    weights = safetensors or [
        name for name in files if re.fullmatch(r"pytorch_model(-\d+-of-\d+)?\.bin(\.index\.json)?", name)
    ]
    return [name for name in files if name in HUB_FILES] + weights


def download(repo_id: str, revision: str | None) -> Path:
    """The local copy of the Hub repository `repo_id`'s files that a conversion reads (`hub_patterns`); offline (or
    when the file list cannot be had), what the local cache holds of them."""
    from huggingface_hub import list_repo_files, snapshot_download
    from huggingface_hub.errors import HFValidationError

    try:
        try:
            patterns = hub_patterns(list_repo_files(repo_id, revision=revision))
        except HFValidationError:
            raise
        except Exception:  # noqa: BLE001 - offline: the cached copy, if there is one, is what snapshot_download gives
            patterns = [*HUB_FILES, *CACHED_WEIGHTS]
        return Path(snapshot_download(repo_id, revision=revision, allow_patterns=patterns))
    except HFValidationError:
        raise ConversionError(f"{repo_id} is not a file, a folder, nor a Hub model id") from None
    except Exception as error:  # noqa: BLE001 - offline, not found, gated: one line naming it
        raise ConversionError(f"cannot download {repo_id} from the Hub: {type(error).__name__}: {error}") from error


def beside(folder: Path, name: str) -> Path:
    """`folder / name`, a file found (not given) beside the source: ConversionError if it is a symbolic link leading
    out of `folder`, the rule `check_no_link_leaves` applies to a whole folder."""
    path = folder / name
    if path.is_symlink() and not path.resolve().is_relative_to(folder.resolve()):
        raise ConversionError(
            f"{path} is a symbolic link to {path.resolve()}, outside the source folder: the conversion reads no file "
            "found beside the source through such a link; give the file itself by its flag, or copy it into the folder"
        )
    return path


def check_no_link_leaves(folder: Path, allowed_root: Path | None = None) -> None:
    """ConversionError for an entry of the source `folder` that is a symbolic link leading out of it (or out of
    `allowed_root`: a Hub cache's repository folder, whose snapshots link into its blobs). Transformers' loaders
    follow such a link, and what they read (a tokenizer_config.json linked to another folder's secrets) would be
    written into the converted folder."""
    root = (allowed_root or folder).resolve()
    for directory, folders, files in os.walk(folder):  # links to folders are listed, not followed
        for name in sorted([*folders, *files]):
            path = Path(directory) / name
            if path.is_symlink() and not path.resolve().is_relative_to(root):
                raise ConversionError(
                    f"{path} is a symbolic link to {path.resolve()}, outside the source folder: the conversion reads "
                    "no file through such a link; copy the file into the folder if it is the source's"
                )


def known_tokenizer_settings(tokenizer, settings: dict) -> dict:
    """Of a source's tokenizer_config.json `settings` (which transformers' tokenizers write back whole, whatever keys
    they hold), those a tokenizer of its class takes: its own parameters and the base class's. Anything else (a key
    planted in a downloaded file) is not carried into the converted folder."""
    from transformers.tokenization_utils_base import PreTrainedTokenizerBase

    known = {*inspect.signature(type(tokenizer).__init__).parameters, *TOKENIZER_BASE_SETTINGS}
    known |= set(PreTrainedTokenizerBase.SPECIAL_TOKENS_ATTRIBUTES)
    return {name: value for name, value in settings.items() if name in known}


# what every transformers tokenizer reads from tokenizer_config.json besides its class's own parameters
TOKENIZER_BASE_SETTINGS = (
    "tokenizer_class",
    "added_tokens_decoder",
    "model_max_length",
    "padding_side",
    "truncation_side",
    "model_input_names",
    "clean_up_tokenization_spaces",
    "split_special_tokens",
    "extra_special_tokens",
    "additional_special_tokens",
    "source_lang",
    "target_lang",
)
