"""Refresh a saved model folder: the installed model code, the current weights format, then a decoding check.

    vanilla-transformer refresh-code outputs/vanilla-transformer

A model folder carries the code it was saved with (configuration, modeling and pipeline files, and
custom_generate/generate.py), and transformers runs that copy under whatever release is installed. Folders saved by
earlier releases of this project may hold code that no longer runs under transformers {supported}, weights in an
earlier format (the attention's fused `qkv_proj`/`kv_proj`) and config fields that are gone: this command

1. replaces the folder's code files with this installation's, sets aside the code files earlier releases wrote and
   this one does not (`fast_paths_vanilla_transformer.py`), and points config.json's `auto_map` and
   `custom_pipelines` at the project's own classes (a folder whose entries name other files is rewritten, and said);
2. upgrades the weights and config.json to the current format (`vanilla_transformer.model.upgrade`, the one place that
   knows earlier formats);
3. loads the folder with the installed project's classes (never the folder's own code: nothing the folder holds is
   imported) and decodes a few sentences, with and without the cache: the tokens must agree.

The replaced files are kept in `.previous_code/<time>-<random>/` inside the folder (a hidden folder, never uploaded);
if anything fails, they are put back and the command exits with an error. Then push the folder again to update a Hub
repository (`vanilla-transformer push`).
"""

import json
import shutil
import tempfile
import time
from pathlib import Path

import torch
from safetensors import safe_open
from safetensors.torch import load_file, save_file

import generate_vanilla_transformer
import modeling_vanilla_transformer
from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS, VanillaTransformerForConditionalGeneration
from vanilla_transformer.data.tokenization import load_tokenizer
from vanilla_transformer.hub.model_card import EXAMPLE_SOURCES
from vanilla_transformer.hub.model_folder import BASE_MODEL
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import (
    describe_link,
    give_umask_modes,
    link_on_the_way,
    move_into_place,
    replace_file,
    staging_path,
)
from vanilla_transformer.mechanics.names import CODE_FILES, CUSTOM_GENERATE, RETIRED_CODE_FILES, WEIGHTS_NAME
from vanilla_transformer.mechanics.outputs import check_output_folder
from vanilla_transformer.model.loading import ModelFolderError, check_folder_sizes, load_model_folder
from vanilla_transformer.model.upgrade import (
    folder_needs_upgrade,
    has_fused_projections,
    split_fused_projections,
    upgrade_config,
)

__doc__ = __doc__.format(supported=SUPPORTED_TRANSFORMERS)
BACKUP_FOLDER = ".previous_code"
CHECK_SENTENCES = [*EXAMPLE_SOURCES.values(), "A man in a blue shirt is standing on a ladder."]
GENERATE = dict(num_beams=1, do_sample=False, max_new_tokens=20)
# the entries of config.json that make transformers import a folder's code, as the project writes them
PROJECT_CODE = {
    "auto_map": {
        "AutoConfig": "configuration_vanilla_transformer.VanillaTransformerConfig",
        "AutoModel": BASE_MODEL,
        "AutoModelForSeq2SeqLM": "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration",
    },
    "custom_pipelines": {
        "translation": {
            "impl": "pipeline_vanilla_transformer.VanillaTransformerTranslationPipeline",
            "pt": ["AutoModelForSeq2SeqLM"],
        }
    },
}


class RefreshError(VanillaTransformerError):
    """The folder is not a model folder of this project, or its refreshed code does not decode as it should."""


def check_refresh_target(folder: Path) -> dict:
    """config.json's content, once the folder is known to be a model folder of this project that we may write (the
    one output-folder rule, mechanics/outputs.py, for a folder replaced in place)."""
    if not folder.is_dir() and not folder.is_symlink():
        raise RefreshError(f"{folder} is not a folder: give a model folder written by this project")
    replaced = check_output_folder(
        folder,
        overwrite=True,
        why_not_previous=why_not_ours,
        previous="a model folder of this project",
        error=RefreshError,
        flag=None,
    )
    if not replaced:
        raise RefreshError(f"{folder} is empty: give a model folder written by this project")
    return json.loads((folder / "config.json").read_text(encoding="utf-8"))


def why_not_ours(folder: Path) -> str | None:
    """None if `folder` is a model folder of this project that refresh-code may rewrite in place; else why not."""
    config_file = folder / "config.json"
    if not config_file.is_file():
        return "it has no config.json"
    try:
        config = json.loads(config_file.read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        return f"its config.json is not valid JSON: {error}"
    model_type = config.get("model_type") if isinstance(config, dict) else None
    if model_type != modeling_vanilla_transformer.VanillaTransformerConfig.model_type:
        return f"it holds a {model_type!r} model, not a vanilla_transformer one"
    if not (folder / WEIGHTS_NAME).is_file():
        return f"it has no {WEIGHTS_NAME} (a sharded folder is refreshed by saving it again)"
    names = ["config.json", WEIGHTS_NAME, BACKUP_FOLDER, CUSTOM_GENERATE, *CODE_FILES, *RETIRED_CODE_FILES]
    for name in names:
        if (link := link_on_the_way(folder, name)) is not None:
            return f"{describe_link(link)}: refresh-code writes only inside the folder, never through a link"
    return None


@torch.no_grad()
def decode(model, tokenizer, use_cache: bool = True) -> list[list[int]]:
    inputs = tokenizer(CHECK_SENTENCES, return_tensors="pt", padding=True)
    return model.generate(**inputs, **GENERATE, use_cache=use_cache).tolist()


def refresh(folder: str | Path) -> tuple[Path, list[str]]:
    """Refresh the folder (the module docstring); return the backup folder and what was changed besides the code."""
    folder = Path(folder)
    config = check_refresh_target(folder)
    try:
        check_folder_sizes(folder)  # what loading it would allocate, before anything is written
    except ModelFolderError as error:
        raise RefreshError(str(error)) from None
    tokenizer = load_tokenizer(folder)
    with safe_open(folder / WEIGHTS_NAME, "pt") as weights:
        weight_keys = list(weights.keys())
    fused = has_fused_projections(weight_keys)
    changes = folder_needs_upgrade(folder, weight_keys)
    changes += [
        f"config.json's {name} rewritten to name the project's classes"
        for name in PROJECT_CODE
        if config.get(name) != PROJECT_CODE[name]
    ]
    (folder / BACKUP_FOLDER).mkdir(exist_ok=True)
    backup = Path(tempfile.mkdtemp(prefix=f"{time.strftime('%Y%m%d-%H%M%S')}-", dir=folder / BACKUP_FOLDER))
    kept = [*CODE_FILES, *RETIRED_CODE_FILES, CUSTOM_GENERATE, "config.json", WEIGHTS_NAME]
    for name in kept:
        if (folder / name).is_file():
            (backup / name).parent.mkdir(exist_ok=True)
            shutil.copy2(folder / name, backup / name)
    try:
        _write_current_format(folder, config, upgrade_weights=fused)
        model = load_model_folder(folder, VanillaTransformerForConditionalGeneration).eval()
        if decode(model, tokenizer, use_cache=False) != decode(model, tokenizer):
            raise RefreshError("the refreshed folder decodes differently with and without its cache")
    except Exception as error:
        restore(folder, backup, kept)
        raise RefreshError(f"{error}; the folder's files are restored") from error
    return backup, changes


def _write_current_format(folder: Path, config: dict, upgrade_weights: bool) -> None:
    source = Path(modeling_vanilla_transformer.__file__).resolve().parent
    for name in CODE_FILES:
        replace_file(folder / name, (source / name).read_bytes())
    (folder / CUSTOM_GENERATE).parent.mkdir(exist_ok=True)
    replace_file(folder / CUSTOM_GENERATE, Path(generate_vanilla_transformer.__file__).read_bytes())
    for name in RETIRED_CODE_FILES:
        (folder / name).unlink(missing_ok=True)  # kept in the backup
    config = {**upgrade_config(config), **PROJECT_CODE}
    replace_file(folder / "config.json", (json.dumps(config, indent=2, sort_keys=True) + "\n").encode())
    if upgrade_weights:
        model_config = modeling_vanilla_transformer.VanillaTransformerConfig.from_pretrained(folder)
        weights = split_fused_projections(load_file(folder / WEIGHTS_NAME), model_config)
        staged = staging_path(folder / WEIGHTS_NAME)
        save_file({key: tensor.contiguous() for key, tensor in weights.items()}, staged, metadata={"format": "pt"})
        move_into_place(staged, folder / WEIGHTS_NAME)
        give_umask_modes([folder / WEIGHTS_NAME])


def restore(folder: Path, backup: Path, names: list[str]) -> None:
    for name in names:
        if (backup / name).is_file():
            shutil.copy2(backup / name, folder / name)
        else:  # the folder had no such file before
            (folder / name).unlink(missing_ok=True)
