"""Where `convert` may write: a new or empty folder, never the source's own, and with --overwrite a previous
conversion there (a folder of the files a conversion writes and nothing else), never anything else."""

import json
from fnmatch import fnmatch
from pathlib import Path

from configuration_vanilla_transformer import VanillaTransformerConfig
from vanilla_transformer.converters.core import TOKENIZER_FILES, ConversionError
from vanilla_transformer.mechanics.names import UPLOADED_FILES, UPLOADED_PATTERNS
from vanilla_transformer.mechanics.outputs import check_output_folder as check_output_folder_rule

# what a written folder holds: a folder of these and nothing else is a previous conversion (--overwrite replaces it)
CONVERTED_FILES = {*UPLOADED_FILES, *TOKENIZER_FILES}


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
    """The one output-folder rule (mechanics/outputs.py) for `convert`: never the source's folder, and with
    `overwrite`, a previous conversion and nothing else is replaced (a folder holding a checkpoint file is no previous
    conversion). ConversionError otherwise."""
    inputs = [("the source's folder", source)] if Path(source).is_dir() else []
    check_output_folder_rule(
        output_dir,
        overwrite=overwrite,
        why_not_previous=why_not_a_conversion,
        previous="a previous conversion",
        inputs=inputs,
        error=ConversionError,
    )
