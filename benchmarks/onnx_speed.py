"""ONNX Runtime against the model backend and CTranslate2 on a CPU: `vanilla-transformer translate` on the same
Multi30k sentences with each engine, and the q8 export's BLEU against float32's.

Engines, each the translate command in a process of its own (CTranslate2 or ONNX Runtime in a PyTorch process change
each other's speed, docs/BENCHMARKS.md), with the model folder's own decoding (generation_config.json: a model trained
here has the paper's beam 4, length penalty 0.6, input + 50):
- model: the model backend, float32 (PyTorch's generate());
- ctranslate2 int8: `--backend ctranslate2 --compute_type int8` on a float32 export made here (export-ctranslate2);
- onnx float32: `--backend onnx --onnx_dir OUT` on the export made here (`export-onnx MODEL_DIR OUT --quantize q8`,
  checked against the model before it is written);
- onnx q8: the same with `--onnx_variant q8` (ONNX Runtime's dynamic int8: int8 weights, activations quantized as
  they come).

The sentences: the first --sentences (default 2,000) of Multi30k's test_2016_flickr.en then val.en (1,000 + 1,014),
one file, in that order. Lines/s and target tokens/s are the engine's own clock (the command's summary line:
`translated N lines (... target tokens) in S s`, loading left out); "wall s" is the process from start to exit,
loading included. Target tokens are the command's count (special tokens left out), so engines that stop at other
lengths are compared by tokens/s. --repeat R runs the engines R times in turn, the median kept.

Quality, on the test_2016_flickr part of the sentences (all 1,000 when --sentences >= 1,000): each engine's BLEU and
chrF against the .de references (sacreBLEU's defaults, as training/evaluation.py scores: 13a tokenization, cased),
q8's BLEU minus float32's, and on every sentence the share where an engine gives onnx float32's text exactly.

Usage:
    python benchmarks/onnx_speed.py --model_dir /tmp/multi30k-model --output onnx_speed.json
    python benchmarks/onnx_speed.py --model_dir /tmp/multi30k-model --onnx_dir /tmp/multi30k-onnx --repeat 3
    python benchmarks/onnx_speed.py --tiny   # a random tiny model on 50 sentences: checks that the script runs
"""

import argparse
import gzip
import itertools
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import sacrebleu

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from common import SUMMARY, describe_machine, environment, machine, uptime  # noqa: E402

MULTI30K = ROOT.parent / "shared" / "data" / "multi30k"
TEST, VALIDATION = MULTI30K / "test_2016_flickr.en.gz", MULTI30K / "val.en.gz"
REFERENCES = MULTI30K / "test_2016_flickr.de.gz"
ENGINES = {
    "model float32": [],
    "ctranslate2 int8": ["--backend", "ctranslate2", "--compute_type", "int8"],
    "onnx float32": ["--backend", "onnx"],
    "onnx q8": ["--backend", "onnx", "--onnx_variant", "q8"],
}
REFERENCE_ENGINE = "onnx float32"  # "same text" is measured against it

# tests/helpers.py's tiny model folder, built in a process of its own: an import of `tests` here would be a module
# deptry does not know (pyproject's known_first_party lists the benchmark modules only)
TINY = """
import sys
from pathlib import Path
sys.path.insert(0, sys.argv[1])
from tests.helpers import save_tiny_model_folder
save_tiny_model_folder(Path(sys.argv[2]), init_std=1.0)
"""


def read_lines(path: Path, count: int | None = None) -> list[str]:
    with gzip.open(path, "rt", encoding="utf-8") as file:
        return [line.rstrip("\n") for line in itertools.islice(file, count)]


def run(command: list[str], threads: int, what: str) -> subprocess.CompletedProcess:
    done = subprocess.run(command, cwd=ROOT, env=environment(threads), capture_output=True, text=True)
    if done.returncode != 0:
        raise SystemExit(f"{what} failed ({' '.join(map(str, command))}):\n{done.stderr[-3000:]}")
    return done


def vanilla_transformer(*arguments) -> list[str]:
    return [sys.executable, "-m", "vanilla_transformer", *map(str, arguments)]


def prepare(args: argparse.Namespace, work: Path) -> tuple[Path, Path, Path]:
    """The model folder (the tiny one built with --tiny), its ONNX export with q8 (--onnx_dir, or made here) and its
    CTranslate2 export (made here)."""
    model = Path(args.model_dir) if args.model_dir else work / "tiny-model"
    if args.tiny and not args.model_dir:
        run([sys.executable, "-c", TINY, str(ROOT), str(model)], args.threads, "building the tiny model")
    onnx_dir = Path(args.onnx_dir) if args.onnx_dir else work / "onnx"
    if not (onnx_dir / "onnx" / "encoder_model_quantized.onnx").is_file():
        started = time.monotonic()
        run(vanilla_transformer("export-onnx", model, onnx_dir, "--quantize", "q8"), args.threads, "export-onnx")
        print(f"export-onnx (checked, with q8): {time.monotonic() - started:.0f} s", flush=True)
    ctranslate2_dir = work / "ctranslate2"
    exporting = vanilla_transformer("export-ctranslate2", model, ctranslate2_dir, "--overwrite")
    run(exporting, args.threads, "export-ctranslate2")
    return model, onnx_dir, ctranslate2_dir


def translate(args, model: Path, flags: list[str], source: Path, output: Path) -> dict:
    """One engine's run: the command's own count and clock, and the process's wall seconds."""
    command = vanilla_transformer("translate", model, "--input", source, "--output", output, "--overwrite")
    command += ["--device", "cpu", *flags]
    started = time.monotonic()
    done = run(command, args.threads, "translate")
    wall = time.monotonic() - started
    found = SUMMARY.findall(done.stderr)
    if not found:
        raise SystemExit(f"no summary line in translate's output:\n{done.stderr[-3000:]}")
    lines, _, tokens, seconds = found[-1]
    return {"lines": int(lines), "target_tokens": int(tokens), "seconds": float(seconds), "wall_seconds": wall}


def measure(args, model: Path, onnx_dir: Path, ctranslate2_dir: Path, sentences: list[str], work: Path) -> dict:
    """Every engine on the sentences, --repeat times in turn: the median run of each, and its translations."""
    source = work / "sentences.en"
    source.write_text("".join(line + "\n" for line in sentences), encoding="utf-8")
    exports = {"ctranslate2": ["--ctranslate2_dir", ctranslate2_dir], "onnx": ["--onnx_dir", onnx_dir]}
    runs = {name: [] for name in ENGINES}
    for repetition in range(args.repeat):
        for name, flags in ENGINES.items():
            backend = flags[1] if flags else "model"
            output = work / f"{name.replace(' ', '-')}.de"
            runs[name].append(translate(args, model, [*flags, *exports.get(backend, [])], source, output))
            print(
                f"  {repetition + 1}/{args.repeat} {name}: {runs[name][-1]['seconds']:.1f} s "
                f"({runs[name][-1]['target_tokens'] / runs[name][-1]['seconds']:,.0f} target tokens/s)",
                flush=True,
            )
    rows = {}
    for name, measured in runs.items():
        middle = sorted(measured, key=lambda row: row["seconds"])[len(measured) // 2]
        output = work / f"{name.replace(' ', '-')}.de"
        rows[name] = middle | {
            "seconds_each": [row["seconds"] for row in measured],
            "lines_per_second": middle["lines"] / middle["seconds"],
            "target_tokens_per_second": middle["target_tokens"] / middle["seconds"],
            "wall_seconds": statistics.median(row["wall_seconds"] for row in measured),
            "translations": output.read_text(encoding="utf-8").split("\n")[: len(sentences)],
        }
    return rows


def quality(rows: dict, tested: int) -> dict:
    """BLEU and chrF of each engine on the first `tested` sentences (test_2016_flickr's) against the references, and
    the share of every sentence where it gives REFERENCE_ENGINE's text."""
    references = read_lines(REFERENCES, tested)
    same_as = rows[REFERENCE_ENGINE]["translations"]
    bleu, chrf = sacrebleu.BLEU(), sacrebleu.CHRF()
    for row in rows.values():
        hypotheses = row["translations"][:tested]
        row["bleu"] = bleu.corpus_score(hypotheses, [references]).score
        row["chrf"] = chrf.corpus_score(hypotheses, [references]).score
        row["same_text_as_onnx_float32"] = sum(
            a == b for a, b in zip(row["translations"], same_as, strict=True)
        ) / len(same_as)
    return {
        "test_sentences": tested,
        "bleu_signature": str(bleu.get_signature()),
        "q8_minus_float32_bleu": rows["onnx q8"]["bleu"] - rows["onnx float32"]["bleu"],
        "q8_same_text_as_float32": rows["onnx q8"]["same_text_as_onnx_float32"],
    }


def table(rows: dict) -> str:
    model = rows["model float32"]["target_tokens_per_second"]
    lines = [
        "| engine | lines/s | target tokens/s | vs model | engine s | wall s | BLEU | chrF | same text as onnx float32 |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for name, row in rows.items():
        lines.append(
            f"| {name} | {row['lines_per_second']:.1f} | {row['target_tokens_per_second']:,.0f} "
            f"| {row['target_tokens_per_second'] / model:.2f}x | {row['seconds']:.1f} | {row['wall_seconds']:.1f} "
            f"| {row['bleu']:.2f} | {row['chrf']:.2f} | {row['same_text_as_onnx_float32']:.1%} |"
        )
    return "\n".join(lines)


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--model_dir", help="a trained Multi30k en-de model folder (required unless --tiny)")
    parser.add_argument("--onnx_dir", help="its export with q8 (export-onnx --quantize q8); default: made here")
    parser.add_argument("--tiny", action="store_true", help="a random tiny model on 50 sentences: a quick check")
    parser.add_argument("--sentences", type=int, help="test_2016_flickr.en then val.en, the first N (default 2,000)")
    parser.add_argument("--repeat", type=int, default=1, help="runs of each engine, in turn; the median is kept")
    parser.add_argument("--threads", type=int, default=2, help="each engine's threads (OMP_NUM_THREADS)")
    parser.add_argument("--work_dir", help="keep the exports and translations here (default: a temporary folder)")
    parser.add_argument("--output", help="also write every figure (and the machine) to this JSON file")
    args = parser.parse_args(argv)
    if not args.model_dir and not args.tiny:
        parser.error("give --model_dir (a trained Multi30k model folder), or --tiny for a quick check")
    if args.sentences is None:
        args.sentences = 50 if args.tiny else 2000
    return args


def main(argv=None) -> None:
    args = parse_args(argv)
    sentences = (read_lines(TEST) + read_lines(VALIDATION))[: args.sentences]
    info = machine() | {"engine_threads": args.threads}
    print(describe_machine(info), f"; {args.threads} threads each engine\nbefore:", uptime(), flush=True)
    with tempfile.TemporaryDirectory(prefix="onnx-speed-") as temporary:
        work = Path(args.work_dir or temporary)
        work.mkdir(parents=True, exist_ok=True)
        model, onnx_dir, ctranslate2_dir = prepare(args, work)
        rows = measure(args, model, onnx_dir, ctranslate2_dir, sentences, work)
    print("after:", uptime())
    found = quality(rows, min(len(sentences), len(read_lines(TEST))))
    print(
        f"# {len(sentences)} Multi30k sentences; {model}; BLEU on test_2016_flickr's first {found['test_sentences']}"
    )
    print(table(rows))
    print(
        f"q8 against float32: {found['q8_minus_float32_bleu']:+.2f} BLEU, the same text on "
        f"{found['q8_same_text_as_float32']:.1%} of the sentences ({found['bleu_signature']})"
    )
    if args.output:
        kept = {
            name: {key: value for key, value in row.items() if key != "translations"} for name, row in rows.items()
        }
        record = {"machine": info, "model_dir": str(model), "sentences": len(sentences), "rows": kept, **found}
        Path(args.output).write_text(json.dumps(record, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
