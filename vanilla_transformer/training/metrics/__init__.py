"""Evaluation metrics shipped with the package, loadable by `evaluate` without network access."""

from pathlib import Path
from typing import Any

import evaluate

# evaluate.load accepts a folder that holds a script of the same name (<name>/<name>.py).
SACREBLEU_CHRF_PATH = str(Path(__file__).resolve().parent / "sacrebleu_chrf")


def load_bleu_and_chrf(**load_kwargs: Any) -> evaluate.EvaluationModule:
    """Load the sacreBLEU + chrF metric shipped with the package (see `sacrebleu_chrf.py` for its outputs: "bleu",
    "chrf", "bleu_signature", ...). `load_kwargs` go to `evaluate.load` (e.g. `keep_in_memory=True`)."""
    return evaluate.load(SACREBLEU_CHRF_PATH, **load_kwargs)
