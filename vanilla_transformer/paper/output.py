"""Where `vanilla-transformer paper-figures` writes: a new or empty folder, or with --overwrite a previous output of
the command and nothing else (the one rule, `mechanics/outputs.py`). `PAPER_FIGURES_RECORD` lists every file it
wrote with its size and sha256, so that only those, unchanged since, are ever replaced. The figures are drawn into a new folder beside it
and moved into place when complete: a full disk, or a folder that may not be written, is one error that names the
folder and what to do, and leaves it as it was (a previous output whole, for the same command to replace)."""

from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.outputs import check_output_folder, why_not_recorded, write_recorded_folder

WRITTEN_BY = "vanilla-transformer paper-figures"
PAPER_FIGURES_RECORD = ".vanilla_transformer_paper_figures.json"


class PaperFiguresError(VanillaTransformerError, ValueError):
    """An output folder that paper-figures may not write, or a model it cannot draw."""


def why_not_paper_figures(folder: Path) -> str | None:
    """None if `folder` holds a previous paper-figures output (its record, every listed file unchanged, nothing
    else); else why not."""
    return why_not_recorded(folder, PAPER_FIGURES_RECORD, WRITTEN_BY)


def check_figures_folder(folder: Path, overwrite: bool, inputs=()) -> bool:
    """Check `folder` by the rule; True if it holds a previous output that `overwrite` replaces."""
    return check_output_folder(
        folder,
        overwrite=overwrite,
        why_not_previous=why_not_paper_figures,
        previous=f"a previous `{WRITTEN_BY}` output",
        inputs=inputs,
        error=PaperFiguresError,
    )


def check_sentence_lengths(model, tokenizer, source: str | None, target: str | None, dpi: int) -> None:
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

    check_sentence_lengths(model, tokenizer, source, target, dpi)
    replacing = check_figures_folder(folder, overwrite, inputs)
    layer = layer - 1 if layer > 0 else layer
    names = write_recorded_folder(
        folder,
        lambda staging: write_figures(staging, model, tokenizer, source, target, layer, dpi),
        replacing=replacing,
        record=PAPER_FIGURES_RECORD,
        written_by=WRITTEN_BY,
        error=PaperFiguresError,
        what="the figures",
    )
    return [folder / name for name in names]
