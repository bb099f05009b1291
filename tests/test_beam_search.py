"""model/beam_search.py: generate()'s beam search with each step's candidates found from block maxima."""

import pytest
import torch

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from tests.helpers import TINY
from vanilla_transformer.model.beam_search import BLOCK, beam_search, top_candidates

SENTENCES, BEAMS = 6, 4


def candidates(vocab: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    generator = torch.Generator().manual_seed(seed)
    log_probs = torch.randn(SENTENCES * BEAMS, vocab, generator=generator).mul(3).log_softmax(-1)
    return log_probs, torch.randn(SENTENCES, BEAMS, generator=generator) * 2


def whole_topk(log_probs, scores, k):
    return torch.topk((log_probs.view(*scores.shape, -1) + scores[:, :, None]).flatten(1), k)


@pytest.mark.parametrize(
    "case", ["random", "first step", "masked tokens", "ties", "a tie across beams", "nan", "vocabulary under k blocks"]
)
def test_top_candidates_are_torch_topks_of_the_whole_sum(case):
    vocab = 40 * BLOCK + 77  # a tail after the last whole block
    log_probs, scores = candidates(vocab if case != "vocabulary under k blocks" else 3 * BLOCK, seed=len(case))
    if case == "first step":
        scores[:, 1:] = -1e9  # as generate() starts: the rounded sums of the other beams are all equal
    if case == "masked tokens":
        log_probs[:, 5:] = float("-inf")  # fewer finite candidates a sentence than k + 1
    if case == "ties":
        log_probs[:, 3 * BLOCK + 1] = log_probs[:, 700] = log_probs.max(-1).values  # a row's best, twice
    if case == "a tie across beams":
        scores[:] = 0.5
        log_probs[1::BEAMS] = log_probs[::BEAMS]  # each sentence's first two beams: the same candidates
    if case == "nan":
        log_probs[2, vocab - 1] = log_probs[7, 1000] = float("nan")
    for k in (BEAMS * 2, BEAMS * 3):
        values, indices = top_candidates(log_probs, scores, k)
        expected_values, expected_indices = whole_topk(log_probs, scores, k)
        assert torch.equal(indices, expected_indices)
        assert torch.equal(values.nan_to_num(), expected_values.nan_to_num())


@pytest.fixture(scope="module")
def model():
    """A random model whose vocabulary holds more blocks than a step's candidates (the fast path, not the fallback),
    with its end token's embedding (the output projection's row) scaled so that some beams end, at different steps."""
    torch.manual_seed(0)
    config = VanillaTransformerConfig(**{**TINY, "vocab_size": 12 * BLOCK, "max_position_embeddings": 64})
    model = VanillaTransformerForConditionalGeneration(config).eval()
    with torch.no_grad():
        model.get_input_embeddings().weight[config.eos_token_id] *= 4
    return model


@pytest.fixture(scope="module")
def sources(model) -> dict:
    """Five sources, two of them padded."""
    input_ids = torch.randint(4, model.config.vocab_size, (5, 9), generator=torch.Generator().manual_seed(1))
    attention_mask = torch.ones_like(input_ids)
    attention_mask[1, 6:] = attention_mask[3, 4:] = 0
    return {"input_ids": input_ids, "attention_mask": attention_mask}


SETTINGS = {
    "no end token": dict(eos_token_id=None),
    "defaults": {},
    "length penalty 0.6": dict(length_penalty=0.6),
    "length penalty 2, early stopping": dict(length_penalty=2.0, early_stopping=True),
    "negative length penalty, never": dict(length_penalty=-1.0, early_stopping="never"),
    "never": dict(early_stopping="never"),
    "processors": dict(no_repeat_ngram_size=2, bad_words_ids=[[7], [9, 10]], min_new_tokens=3),
    "two end tokens, 3 beams": dict(num_beams=3, eos_token_id=[2, 1512]),
    "5 beams": dict(num_beams=5),
}


@pytest.mark.parametrize("name", SETTINGS)
def test_beam_search_gives_generates_sequences(model, sources, name):
    settings = {"num_beams": BEAMS, "eos_token_id": model.config.eos_token_id, **SETTINGS[name]}
    with torch.no_grad():
        expected = model.generate(**sources, max_new_tokens=14, **settings)
        ours = model.generate(**sources, max_new_tokens=14, custom_generate=beam_search, **settings)
    assert torch.equal(ours, expected)
    if settings["eos_token_id"] is not None:  # the ends were exercised: some sentence ended before the longest
        ends = torch.isin(expected[:, 1:], torch.tensor(settings["eos_token_id"]))
        assert ends.any(1).any() and (ends.float().argmax(1) < expected.shape[1] - 2).any()


def test_beam_search_refuses_what_it_does_not_do_by_name(model, sources):
    with pytest.raises(ValueError, match="return_dict_in_generate"), torch.no_grad():
        model.generate(
            **sources, num_beams=2, max_new_tokens=3, return_dict_in_generate=True, custom_generate=beam_search
        )


def test_the_model_backends_beam_search_is_this_one_and_greedy_search_is_generates(monkeypatch, model_and_tokenizer):
    from vanilla_transformer.model import beam_search as module
    from vanilla_transformer.model.decoding import ModelBackend

    steps = []
    real = module.top_candidates
    monkeypatch.setattr(module, "top_candidates", lambda *args: (steps.append(True), real(*args))[1])
    model, tokenizer = model_and_tokenizer
    for beams in (1, 3):
        backend = ModelBackend(model, tokenizer, beams, 5)
        backend.translate(backend.encode(["a short sentence", "and another one, longer than the first"]))
        assert bool(steps) == (beams > 1)  # a step of beam search at least
