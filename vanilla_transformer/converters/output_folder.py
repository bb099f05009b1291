"""Where `convert` may write: a new or empty folder, never the source's own, and with --overwrite a previous
conversion there, never anything else. A conversion is marked as one: `CONVERSION_RECORD` lists every file it wrote
with its size and sha256, so that a folder of the same file names (a trained model's, a copy of another conversion's,
one whose card was edited since) is never taken for a conversion that --overwrite may replace."""

from fnmatch import fnmatch
from pathlib import Path

from vanilla_transformer.converters.core import SOURCE_TOKENIZER_FILES, ConversionError
from vanilla_transformer.mechanics.names import UPLOADED_FILES, UPLOADED_PATTERNS
from vanilla_transformer.mechanics.outputs import check_output_folder, why_not_recorded

WRITTEN_BY = "vanilla-transformer convert"
CONVERSION_RECORD = (
    ".vanilla_transformer_conversion.json"  # what a conversion wrote (never uploaded: not allow-listed)
)
# what a written folder holds
CONVERTED_FILES = {*UPLOADED_FILES, *SOURCE_TOKENIZER_FILES, CONVERSION_RECORD}


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
    """None if `folder` holds a previous conversion: its record, and every file it lists unchanged and nothing else;
    else why not."""
    if others := foreign_entries(folder):
        return f"it holds {', '.join(others[:5])}" + (f" and {len(others) - 5} more" if len(others) > 5 else "")
    return why_not_recorded(folder, CONVERSION_RECORD, WRITTEN_BY)


def check_conversion_folder(source: str | Path, output_dir: str | Path, overwrite: bool) -> bool:
    """The one output-folder rule (mechanics/outputs.py) for `convert`: never the source's folder, and with
    `overwrite`, a previous conversion and nothing else is replaced (a folder holding a checkpoint file is no previous
    conversion). ConversionError otherwise. True where a previous conversion will be replaced."""
    inputs = [("the source's folder", source)] if Path(source).is_dir() else []
    return check_output_folder(
        output_dir,
        overwrite=overwrite,
        why_not_previous=why_not_a_conversion,
        previous="a previous conversion",
        inputs=inputs,
        error=ConversionError,
    )
