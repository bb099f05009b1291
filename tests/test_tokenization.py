import json

import pytest
from transformers import AutoTokenizer, PreTrainedTokenizerFast

from vanilla_transformer.data.tokenization import SPECIAL_TOKENS, train_shared_tokenizer

CORPUS = [
    "The quick brown fox jumps over the lazy dog.",
    "Der schnelle braune Fuchs springt über den faulen Hund.",
    "Le renard brun rapide saute par-dessus le chien paresseux.",
    "Die Straße ist nass, weil es regnet; Größe und Maß zählen.",
    "Où est la gare ? Je ne sais pas, désolé !",
    "He said: \"It's 42 o'clock!\" and left at 7:30.",
    "Äpfel, Öl und Übungen kosten 3,50 € pro Stück.",
    "Les élèves à l'école français préfèrent la crème brûlée.",
]

SENTENCES = [
    "Die Straße ist nass.",
    "Größe, Maß und Übermut: Äpfel für 3,50 €!",
    "L'élève a déjà mangé la crème brûlée à Noël.",
    'She asked, "Why?" - and nobody answered (again).',
    "Ja , nein ... vielleicht ?",
    "Numbers like 1,234.56 and 2017 stay as they are.",
    "Ein völlig neues Wort: Donaudampfschifffahrtsgesellschaft",
    "日本語も大丈夫",
]


@pytest.fixture(scope="module")
def tokenizer() -> PreTrainedTokenizerFast:
    return train_shared_tokenizer(CORPUS * 5, vocab_size=400)


def test_special_token_ids_are_fixed(tokenizer):
    assert [tokenizer.convert_tokens_to_ids(token) for token in SPECIAL_TOKENS] == [0, 1, 2, 3]
    assert (tokenizer.pad_token_id, tokenizer.bos_token_id, tokenizer.eos_token_id, tokenizer.unk_token_id) == (
        0,
        1,
        2,
        3,
    )


def test_tokenizer_settings(tokenizer):
    assert isinstance(tokenizer, PreTrainedTokenizerFast)
    assert 300 < len(tokenizer) <= 400
    assert tokenizer.padding_side == "right"
    assert tokenizer.model_max_length == 1024
    assert tokenizer.clean_up_tokenization_spaces is False


def test_encoding_ends_with_eos_and_has_no_bos(tokenizer):
    ids = tokenizer("Der Hund schläft.")["input_ids"]
    assert ids[-1] == tokenizer.eos_token_id
    assert tokenizer.bos_token_id not in ids
    assert ids.count(tokenizer.eos_token_id) == 1
    assert tokenizer.encode("") == [tokenizer.eos_token_id]


@pytest.mark.parametrize("sentence", SENTENCES)
def test_decode_gives_the_exact_text_back(tokenizer, sentence):
    ids = tokenizer.encode(sentence)
    assert tokenizer.unk_token_id not in ids
    assert tokenizer.decode(ids, skip_special_tokens=True) == sentence


def test_batch_padding_is_on_the_right(tokenizer):
    batch = tokenizer(["Ja.", "Die Straße ist nass."], padding=True)
    short, long = batch["input_ids"]
    assert len(short) == len(long)
    assert short[-1] == tokenizer.pad_token_id
    assert batch["attention_mask"][0][-1] == 0


def test_vocab_size_below_byte_alphabet_is_rejected():
    with pytest.raises(ValueError, match="at least 260"):
        train_shared_tokenizer(CORPUS, vocab_size=100)


def test_save_and_load_with_auto_tokenizer(tokenizer, tmp_path):
    tokenizer.save_pretrained(tmp_path)
    loaded = AutoTokenizer.from_pretrained(tmp_path)

    assert isinstance(loaded, PreTrainedTokenizerFast)
    assert json.loads(loaded.backend_tokenizer.to_str()) == json.loads(tokenizer.backend_tokenizer.to_str())
    assert loaded.get_vocab() == tokenizer.get_vocab()
    assert loaded.special_tokens_map == tokenizer.special_tokens_map
    assert (loaded.pad_token_id, loaded.bos_token_id, loaded.eos_token_id, loaded.unk_token_id) == (0, 1, 2, 3)
    assert loaded.padding_side == "right"
    assert loaded.model_max_length == 1024
    assert loaded.clean_up_tokenization_spaces is False
    for sentence in SENTENCES:
        ids = tokenizer.encode(sentence)
        assert loaded.encode(sentence) == ids
        assert loaded.decode(ids, skip_special_tokens=True) == sentence
