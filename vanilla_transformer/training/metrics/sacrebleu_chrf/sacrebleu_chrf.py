"""Corpus BLEU and chrF from sacreBLEU in one `evaluate` metric.

Load it by path so that no network access is needed:

    metric = evaluate.load("/path/to/vanilla_transformer/training/metrics/sacrebleu_chrf")
    result = metric.compute(predictions=["the cat sat"], references=[["the cat sat"]])

This file is copied on its own into evaluate's module cache, so it must only use
absolute imports of installed libraries (no relative imports, no project imports).
"""

import datasets
import evaluate
from sacrebleu.metrics import BLEU, CHRF

_DESCRIPTION = """\
Corpus-level BLEU and chrF computed with sacreBLEU on detokenized text.
BLEU uses sacreBLEU's own tokenizer ("13a" by default) and is case-sensitive unless
`lowercase=True`. Both scores are on a 0-100 scale and come with sacreBLEU's
reproducibility signature.
"""

_CITATION = """\
@inproceedings{post-2018-call,
    title = "A Call for Clarity in Reporting {BLEU} Scores",
    author = "Post, Matt",
    booktitle = "Proceedings of the Third Conference on Machine Translation: Research Papers",
    year = "2018",
    pages = "186--191",
}
@inproceedings{popovic-2015-chrf,
    title = "chr{F}: character n-gram {F}-score for automatic {MT} evaluation",
    author = "Popovi{\\'c}, Maja",
    booktitle = "Proceedings of the Tenth Workshop on Statistical Machine Translation",
    year = "2015",
    pages = "392--395",
}
"""

_KWARGS_DESCRIPTION = """
Args:
    predictions (list of str): detokenized system outputs.
    references (list of str, or list of list of str): one reference per prediction, or
        several. The number of references may differ between predictions.
    tokenize (str): sacreBLEU tokenizer for BLEU ("13a", "intl", "zh", "ja-mecab", "char", "none", ...).
    lowercase (bool): lowercase hypotheses and references (BLEU and chrF).
    smooth_method (str): BLEU smoothing: "exp" (default), "floor", "add-k" or "none".
    smooth_value (float, optional): value for the "floor" and "add-k" smoothing methods.
    chrf_word_order (int): 0 gives chrF (default), 2 gives chrF++.
Returns:
    bleu, bleu_signature, counts, totals, precisions, brevity_penalty, sys_len, ref_len,
    chrf, chrf_signature.
Example:
    >>> metric = evaluate.load(path_to_this_folder)
    >>> metric.compute(predictions=["the cat sat on the mat"], references=[["the cat sat on the mat"]])["bleu"]
    100.0
"""


def _reference_streams(references: list[str] | list[list[str]]) -> list[list[str | None]]:
    """Turn per-prediction references into sacreBLEU's per-reference-set streams.

    Missing references (ragged input) become None, which sacreBLEU skips.
    """
    per_prediction = [[refs] if isinstance(refs, str) else list(refs) for refs in references]
    for index, refs in enumerate(per_prediction):
        if not refs:
            raise ValueError(f"Prediction {index} has no reference.")
    max_refs = max(len(refs) for refs in per_prediction)
    return [[refs[i] if i < len(refs) else None for refs in per_prediction] for i in range(max_refs)]


@evaluate.utils.file_utils.add_start_docstrings(_DESCRIPTION, _KWARGS_DESCRIPTION)
class SacrebleuChrf(evaluate.Metric):
    def _info(self) -> evaluate.MetricInfo:
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation=_CITATION,
            inputs_description=_KWARGS_DESCRIPTION,
            features=[
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Sequence(datasets.Value("string")),
                    }
                ),
                datasets.Features(
                    {
                        "predictions": datasets.Value("string"),
                        "references": datasets.Value("string"),
                    }
                ),
            ],
            codebase_urls=["https://github.com/mjpost/sacrebleu"],
            reference_urls=["https://aclanthology.org/W18-6319", "https://aclanthology.org/W15-3049"],
        )

    def _compute(
        self,
        predictions: list[str],
        references: list[str] | list[list[str]],
        tokenize: str = "13a",
        lowercase: bool = False,
        smooth_method: str = "exp",
        smooth_value: float | None = None,
        chrf_word_order: int = 0,
    ) -> dict:
        if not predictions:
            raise ValueError("No predictions to score.")
        streams = _reference_streams(references)

        bleu_metric = BLEU(
            lowercase=lowercase, tokenize=tokenize, smooth_method=smooth_method, smooth_value=smooth_value
        )
        bleu = bleu_metric.corpus_score(predictions, streams)
        chrf_metric = CHRF(word_order=chrf_word_order, lowercase=lowercase)
        chrf = chrf_metric.corpus_score(predictions, streams)

        return {
            "bleu": bleu.score,
            "bleu_signature": str(bleu_metric.get_signature()),
            "counts": bleu.counts,
            "totals": bleu.totals,
            "precisions": bleu.precisions,
            "brevity_penalty": bleu.bp,
            "sys_len": bleu.sys_len,
            "ref_len": bleu.ref_len,
            "chrf": chrf.score,
            "chrf_signature": str(chrf_metric.get_signature()),
        }
