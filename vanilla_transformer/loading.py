"""Loading a saved model folder: `load_model_folder`, the one way the library and its commands (translate, the demo,
attention-maps, export-ctranslate2, --evaluate_only) build a model from a folder's weights.

transformers builds the model its config.json describes and fills it from the weights; a tensor the config asks for
but the weights lack (a config with one layer more than was saved) is initialised at random, and one the weights hold
but the model has no place for is dropped, with only a logged report. Such a folder is refused here instead, naming
the keys: its translations would come from a partly random model. The tied embedding copies are not missing when the
shared matrix is there, and the sinusoidal position tables are computed, not saved (non-persistent buffers):
transformers leaves both out of what it reports.
"""

from pathlib import Path

from vanilla_transformer.names import WEIGHTS_NAME
from vanilla_transformer.upgrade import has_fused_projections

MAX_KEYS_NAMED = 5


class ModelFolderError(ValueError):
    """A model folder whose weights do not fit its config.json; the message names the folder and the keys."""


def load_model_folder(folder: str | Path, model_class=None, **from_pretrained_kwargs):
    """The model saved in `folder` (`model_class.from_pretrained`, AutoModelForSeq2SeqLM by default, with
    `from_pretrained_kwargs`), or ModelFolderError naming the keys its weights lack or hold beyond its config.json."""
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
    if has_fused_projections(unexpected):  # the attention weights of a release before issue 33
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
