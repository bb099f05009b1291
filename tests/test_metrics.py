import socket
from pathlib import Path

import evaluate
import pytest
import sacrebleu

from vanilla_transformer.training.metrics import SACREBLEU_CHRF_PATH, load_bleu_and_chrf

HYPOTHESES = ["the cat sat on the mat", "a quick brown fox jumps over the dog", "hello world !"]
REFERENCES = ["the cat sat on a mat", "the quick brown fox jumped over the lazy dog", "hello , world !"]


@pytest.fixture(scope="module")
def metric() -> evaluate.EvaluationModule:
    return evaluate.load(SACREBLEU_CHRF_PATH, keep_in_memory=True)


def test_module_path_is_inside_the_package() -> None:
    # pyproject's package-data pattern "metrics/*/*.py" must cover the script.
    script = Path(SACREBLEU_CHRF_PATH) / "sacrebleu_chrf.py"
    package_dir = Path(__file__).resolve().parents[1] / "vanilla_transformer"
    assert script.is_file()
    assert script.relative_to(package_dir).match("metrics/*/*.py")


def test_identical_text_scores_100(metric: evaluate.EvaluationModule) -> None:
    result = metric.compute(predictions=REFERENCES, references=REFERENCES)
    assert result["bleu"] == pytest.approx(100.0)
    assert result["chrf"] == pytest.approx(100.0)
    assert result["brevity_penalty"] == pytest.approx(1.0)


def test_matches_sacrebleu(metric: evaluate.EvaluationModule) -> None:
    result = metric.compute(predictions=HYPOTHESES, references=REFERENCES)
    bleu = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES])
    chrf = sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES])
    assert result["bleu"] == pytest.approx(bleu.score)
    assert result["chrf"] == pytest.approx(chrf.score)
    assert result["counts"] == bleu.counts
    assert result["totals"] == bleu.totals
    assert result["precisions"] == pytest.approx(bleu.precisions)
    assert result["brevity_penalty"] == pytest.approx(bleu.bp)
    assert (result["sys_len"], result["ref_len"]) == (bleu.sys_len, bleu.ref_len)
    assert "tok:13a" in result["bleu_signature"]
    assert "nrefs:1" in result["bleu_signature"]
    assert "case:mixed" in result["bleu_signature"]
    assert result["chrf_signature"].startswith("nrefs:1|")


def test_options_reach_sacrebleu(metric: evaluate.EvaluationModule) -> None:
    shouting = [hypothesis.upper() for hypothesis in HYPOTHESES]
    result = metric.compute(
        predictions=shouting, references=REFERENCES, tokenize="intl", lowercase=True, smooth_method="floor"
    )
    expected = sacrebleu.corpus_bleu(shouting, [REFERENCES], tokenize="intl", lowercase=True, smooth_method="floor")
    assert result["bleu"] == pytest.approx(expected.score)
    assert "tok:intl" in result["bleu_signature"]
    assert "case:lc" in result["bleu_signature"]


def test_multiple_references(metric: evaluate.EvaluationModule) -> None:
    second_references = ["a cat sat on the mat", "a quick brown fox jumps over the dog", "hello world"]
    references = [[first, second] for first, second in zip(REFERENCES, second_references, strict=True)]
    result = metric.compute(predictions=HYPOTHESES, references=references)
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES, second_references])
    assert result["bleu"] == pytest.approx(expected.score)
    assert "nrefs:2" in result["bleu_signature"]


def test_ragged_references(metric: evaluate.EvaluationModule) -> None:
    references = [[REFERENCES[0], HYPOTHESES[0]], [REFERENCES[1]], [REFERENCES[2]]]
    result = metric.compute(predictions=HYPOTHESES, references=references)
    expected = sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES, [HYPOTHESES[0], None, None]])
    assert result["bleu"] == pytest.approx(expected.score)
    assert "nrefs:var" in result["bleu_signature"]


def test_loads_offline_without_network(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("HF_EVALUATE_OFFLINE", "1")
    monkeypatch.setattr(evaluate.config, "HF_EVALUATE_OFFLINE", True)  # read once at import time

    def refuse_connection(*args: object, **kwargs: object) -> None:
        raise OSError("network access attempted in a test")

    monkeypatch.setattr(socket.socket, "connect", refuse_connection)
    for path in (SACREBLEU_CHRF_PATH, str(Path(SACREBLEU_CHRF_PATH) / "sacrebleu_chrf.py")):
        metric = evaluate.load(path, keep_in_memory=True)
        assert metric.compute(predictions=REFERENCES, references=REFERENCES)["bleu"] == pytest.approx(100)

    # What the training script reads from the metric it loads.
    result = load_bleu_and_chrf(keep_in_memory=True).compute(predictions=HYPOTHESES, references=REFERENCES)
    assert result["bleu"] == pytest.approx(sacrebleu.corpus_bleu(HYPOTHESES, [REFERENCES]).score)
    assert result["chrf"] == pytest.approx(sacrebleu.corpus_chrf(HYPOTHESES, [REFERENCES]).score)
    assert "tok:13a" in result["bleu_signature"]
