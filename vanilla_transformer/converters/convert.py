"""Convert published Transformers of the paper's architecture into model folders of this project: exactly, or not
at all.

    convert("Helsinki-NLP/opus-mt-en-de", "opus-mt-en-de")                  # a Marian (OPUS-MT) folder or Hub id
    convert("path/to/fsmt-folder", "fsmt-model")                            # an FSMT folder or Hub id
    convert("wmt16.en-de.joined-dict.transformer/model.pt", "wmt16-en-de",  # a fairseq checkpoint file
            dictionary=["dict.en.txt", "dict.de.txt"], bpe_codes="bpecodes", source_lang="en", target_lang="de")

The command is `vanilla-transformer convert` (vanilla_transformer/commands/convert.py).

What converts exactly. OPUS-MT's `MarianMTModel`, FSMT (transformers' port of fairseq's WMT models) and fairseq's
`transformer` are the paper's model: post-LN layers, sinusoidal positions, one embedding matrix for the encoder input,
the decoder input and the pre-softmax projection. Each made a few choices the paper leaves open, which the written
config.json records (`configuration_vanilla_transformer.py`) and the model computes:

    choice                 Marian (OPUS-MT)        FSMT and fairseq             the paper (our default)
    position_layout        sin_cos (sines first)   sin_cos                      interleaved
    position_frequencies   paper                   fairseq, 1/10000^(i/(d/2-1)) paper
    position_offset        0                       padding id + 1               0
    activation_function    swish (usually)         relu (fairseq's activation_fn)
    lm_head_bias           final_logits_bias       none                         none
    special token ids      </s>=0, <unk>=1,        <s>=0, <pad>=1, </s>=2,      <pad>=0, <s>=1, </s>=2, <unk>=3
                           <pad>=last, decoding    <unk>=3, decoding starts
                           starts from <pad>       from </s>

Every weight of the source goes somewhere or the conversion is refused (a weight left over is a part our model does not
have), and for Marian and FSMT the converted model is checked against the source model on a padded probe batch before
anything is written (fairseq checkpoints against FSMT, transformers' port of fairseq's model, fed the same weights).
The tests (tests/test_convert.py) check logits within 1e-5 and the same greedy and beam-search tokens.

What is refused, with a ConversionError naming the field (or file) and its value, before anything is written: separate
source and target vocabularies (Marian `share_encoder_decoder_embeddings: false` or a `decoder_vocab_size` of its own,
FSMT's `src_vocab_size` != `tgt_vocab_size` or vocab-src.json != vocab-tgt.json, two different fairseq dictionaries),
embedding matrices or an output projection that differ (e.g. `tie_word_embeddings: false` with another lm_head), pre-LN
layers (`normalize_before`, fairseq's `encoder_normalize_before`/`decoder_normalize_before`), a LayerNorm on the
embeddings (`layernorm_embedding`, `normalize_embedding`) or after the stacks (`add_final_layer_norm`), learned
positions (`static_position_embeddings: false`, fairseq's `encoder_learned_pos`), an adaptive softmax or input, an
activation our model does not have, and sizes no model of this kind has (checked before anything is allocated).

Tokenizers: the converted folder keeps the source's own tokenizer class, so it gives the same ids and text:

- OPUS-MT: transformers' `MarianTokenizer` (source.spm, target.spm, vocab.json). A `tokenizers` fast tokenizer cannot
  be exact: Marian encodes with the source language's SentencePiece model, decodes with the target language's, and maps
  pieces to ids through its own vocab.json, which one `tokenizers` pipeline cannot express (transformers has no fast
  Marian tokenizer for this reason).
- FSMT and fairseq: transformers' `FSMTTokenizer` (vocab-src.json, vocab-tgt.json, merges.txt): Moses punctuation
  normalization and tokenization (sacremoses), then subword-nmt BPE. Moses' rules (language-specific non-breaking
  prefixes, escaping, aggressive hyphen splitting) have no `tokenizers` equivalent. For a fairseq checkpoint, the files
  are built from its dictionary and BPE codes as transformers' own FSMT conversion builds them (a continued subword
  "xy@@" becomes "xy", a word end "xy" becomes "xy</w>"; fairseq's four special symbols keep ids 0-3). Its ids are
  those of fairseq's WMT data preparation (Moses normalize-punctuation, remove-non-printing-char, tokenizer -a, then
  subword-nmt); fairseq's hub interface tokenizes without the normalization, so it gives other ids on the characters
  normalization changes (e.g. "–" becomes "-"), and the same ids elsewhere.

Both need `pip install "vanilla-transformer[convert]"` (sentencepiece, sacremoses). The project's loaders take such a
folder (`tokenization.load_tokenizer` falls back to AutoTokenizer without a tokenizer.json).

Untrusted input: config files, dictionaries, codes and tokenizer files are read with size limits; model sizes are
checked before any model is built; Hub and folder weights load through transformers (safetensors, or torch.load with
weights_only=True; `loading.load_model_folder` refuses weights that do not cover the config), and fairseq checkpoints
with torch.load(weights_only=True), only `argparse.Namespace` allowed besides tensors and containers: a checkpoint
needing any other class is refused with its name (fairseq 0.10 and later store `cfg` as an omegaconf DictConfig:
re-save it with `cfg` as a plain dict, see OMEGACONF_HINT). Nothing is ever unpickled beyond that, and no remote code
runs.
"""

import argparse
import json
import pickle
import re
import tempfile
import zipfile
from dataclasses import dataclass, field
from fnmatch import fnmatch
from pathlib import Path
from string import Template
from typing import Any

import torch
import yaml
from torch import nn

from configuration_vanilla_transformer import ACTIVATION_FUNCTIONS, VanillaTransformerConfig
from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS, VanillaTransformerForConditionalGeneration
from vanilla_transformer.hub.model_folder import save_model_folder
from vanilla_transformer.mechanics.files import on_full_disk, staged_folder
from vanilla_transformer.mechanics.names import UPLOADED_FILES, UPLOADED_PATTERNS
from vanilla_transformer.model.loading import MAX_CONFIG_BYTES, MAX_TABLE_BYTES, ModelFolderError, load_model_folder

MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json")
FSMT_TOKENIZER_FILES = ("vocab-src.json", "vocab-tgt.json", "merges.txt")
TOKENIZER_FILES = ("tokenizer_config.json", "special_tokens_map.json", *MARIAN_TOKENIZER_FILES, *FSMT_TOKENIZER_FILES)
# what a written folder holds: a folder of these and nothing else is a previous conversion (--overwrite replaces it)
CONVERTED_FILES = {*UPLOADED_FILES, *TOKENIZER_FILES}
HUB_FILES = ("config.json", "generation_config.json", "README.md", *TOKENIZER_FILES)
CACHED_WEIGHTS = (
    "*.safetensors",
    "model.safetensors.index.json",
    "pytorch_model*.bin",
    "pytorch_model.bin.index.json",
)

MAX_TEXT_BYTES = 64 * 2**20  # a dictionary, BPE codes, vocabulary or SentencePiece model: OPUS-MT's are ~1 MB
MAX_CHECKPOINT_BYTES = 32 * 2**30  # a fairseq checkpoint with its optimizer state; the big WMT models are ~2 GB
MAX_PARAMETERS = 2 * 10**9  # ten times the paper's big model (213M); 8 GB in float32
SIZE_LIMITS = {
    "vocab_size": 2**20,
    "d_model": 2**14,
    "encoder_layers": 256,
    "decoder_layers": 256,
    "encoder_attention_heads": 1024,
    "decoder_attention_heads": 1024,
    "encoder_ffn_dim": 2**18,
    "decoder_ffn_dim": 2**18,
    "max_position_embeddings": 2**20,
}
LOGITS_TOLERANCE = 1e-4  # the check of the converted model against the source, relative to the logits' scale
POSITIONS_TOLERANCE = 1e-3  # a stored sinusoid table: float32 tables drift ~1e-7 per position from exact ones
FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # a fairseq Dictionary's first four symbols: bos, pad, eos, unk
ALLOWED_CLASSES = (argparse.Namespace,)  # what a fairseq checkpoint may hold besides tensors and containers
OMEGACONF_HINT = (
    "Where fairseq is installed and you trust the file, re-save it with `cfg` as a plain dict: "
    "state = fairseq.checkpoint_utils.load_checkpoint_to_cpu(path); torch.save({'cfg': "
    "omegaconf.OmegaConf.to_container(state['cfg'], resolve=True), 'model': state['model']}, 'plain.pt')"
)

# Fields of a transformers config whose other value names an architecture our model does not have:
# field -> (the value it must have, what another value means)
CONFIG_REFUSALS = {
    "normalize_before": (False, "pre-LN layers (LayerNorm before each sub-layer)"),
    "encoder_normalize_before": (False, "pre-LN encoder layers"),
    "decoder_normalize_before": (False, "pre-LN decoder layers"),
    "add_final_layer_norm": (False, "a LayerNorm after each stack"),
    "normalize_embedding": (False, "a LayerNorm on the embeddings"),
    "layernorm_embedding": (False, "a LayerNorm on the embeddings"),
    "static_position_embeddings": (True, "learned positions"),
    "share_encoder_decoder_embeddings": (True, "separate source and target vocabularies"),
}
# fairseq's settings (args or cfg.model): field -> (the value it must have, what another value means); absent is fine
FAIRSEQ_REFUSALS = {
    "encoder_normalize_before": (False, "pre-LN encoder layers"),
    "decoder_normalize_before": (False, "pre-LN decoder layers"),
    "layernorm_embedding": (False, "a LayerNorm on the embeddings"),
    "encoder_learned_pos": (False, "learned encoder positions"),
    "decoder_learned_pos": (False, "learned decoder positions"),
    "no_token_positional_embeddings": (False, "no positions at all"),
    "adaptive_input": (False, "adaptive input embeddings"),
    "adaptive_softmax_cutoff": (None, "an adaptive softmax"),
    "cross_self_attention": (False, "cross+self attention"),
    "no_cross_attention": (False, "a decoder without encoder-decoder attention"),
}
FAIRSEQ_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_accurate": "gelu_new",
    "gelu_fast": "gelu_new",
    "tanh": "tanh",
}
# the decoding settings of a source's generation config that the converted folder keeps
DECODING_FIELDS = (
    "num_beams",
    "length_penalty",
    "early_stopping",
    "max_length",
    "min_length",
    "no_repeat_ngram_size",
    "repetition_penalty",
    "bad_words_ids",
    "forced_eos_token_id",
    "renormalize_logits",
)


class ConversionError(ValueError):
    """The source cannot be converted exactly, or the output folder cannot be written; the message says why."""


@dataclass
class Source:
    """A model read for conversion: our config's fields, its weights under fairseq's layer names
    ("encoder.layers.0.self_attn.q_proj.weight", ...), its one embedding matrix, its tokenizer and decoding, what the
    card says about it, and the source model as transformers runs it (what the conversion is checked against)."""

    kind: str
    name: str
    fields: dict[str, Any]
    layers: dict[str, torch.Tensor]
    embedding: torch.Tensor
    tokenizer: Any
    reference: nn.Module
    logits_bias: torch.Tensor | None = None
    decoding: dict[str, Any] = field(default_factory=dict)
    languages: tuple[str | None, str | None] = (None, None)
    license: str | None = None
    hub_id: str | None = None


def convert(
    source: str | Path,
    output_dir: str | Path,
    *,
    dictionary: str | Path | list[str | Path] | None = None,
    bpe_codes: str | Path | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    license: str | None = None,
    revision: str | None = None,
    overwrite: bool = False,
) -> Path:
    """Convert `source` (a Marian or FSMT folder or Hub id, or a fairseq checkpoint file with its `dictionary` and
    `bpe_codes`) into a model folder of this project at `output_dir`; returns its path. ConversionError, before
    anything is written, for a source that cannot be converted exactly or an output folder that holds anything but a
    previous conversion (which `overwrite` replaces). `source_lang`, `target_lang` and `license` override the
    source's."""
    check_output_folder(source, output_dir, overwrite)
    with tempfile.TemporaryDirectory(prefix="vanilla-transformer-convert-") as scratch:
        read = read_source(source, dictionary, bpe_codes, (source_lang, target_lang), revision, Path(scratch))
        read.license = license or read.license
        model = build_model(read)
        difference = check_against_reference(model, read)
        write_folder(model, read, Path(output_dir), difference)
    return Path(output_dir)


# --- the output folder ---------------------------------------------------------------------------------------------


def foreign_entries(folder: Path, prefix: str = "") -> list[str]:
    """The entries of `folder` that a converted model folder does not hold (CONVERTED_FILES, the weights' shards, and
    the subfolders of names such as custom_generate/generate.py): links, other files, other folders."""
    foreign = []
    for path in sorted(folder.iterdir()):
        name = f"{prefix}{path.name}"
        if path.is_symlink():
            foreign.append(name)
        elif path.is_dir():
            inside = any(allowed.startswith(f"{name}/") for allowed in CONVERTED_FILES)
            foreign += foreign_entries(path, f"{name}/") if inside else [name]
        elif name not in CONVERTED_FILES and not any(fnmatch(name, pattern) for pattern in UPLOADED_PATTERNS):
            foreign.append(name)
    return foreign


def why_not_a_conversion(folder: Path) -> str | None:
    """None if `folder` holds a previous conversion (a model folder of ours and nothing else); else why not."""
    if others := foreign_entries(folder):
        return f"it holds {', '.join(others[:5])}" + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    try:
        model_type = json.loads((folder / "config.json").read_text(encoding="utf-8")).get("model_type")
    except (OSError, ValueError, AttributeError):
        model_type = None
    if model_type != VanillaTransformerConfig.model_type:
        return "its config.json is not a vanilla-transformer model's"
    return None


def check_output_folder(source: str | Path, output_dir: str | Path, overwrite: bool) -> None:
    """Refuse (ConversionError) an output folder that is, holds or is inside a source folder, a file, or a non-empty
    folder: with `overwrite`, a previous conversion and nothing else may be replaced (a folder holding a checkpoint
    file is no previous conversion, so it is never replaced)."""
    output = Path(output_dir).resolve()
    if Path(source).is_dir():
        local = Path(source).resolve()
        if output == local or local in output.parents or output in local.parents:
            raise ConversionError(
                f"the output folder {output_dir} is, holds or is inside the source's folder {local}: write the "
                "converted model to a folder of its own"
            )
    if not Path(output_dir).exists() and not Path(output_dir).is_symlink():
        return
    if Path(output_dir).is_symlink() or not output.is_dir():
        raise ConversionError(f"{output_dir} exists and is not a folder: choose another output folder")
    if not any(output.iterdir()):
        return
    if not overwrite:
        raise ConversionError(
            f"{output_dir} is not empty: choose another output folder, or add --overwrite to replace a previous "
            "conversion there"
        )
    if why := why_not_a_conversion(output):
        raise ConversionError(
            f"--overwrite replaces only a previous conversion, and {output_dir} is not one ({why}): move or delete it "
            "yourself, or choose another output folder"
        )


def write_folder(model: nn.Module, source: Source, output_dir: Path, difference: float) -> None:
    """Write the model folder into a new hidden folder beside `output_dir`, then move it into place: a failed write
    (a full disk) leaves `output_dir` as it was."""
    output = output_dir.resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    languages = dict(zip(("source_lang", "target_lang"), source.languages, strict=True))
    full_disk = ConversionError(f"no space left on device while writing {output_dir}: it is as it was")
    with on_full_disk(lambda cause: full_disk), staged_folder(output) as staging:
        save_model_folder(model, source.tokenizer, staging, card_values=languages, decoding=source.decoding)
        (staging / "README.md").write_text(conversion_card(model, source, difference), encoding="utf-8")


# --- reading sources -----------------------------------------------------------------------------------------------


def read_source(source, dictionary, bpe_codes, languages, revision, scratch: Path) -> Source:
    """The Source behind `source`: a fairseq checkpoint file, a local Marian or FSMT folder, or a Hub id."""
    path = Path(source)
    if path.is_file():
        return read_fairseq(path, dictionary, bpe_codes, languages, scratch)
    if dictionary is not None or bpe_codes is not None:
        raise ConversionError("--dictionary and --bpe_codes go with a fairseq checkpoint file, not with a folder")
    hub_id = None
    if not path.is_dir():
        if str(source).endswith((".pt", ".pth", ".bin")) or str(source).startswith((".", "/", "~")):
            raise ConversionError(f"{source}: no such file or folder")
        hub_id, path = str(source), download(str(source), revision)
    config = read_json(path / "config.json")
    model_type = config.get("model_type")
    if model_type == "marian":
        read = read_marian(path, config)
    elif model_type == "fsmt":
        read = read_fsmt(path, config)
    else:
        raise ConversionError(
            f"{path / 'config.json'}: model_type is {model_type!r}; convert reads Marian (OPUS-MT) and FSMT folders, "
            "and fairseq checkpoint files"
        )
    read.name, read.hub_id = hub_id or path.resolve().name, hub_id  # a folder by its name: no path of this machine
    read.languages = tuple(given or found for given, found in zip(languages, read.languages, strict=True))
    read.license = read.license or card_license(path / "README.md")
    return read


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


def read_bytes(path: Path, limit: int = MAX_TEXT_BYTES) -> bytes:
    """A file's bytes, refused (ConversionError naming it) when missing or over `limit` bytes."""
    if not path.is_file():
        raise ConversionError(f"{path} is missing")
    if (size := path.stat().st_size) > limit:
        raise ConversionError(f"{path} is {size:,} bytes, over the {limit:,} this kind of file ever needs")
    return path.read_bytes()


def read_json(path: Path) -> dict:
    """A config file as a dict; ConversionError for one missing, too big, or not a JSON object."""
    try:
        content = json.loads(read_bytes(path, MAX_CONFIG_BYTES))
    except ValueError as error:
        raise ConversionError(f"{path} is not valid JSON: {error}") from None
    if not isinstance(content, dict):
        raise ConversionError(f"{path} is not a JSON object")
    return content


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


def check_sizes(sizes: dict[str, Any], where: str) -> None:
    """Refuse sizes no model of the paper's architecture has, before anything is allocated: each a whole number up to
    SIZE_LIMITS, the embedding matrix and position table at most 1 GiB (what `translate` loads), the parameters at
    most MAX_PARAMETERS."""
    for name, limit in SIZE_LIMITS.items():
        value = sizes.get(name)
        if not isinstance(value, int) or isinstance(value, bool) or not 1 <= value <= limit:
            raise ConversionError(
                f"{where}: {name} is {value!r}; this converter takes a whole number from 1 to {limit:,}"
            )
    d_model = sizes["d_model"]
    for name in ("vocab_size", "max_position_embeddings"):
        if sizes[name] * d_model * 4 > MAX_TABLE_BYTES:
            raise ConversionError(f"{where}: {name} {sizes[name]:,} x d_model {d_model:,} in float32 is over 1 GiB")
    parameters = sizes["vocab_size"] * d_model
    parameters += sizes["encoder_layers"] * (4 * d_model**2 + 2 * d_model * sizes["encoder_ffn_dim"])
    parameters += sizes["decoder_layers"] * (8 * d_model**2 + 2 * d_model * sizes["decoder_ffn_dim"])
    if parameters > MAX_PARAMETERS:
        raise ConversionError(f"{where}: these sizes make {parameters:,} parameters, over {MAX_PARAMETERS:,}")


def refuse(settings: dict[str, Any], refusals: dict[str, tuple[Any, str]], where: str) -> None:
    """ConversionError naming the first field of `settings` whose value is not the one `refusals` allows."""
    for name, (allowed, meaning) in refusals.items():
        if name in settings and settings[name] != allowed:
            raise ConversionError(
                f"{where}: {name} is {settings[name]!r}, which means {meaning}; the paper's model (and this "
                f"converter) needs {allowed!r}"
            )


def check_activation(name: Any, where: str, field_name: str = "activation_function") -> str:
    if name not in ACTIVATION_FUNCTIONS:
        raise ConversionError(f"{where}: {field_name} is {name!r}; the model has {', '.join(ACTIVATION_FUNCTIONS)}")
    return name


def hf_sizes(config: dict, config_class, vocab_field: str = "vocab_size") -> dict[str, Any]:
    """The sizes of a transformers config.json (the class's defaults where a field is left out)."""
    value = lambda name: config.get(name, getattr(config_class, name, None))  # noqa: E731
    sizes = {name: value(name) for name in SIZE_LIMITS if name != "vocab_size"}
    return {**sizes, "vocab_size": value(vocab_field)}


def hf_fields(config, **choices) -> dict[str, Any]:
    """Our config's fields from a loaded transformers Marian or FSMT config, plus the implementation's `choices`."""
    names = [name for name in SIZE_LIMITS if name != "vocab_size"]
    names += ["activation_function", "dropout", "attention_dropout", "activation_dropout", "scale_embedding"]
    names += ["pad_token_id", "bos_token_id", "eos_token_id", "decoder_start_token_id", "forced_eos_token_id"]
    fields = {name: getattr(config, name) for name in names}
    return {
        **fields,
        "position_embedding_type": "sinusoidal",
        "tie_word_embeddings": True,
        "layer_norm_eps": 1e-5,
        **choices,
    }


def hf_weights(model: nn.Module) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A transformers model's tensors under fairseq's names ("model." dropped): layers, embeddings, position tables."""
    layers, embeddings, positions = {}, {}, {}
    for key, tensor in model.state_dict().items():
        name = key.removeprefix("model.")
        if (
            name.endswith(("embed_tokens.weight", "shared.weight", "output_projection.weight"))
            or name == "lm_head.weight"
        ):
            embeddings[name] = tensor
        elif name.endswith("embed_positions.weight"):
            positions[name] = tensor
        elif name != "final_logits_bias":
            layers[name] = tensor
    return layers, embeddings, positions


def read_marian(folder: Path, config: dict) -> Source:
    """An OPUS-MT (MarianMTModel) folder: its config checked, its model loaded by transformers, its tokenizer."""
    from transformers import MarianConfig, MarianMTModel

    where = str(folder / "config.json")
    check_sizes(hf_sizes(config, MarianConfig), where)
    refuse(config, CONFIG_REFUSALS, where)
    if config.get("decoder_vocab_size") not in (None, config.get("vocab_size", MarianConfig.vocab_size)):
        raise ConversionError(
            f"{where}: decoder_vocab_size is {config['decoder_vocab_size']!r} and vocab_size "
            f"{config.get('vocab_size')!r}: separate source and target vocabularies; the paper's model has one"
        )
    check_activation(config.get("activation_function", MarianConfig.activation_function), where)
    tokenizer = marian_tokenizer(folder)
    reference = load_reference(folder, MarianMTModel)
    layers, embeddings, positions = hf_weights(reference)
    check_position_tables(positions, reference.config.d_model, "sin_cos", "paper", 0)
    bias = reference.final_logits_bias.detach()[0]
    fields = hf_fields(
        reference.config, vocab_size=reference.config.vocab_size, position_layout="sin_cos",
        position_frequencies="paper", position_offset=0,
        lm_head_bias=bool(bias.any()),
    )  # fmt: skip
    why = "Marian's `tie_word_embeddings: false`: input embeddings and an lm_head of their own"
    languages = (tokenizer.init_kwargs.get("source_lang"), tokenizer.init_kwargs.get("target_lang"))
    return Source(
        "Marian (OPUS-MT)", str(folder), fields, layers, one_embedding(embeddings, why), tokenizer, reference,
        logits_bias=bias if bias.any() else None, decoding=source_decoding(reference), languages=languages,
    )  # fmt: skip


def load_reference(folder: Path, model_class) -> nn.Module:
    """The source model as transformers runs it (safetensors, or torch.load with weights_only=True); refused when its
    weights lack tensors its config.json describes (transformers would make them up) or hold ones it has no place for
    (transformers would drop them)."""
    try:
        model = load_model_folder(folder, model_class, dtype=torch.float32, weights_only=True)
    except ModelFolderError as error:
        raise ConversionError(str(error)) from None
    except OSError as error:  # no weights file, or one transformers cannot read
        raise ConversionError(f"cannot load the weights of {folder}: {error}") from None
    return model.eval()


def marian_tokenizer(folder: Path):
    """The folder's MarianTokenizer (its files size-checked); refused with separate source and target vocabularies."""
    from transformers import MarianTokenizer

    for name in ("source.spm", "target.spm", "vocab.json"):
        read_bytes(folder / name)
    settings = read_json(folder / "tokenizer_config.json") if (folder / "tokenizer_config.json").is_file() else {}
    if settings.get("separate_vocabs") or (folder / "target_vocab.json").is_file():
        raise ConversionError(
            f"{folder}: tokenizer_config.json has separate_vocabs {settings.get('separate_vocabs')!r} (or the folder "
            "has a target_vocab.json): separate source and target vocabularies; the paper's model has one"
        )
    return MarianTokenizer.from_pretrained(folder)


def read_fsmt(folder: Path, config: dict) -> Source:
    """An FSMT folder: its config checked, its model loaded by transformers, its tokenizer."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    where = str(folder / "config.json")
    sizes = hf_sizes(config, FSMTConfig, "src_vocab_size")
    check_sizes(sizes, where)
    refuse(config, CONFIG_REFUSALS, where)
    target_size = config.get("tgt_vocab_size", FSMTConfig.tgt_vocab_size)
    if target_size != sizes["vocab_size"]:
        raise ConversionError(
            f"{where}: src_vocab_size is {sizes['vocab_size']!r} and tgt_vocab_size {target_size!r}: separate source "
            "and target vocabularies (dictionaries); the paper's model has one"
        )
    check_activation(config.get("activation_function", FSMTConfig.activation_function), where)
    tokenizer = fsmt_tokenizer(folder)
    reference = load_reference(folder, FSMTForConditionalGeneration)
    pad = reference.config.pad_token_id
    layers, embeddings, positions = hf_weights(reference)
    check_position_tables(positions, reference.config.d_model, "sin_cos", "fairseq", pad + 1)
    fields = hf_fields(
        reference.config, vocab_size=sizes["vocab_size"], position_layout="sin_cos", position_frequencies="fairseq",
        position_offset=pad + 1, lm_head_bias=False,
    )  # fmt: skip
    why = "FSMT's `tie_word_embeddings: false`, with embeddings or an output projection of their own"
    return Source(
        "FSMT", str(folder), fields, layers, one_embedding(embeddings, why), tokenizer, reference,
        decoding=source_decoding(reference), languages=(tokenizer.src_lang, tokenizer.tgt_lang),
    )  # fmt: skip


def fsmt_tokenizer(folder: Path):
    """The folder's FSMTTokenizer (its files size-checked); refused when its source and target vocabularies differ."""
    from transformers import FSMTTokenizer

    vocabularies = [json.loads(read_bytes(folder / name)) for name in FSMT_TOKENIZER_FILES[:2]]
    read_bytes(folder / "merges.txt")
    if vocabularies[0] != vocabularies[1]:
        differing = sorted(set(vocabularies[0].items()) ^ set(vocabularies[1].items()))[:1]
        raise ConversionError(
            f"{folder}: vocab-src.json and vocab-tgt.json differ (e.g. {differing[0][0]!r}): separate source and "
            "target dictionaries; the paper's model has one vocabulary"
        )
    return FSMTTokenizer.from_pretrained(folder)


def source_decoding(reference: nn.Module) -> dict[str, Any]:
    """The decoding settings of the source model's generation config that a converted folder keeps (DECODING_FIELDS):
    it then decodes as the source does. num_beams, length_penalty and early_stopping always (transformers' defaults
    where the source sets none, rather than the paper's beam 4 and length penalty 0.6)."""
    generation = reference.generation_config
    decoding = {name: getattr(generation, name, None) for name in DECODING_FIELDS}
    decoding = {name: value for name, value in decoding.items() if value is not None}
    decoding.setdefault("num_beams", 1)
    decoding.setdefault("length_penalty", 1.0)
    decoding.setdefault("early_stopping", False)
    return decoding


def check_position_tables(tables: dict[str, torch.Tensor], d_model: int, layout: str, frequencies: str, offset: int):
    """Refuse a source whose position tables are not the sinusoids our config describes (learned ones, another
    layout): rows `offset` and up must be the table of positions `offset`, `offset` + 1, ... (FSMT's first rows are
    unused: fairseq numbers positions from padding id + 1)."""
    from modeling_vanilla_transformer import sinusoidal_position_table

    for name, table in tables.items():
        rows = table.shape[0] - offset
        if table.dim() != 2 or table.shape[1] != d_model or rows < 1:
            raise ConversionError(f"the source's {name} has shape {list(table.shape)}, not a position table")
        expected = sinusoidal_position_table(rows, d_model, layout, frequencies, offset)
        difference = (table[offset:].float() - expected).abs().max().item()
        if difference > POSITIONS_TOLERANCE:
            raise ConversionError(
                f"the source's {name} is not the {layout} sinusoid table with {frequencies} frequencies from position "
                f"{offset} (it differs by {difference:.3g}): learned or other positions, which this model cannot hold"
            )


def one_embedding(embeddings: dict[str, torch.Tensor], why: str) -> torch.Tensor:
    """The one matrix all of `embeddings` (encoder input, decoder input, output projection) hold; ConversionError
    naming two that differ, with `why` (the source's field that allows it)."""
    names = sorted(embeddings)
    first = embeddings[names[0]]
    for name in names[1:]:
        if embeddings[name].shape != first.shape or not torch.equal(embeddings[name], first):
            raise ConversionError(
                f"the source's {names[0]} and {name} differ ({why}): the paper's model has one matrix for the "
                "encoder input, the decoder input and the output projection"
            )
    return first.detach()


# --- fairseq checkpoints --------------------------------------------------------------------------------------------


def load_fairseq_checkpoint(path: Path) -> dict:
    """torch.load(weights_only=True) with only ALLOWED_CLASSES allowed: never unpickles anything else. A checkpoint
    that needs another class is refused naming it (all of them, for the zip format), before any of it is loaded."""
    if (size := path.stat().st_size) > MAX_CHECKPOINT_BYTES:
        raise ConversionError(f"{path} is {size:,} bytes, over the {MAX_CHECKPOINT_BYTES:,} a checkpoint may have")
    allowed = {f"{kind.__module__}.{kind.__qualname__}" for kind in ALLOWED_CLASSES}
    is_zip = zipfile.is_zipfile(path)
    if is_zip:
        try:
            needed = torch.serialization.get_unsafe_globals_in_checkpoint(path)
        except Exception as error:  # noqa: BLE001 - a damaged file: said in one line
            raise ConversionError(f"{path} is not a readable torch checkpoint: {error}") from None
        if unlisted := sorted(set(needed) - allowed):
            raise unpickling_refusal(path, unlisted)
    try:
        with torch.serialization.safe_globals(list(ALLOWED_CLASSES)):
            state = torch.load(path, map_location="cpu", weights_only=True, mmap=is_zip)
    except pickle.UnpicklingError as error:
        raise unpickling_refusal(path, re.findall(r"GLOBAL (\S+)", str(error))[:1] or [str(error)[:200]]) from None
    except (RuntimeError, EOFError, ValueError) as error:
        raise ConversionError(f"{path} is not a readable torch checkpoint: {error}") from None
    if not isinstance(state, dict) or not isinstance(state.get("model"), dict):
        raise ConversionError(f"{path} is not a fairseq checkpoint: it has no `model` state dict")
    return state


def unpickling_refusal(path: Path, names: list[str]) -> ConversionError:
    hint = f" {OMEGACONF_HINT}" if any(name.startswith("omegaconf") for name in names) else ""
    return ConversionError(
        f"{path} needs {', '.join(names)} to be unpickled, which this converter does not allow (unpickling a class "
        f"runs its code; only {', '.join(kind.__name__ for kind in ALLOWED_CLASSES)} is allowed besides tensors and "
        f"containers).{hint}"
    )


def fairseq_settings(state: dict, path: Path) -> dict[str, Any]:
    """A fairseq checkpoint's model settings: `args` (an argparse.Namespace), or `cfg` saved as a plain dict
    (its `model` section, with its `task`'s languages)."""
    if isinstance(state.get("args"), argparse.Namespace):
        return vars(state["args"])
    cfg = state.get("cfg")
    if isinstance(cfg, dict):
        model = vars(cfg["model"]) if isinstance(cfg.get("model"), argparse.Namespace) else cfg.get("model")
        task = cfg.get("task") if isinstance(cfg.get("task"), dict) else {}
        if isinstance(model, dict):
            return {**{name: task.get(name) for name in ("source_lang", "target_lang")}, **model}
    raise ConversionError(
        f"{path} has neither `args` (an argparse.Namespace) nor `cfg` with a `model` section: its architecture is "
        "unknown"
    )


LEGACY_NORMS = {
    "encoder": {"0": "self_attn_layer_norm", "1": "final_layer_norm"},
    "decoder": {"0": "self_attn_layer_norm", "1": "encoder_attn_layer_norm", "2": "final_layer_norm"},
}


def modern_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Older fairseq names as fairseq 0.9 and later load them: one `in_proj_weight`/`in_proj_bias` per attention
    (rows q, k, v) into q_proj, k_proj, v_proj; a layer's `layer_norms.N` into its named LayerNorms."""
    renamed = {}
    for key, tensor in weights.items():
        norm = re.fullmatch(r"(encoder|decoder)(\.layers\.\d+\.)layer_norms\.(\d)\.(weight|bias)", key)
        fused = re.fullmatch(r"(.+)\.in_proj_(weight|bias)", key)
        if norm and norm[3] in LEGACY_NORMS[norm[1]]:
            renamed[f"{norm[1]}{norm[2]}{LEGACY_NORMS[norm[1]][norm[3]]}.{norm[4]}"] = tensor
        elif fused and tensor.shape[0] % 3 == 0:
            for part, rows in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3), strict=True):
                renamed[f"{fused[1]}.{part}.{fused[2]}"] = rows
        else:
            renamed[key] = tensor
    return renamed


def fairseq_weights(state: dict) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A fairseq state dict as (layers, embeddings), in float32; version counters and the sinusoid buffers (which
    fairseq recomputes) dropped, learned positions refused."""
    layers, embeddings = {}, {}
    for key, tensor in modern_names(state["model"]).items():
        if not isinstance(tensor, torch.Tensor):
            raise ConversionError(f"the checkpoint's model.{key} is a {type(tensor).__name__}, not a tensor")
        if key in ("encoder.version", "decoder.version") or key.endswith("embed_positions._float_tensor"):
            continue
        if key.endswith("embed_positions.weight"):
            raise ConversionError(
                f"the checkpoint has {key}: learned positions, which the paper's model does not have"
            )
        names = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight")
        target = embeddings if key in names or key == "decoder.embed_out" else layers
        target[key] = tensor.detach().float()
    return layers, embeddings


def fairseq_fields(settings: dict, layers: dict, embedding: torch.Tensor, where: str) -> dict[str, Any]:
    """Our config's fields for a fairseq transformer: sizes from its weights (checked against its settings), heads,
    activation and dropouts from its settings."""
    refuse(settings, FAIRSEQ_REFUSALS, where)
    heads = {side: settings.get(f"{side}_attention_heads") for side in ("encoder", "decoder")}
    if missing := [f"{side}_attention_heads" for side, value in heads.items() if not isinstance(value, int)]:
        raise ConversionError(f"{where}: the settings have no {missing[0]}, which the weights cannot tell")
    count = lambda side: len({key.split(".")[2] for key in layers if key.startswith(f"{side}.layers.")})  # noqa: E731
    positions = max(settings.get(f"max_{side}_positions") or 1024 for side in ("source", "target"))
    fields = {
        "vocab_size": embedding.shape[0], "d_model": embedding.shape[1], "encoder_layers": count("encoder"),
        "decoder_layers": count("decoder"), "encoder_attention_heads": heads["encoder"],
        "decoder_attention_heads": heads["decoder"], "max_position_embeddings": positions,
    }  # fmt: skip
    for side in ("encoder", "decoder"):
        fc1 = layers.get(f"{side}.layers.0.fc1.weight")
        fields[f"{side}_ffn_dim"] = fc1.shape[0] if fc1 is not None else settings.get(f"{side}_ffn_embed_dim")
        for name, value in ((f"{side}_embed_dim", fields["d_model"]), (f"{side}_layers", fields[f"{side}_layers"])):
            if settings.get(name) not in (None, value):
                raise ConversionError(f"{where}: {name} is {settings[name]!r} but the weights have {value}")
    check_sizes(fields, where)
    activation = settings.get("activation_fn", "relu")
    if activation not in FAIRSEQ_ACTIVATIONS:
        raise ConversionError(
            f"{where}: activation_fn is {activation!r}; the model has {', '.join(FAIRSEQ_ACTIVATIONS)}"
        )
    dropouts = {
        "dropout": settings.get("dropout", 0.1), "attention_dropout": settings.get("attention_dropout", 0.0),
        "activation_dropout": settings.get("activation_dropout") or settings.get("relu_dropout") or 0.0,
    }  # fmt: skip
    return {
        **fields, **dropouts, "activation_function": FAIRSEQ_ACTIVATIONS[activation],
        "scale_embedding": not settings.get("no_scale_embedding", False), "position_embedding_type": "sinusoidal",
        "position_layout": "sin_cos", "position_frequencies": "fairseq", "position_offset": 2, "lm_head_bias": False,
        "tie_word_embeddings": True, "layer_norm_eps": 1e-5, "pad_token_id": 1, "bos_token_id": 0, "eos_token_id": 2,
        "decoder_start_token_id": 2, "forced_eos_token_id": 2,
    }  # fmt: skip


def read_fairseq(path: Path, dictionary, bpe_codes, languages, scratch: Path) -> Source:
    """A fairseq transformer checkpoint, its dictionary (one, or the source's and the target's, which must be the
    same) and BPE codes (default: dict.txt, dict.SRC.txt and dict.TGT.txt, bpecodes beside it)."""
    state = load_fairseq_checkpoint(path)
    settings = fairseq_settings(state, path)
    languages = tuple(
        given or settings.get(name) for given, name in zip(languages, ("source_lang", "target_lang"), strict=True)
    )
    if not all(isinstance(language, str) and language for language in languages):
        raise ConversionError(
            f"{path}: its settings name no source_lang and target_lang: give --source_lang and --target_lang"
        )
    layers, embeddings = fairseq_weights(state)
    if not embeddings:
        raise ConversionError(f"{path}: the checkpoint's model has no encoder.embed_tokens.weight")
    why = "fairseq's share_all_embeddings / share_decoder_input_output_embed were off"
    embedding = one_embedding(embeddings, why)
    fields = fairseq_fields(settings, layers, embedding, f"{path} (settings)")
    symbols = fairseq_symbols(dictionary_files(path, dictionary, languages))
    if len(symbols) != embedding.shape[0]:
        raise ConversionError(
            f"the dictionary has {len(symbols):,} symbols but the embeddings {embedding.shape[0]:,} rows"
        )
    codes = bpe_codes if bpe_codes is not None else path.parent / "bpecodes"
    tokenizer = tokenizer_from_fairseq(symbols, Path(codes), languages, fields["max_position_embeddings"], scratch)
    reference = fsmt_reference(fields, layers, embedding, languages)
    card_name = f"{path.parent.name}/{path.name}" if path.parent.name else path.name
    # the paper's decoding (Ott et al. 2018 report their BLEU with it), and </s> at the last step as fairseq forces it
    decoding = {"forced_eos_token_id": fields["eos_token_id"]}
    return Source(
        "fairseq", card_name, fields, layers, embedding, tokenizer, reference, decoding=decoding, languages=languages
    )


def dictionary_files(path: Path, dictionary, languages) -> list[Path]:
    """The dictionary files given, else those beside the checkpoint: dict.txt, or dict.SRC.txt and dict.TGT.txt."""
    if dictionary is not None:
        files = [Path(name) for name in ([dictionary] if isinstance(dictionary, (str, Path)) else dictionary)]
        if not 1 <= len(files) <= 2:
            raise ConversionError(f"give one dictionary, or the source's and the target's: got {len(files)}")
        return files
    if (path.parent / "dict.txt").is_file():
        return [path.parent / "dict.txt"]
    files = [path.parent / f"dict.{language}.txt" for language in languages]
    if not all(file.is_file() for file in files):
        raise ConversionError(f"no dict.txt nor {files[0].name} and {files[1].name} beside {path}: give --dictionary")
    return files


def fairseq_symbols(files: list[Path]) -> list[str]:
    """The fairseq Dictionary of `files` (lines "symbol count"), by id: its four special symbols, then the lines. Two
    files must hold the same symbols in the same order (a joined dictionary): else separate vocabularies, refused."""
    lists = [read_dictionary(file) for file in files]
    if len(lists) == 2 and lists[0] != lists[1]:
        index = next((i for i, (a, b) in enumerate(zip(*lists, strict=False)) if a != b), min(map(len, lists)))
        raise ConversionError(
            f"{files[0]} and {files[1]} differ (from symbol {index + 1}): separate source and target dictionaries; "
            "the paper's model has one vocabulary (fairseq's --joined-dictionary)"
        )
    return [*FAIRSEQ_SPECIALS, *lists[0]]


def read_dictionary(path: Path) -> list[str]:
    symbols, seen = [], set(FAIRSEQ_SPECIALS)
    for number, line in enumerate(read_bytes(path).decode("utf-8").splitlines(), 1):
        symbol, _, count = line.rstrip().removesuffix(" #fairseq:overwrite").rpartition(" ")
        if not symbol or not count.isdigit():
            raise ConversionError(f"{path}, line {number}: {line[:80]!r} is not `symbol count`")
        if symbol in seen:
            raise ConversionError(f"{path}, line {number}: {symbol!r} is there twice (or is a special symbol)")
        seen.add(symbol)
        symbols.append(symbol)
    return symbols


def fsmt_vocabulary(symbols: list[str]) -> dict[str, int]:
    """A fairseq dictionary as FSMTTokenizer's vocabulary: subword-nmt marks a subword that the word continues after
    with "@@", FSMT's BPE marks the subword that ends a word with "</w>"; the special symbols stay as they are."""
    vocabulary = {}
    for index, symbol in enumerate(symbols):
        token = symbol if symbol in FAIRSEQ_SPECIALS else symbol[:-2] if symbol.endswith("@@") else f"{symbol}</w>"
        if token in vocabulary:
            raise ConversionError(f"the dictionary's {symbols[vocabulary[token]]!r} and {symbol!r} are the same token")
        vocabulary[token] = index
    return vocabulary


def fsmt_merges(path: Path) -> str:
    """subword-nmt's (or fastBPE's) BPE codes as FSMT's merges.txt: "a b" per line, counts and the version header
    dropped. Codes of subword-nmt 0.1, where a word's end is a symbol of its own, segment differently: refused."""
    lines = read_bytes(path).decode("utf-8").splitlines()
    if lines and lines[0].startswith("#version:"):
        if lines[0].split()[-1] != "0.2":
            raise ConversionError(f"{path}: {lines[0]!r}; FSMTTokenizer applies subword-nmt 0.2 codes")
        lines = lines[1:]
    merges = []
    for number, line in enumerate(lines, 1):
        parts = line.split()
        if len(parts) not in (2, 3) or parts[1] == "</w>":
            raise ConversionError(f"{path}, line {number}: {line[:80]!r} is not a 0.2 merge `a b` (or `a b count`)")
        merges.append(f"{parts[0]} {parts[1]}")
    return "\n".join(merges) + "\n"


def tokenizer_from_fairseq(symbols: list[str], codes: Path, languages, max_length: int, scratch: Path):
    """FSMTTokenizer files built from a fairseq dictionary and BPE codes (in `scratch`), and the tokenizer."""
    from transformers import FSMTTokenizer

    vocabulary = json.dumps(fsmt_vocabulary(symbols), ensure_ascii=False, indent=1)
    for name in FSMT_TOKENIZER_FILES[:2]:
        (scratch / name).write_text(vocabulary, encoding="utf-8")
    (scratch / "merges.txt").write_text(fsmt_merges(codes), encoding="utf-8")
    files = {
        f"{kind}_file": str(scratch / name)
        for kind, name in zip(("src_vocab", "tgt_vocab", "merges"), FSMT_TOKENIZER_FILES, strict=True)
    }
    return FSMTTokenizer(langs=list(languages), model_max_length=max_length, **files)


def fsmt_reference(fields: dict, layers: dict, embedding: torch.Tensor, languages) -> nn.Module:
    """FSMT, transformers' port of fairseq's transformer, fed a fairseq checkpoint's weights: what the converted model
    is checked against."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    sizes = {name: fields[name] for name in SIZE_LIMITS if name != "vocab_size"}
    config = FSMTConfig(
        langs=list(languages), src_vocab_size=fields["vocab_size"], tgt_vocab_size=fields["vocab_size"], **sizes,
        activation_function=fields["activation_function"], scale_embedding=fields["scale_embedding"],
        tie_word_embeddings=True, dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2,
        decoder_start_token_id=2,
    )  # fmt: skip
    reference = FSMTForConditionalGeneration(config).eval()
    state = {f"model.{name}": tensor for name, tensor in layers.items()}
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        state[f"model.{name}"] = embedding
    result = reference.load_state_dict(state, strict=False)
    unexpected = [name.removeprefix("model.") for name in result.unexpected_keys]
    missing = [name for name in result.missing_keys if "embed_positions" not in name]
    if unexpected or missing:
        raise ConversionError(weights_problem(unexpected, [name.removeprefix("model.") for name in missing]))
    return reference


# --- our model -----------------------------------------------------------------------------------------------------


def is_embedding(key: str) -> bool:
    """Whether our state dict's `key` is the shared embedding matrix (or one of its tied names)."""
    return key.endswith(("embed_tokens.weight", "shared.weight")) or key == "lm_head.weight"


def fairseq_name(key: str) -> str:
    """Our state dict's layer `key` under fairseq's (FSMT's, Marian's) name: "model." and "feed_forward." dropped."""
    return key.removeprefix("model.").replace(".feed_forward.", ".")


def weights_problem(left_over: list[str], missing: list[str]) -> str:
    parts = []
    if left_over:
        parts.append(f"the source has weights the paper's model has no place for: {', '.join(sorted(left_over)[:6])}")
    if missing:
        parts.append(f"the source lacks weights the model needs: {', '.join(sorted(missing)[:6])}")
    return "; ".join(parts) + " (an architecture other than the paper's)"


def build_model(source: Source) -> VanillaTransformerForConditionalGeneration:
    """Our model with the source's weights: every key of our state dict (read at run time) filled from the source,
    every source weight used; ConversionError naming what is left over, missing, or of another shape."""
    try:
        config = VanillaTransformerConfig(**source.fields)
    except (ValueError, TypeError) as error:
        raise ConversionError(f"the source's settings make no valid config: {error}") from None
    model = VanillaTransformerForConditionalGeneration(config)
    state, missing, used = {}, [], set()
    for key, tensor in model.state_dict().items():
        if is_embedding(key):
            value = source.embedding
        elif key == "lm_head.bias":
            value = source.logits_bias
        else:
            value = source.layers.get(fairseq_name(key))
            used.add(fairseq_name(key))
        if value is None:
            missing.append(fairseq_name(key))
        elif value.shape != tensor.shape:
            raise ConversionError(
                f"the source's {fairseq_name(key)} has shape {list(value.shape)}, ours {list(tensor.shape)}"
            )
        else:
            state[key] = value.to(tensor.dtype)
    if missing or set(source.layers) - used:
        raise ConversionError(weights_problem(sorted(set(source.layers) - used), missing))
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ConversionError(f"the model did not take the weights: {result}")
    check_ties(model)
    return model.eval()


def check_ties(model: nn.Module) -> None:
    """Every name of the embedding matrix must hold the same values (tied or copied): the paper's one matrix."""
    state = model.state_dict()
    names = [key for key in state if is_embedding(key)]
    if differing := [key for key in names if not torch.equal(state[key], state[names[0]])]:
        raise ConversionError(f"the converted model's {differing[0]} is not {names[0]}: the embeddings came untied")


def probe_batch(config, generator_seed: int = 0) -> dict[str, torch.Tensor]:
    """Two sources (the second padded) and decoder inputs of ordinary tokens, for the check against the source."""
    special = {config.pad_token_id, config.eos_token_id, config.bos_token_id, config.decoder_start_token_id, 3}
    ordinary = torch.tensor([index for index in range(config.vocab_size) if index not in special][:4096])
    generator = torch.Generator().manual_seed(generator_seed)
    pick = lambda *shape: ordinary[torch.randint(len(ordinary), shape, generator=generator)]  # noqa: E731
    input_ids, attention_mask = pick(2, 9), torch.ones(2, 9, dtype=torch.long)
    input_ids[:, -1] = config.eos_token_id
    input_ids[1, 5], input_ids[1, 6:], attention_mask[1, 6:] = config.eos_token_id, config.pad_token_id, 0
    decoder_input_ids = torch.cat([torch.full((2, 1), config.decoder_start_token_id), pick(2, 6)], dim=1)
    return {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": decoder_input_ids}


def check_against_reference(model: nn.Module, source: Source) -> float:
    """The largest difference between the converted model's logits and the source model's on a padded probe batch;
    ConversionError when over LOGITS_TOLERANCE (relative to the logits' scale). The decoder inputs have no padding."""
    batch = probe_batch(model.config)
    with torch.inference_mode():
        ours = model(**batch).logits
        # FSMT builds its causal mask only without the cache: with use_cache it expects one token at a time
        theirs = source.reference(**batch, use_cache=False).logits
    if ours.shape != theirs.shape:
        raise ConversionError(
            f"the converted model gives logits of shape {list(ours.shape)}, the source {list(theirs.shape)}"
        )
    difference = (ours - theirs).abs().max().item()
    if not difference <= LOGITS_TOLERANCE * max(1.0, theirs.abs().max().item()):
        raise ConversionError(
            f"the converted model's logits differ from the source's by {difference:.3g} on a probe batch: the source "
            "computes something the paper's model does not"
        )
    return difference


# --- the model card ------------------------------------------------------------------------------------------------

CARD = Template("""---
language: $language
license: $license
library_name: transformers
pipeline_tag: translation
tags:
- translation
- transformer
- vanilla-transformer
- custom_code
$base_model---

# $title

The Transformer of ["Attention Is All You Need"](https://arxiv.org/abs/1706.03762) (Vaswani et al., 2017) as a
`transformers` model with custom code (the vanilla-transformer project), holding the weights of **$source**, a
$kind model that translates **$source_lang → $target_lang**. It was not trained here: `vanilla-transformer convert`
copied the weights, with nothing approximated; on a padded probe batch its logits differed from the source model's by
$difference (float32).

- Source: $source ($kind); its license, as its card records it: **$license_text**. The weights are the source's: its
  license and terms apply, and its card describes the data, the training and the scores its publishers measured.
- Converted by `vanilla-transformer convert` (`vanilla_transformer/converters/convert.py`), for transformers
  $transformers_range.

## Architecture

| | |
|---|---|
| d_model | $d_model |
| layers (encoder / decoder) | $encoder_layers / $decoder_layers |
| attention heads | $attention_heads |
| feed-forward inner size d_ff | $ffn_dim |
| activation | $activation |
| positions | sinusoidal, $position_layout layout, $position_frequencies frequencies, from position $position_offset |
| output bias | $lm_head_bias |
| shared vocabulary | $vocab_size tokens |
| parameters | $parameters |

Post-LN layers and one embedding matrix for the encoder input, the decoder input and the output projection, as in
the paper; the layout, frequencies and first position of the sinusoids, the activation and the output bias are the
source's choices, recorded in config.json. Tokenizer: the source's own ($tokenizer), which gives its ids and text.
Decoding: $decoding (generation_config.json, as the source decodes).

## Usage

```python
from transformers import pipeline

translator = pipeline("translation", model="$model_id", trust_remote_code=True)
print(translator("$example"))
```

or `vanilla-transformer translate FOLDER < source.txt`, `vanilla-transformer demo FOLDER`, and
`vanilla-transformer export-ctranslate2 FOLDER OUTPUT` like any model of the project.
""")


def conversion_card(model: nn.Module, source: Source, difference: float) -> str:
    """README.md of a converted folder: the source, its license, the conversion and what the model is."""
    config = model.config
    languages = [language for language in source.languages if language]
    generation = model.generation_config
    decoding = "greedy search" if (generation.num_beams or 1) == 1 else (
        f"beam search with beam size {generation.num_beams} and length penalty {generation.length_penalty}"
    )  # fmt: skip
    base_model = f"base_model: {json.dumps(source.hub_id)}\n" if source.hub_id else ""
    return CARD.substitute(
        language=json.dumps(languages, ensure_ascii=False), license=json.dumps(source.license or "unknown"),
        base_model=base_model, title=f"{source.name.split('/')[-1]} (vanilla-transformer)", source=source.name,
        kind=source.kind, source_lang=source.languages[0] or "?", target_lang=source.languages[1] or "?",
        difference=f"{difference:.2g}", license_text=source.license or "not recorded",
        transformers_range=SUPPORTED_TRANSFORMERS, d_model=config.d_model, encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers, attention_heads=config.encoder_attention_heads,
        ffn_dim=config.encoder_ffn_dim, activation=config.activation_function, position_layout=config.position_layout,
        position_frequencies=config.position_frequencies, position_offset=config.position_offset,
        lm_head_bias="a learned bias (Marian's final_logits_bias)" if config.lm_head_bias else "none",
        vocab_size=config.vocab_size, parameters=f"{model.num_parameters():,}",
        tokenizer=type(source.tokenizer).__name__, decoding=decoding, model_id="your-username/model-id",
        example="The house is small.",
    )  # fmt: skip
