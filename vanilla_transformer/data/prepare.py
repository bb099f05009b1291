"""Prepare a translation corpus once: raw pairs -> Arrow -> shared BPE -> filtered token ids, memory-mapped.

    vanilla-transformer prepare --data_dir wmt14 --source_lang en --target_lang de \
        --validation_split newstest2013 --test_split newstest2014 --vocab_size 37000 \
        --preprocessing_num_workers 16 --output_dir data-bin/wmt14-en-de
    python train_accelerate.py --prepared_data data-bin/wmt14-en-de ...      # any number of experiments

A prepared folder holds
    manifest.json         what it was made from (files with sizes and modification times, tokenizer, filters),
                          what reading and filtering kept and dropped per split, and the size and sha256 of every
                          other file in the folder (checked before use: `verify_prepared`)
    tokenizer/            the shared BPE vocabulary (5.1), trained on a seeded sample of the training pairs, or the
                          tokenizer given with --tokenizer_name_or_path
    train/                a `datasets` folder: `input_ids` and `labels` (int32, `tokens </s>`), filtered
    validation/, test/    the same plus the `source` and `target` text (the references for BLEU); never filtered

Every process memory-maps these files, so memory grows with the batch, not with the corpus. Without --prepared_data,
`train_accelerate.py` prepares into `--data_cache_dir/<key>`, where the key hashes the manifest's `key` entry: a
relaunch, or another experiment on the same data, tokenizer settings and filters, loads it in seconds, and any change
to them (a file's size or modification time, --vocab_size, --max_sentence_tokens, ...) prepares a new folder.
"""

import functools
import hashlib
import json
import os
import shutil
import socket
import tempfile
import time
import uuid
from collections.abc import Callable, Iterable, Iterator
from dataclasses import asdict, dataclass
from itertools import islice
from pathlib import Path

import numpy as np
from tokenizers import Tokenizer

from vanilla_transformer.data import readers, toy_task
from vanilla_transformer.data.batching import TokenizedPairs
from vanilla_transformer.data.readers import DataError, DataReport, Pair
from vanilla_transformer.data.settings import Corpus, DataSettings, LengthFilter
from vanilla_transformer.data.tokenization import load_tokenizer
from vanilla_transformer.mechanics.barrier import PREPARE_BEFOREHAND, run_while_others_wait
from vanilla_transformer.mechanics.files import move_into_place, on_full_disk, remove_stale
from vanilla_transformer.mechanics.integrity import files_problem, record_files

FORMAT_VERSION = 1
MANIFEST = "manifest.json"
TOKENIZER_FOLDER = "tokenizer"
SPLITS = ("train", "validation", "test")
WRITE_CHUNK_PAIRS = 100_000


# --- what a split is read from ---------------------------------------------------------------------------------


def _file_entry(path: Path) -> dict:
    stat = path.stat()
    return {"path": str(path.resolve()), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


def _find_split_file(data_dir: str, split: str, lang: str, required: bool) -> Path | None:
    for candidate in (Path(data_dir) / f"{split}.{lang}", Path(data_dir) / f"{split}.{lang}.gz"):
        if candidate.is_file():
            return candidate
    if required:
        raise DataError(f"No file {split}.{lang} or {split}.{lang}.gz in {data_dir}.")
    return None


def split_sources(corpus: Corpus, splits: Iterable[str] = SPLITS) -> dict[str, dict]:
    """For each split that has data, a JSON-able description of where its pairs come from (files with their size
    and modification time), which is also its part of the cache key."""
    if corpus.is_embedded_task:
        return {
            split: {"kind": "synthetic", "pairs": corpus.synthetic_pairs, "seed": corpus.synthetic_seed}
            for split in splits
        }
    sources = {}
    for split in splits:
        if corpus.dataset_name:
            sources[split] = {
                "kind": "hub",
                "name": corpus.dataset_name,
                "config": corpus.dataset_config,
                "split": corpus.split_name(split),
            }
        elif corpus.data_dir:
            paths = [
                _find_split_file(corpus.data_dir, corpus.split_name(split), lang, required=split == "train")
                for lang in (corpus.source_lang, corpus.target_lang)
            ]
            if None not in paths:
                sources[split] = {"kind": "parallel", "files": [_file_entry(path) for path in paths]}
        elif corpus.split_file(split):
            path = Path(corpus.split_file(split))
            if not path.is_file():
                raise DataError(f"{path}: file not found")
            kind = "jsonl" if path.name.endswith((".jsonl", ".jsonl.gz")) else "tsv"
            sources[split] = {"kind": kind, "files": [_file_entry(path)]}
    return sources


def source_label(source: dict) -> str:
    if source["kind"] == "hub":
        return readers.hub_dataset_label(source["name"], source["config"], source["split"])
    if source["kind"] == "synthetic":
        return "synthetic (embedded)"
    return ", ".join(entry["path"] for entry in source["files"])


@functools.lru_cache(maxsize=1)
def _synthetic_splits(pairs: int, seed: int) -> dict[str, list[Pair]]:
    held_out = min(500, pairs // 10)  # validation and test pairs each
    every_pair = toy_task.synthetic_translation_pairs(pairs + 2 * held_out, seed=seed)
    train, validation, test = readers.split_pairs(every_pair, valid_size=held_out, test_size=held_out, seed=seed)
    return {"train": train, "validation": validation, "test": test}


def iter_source_pairs(split: str, source: dict, source_lang: str, target_lang: str, report=None) -> Iterator[Pair]:
    """Stream the pairs of one split (empty sides included); `DataError` names the file and line of bad data, and
    the readers' repairs (CRLF endings, byte-order marks) are counted in `report`."""
    kind = source["kind"]
    if kind == "synthetic":
        yield from _synthetic_splits(source["pairs"], source["seed"])[split]
    elif kind == "hub":
        yield from readers.iter_hub_dataset(
            source["name"], source["config"], source["split"], source_lang, target_lang
        )
    elif kind == "parallel":
        yield from readers.iter_parallel_text(*(entry["path"] for entry in source["files"]), report=report)
    elif kind == "jsonl":
        yield from readers.iter_jsonl(source["files"][0]["path"], source_lang, target_lang, report=report)
    else:
        yield from readers.iter_tsv(source["files"][0]["path"], report=report)


# --- the cache key ---------------------------------------------------------------------------------------------


def tokenizer_fingerprint(tokenizer) -> str:
    """sha256 of the tokenizer's vocabulary and rules, without its padding and truncation settings: calling a
    tokenizer with padding=True turns padding on in its backend, and save_pretrained writes that into tokenizer.json.
    A stock tokenizer without a `tokenizers` backend (a converted model's MarianTokenizer or FSMTTokenizer): its class
    and the files of its vocabulary."""
    if not hasattr(tokenizer, "backend_tokenizer"):
        digest = hashlib.sha256(type(tokenizer).__name__.encode("utf-8"))
        with tempfile.TemporaryDirectory() as folder:
            for path in sorted(tokenizer.save_vocabulary(folder)):
                digest.update(Path(path).read_bytes())
        return digest.hexdigest()
    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    backend.no_truncation()
    return hashlib.sha256(backend.to_str().encode("utf-8")).hexdigest()


def corpus_key(settings: DataSettings, sources: dict[str, dict], tokenizer=None) -> dict:
    """Everything the prepared corpus depends on; its hash names the cache folder. (The filter's JSON name
    `max_source_tokens` is the flag's old name, kept so that corpora cached before the rename are found.)"""
    if tokenizer is not None:
        tokenizer_spec = {"given": settings.tokenizer.name_or_path, "sha256": tokenizer_fingerprint(tokenizer)}
    else:
        trained = settings.tokenizer
        tokenizer_spec = {
            "train": {"vocab_size": trained.vocab_size, "sample_pairs": trained.sample_pairs, "seed": trained.seed}
        }
    return {
        "format": FORMAT_VERSION,
        "source_lang": settings.corpus.source_lang,
        "target_lang": settings.corpus.target_lang,
        "sources": sources,
        "tokenizer": tokenizer_spec,
        "filters": {
            "max_source_tokens": settings.filters.max_sentence_tokens,  # the key of corpora prepared before
            "max_length_ratio": settings.filters.max_length_ratio,
        },
    }


def key_hash(key: dict) -> str:
    return hashlib.sha256(json.dumps(key, sort_keys=True).encode("utf-8")).hexdigest()[:20]


def default_cache_dir() -> Path:
    from huggingface_hub import constants

    return Path(constants.HF_HOME) / "vanilla_transformer" / "prepared"


# --- preparation -----------------------------------------------------------------------------------------------


def write_pairs_arrow(pairs: Iterable[Pair], path: Path) -> int:
    """Write pairs into an Arrow stream file (`source`, `target` columns) a chunk at a time; returns the count."""
    import pyarrow as pa

    schema = pa.schema([("source", pa.string()), ("target", pa.string())])
    count = 0
    pairs = iter(pairs)
    with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        while chunk := list(islice(pairs, WRITE_CHUNK_PAIRS)):
            sources, targets = zip(*chunk, strict=True)
            writer.write_batch(pa.record_batch([pa.array(sources), pa.array(targets)], schema=schema))
            count += len(chunk)
    return count


def sample_texts(path: Path, total_pairs: int, sample_pairs: int, seed: int) -> Iterator[str]:
    """Source and target sentences of a seeded random sample of `sample_pairs` of the `total_pairs` pairs in the
    Arrow file `path` (every pair, in order, when there are no more than that).

    The file is read a record batch at a time into ordinary buffers, not memory-mapped: a sample touches pages all
    over the file, which a memory map would keep resident (1.3 GB at 4.5M pairs).
    """
    import pyarrow as pa

    chosen = None
    if total_pairs > sample_pairs:
        chosen = np.sort(np.random.default_rng(seed).choice(total_pairs, sample_pairs, replace=False))
    first_row = 0
    with pa.OSFile(str(path)) as file, pa.ipc.open_stream(file) as reader:
        for batch in reader:
            if chosen is not None:
                rows = chosen[np.searchsorted(chosen, first_row) : np.searchsorted(chosen, first_row + len(batch))]
                first_row += len(batch)
                batch = batch.take(pa.array(rows - (first_row - len(batch))))
            for source, target in zip(batch.column(0).to_pylist(), batch.column(1).to_pylist(), strict=True):
                yield source
                yield target


def encode_pairs_batch(batch: dict, tokenizer) -> dict:
    return {
        "input_ids": tokenizer(batch["source"], return_attention_mask=False)["input_ids"],
        "labels": tokenizer(batch["target"], return_attention_mask=False)["input_ids"],
    }


def _tokenize_split(raw, tokenizer, split: str, filters: LengthFilter, report: DataReport, workers: int | None):
    import datasets

    features = {"input_ids": datasets.List(datasets.Value("int32")), "labels": datasets.List(datasets.Value("int32"))}
    if split != "train":
        features = {"source": datasets.Value("string"), "target": datasets.Value("string"), **features}
    tokenized = raw.map(
        encode_pairs_batch,
        batched=True,
        fn_kwargs={"tokenizer": tokenizer},
        num_proc=workers,
        remove_columns=["source", "target"] if split == "train" else None,
        features=datasets.Features(features),
        desc=f"tokenizing {split}",
    )
    if split == "train":
        pairs = TokenizedPairs(tokenized)  # lengths from the Arrow offsets: no row is read
        keep = filters.keep(pairs.source_lengths, pairs.target_lengths, report)
        filters.refuse_if_none_kept(len(keep), report)
        if not keep.all():
            tokenized = tokenized.select(np.flatnonzero(keep))
    return tokenized


def _progress(start: float, seconds: bool = True) -> str:
    """` (N s, peak RSS M MB)`: the preparation's time so far and this process's memory high-water mark."""
    parts = [f"{time.time() - start:.0f} s"] if seconds else []
    try:
        import resource

        parts.append(f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB")  # KiB on Linux
    except ImportError:  # not on Windows
        pass
    return f" ({', '.join(parts)})" if parts else ""


def prepare_corpus(
    settings: DataSettings, sources: dict[str, dict], folder: Path, key: dict, tokenizer=None, log=print
) -> Path:
    """Read, tokenize and filter every split into `folder` (see the module docstring); returns `folder`.

    Works in a staging folder beside `folder` and renames it into place when complete, so an interrupted preparation
    never looks like a prepared corpus, and two nodes preparing into one shared folder cannot mix their files.
    """

    from vanilla_transformer.data.tokenization import train_shared_tokenizer

    start = time.time()
    folder.parent.mkdir(parents=True, exist_ok=True)
    remove_stale_preparations(folder, log)
    staging = folder.parent / f".incomplete-{folder.name}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}"
    (staging / "raw").mkdir(parents=True)

    def raw_path(split: str) -> Path:
        return staging / "raw" / f"{split}.arrow"

    try:
        with on_full_disk(out_of_space(folder)):
            reports, raw = _read_splits(sources, settings.corpus, raw_path)
            log(f"[prepare] read {', '.join(f'{s}: {len(d)} pairs' for s, d in raw.items())}{_progress(start)}")
            if tokenizer is None:
                trained = settings.tokenizer
                tokenizer = train_shared_tokenizer(
                    sample_texts(raw_path("train"), len(raw["train"]), trained.sample_pairs, trained.seed),
                    vocab_size=trained.vocab_size,
                )
                log(f"[prepare] trained a {len(tokenizer)}-token BPE vocabulary{_progress(start)}")
            tokenizer.save_pretrained(staging / TOKENIZER_FOLDER)
            workers = settings.num_workers if (settings.num_workers or 1) > 1 else None
            for split in raw:
                tokenized = _tokenize_split(raw[split], tokenizer, split, settings.filters, reports[split], workers)
                tokenized.save_to_disk(
                    str(staging / split), num_proc=workers
                )  # written by the workers, when there are
                del tokenized
                log(f"[prepare] tokenized {split}{_progress(start)}")
            del raw
            shutil.rmtree(staging / "raw")
            manifest = {
                "key": key,
                "reports": {split: asdict(report) for split, report in reports.items()},
                "prepared_seconds": round(time.time() - start, 1),
                "files": record_files(staging),  # sizes and sha256, checked before every use (`prepared_problem`)
            }
            (staging / MANIFEST).write_text(json.dumps(manifest, indent=2))
            _move_into_place(staging, folder, key, log)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    log(f"[prepare] prepared {folder} in {time.time() - start:.0f} s{_progress(start, seconds=False)}")
    return folder


def _read_splits(sources: dict[str, dict], corpus: Corpus, raw_path) -> tuple[dict, dict]:
    """Each split's pairs (empty sides dropped) written as Arrow to `raw_path(split)` and memory-mapped: (reports,
    datasets) by split."""
    import datasets

    reports, raw = {}, {}
    for split, source in sources.items():
        report = DataReport(sources=[source_label(source)])
        pairs = iter_source_pairs(split, source, corpus.source_lang, corpus.target_lang, report)
        write_pairs_arrow(readers.non_empty_pairs(pairs, report), raw_path(split))
        if report.kept == 0:
            raise DataError(f"{', '.join(report.sources)}: no translation pairs found")
        reports[split], raw[split] = report, datasets.Dataset.from_file(str(raw_path(split)))
    return reports, raw


def out_of_space(folder: Path) -> Callable[[BaseException], DataError]:
    """For `on_full_disk`: a write into `folder` that ran out of space (a preparation, a cached tokenizer, both staged
    so that nothing half-written is left) is one DataError that says what to do."""
    return lambda cause: DataError(
        f"no space left on device while writing {folder} ({cause}); nothing half-written is left: free space on "
        "that disk, or prepare elsewhere (--data_cache_dir, or vanilla-transformer prepare --output_dir)"
    )


def remove_stale_preparations(folder: Path, log=print) -> None:
    """Delete what preparations of `folder` killed on this machine left behind (`kill -9`, a power cut): their
    staging folders (named after host and process id; another live process's is left alone, as are other
    machines') and damaged corpora moved aside."""
    for path in remove_stale(folder.parent, f".incomplete-{folder.name}-{socket.gethostname()}-"):
        log(f"[prepare] removed {path}, left by an interrupted preparation")
    for path in folder.parent.glob(f".damaged-{folder.name}-*"):
        shutil.rmtree(path, ignore_errors=True)


def _move_into_place(staging: Path, folder: Path, key: dict, log) -> None:
    """Rename the finished staging folder to `folder`. When another preparation (another process, node or command)
    got there first, theirs is kept if it is the same corpus, and anything else is an error: never silently used."""
    try:
        move_into_place(staging, folder, replace=False)
        return
    except OSError:
        if not folder.exists():
            raise
    theirs = read_manifest(folder)["key"]
    if key_hash(theirs) != key_hash(key):
        differing = [name for name in sorted(key.keys() | theirs.keys()) if key.get(name) != theirs.get(name)]
        raise DataError(
            f"{folder} was filled by another preparation while this one ran, with another corpus (its "
            f"{', '.join(differing)} differ); this preparation is discarded: prepare into another folder"
        )
    log(f"[prepare] {folder} was prepared meanwhile by another process, from the same data and settings: using it")


# --- loading ---------------------------------------------------------------------------------------------------


def read_manifest(folder: Path) -> dict:
    """A prepared folder's manifest.json, or a DataError that names the file and what is wrong with it."""
    path = folder / MANIFEST
    if not path.is_file():
        raise DataError(
            f"{folder} is not a prepared corpus (no {MANIFEST}); make one with vanilla-transformer prepare"
        )
    try:
        manifest = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError) as error:
        raise DataError(f"{path} cannot be read ({type(error).__name__}: {error})") from error
    if not isinstance(manifest, dict) or not isinstance(manifest.get("key"), dict):
        raise DataError(f"{path} is not a prepared corpus's manifest (no `key` object)")
    if not isinstance(manifest.get("reports"), dict) or not set(manifest["reports"]) <= set(SPLITS):
        raise DataError(f"{path}: `reports` must map the splits {', '.join(SPLITS)} to their reports")
    if manifest["key"].get("format") != FORMAT_VERSION:
        raise DataError(
            f"{folder} was prepared by another version of this code (format "
            f"{manifest['key'].get('format')}, need {FORMAT_VERSION}); prepare it again"
        )
    return manifest


def prepared_problem(folder: Path) -> str | None:
    """Why a prepared folder cannot be trusted (its manifest, or a file that is missing, truncated or edited since
    preparation, named), or None."""
    try:
        manifest = read_manifest(folder)
    except DataError as error:
        return str(error)
    if not isinstance(manifest.get("files"), dict):
        return f"{folder / MANIFEST} records no file sizes and sha256 (`files`): prepared by an older version"
    return files_problem(folder, manifest["files"])


@dataclass
class PreparedCorpus:
    folder: Path
    tokenizer: object
    splits: dict  # split name -> memory-mapped datasets.Dataset
    manifest: dict

    def summary(self) -> list[str]:
        return [
            f"[data] {split}: {DataReport(**report).summary()}" for split, report in self.manifest["reports"].items()
        ]


def verify_prepared(folder: str | Path) -> None:
    """A DataError naming what is damaged in a prepared folder (see `prepared_problem`)."""
    if problem := prepared_problem(Path(folder)):
        raise DataError(f"the prepared corpus {folder} cannot be used: {problem}; prepare it again")


def load_prepared(folder: str | Path) -> PreparedCorpus:
    """Memory-map a prepared folder (checked beforehand with `verify_prepared`, once per machine)."""
    import datasets

    folder = Path(folder)
    manifest = read_manifest(folder)
    try:
        splits = {split: datasets.load_from_disk(str(folder / split)) for split in manifest["reports"]}
        tokenizer = load_tokenizer(folder / TOKENIZER_FOLDER)
    except Exception as error:  # whatever pyarrow, datasets or tokenizers raise on a damaged folder
        raise DataError(f"the prepared corpus {folder} cannot be read ({type(error).__name__}: {error})") from error
    return PreparedCorpus(folder, tokenizer, splits, manifest)


def training_data_fingerprint(corpus: PreparedCorpus, pairs: TokenizedPairs) -> dict:
    """What a run resumed from a checkpoint must train on to continue it (compared on resume): the prepared training
    pairs, their number, tokens and content in order (`TokenizedPairs.content_sha256`, which a copy or a preparation
    with other workers keeps), and the filters that kept them."""
    filters = corpus.manifest["key"].get("filters", {})
    return {
        "pairs": len(pairs),
        "tokens": int(pairs.source_lengths.sum()) + int(pairs.target_lengths.sum()),
        "sha256": pairs.content_sha256(),
        "max_sentence_tokens": filters.get("max_source_tokens"),
        "max_length_ratio": filters.get("max_length_ratio"),
    }


def discard_damaged(folder: Path, problem: str, log=print) -> None:
    """Move a damaged cached corpus out of the way (renamed first, so no reader finds half of it), then delete it."""
    log(f"[data] the cached corpus {folder} is damaged ({problem}): preparing it again")
    aside = folder.parent / f".damaged-{folder.name}-{uuid.uuid4().hex[:8]}"
    os.replace(folder, aside)
    shutil.rmtree(aside, ignore_errors=True)


def load_or_prepare(
    settings: DataSettings, accelerator=None, splits: Iterable[str] = SPLITS, tokenizer=None
) -> PreparedCorpus:
    """The prepared corpus the settings describe: `prepared_data` as it is, or the cached folder for this data,
    tokenizer and filters, prepared first if missing. `tokenizer` (evaluation with a saved model, or a stream's)
    replaces the tokenizer settings. With several processes, each node's local main process prepares (on its own
    disk) while the others wait, then every process memory-maps the same files."""
    if settings.prepared_data:
        check = functools.partial(verify_prepared, settings.prepared_data)
        run_while_others_wait(accelerator, check, "checking --prepared_data")
        return load_prepared(settings.prepared_data)
    if tokenizer is None:
        tokenizer = settings.tokenizer.load_given()
    sources = split_sources(settings.corpus, splits)
    if "train" in splits and "train" not in sources:
        raise DataError("no training data: give --data_dir, --train_file or --dataset_name")
    key = corpus_key(settings, sources, tokenizer)
    folder = Path(settings.cache_dir or default_cache_dir()) / key_hash(key)

    def prepare_if_missing():
        if folder.exists():
            if (problem := prepared_problem(folder)) is None:
                return
            discard_damaged(folder, problem)
        prepare_corpus(settings, sources, folder, key, tokenizer)

    run_while_others_wait(accelerator, prepare_if_missing, "preparing the data", if_too_slow=PREPARE_BEFOREHAND)
    corpus = load_prepared(folder)
    if accelerator is not None and accelerator.is_main_process:
        print(f"[data] prepared corpus: {folder}")
    return corpus
