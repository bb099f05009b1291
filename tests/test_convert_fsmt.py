"""FSMT folders (transformers' port of fairseq's WMT models) converted: FSMT's logits, tokens and tokenizer kept, and
the converted folder translating through `translate` and transformers' pipeline."""

import pytest

from .helpers import run_in_this_process
from .sources import (
    MULTI30K_LIKE,
    NEW_TOKENS,
    SENTENCES,
    TOLERANCE,
    check_same_generation,
    generated,
    logits_difference,
    padded_batch,
)


def test_converted_fsmt_gives_fsmts_logits_within_1e_5_on_a_padded_batch(fsmt):
    assert logits_difference(fsmt, padded_batch(fsmt[1], fsmt[2])) < TOLERANCE


@pytest.mark.parametrize("num_beams", [1, 4])
def test_converted_fsmt_generates_fsmts_tokens(fsmt, num_beams):
    check_same_generation(fsmt, fsmt[1], num_beams)


def test_converted_fsmt_keeps_fsmts_tokenizer_ids_and_text(fsmt):
    _, theirs, _, ours, _ = fsmt
    assert type(ours).__name__ == "FSMTTokenizer"
    expected = theirs(SENTENCES)["input_ids"]
    assert ours(SENTENCES)["input_ids"] == expected
    assert ours.batch_decode(expected, skip_special_tokens=True) == theirs.batch_decode(
        expected, skip_special_tokens=True
    )


def test_translating_a_converted_fsmt_folder_prints_no_length_warning_per_batch(fsmt, tmp_path):
    """FSMT's folders set max_length: the command decodes by it without transformers' warning about two lengths."""
    from vanilla_transformer.commands.translate import main as translate

    lines = tmp_path / "lines.en"
    lines.write_text("".join(f"{sentence}\n" for sentence in (SENTENCES * 3)[:12]), encoding="utf-8")
    result = run_in_this_process(translate, [str(fsmt[4]), "--input", str(lines), "--batch_size", "4"])
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 12
    assert "max_length" not in result.stderr, result.stderr


def test_the_translation_pipeline_translates_with_a_converted_folder(fsmt):
    from transformers import pipeline

    translator = pipeline("translation", model=str(fsmt[4]), trust_remote_code=True)
    batch = fsmt[1]([MULTI30K_LIKE[0]], return_tensors="pt")
    expected = fsmt[1].decode(generated(fsmt[0], batch, 1)[0], skip_special_tokens=True)
    assert translator(MULTI30K_LIKE[0], num_beams=1, max_new_tokens=NEW_TOKENS) == [{"translation_text": expected}]
