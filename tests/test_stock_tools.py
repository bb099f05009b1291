"""The calls Hugging Face users make, with no argument of ours: they must give the paper's answer (issue 33).

generate() without a length decodes up to section 6.1's input length + 50, ending early at </s>, as the pipeline and
the commands do; a length the user sets, in the call or in the generation config, is used as given.
"""

import torch
from transformers import GenerationConfig

from .conftest import random_ids, random_tiny_model, run_without_the_project, save_tiny_model_folder

SOURCE_TOKENS = 25  # longer than transformers' own fallback of 20 new tokens


def test_a_plain_generate_call_may_decode_input_length_plus_50_tokens():
    model = random_tiny_model(61)
    sources = random_ids(model.config, (2, SOURCE_TOKENS))
    never_ending = [[model.config.eos_token_id]]  # the random model then decodes to the limit
    output = model.generate(input_ids=sources, attention_mask=torch.ones_like(sources), bad_words_ids=never_ending)
    assert output.shape == (2, 1 + SOURCE_TOKENS + 50)  # the decoder start token, then the new tokens
    assert model.generate(sources, bad_words_ids=never_ending).shape == output.shape  # the ids as `inputs`


def test_the_limit_counts_the_longest_source_without_its_padding():
    model = random_tiny_model(61)
    sources = random_ids(model.config, (2, SOURCE_TOKENS))
    mask = torch.ones_like(sources)
    mask[:, 20:] = 0  # both right-padded from position 20
    output = model.generate(input_ids=sources, attention_mask=mask, bad_words_ids=[[model.config.eos_token_id]])
    assert output.shape == (2, 1 + 20 + 50)


def test_a_plain_generate_call_ends_at_the_end_of_sentence(memorising_model):
    model, sources, targets = memorising_model
    assert torch.equal(model.generate(input_ids=sources, num_beams=1)[:, 1:], targets)


def test_a_length_the_user_sets_is_used_as_given():
    model = random_tiny_model(61)
    sources = random_ids(model.config, (1, SOURCE_TOKENS))
    never_ending = [[model.config.eos_token_id]]
    assert model.generate(sources, max_new_tokens=7, bad_words_ids=never_ending).shape == (1, 8)
    assert model.generate(sources, max_length=12, bad_words_ids=never_ending).shape == (1, 12)
    given = GenerationConfig(max_new_tokens=5, bad_words_ids=never_ending, **model.generation_config.to_diff_dict())
    assert model.generate(sources, generation_config=given).shape == (1, 6)
    model.generation_config.max_length = 10  # as a folder's generation_config.json may say
    assert model.generate(sources, bad_words_ids=never_ending).shape == (1, 10)


def test_a_saved_folder_loaded_by_transformers_alone_decodes_the_papers_length(tmp_path):
    save_tiny_model_folder(tmp_path / "model")
    printed = run_without_the_project(
        f"""
        import torch
        from transformers import AutoModelForSeq2SeqLM
        model = AutoModelForSeq2SeqLM.from_pretrained("model", trust_remote_code=True)
        sources = torch.randint(4, model.config.vocab_size, (1, {SOURCE_TOKENS}))
        print(model.generate(sources, bad_words_ids=[[model.config.eos_token_id]]).shape[1])
        """,
        tmp_path,
    )
    assert int(printed) == 1 + SOURCE_TOKENS + 50
