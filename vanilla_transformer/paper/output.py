"""Where `vanilla-transformer paper-figures` writes: a new or empty folder, or with --overwrite a previous output of
the command and nothing else (the one rule, `mechanics/outputs.py`). `RECORD` lists every file it wrote with its size
and sha256, so that only those, unchanged since, are ever replaced."""

import json
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.integrity import files_problem, record_files
from vanilla_transformer.mechanics.outputs import check_output_folder

WRITTEN_BY = "vanilla-transformer paper-figures"
RECORD = ".vanilla_transformer_paper_figures.json"


class PaperFiguresError(VanillaTransformerError, ValueError):
    """An output folder that paper-figures may not write, or a model it cannot draw."""


def why_not_paper_figures(folder: Path) -> str | None:
    """None if `folder` holds a previous paper-figures output (its record, every listed file unchanged, nothing
    else); else why not."""
    try:
        record = json.loads((folder / RECORD).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return f"it has no readable record ({RECORD}) of a `{WRITTEN_BY}` output"
    files = record.get("files") if isinstance(record, dict) else None
    if not isinstance(record, dict) or record.get("written_by") != WRITTEN_BY:
        return f"its {RECORD} is not a record of `{WRITTEN_BY}`"
    if problem := files_problem(folder, files):
        return problem
    present = {path.relative_to(folder).as_posix() for path in folder.rglob("*") if not path.is_dir()} - {RECORD}
    if unlisted := sorted(present - set(files)):
        return f"it holds {', '.join(unlisted[:5])}, which `{WRITTEN_BY}` did not write"
    return None


def prepare_folder(folder: Path, overwrite: bool, inputs=()) -> None:
    """Check `folder` by the rule; with a previous output there and `overwrite`, remove the files it lists."""
    replacing = check_output_folder(
        folder,
        overwrite=overwrite,
        why_not_previous=why_not_paper_figures,
        previous=f"a previous `{WRITTEN_BY}` output",
        inputs=inputs,
        error=PaperFiguresError,
    )
    if replacing:
        for name in json.loads((folder / RECORD).read_text(encoding="utf-8"))["files"]:
            (folder / name).unlink()
        (folder / RECORD).unlink()
    folder.mkdir(parents=True, exist_ok=True)


def record_output(folder: Path) -> None:
    record = {"written_by": WRITTEN_BY, "files": record_files(folder, excluded=(RECORD,))}
    (folder / RECORD).write_text(json.dumps(record, indent=1) + "\n", encoding="utf-8")


def check_sentences(model, tokenizer, source: str | None, target: str | None, dpi: int) -> None:
    """Before anything is computed or written: a `source` or `target` longer than the model's positions (the
    demonstration model's without `model`), or whose attention pictures would pass attention-maps' limit, is
    refused by name."""
    from vanilla_transformer.paper import measurements
    from vanilla_transformer.serving.attention_maps import check_picture_sizes

    if model is None:
        model, tokenizer = measurements.demo_model_and_tokenizer()
    positions, lengths = model.config.max_position_embeddings, {}
    for flag, text in (("source", source), ("target", target)):
        if text is not None:
            lengths[flag] = len(tokenizer(text[: 64 * positions]).input_ids)  # a token is at least a character
            if lengths[flag] > positions:
                raise PaperFiguresError(
                    f"--{flag} is over {positions} tokens, the model's positions (max_position_embeddings): give a "
                    "shorter sentence"
                )
    check_picture_sizes(model.config, dpi, lengths.get("source", 1), lengths.get("target"))


def write_paper_figures(
    output_dir: str | Path,
    model_dir: str | Path | None = None,
    overwrite: bool = False,
    source: str | None = None,
    target: str | None = None,
    layer: int = -1,
    dpi: int = 80,
    trust_remote_code: bool = False,
) -> list[Path]:
    """Every figure and `index.md` into `output_dir` (checked by the rule first); the paths written. `layer` counts
    from 1, or from the last with -1. Every input is checked before the folder is touched."""
    folder = Path(output_dir)
    inputs = [("the model's folder", model_dir)] if model_dir is not None else []
    model = tokenizer = None
    if model_dir is not None:
        from vanilla_transformer.serving.translate import load_model_and_tokenizer

        model, tokenizer = load_model_and_tokenizer(
            model_dir, attn_implementation="eager", trust_remote_code=trust_remote_code
        )
        layers = model.config.encoder_layers
        if not (1 <= layer <= layers or -layers <= layer <= -1):
            raise PaperFiguresError(f"--layer {layer}: the model has {layers} layers (give 1 to {layers}, or -1)")
    from vanilla_transformer.paper.figures import write_figures

    check_sentences(model, tokenizer, source, target, dpi)
    prepare_folder(folder, overwrite, inputs)
    names = write_figures(folder, model, tokenizer, source, target, layer - 1 if layer > 0 else layer, dpi)
    record_output(folder)
    return [folder / name for name in names]
