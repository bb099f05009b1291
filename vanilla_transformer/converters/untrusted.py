"""Reading a source's files, none of them trusted: each with a size limit, sizes checked before any model is built, and
a Hub repository downloaded with only the files a conversion reads.

Config files, dictionaries, codes and tokenizer files are read with size limits (`read_bytes`; config files with `loading.read_json_file`); a
config's sizes are checked before anything is allocated (`check_sizes`); Hub and folder weights load through
transformers (safetensors, or torch.load with weights_only=True; `loading.load_model_folder` refuses weights that do
not cover the config), fairseq checkpoints as fairseq.py says (torch.load with weights_only=True and only
`argparse.Namespace` allowed). Nothing is ever unpickled beyond that, and no remote code runs.
"""

import re
from pathlib import Path
from typing import Any

import yaml

from vanilla_transformer.converters.core import TOKENIZER_FILES, ConversionError, Problems
from vanilla_transformer.model.loading import MAX_CONFIG_BYTES, MAX_LAYERS, MAX_TABLE_BYTES

MAX_TEXT_BYTES = 64 * 2**20  # a dictionary, BPE codes, vocabulary or SentencePiece model: OPUS-MT's are ~1 MB
MAX_CHECKPOINT_BYTES = 32 * 2**30  # a fairseq checkpoint with its optimizer state; the big WMT models are ~2 GB
MAX_PARAMETERS = 2 * 10**9  # ten times the paper's big model (213M); 8 GB in float32
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
HUB_FILES = ("config.json", "generation_config.json", "README.md", *TOKENIZER_FILES)
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
    whole number up to SIZE_LIMITS, the embedding matrix and position table at most 1 GiB (what `translate` loads),
    the parameters at most MAX_PARAMETERS. A size left out of `sizes` is the caller's problem to name; the totals are
    checked only when every size is there and valid. A `decoder_vocab_size` (separate vocabularies) is checked as
    `vocab_size` is, and its matrix counted."""
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
    d_model = sizes["d_model"]
    for name in ("vocab_size", "max_position_embeddings", "decoder_vocab_size"):
        if sizes.get(name) is not None and sizes[name] * d_model * 4 > MAX_TABLE_BYTES:
            problems.add(f"{where}: {name} {sizes[name]:,} x d_model {d_model:,} in float32 is over 1 GiB")
    parameters = (sizes["vocab_size"] + (target or 0)) * d_model
    parameters += sizes["encoder_layers"] * (4 * d_model**2 + 2 * d_model * sizes["encoder_ffn_dim"])
    parameters += sizes["decoder_layers"] * (8 * d_model**2 + 2 * d_model * sizes["decoder_ffn_dim"])
    if parameters > MAX_PARAMETERS:
        problems.add(f"{where}: these sizes make {parameters:,} parameters, over {MAX_PARAMETERS:,}")


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
