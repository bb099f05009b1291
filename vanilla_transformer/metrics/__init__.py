"""Evaluation metrics shipped with the package, loadable by `evaluate` without network access."""

import logging
from pathlib import Path
from typing import Any

import evaluate

logger = logging.getLogger(__name__)

# evaluate.load accepts a folder that holds a script of the same name (<name>/<name>.py).
SACREBLEU_CHRF_PATH = str(Path(__file__).resolve().parent / "sacrebleu_chrf")


def load_bleu_metric(prefer_hub: bool = False, **load_kwargs: Any) -> evaluate.EvaluationModule:
    """Load the local sacreBLEU + chrF metric (see `sacrebleu_chrf.py` for its outputs).

    With `prefer_hub=True`, the Hub's "sacrebleu" metric is tried first and the local module is
    used if that fails (offline, no cache, ...). The Hub metric returns its BLEU under "score",
    not "bleu", and has no chrF. `load_kwargs` go to `evaluate.load` (e.g. `keep_in_memory=True`).
    """
    if prefer_hub:
        try:
            return evaluate.load("sacrebleu", **load_kwargs)
        except Exception as error:  # any failure means: use the copy shipped with the package
            logger.warning("Could not load 'sacrebleu' from the Hub (%r); using %s", error, SACREBLEU_CHRF_PATH)
    return evaluate.load(SACREBLEU_CHRF_PATH, **load_kwargs)
