"""Where a corpus translation goes: `--output` checked before anything is loaded, and a dataset written with its
translation column.

`--output` is never an input, a file in an existing folder, or a dataset's folder under the one output-folder rule
(mechanics/outputs.py). serving/corpus.py runs the translation."""

import itertools
import os
import shutil
import sys
from collections.abc import Iterator
from pathlib import Path

from vanilla_transformer.mechanics.files import move_into_place, staging_path
from vanilla_transformer.mechanics.outputs import check_output_folder, why_not_recorded, write_record
from vanilla_transformer.serving.corpus_folder import CorpusError, PartialFolder
from vanilla_transformer.serving.sources import OUTPUT_COLUMN, DatasetSource

DATASET_SUFFIXES = (".parquet", ".jsonl", ".json", ".csv")  # a dataset's output files; no suffix: a folder
WRITTEN_BY = "vanilla-transformer translate"
DATASET_RECORD = ".vanilla_transformer_translation.json"  # in a dataset folder we wrote: its files, for --overwrite


def check_output(output: str, overwrite: bool, dataset: bool, inputs: list[tuple[str, str]] = ()) -> None:
    """Refuse, before anything is loaded, an --output that could not be written or would replace what is not ours:
    one of `inputs` ((what, path) pairs: the model folder, the input files), or inside one; a dataset's folder under
    the one output rule (mechanics/outputs.py)."""
    path = Path(output)
    if dataset and is_dataset_folder(path):
        check_output_folder(
            output,
            overwrite=overwrite,
            why_not_previous=why_not_a_translation,
            previous="a dataset translated by this command",
            inputs=inputs,
            error=CorpusError,
        )
    elif dataset and path.suffix not in DATASET_SUFFIXES:
        raise CorpusError(
            f"--output {output}: a dataset is written as {', '.join(DATASET_SUFFIXES)} (by the suffix), or as a "
            "save_to_disk folder (a name without a suffix)"
        )
    if not dataset and path.is_dir():
        raise CorpusError(f"--output {output} is a folder: name the file to write")
    if not path.parent.is_dir():
        raise CorpusError(f"--output {output}: the folder {path.parent} does not exist")
    if not os.access(path.parent, os.W_OK):
        raise CorpusError(f"--output {output} cannot be written (permission denied)")
    check_not_an_input(output, inputs)
    partial = PartialFolder(output)
    if partial.folder.exists() and not partial.is_ours():
        raise CorpusError(
            f"{partial.folder} exists and is not a partial translation of ours: move or delete it yourself"
        )
    if os.path.lexists(path) and not overwrite and not partial.replaces(path):
        raise CorpusError(f"--output {output} exists: add --overwrite to replace it, or choose another --output")


def is_dataset_folder(path: Path) -> bool:
    """Whether a dataset's --output is a save_to_disk folder: no suffix, or a folder already."""
    return path.suffix == "" or (path.is_dir() and not path.is_symlink())


def check_not_an_input(output: str, inputs: list[tuple[str, str]]) -> None:
    """Refuse an --output that is one of `inputs` or inside one (the model folder's weights, an export)."""
    resolved = Path(output).resolve()
    for what, path in inputs:
        own = Path(path).resolve()
        if resolved == own or own in resolved.parents:
            relation = "is" if resolved == own else "is inside"
            raise CorpusError(
                f"--output {output} {relation} {what} {path}: write the translation outside it, so that it can "
                "never replace what the run reads"
            )


def why_not_a_translation(folder: Path) -> str | None:
    """None if `folder` is a dataset folder this command wrote, every file as it wrote it and nothing else."""
    return why_not_recorded(folder, DATASET_RECORD, WRITTEN_BY)


def same_file(input_path: str | None, output: str) -> bool:
    """Whether --output is the --input file (or stdin's file), by device and inode: a hard link or another spelling of
    the path is the same file."""
    try:
        output_stat = os.stat(output)
    except OSError:
        return False
    try:
        input_stat = os.stat(input_path) if input_path is not None else os.fstat(sys.stdin.fileno())
    except (OSError, AttributeError, ValueError):
        return False
    return (input_stat.st_dev, input_stat.st_ino) == (output_stat.st_dev, output_stat.st_ino)


def write_dataset(source: DatasetSource, partial: PartialFolder, chunks: int, output: str) -> None:
    """The input dataset with a `translation` column, as Parquet, JSON Lines, CSV or a `save_to_disk` folder (by the
    output's suffix; the folder with its record, DATASET_RECORD), built row by row through an Arrow cache in the
    partial folder (bounded memory)."""
    import datasets

    features = source.load().features
    if features is not None:
        features = datasets.Features({**features, OUTPUT_COLUMN: datasets.Value("string")})
    generated = datasets.Dataset.from_generator(
        _rows_with_translations,
        gen_kwargs={"source": source, "partial": str(partial.output), "chunks": chunks},
        features=features,
        cache_dir=str(partial.folder / "cache"),
    )
    suffix = Path(output).suffix
    staging = staging_path(output)
    try:
        if is_dataset_folder(Path(output)):
            generated.save_to_disk(str(staging))
            write_record(staging, DATASET_RECORD, WRITTEN_BY)
            if Path(output).is_dir() and (why := why_not_a_translation(Path(output))) and os.listdir(output):
                raise CorpusError(f"--output {output} changed while the run wrote it ({why}): it was left as it is")
        elif suffix == ".parquet":
            generated.to_parquet(str(staging))
        elif suffix == ".csv":
            generated.to_csv(str(staging))
        else:
            generated.to_json(str(staging), lines=True, force_ascii=False)
        move_into_place(staging, output)
    finally:
        if staging.is_dir():
            shutil.rmtree(staging, ignore_errors=True)
        else:
            staging.unlink(missing_ok=True)


def _rows_with_translations(source: DatasetSource, partial: str, chunks: int) -> Iterator[dict]:
    folder = PartialFolder(partial)
    translations = (text for number in range(chunks) for text in folder.chunk_translations(number))
    for row, translation in itertools.zip_longest(source.rows(), translations):
        if row is None or translation is None:
            raise CorpusError(
                f"the dataset {source.label} changed while this run read it: start again with --overwrite"
            )
        yield {**row, OUTPUT_COLUMN: translation}
