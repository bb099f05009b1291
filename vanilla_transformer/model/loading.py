"""Loading a saved model folder: `load_model_folder`, the one way the library and its commands build a model from a
folder's weights.

Its callers include translate, the demo, attention-maps, export-ctranslate2 and --evaluate_only.

transformers builds the model its config.json describes and fills it from the weights; a tensor the config asks for
but the weights lack (a config with one layer more than was saved) is initialised at random, and one the weights hold
but the model has no place for is dropped, with only a logged report. Such a folder is refused here instead, naming
the keys: its translations would come from a partly random model. The tied embedding copies are not missing when the
shared matrix is there, and the sinusoidal position tables are computed, not saved (non-persistent buffers):
transformers leaves both out of what it reports.
"""

import json
import math
from pathlib import Path

from configuration_vanilla_transformer import VanillaTransformerConfig
from pipeline_vanilla_transformer import MAX_BEAMS, MAX_OUTPUT_TOKENS
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.names import WEIGHTS_NAME
from vanilla_transformer.model.registration import register_model
from vanilla_transformer.model.upgrade import has_fused_projections

MAX_KEYS_NAMED = 5
# What a folder may make us allocate, checked from its JSON before anything is built (`check_folder_sizes`)
MAX_TABLE_BYTES = 2**30  # one table the loader builds: a stack's position table at its peak, or the embedding matrix
POSITION_TABLE_BYTES = 24  # per row and feature at the peak of building a sinusoid table: float64 angles, sines,
# cosines and table (8 x (1/2 + 1/2 + 1/2 + 1)), then its float32 copy (4)
MAX_MODEL_BYTES = 4 * 2**30  # every weight in float32: 1G weights (the paper's big model has 213M)
MAX_LAYERS = 128  # a stack's layers (the paper's have 6): building 20,000 took more than 10 minutes
MAX_CONFIG_BYTES = 2**20  # config.json and generation_config.json are a few KB
MAX_WEIGHTS_HEADER_BYTES = 16 * 2**20  # a safetensors header names each tensor in ~100 bytes: ours hold hundreds


class ModelFolderError(VanillaTransformerError, ValueError):
    """A model folder whose weights do not fit its config.json; the message names the folder and the keys."""


def load_model_folder(folder: str | Path, model_class=None, **from_pretrained_kwargs):
    """The model saved in `folder` (`model_class.from_pretrained`, AutoModelForSeq2SeqLM by default, with
    `from_pretrained_kwargs`), or ModelFolderError naming the keys its weights lack or hold beyond its config.json."""
    check_folder_sizes(Path(folder))
    register_model()
    if model_class is None:
        from transformers import AutoModelForSeq2SeqLM as model_class
    model, info = model_class.from_pretrained(folder, output_loading_info=True, **from_pretrained_kwargs)
    if problem := loading_problem(info):
        raise ModelFolderError(f"cannot load the model of {folder}: {problem}")
    return model


def loading_problem(info: dict) -> str | None:
    """What transformers' loading info (`output_loading_info=True`) says is wrong, in words; None if nothing."""
    missing, unexpected = sorted(info.get("missing_keys", ())), sorted(info.get("unexpected_keys", ()))
    mismatched = sorted(
        str(entry[0] if isinstance(entry, tuple) else entry) for entry in info.get("mismatched_keys", ())
    )
    problems = []
    if missing:
        problems.append(
            f"its config.json describes {len(missing)} tensor(s) that its {WEIGHTS_NAME} lacks ({name_keys(missing)}), "
            "which would be random"
        )
    if unexpected:
        problems.append(
            f"its {WEIGHTS_NAME} holds {len(unexpected)} tensor(s) that the model of its config.json has no place for "
            f"({name_keys(unexpected)})"
        )
    if mismatched:
        problems.append(
            f"{len(mismatched)} tensor(s) have another shape than config.json says ({name_keys(mismatched)})"
        )
    if not problems:
        return None
    if has_fused_projections(unexpected):  # the fused attention weights of an earlier release
        return (
            "it was saved by an earlier release of vanilla-transformer (fused qkv_proj/kv_proj attention weights): "
            "upgrade it with `vanilla-transformer refresh-code FOLDER`"
        )
    return (
        f"{'; '.join(problems)}. The config's sizes (encoder_layers, decoder_layers, d_model, heads, ffn dims, "
        "vocab_size) must be those the weights were saved with"
    )


def name_keys(keys: list[str]) -> str:
    named = ", ".join(keys[:MAX_KEYS_NAMED])
    return named + (f" and {len(keys) - MAX_KEYS_NAMED} more" if len(keys) > MAX_KEYS_NAMED else "")


def read_json_file(path: Path, error: type[Exception] = ModelFolderError, required: bool = False) -> dict:
    """A config file as a dict ({} if it is absent, unless `required`): the one size-limited JSON reader of the
    library. `error` (the caller's class: ModelFolderError here, ConversionError for a converter's source) names the
    file when it is missing and required, over MAX_CONFIG_BYTES, unreadable, or not a JSON object."""
    if not path.is_file():
        if required:
            raise error(f"{path} is missing")
        return {}
    if (size := path.stat().st_size) > MAX_CONFIG_BYTES:
        raise error(f"{path} is {size:,} bytes: a model's {path.name} is a few KB (the limit is 1 MiB).")
    try:
        content = json.loads(path.read_bytes())
    except (OSError, ValueError) as problem:  # unreadable, not UTF-8, not JSON
        raise error(f"cannot load a model and tokenizer from {path.parent}: {path.name}: {problem}") from None
    if not isinstance(content, dict):
        raise error(f"cannot load a model and tokenizer from {path.parent}: {path.name} is not an object.")
    return content


def finite_number(value) -> bool:
    """An int or float, not a bool, neither infinite nor NaN: what a number from a config file, the demo's page or a
    JSON request must be."""
    return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)


def whole_number(value, high: float = math.inf) -> bool:
    """Whether `value` is a finite number that is whole (6 or 6.0, not 6.5 or True), from 1 to `high`."""
    return finite_number(value) and value == int(value) and 1 <= value <= high


def whole_field(path: Path, content: dict, field: str, high: float) -> int | None:
    """`content[field]` (None if absent) if it is a whole number from 1 to `high`; else ModelFolderError naming the
    file, the field and the limit."""
    value = content.get(field)
    if value is None:
        return None
    if not whole_number(value):
        raise ModelFolderError(f"{path}: {field} must be a whole number >= 1, got {value!r}.")
    if value > high:
        raise ModelFolderError(f"{path}: {field} is {int(value):,}; the limit is {int(high):,}.")
    return int(value)


def finite_field(path: Path, content: dict, field: str, positive: bool = False) -> None:
    """ModelFolderError naming the file and the field unless `content[field]` is absent or a finite number (> 0
    where `positive`): a NaN `layer_norm_eps` or temperature decodes to empty or random output without an error."""
    value = content.get(field)
    if value is None:
        return
    if not finite_number(value) or (positive and value <= 0):
        kind = "a finite number > 0" if positive else "a finite number"
        raise ModelFolderError(f"{path}: {field} must be {kind}, got {value!r}.")


# settings of config.json and generation_config.json that are plain numbers (True: must be > 0)
CONFIG_NUMBERS = {"layer_norm_eps": True, "init_std": False}
GENERATION_NUMBERS = {"temperature": False, "length_penalty": False, "top_p": False, "repetition_penalty": True}


def check_folder_sizes(folder: Path) -> None:
    """Refuse, from the plain JSON of config.json and generation_config.json and before any model is built, a folder
    whose sizes would make loading or decoding allocate without bound (`check_model_sizes`), a default beam over
    MAX_BEAMS, a default output length over MAX_OUTPUT_TOKENS; and a number that is not finite where one must be
    (CONFIG_NUMBERS, GENERATION_NUMBERS: a NaN layer_norm_eps translates every line to an empty one).
    ModelFolderError names the file, the field and the limit."""
    config_path, generation_path = folder / "config.json", folder / "generation_config.json"
    config = read_json_file(config_path)
    check_weights_headers(folder)
    if config.get("model_type", VanillaTransformerConfig.model_type) == VanillaTransformerConfig.model_type:
        check_model_sizes(config_path, config)
    generation = read_json_file(generation_path)
    for numbers, path, content in (
        (CONFIG_NUMBERS, config_path, config),
        (GENERATION_NUMBERS, generation_path, generation),
    ):
        for field, positive in numbers.items():
            finite_field(path, content, field, positive)
    for path, content in ((config_path, config), (generation_path, generation)):
        whole_field(path, content, "num_beams", MAX_BEAMS)
        whole_field(path, content, "num_return_sequences", MAX_BEAMS)
        for field in ("max_new_tokens", "max_length"):
            whole_field(path, content, field, MAX_OUTPUT_TOKENS)


def check_model_sizes(config_path: Path, config: dict) -> None:
    """What building the model of `config` allocates, bounded before it is built: each position table at its peak
    (computed in float64 with its temporaries: POSITION_TABLE_BYTES_PER_ENTRY a row and feature, once per stack),
    each embedding matrix and every weight (float32) within MAX_TABLE_BYTES and MAX_MODEL_BYTES, and at most MAX_LAYERS
    layers a stack (the time to build them). With separate vocabularies the decoder's matrix (decoder_vocab_size rows)
    counts too, and an untied pre-softmax projection once more. ModelFolderError names the file, the field and the
    limit."""

    def size(field: str) -> int:  # a field left out has the config class's default
        return whole_field(config_path, config, field, math.inf) or getattr(VanillaTransformerConfig, field)

    d_model, gib = size("d_model"), MAX_TABLE_BYTES / 2**30
    separate = config.get("share_encoder_decoder_embeddings") is False
    target_field = "decoder_vocab_size" if separate and config.get("decoder_vocab_size") is not None else "vocab_size"
    tables = (
        ("max_position_embeddings", "position table at its peak (float64, with temporaries)", POSITION_TABLE_BYTES),
        ("vocab_size", "embedding matrix (float32)", 4),
        (target_field, "decoder embedding matrix (float32)", 4),
    )
    for field, table, bytes_per_entry in tables:
        rows, entry = size(field), bytes_per_entry * d_model
        if rows * entry > MAX_TABLE_BYTES:
            raise ModelFolderError(
                f"{config_path}: {field} {rows:,} x d_model {d_model:,} would be a {rows * entry / 2**30:,.1f} GiB "
                f"{table}; the limit is {gib:g} GiB, {field} up to {MAX_TABLE_BYTES // entry:,} at this d_model."
            )
    for field in ("encoder_layers", "decoder_layers"):
        whole_field(config_path, config, field, MAX_LAYERS)
    per_layer = {
        stack: (4 if stack == "encoder" else 8) * d_model * d_model + 2 * d_model * size(f"{stack}_ffn_dim")
        for stack in ("encoder", "decoder")
    }
    matrices = size("vocab_size") + size(target_field) * (separate + (config.get("tie_word_embeddings") is False))
    weights = matrices * d_model + sum(size(f"{stack}_layers") * n for stack, n in per_layer.items())
    if weights * 4 > MAX_MODEL_BYTES:
        raise ModelFolderError(
            f"{config_path}: its sizes (d_model {d_model:,}, layers, ffn dims, vocab_size) make {weights:,} weights, "
            f"{weights * 4 / 2**30:,.1f} GiB in float32; the limit is {MAX_MODEL_BYTES / 2**30:g} GiB."
        )


def check_weights_headers(folder: Path) -> None:
    """Refuse a .safetensors file whose header (JSON, read whole by any loader before a tensor) is over
    MAX_WEIGHTS_HEADER_BYTES, from its first 8 bytes: an 87 MB header takes 1.75 GB and 199 s to load."""
    for path in sorted(folder.glob("*.safetensors")):
        if not path.is_file():
            continue
        with path.open("rb") as weights:
            declared = int.from_bytes(weights.read(8), "little")
        if declared > MAX_WEIGHTS_HEADER_BYTES:
            raise ModelFolderError(
                f"{path}: its header declares {declared:,} bytes; a model's is a few hundred KB at most (the limit is "
                f"{MAX_WEIGHTS_HEADER_BYTES // 2**20} MiB)."
            )
