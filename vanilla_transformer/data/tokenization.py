"""One BPE vocabulary shared by source and target language, as in the paper (section 5.1).

The tokenizer is byte-level BPE trained with the `tokenizers` library: every string can be encoded without unknown
tokens and `decode(encode(text))` gives `text` back exactly (there is no normalization step). Every encoded sequence
ends with `</s>`; nothing is prepended, because the decoder starts from `<s>` (the model's `decoder_start_token_id`)
when it shifts the labels right.

Save it with `tokenizer.save_pretrained(folder)` and load it back with `load_tokenizer(folder)`.
"""

import json
from collections.abc import Iterable
from pathlib import Path

from tokenizers import Tokenizer, decoders, models, pre_tokenizers, processors, trainers
from transformers import PreTrainedTokenizerFast

PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = [PAD_TOKEN, BOS_TOKEN, EOS_TOKEN, UNK_TOKEN]
PAD_TOKEN_ID, BOS_TOKEN_ID, EOS_TOKEN_ID, UNK_TOKEN_ID = 0, 1, 2, 3
MODEL_MAX_LENGTH = 1024

# Byte-level BPE starts from all 256 byte symbols, so a smaller vocabulary cannot hold them plus the special tokens.
MIN_VOCAB_SIZE = len(pre_tokenizers.ByteLevel.alphabet()) + len(SPECIAL_TOKENS)


def load_tokenizer(name_or_path: str | Path):
    """The tokenizer saved in a folder (a model folder, a prepared corpus's, a trained one) or on the Hub. A folder
    holding `tokenizer.json` loads as the plain `tokenizers` tokenizer it is, and one whose tokenizer_config.json
    names a tokenizer class of transformers (a converted OPUS-MT or FSMT folder's MarianTokenizer, FSMTTokenizer) as
    that class: since transformers 5, `AutoTokenizer` reads a model folder's configuration first and, in a process
    that has not registered the model type (`vanilla_transformer.register()`), asks whether to run its custom code."""
    import transformers

    folder = Path(name_or_path)
    if (folder / "tokenizer.json").is_file():
        return PreTrainedTokenizerFast.from_pretrained(name_or_path)
    tokenizer_class = getattr(transformers, named_tokenizer_class(folder / "tokenizer_config.json"), None)
    if isinstance(tokenizer_class, type) and issubclass(tokenizer_class, transformers.PreTrainedTokenizerBase):
        return tokenizer_class.from_pretrained(name_or_path)
    return transformers.AutoTokenizer.from_pretrained(name_or_path)


def named_tokenizer_class(settings: Path) -> str:
    """The `tokenizer_class` a tokenizer_config.json names ("" where none is, or the file is not a JSON object: then
    AutoTokenizer reads it and says what is wrong)."""
    try:
        named = json.loads(settings.read_text(encoding="utf-8")).get("tokenizer_class") if settings.is_file() else ""
    except (ValueError, AttributeError):
        return ""
    return named if isinstance(named, str) else ""


def train_shared_tokenizer(
    texts: Iterable[str], vocab_size: int, min_frequency: int = 2, show_progress: bool = False
) -> PreTrainedTokenizerFast:
    """Train one byte-level BPE vocabulary of `vocab_size` tokens on `texts` (source and target sentences mixed).

    `min_frequency` is the number of times a pair must occur to be merged. Special token ids are fixed:
    `<pad>`=0, `<s>`=1, `</s>`=2, `<unk>`=3.
    """
    if vocab_size < MIN_VOCAB_SIZE:
        raise ValueError(
            f"vocab_size must be at least {MIN_VOCAB_SIZE} (256 bytes + 4 special tokens), got {vocab_size}."
        )

    backend = Tokenizer(models.BPE(unk_token=UNK_TOKEN))
    # No prefix space: a sentence's first word is encoded without a leading space, which keeps the round trip exact.
    backend.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    backend.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        min_frequency=min_frequency,
        special_tokens=SPECIAL_TOKENS,
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=show_progress,
    )
    backend.train_from_iterator(texts, trainer=trainer)
    # Like Marian: `tokens </s>`; a pair (not used for translation) gets `</s>` after each part.
    backend.post_processor = processors.TemplateProcessing(
        single=f"$A {EOS_TOKEN}",
        pair=f"$A {EOS_TOKEN} $B:1 {EOS_TOKEN}:1",
        special_tokens=[(EOS_TOKEN, EOS_TOKEN_ID)],
    )

    for token, expected_id in zip(SPECIAL_TOKENS, range(len(SPECIAL_TOKENS)), strict=True):
        actual_id = backend.token_to_id(token)
        if actual_id != expected_id:
            raise RuntimeError(f"Special token {token} got id {actual_id}, expected {expected_id}.")

    return PreTrainedTokenizerFast(
        tokenizer_object=backend,
        pad_token=PAD_TOKEN,
        bos_token=BOS_TOKEN,
        eos_token=EOS_TOKEN,
        unk_token=UNK_TOKEN,
        model_max_length=MODEL_MAX_LENGTH,
        padding_side="right",
        truncation_side="right",
        # The generic clean-up removes spaces before punctuation ("Ja , nein" -> "Ja, nein"): wrong for exact text.
        clean_up_tokenization_spaces=False,
    )
