"""The translation pipeline as a Hub user gets it: loaded from a saved folder in a process without the project.

Translation quality of a random model means nothing, so the pipeline's output is compared with `model.generate`
and decoding done here, for the same inputs, batches and generation arguments.
"""

import json
import re

import pytest
import torch
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from pipeline_vanilla_transformer import (
    EXTRA_OUTPUT_TOKENS,
    MAX_OUTPUT_TOKENS,
    VanillaTransformerTranslationPipeline,
    output_length,
)

from .helpers import ENGLISH, run_without_the_project

ONE = ENGLISH[0]
THREE = [ENGLISH[1], ENGLISH[3], ENGLISH[10]]  # different lengths: the first batch of two is padded

PIPELINE_SCRIPT = """
import json
import torch
from transformers import pipeline

torch.set_num_threads(1)  # a tiny model on a shared CPU

calls = []

def record_generate(translator):
    generate = translator.model.generate
    def recording(**kwargs):
        arguments = {key: kwargs.get(key) for key in ("num_beams", "max_new_tokens", "max_length")}
        calls.append({"batch": list(kwargs["input_ids"].shape), **arguments})
        return generate(**kwargs)
    translator.model.generate = recording
    return translator

by_task = record_generate(pipeline("translation", model=FOLDER, trust_remote_code=True))
by_model = record_generate(pipeline(model=FOLDER, trust_remote_code=True))
results = {
    "classes": [type(by_task).__name__, type(by_model).__name__, type(by_task).__module__],
    "one": by_task(ONE),
    "three": by_model(THREE, batch_size=2, num_beams=2, max_new_tokens=6),
    "max_length": by_task(ONE, num_beams=1, max_length=5),
}
try:
    by_task("   ")
except ValueError as error:
    results["empty"] = str(error)
results["calls"] = calls
print(json.dumps(results))
"""


def generate_and_decode(model, tokenizer, sentences: list[str], **generate_kwargs) -> list[str]:
    inputs = tokenizer(sentences, padding=True, return_tensors="pt")
    with torch.no_grad():
        output_ids = model.generate(**inputs, **generate_kwargs)
    return tokenizer.batch_decode(output_ids, skip_special_tokens=True)


@pytest.mark.slow
def test_pipeline_from_a_folder_in_a_process_without_the_project(folder):
    constants = f"FOLDER, ONE, THREE = {str(folder)!r}, {ONE!r}, {THREE!r}\n"
    stdout = run_without_the_project(constants + PIPELINE_SCRIPT, cwd=folder.parent)
    results = json.loads(stdout.strip().splitlines()[-1])

    name, module = VanillaTransformerTranslationPipeline.__name__, "pipeline_vanilla_transformer"
    assert results["classes"][:2] == [name, name]  # with and without the task name
    assert results["classes"][2].startswith("transformers_modules.") and results["classes"][2].endswith(module)

    tokenizer = AutoTokenizer.from_pretrained(folder)
    model = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()  # beam 4, length penalty 0.6 from the folder
    source_length = len(tokenizer(ONE)["input_ids"])
    expected_one = generate_and_decode(model, tokenizer, [ONE], max_new_tokens=source_length + EXTRA_OUTPUT_TOKENS)
    assert results["one"] == [{"translation_text": expected_one[0]}]

    # batch_size=2 over three sentences: batches of 2 and 1, generation arguments passed through
    expected_three = generate_and_decode(model, tokenizer, THREE[:2], num_beams=2, max_new_tokens=6)
    expected_three += generate_and_decode(model, tokenizer, THREE[2:], num_beams=2, max_new_tokens=6)
    assert results["three"] == [{"translation_text": text} for text in expected_three]

    expected_short = generate_and_decode(model, tokenizer, [ONE], num_beams=1, max_length=5)
    assert results["max_length"] == [{"translation_text": expected_short[0]}]

    calls = results["calls"]
    assert calls[0] == {
        "batch": [1, source_length],
        "num_beams": None,
        "max_new_tokens": source_length + 50,
        "max_length": None,
    }
    assert [call["batch"][0] for call in calls[1:3]] == [2, 1]
    assert all(call["num_beams"] == 2 and call["max_new_tokens"] == 6 for call in calls[1:3])
    assert calls[3]["max_length"] == 5 and calls[3]["max_new_tokens"] is None  # no default over the caller's limit
    assert "empty string" in results["empty"]


def test_pipeline_in_process_returns_one_list_per_input_for_several_sequences(folder):
    translator = VanillaTransformerTranslationPipeline(
        model=AutoModelForSeq2SeqLM.from_pretrained(folder), tokenizer=AutoTokenizer.from_pretrained(folder), device=-1
    )
    results = translator(THREE[:2], num_beams=2, num_return_sequences=2, max_new_tokens=3)
    assert [len(translations) for translations in results] == [2, 2]
    assert all(set(translation) == {"translation_text"} for translations in results for translation in translations)


@pytest.mark.parametrize(
    "inputs, error, message",
    [
        ("", ValueError, "empty string"),
        (["fine", " "], ValueError, "position 1"),
        ([], ValueError, "empty list"),
        (["fine", 3], TypeError, "got int at position 1"),
    ],
)
def test_pipeline_rejects_empty_and_non_text_inputs(folder, inputs, error, message):
    translator = VanillaTransformerTranslationPipeline(
        model=AutoModelForSeq2SeqLM.from_pretrained(folder), tokenizer=AutoTokenizer.from_pretrained(folder), device=-1
    )
    with pytest.raises(error, match=message):
        translator(inputs)


@pytest.mark.parametrize(
    ("given", "from_the_folder", "message"),
    [
        ({"max_new_tokens": 10**9}, {}, "max_new_tokens=1000000000 is over this pipeline's limit of 4096 tokens"),
        ({"max_length": 10**9}, {}, "max_length=1000000000 is over this pipeline's limit of 4096 tokens"),
        ({}, {"max_new_tokens": 5000}, "max_new_tokens=5000 is over this pipeline's limit of 4096 tokens"),
        ({}, {"num_beams": 10**6}, "num_beams=1000000 is over this pipeline's limit of 64"),
        ({"num_beams": 100, "num_return_sequences": 100}, {}, "num_beams=100 is over this pipeline's limit of 64"),
    ],
)
def test_pipeline_refuses_an_output_length_over_its_bound_before_generating(folder, given, from_the_folder, message):
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    model.generation_config.update(**from_the_folder)
    generated = []
    model.generate = lambda **kwargs: generated.append(kwargs) or 1 / 0
    translator = VanillaTransformerTranslationPipeline(
        model=model, tokenizer=AutoTokenizer.from_pretrained(folder), device=-1
    )
    with pytest.raises(ValueError, match=re.escape(message)):
        translator(ONE, **given)
    assert generated == []


def recording_pipeline(folder, calls: list, generates: bool = True) -> VanillaTransformerTranslationPipeline:
    """The folder's pipeline, its model's generate() recording the source length and the output length it gets (and
    generating, or returning one token where not `generates`)."""
    model = AutoModelForSeq2SeqLM.from_pretrained(folder)
    generate = model.generate

    def recording(**kwargs):
        calls.append({"source_tokens": kwargs["input_ids"].shape[1], "max_new_tokens": kwargs.get("max_new_tokens")})
        return generate(**kwargs) if generates else torch.ones((1, 1), dtype=torch.long)

    model.generate = recording
    return VanillaTransformerTranslationPipeline(
        model=model, tokenizer=AutoTokenizer.from_pretrained(folder), device=-1
    )


def test_a_100000_word_input_is_cut_at_the_tokenizers_limit_and_its_output_bounded_by_input_plus_50(folder, caplog):
    calls = []
    translator = recording_pipeline(folder, calls)
    result = translator("a " * 100_000, num_beams=1, return_tensors=True)
    limit = translator.tokenizer.model_max_length
    assert limit == 1024 and calls == [{"source_tokens": limit, "max_new_tokens": limit + EXTRA_OUTPUT_TOKENS}]
    assert len(result[0]["translation_token_ids"]) <= 1 + limit + EXTRA_OUTPUT_TOKENS  # the start token, then output
    assert f"is cut at {limit} (the tokenizer's model_max_length); pass truncation=False" in caplog.text


def test_the_default_output_length_is_capped_at_max_output_tokens_and_a_pipeline_may_raise_the_cap(folder):
    config = AutoModelForSeq2SeqLM.from_pretrained(folder).config
    assert output_length(torch.ones(1, 5000, dtype=torch.long), config) == MAX_OUTPUT_TOKENS
    calls = []
    translator = recording_pipeline(folder, calls, generates=False)
    translator.tokenizer.model_max_length = 10**30  # a tokenizer that sets no limit: cut at MAX_OUTPUT_TOKENS
    translator("a " * 5000)
    translator.max_output_tokens = 8192
    translator(ONE, max_new_tokens=5000)  # over the default cap: allowed once raised
    assert calls == [
        {"source_tokens": MAX_OUTPUT_TOKENS, "max_new_tokens": MAX_OUTPUT_TOKENS},
        {"source_tokens": len(translator.tokenizer(ONE)["input_ids"]), "max_new_tokens": 5000},
    ]


def test_a_20_megabyte_string_is_shortened_before_it_is_tokenized_and_cut_as_before(folder):
    """Tokenizing costs memory by the character: a huge source is shortened to its cut x MAX_CHARACTERS_PER_TOKEN
    characters first, which leaves the cut source's ids as they were."""
    from pipeline_vanilla_transformer import MAX_CHARACTERS_PER_TOKEN

    translator = VanillaTransformerTranslationPipeline(
        model=AutoModelForSeq2SeqLM.from_pretrained(folder), tokenizer=AutoTokenizer.from_pretrained(folder), device=-1
    )
    seen = []
    tokenize = translator.tokenizer.__class__.__call__

    def recording(tokenizer, text, **kwargs):
        seen.append(len(text))
        return tokenize(tokenizer, text, **kwargs)

    huge = "the red dog " * 1_700_000  # 20 MB
    translator.tokenizer.__class__.__call__ = recording
    try:
        ids = translator.preprocess(huge)["input_ids"]
    finally:
        translator.tokenizer.__class__.__call__ = tokenize
    limit = translator.input_limit()
    assert seen == [limit * MAX_CHARACTERS_PER_TOKEN]
    whole = translator.tokenizer(huge[: 100 * limit], return_tensors="pt", truncation=True, max_length=limit)
    assert torch.equal(ids, whole["input_ids"])
