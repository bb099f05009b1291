"""The translation pipeline of the vanilla Transformer.

Hub-facing: this file is copied beside the weights of every saved model and runs as remote code, so it imports only
torch and transformers. transformers 5 removed its built-in "translation" pipeline; a saved folder names this class
under `custom_pipelines` in config.json, so that

    translator = pipeline("translation", model=folder, trust_remote_code=True)   # or pipeline(model=folder, ...)
    translator("A sentence.")                      # [{"translation_text": "..."}]
    translator(["One.", "Two."], batch_size=2)     # [{"translation_text": "..."}, {"translation_text": "..."}]

The arguments of transformers 4's TranslationPipeline keep their meaning: `return_text` and `return_tensors` (the
output ids, as `translation_token_ids`), `clean_up_tokenization_spaces` (default: the tokenizer's own setting, as
`tokenizer.decode`), `truncation`, `src_lang` and `tgt_lang`
(checked against the languages the model was trained on, where its tokenizer_config.json records them). Generation
arguments (`num_beams`, `max_new_tokens`, `length_penalty`, ...) pass through to `model.generate`; those not given
come from the model's generation_config.json (the paper: beam 4, length penalty 0.6).

What a call costs is bounded, whatever the input:
- a source is cut at the tokenizer's `model_max_length` (1024 tokens for this project's tokenizers; at most
  MAX_OUTPUT_TOKENS when a tokenizer sets none), with a warning: `truncation=True` by default, where transformers 4
  did not truncate. `truncation=False` translates a longer source whole, at the memory and time it takes.
- the output follows the paper's maximum length, input length + 50 (section 6.1): when neither `max_new_tokens` nor
  `max_length` is set, by the call or the model's generation_config.json, a batch may generate (its longest source,
  in tokens) + 50 new tokens, at most MAX_OUTPUT_TOKENS (4096). A `max_new_tokens` or `max_length` over that limit, given or from generation_config.json,
  is refused with a ValueError before anything is generated. To raise the limit, set it on the pipeline:
  `translator.max_output_tokens = 8192`.
"""

import torch
from transformers import Pipeline
from transformers.utils import logging

EXTRA_OUTPUT_TOKENS = 50  # section 6.1: "maximum output length to input length + 50"
# Section 6.1's beam search: the decoding written into every saved generation_config.json unless a run chose another,
# and the default of the training's final evaluation (the one statement of these numbers)
PAPER_DECODING = {"num_beams": 4, "length_penalty": 0.6, "early_stopping": True}
# The longest output a call or a model's generation_config.json may ask for: a sentence's translation is tens of
# tokens, and the cache and the scores of generation grow with the length asked for (10**9 tried to allocate 32 GB).
MAX_OUTPUT_TOKENS = 4096
# The widest search a call or a model's generation_config.json may ask for: 16 times the paper's beam of 4 (the memory
# and time of a step grow with it; a million beams took 6.1 GB)
MAX_BEAMS = 64
# a source longer than its cut (in tokens) times this is shortened before it is tokenized: tokenizing costs ~100 bytes
# of memory a character (a 20 MB string took 3.3 GB), and no text averages 64 characters a token
MAX_CHARACTERS_PER_TOKEN = 64
LENGTH_SETTINGS = ("max_new_tokens", "max_length")  # the settings of a generation config that give a length

logger = logging.get_logger(__name__)


def paper_max_new_tokens(attention_mask: torch.Tensor) -> int:
    """Section 6.1's maximum output length for a batch: its longest source, in tokens (padding excluded), + 50.
    The one definition, used through `output_length` by this pipeline, the model's `paper_max_new_tokens` (a plain
    generate()), `vanilla_transformer.serving` and the training's evaluation."""
    return int(attention_mask.sum(dim=1).max()) + EXTRA_OUTPUT_TOKENS


def output_length(
    attention_mask: torch.Tensor, config, requested: int | None = None, limit: int = MAX_OUTPUT_TOKENS
) -> int:
    """The new tokens a batch may generate: `requested`, else section 6.1's input + 50 up to `limit`, and at most
    what the model can represent. A learned position table (Table 3, row E) has `max_position_embeddings` rows and
    the decoder start token takes the first; sinusoids have no limit. A cut is logged once."""
    length = requested if requested is not None else min(paper_max_new_tokens(attention_mask), limit)
    if config.position_embedding_type != "learned" or length < config.max_position_embeddings:
        return length
    cap = config.max_position_embeddings - 1
    logger.warning_once(
        f"The model's learned position table has {config.max_position_embeddings} positions: translations longer "
        f"than {cap} tokens are cut there."
    )
    return cap


def length_arguments(
    attention_mask: torch.Tensor,
    config,
    generation_config,
    requested: int | None = None,
    limit: int = MAX_OUTPUT_TOKENS,
) -> dict:
    """The length arguments of a `generate()` call on a batch: `requested` new tokens when given, else the length the
    model's `generation_config` gives (`max_new_tokens` or `max_length`: the model decodes to it, as a converted
    model's source does), else section 6.1's input + 50 up to `limit`; at most what the model can represent
    (`output_length`). Said in the generation config's own setting, so that generate() never sees both; none when the
    generation config's own length stands."""
    configured = configured_new_tokens(generation_config)
    by_max_length = configured is not None and getattr(generation_config, "max_new_tokens", None) is None
    new_tokens = output_length(attention_mask, config, configured if requested is None else requested, limit)
    if requested is None and new_tokens == configured:
        return {}
    return {"max_length": new_tokens + 1} if by_max_length else {"max_new_tokens": new_tokens}


def configured_new_tokens(generation_config) -> int | None:
    """The new tokens the model's generation config allows (its `max_new_tokens`, or its `max_length` less the decoder
    start token); None where it gives no length."""
    for name in LENGTH_SETTINGS:
        if (value := getattr(generation_config, name, None)) is not None:
            return value if name == "max_new_tokens" else value - 1
    return None


def check_output_length(settings: dict, limit: int = MAX_OUTPUT_TOKENS) -> None:
    """Refuse (ValueError naming it) a `max_new_tokens` or `max_length` over `limit`, or a `num_beams` or
    `num_return_sequences` over MAX_BEAMS, in `settings`, the generation arguments of a call on top of the model's
    generation config, before anything is generated."""
    for name in ("num_beams", "num_return_sequences"):
        value = settings.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > MAX_BEAMS:
            raise ValueError(f"{name}={value} is over this pipeline's limit of {MAX_BEAMS}.")
    for name in ("max_new_tokens", "max_length"):
        value = settings.get(name)
        if isinstance(value, (int, float)) and not isinstance(value, bool) and value > limit:
            raise ValueError(
                f"{name}={value} is over this pipeline's limit of {limit} tokens: a translation is far shorter, "
                "and generation allocates for the length asked (raise the limit with `pipeline.max_output_tokens`)."
            )


def _check_text(text, position: int | None = None) -> None:
    where = "" if position is None else f" at position {position}"
    if not isinstance(text, str):
        raise TypeError(f"The translation pipeline takes strings; got {type(text).__name__}{where}.")
    if not text.strip():
        raise ValueError(f"Cannot translate an empty string{where}: every input needs at least one word.")


class VanillaTransformerTranslationPipeline(Pipeline):
    """Translate sentences with a sequence-to-sequence model; returns `[{"translation_text": ...}]` per input."""

    _load_tokenizer = True
    _load_processor = False
    _load_image_processor = False
    _load_video_processor = False
    _load_feature_extractor = False
    _pipeline_calls_generate = True
    max_output_tokens = MAX_OUTPUT_TOKENS  # the longest output a call may generate; an instance may raise it

    def __call__(self, inputs: str | list[str], **kwargs) -> list[dict[str, str]] | list[list[dict[str, str]]]:
        """Translate one string or a list of strings.

        A string gives a list of `{"translation_text": ...}` (one per returned sequence, so one by default). A list
        gives one such dict per input, or one list of dicts per input when `num_return_sequences` > 1. Other
        iterables (generators, datasets) are streamed: each item gives a list of dicts. `batch_size` and the
        generation arguments of `model.generate` are accepted.
        """
        if isinstance(inputs, str):
            _check_text(inputs)
            return super().__call__(inputs, **kwargs)
        if isinstance(inputs, (list, tuple)):
            if not inputs:
                raise ValueError("The translation pipeline got an empty list: there is nothing to translate.")
            for position, text in enumerate(inputs):
                _check_text(text, position)
            results = super().__call__(list(inputs), **kwargs)
            if all(len(translations) == 1 for translations in results):
                return [translations[0] for translations in results]
            return results
        return super().__call__(inputs, **kwargs)

    def _sanitize_parameters(
        self,
        return_text: bool | None = None,
        return_tensors: bool | None = None,
        clean_up_tokenization_spaces: bool | None = None,
        truncation=None,
        src_lang: str | None = None,
        tgt_lang: str | None = None,
        **generate_kwargs,
    ):
        """transformers 4's TranslationPipeline arguments, with their meaning there; the rest go to generate()."""
        self._check_languages(src_lang=src_lang, tgt_lang=tgt_lang)
        preprocess = {} if truncation is None else {"truncation": truncation}  # True by default (`preprocess`)
        postprocess = {}
        if return_tensors is not None or return_text is not None:  # as in v4: ids instead of text, unless both asked
            postprocess["with_ids"] = bool(return_tensors)
            postprocess["with_text"] = return_text if return_text is not None else not return_tensors
            if not (postprocess["with_ids"] or postprocess["with_text"]):
                raise ValueError("return_text=False without return_tensors=True leaves nothing to return.")
        if clean_up_tokenization_spaces is not None:
            postprocess["clean_up_tokenization_spaces"] = clean_up_tokenization_spaces
        return preprocess, generate_kwargs, postprocess

    def _check_languages(self, **given: str | None) -> None:
        """`src_lang`/`tgt_lang` must be the model's own languages: a single-pair model translates nothing else."""
        known = {
            "src_lang": self.tokenizer.init_kwargs.get("source_lang"),
            "tgt_lang": self.tokenizer.init_kwargs.get("target_lang"),
        }
        for name, language in given.items():
            if language is not None and known[name] is not None and language != known[name]:
                raise ValueError(
                    f"{name}={language!r}, but this model translates {known['src_lang']} to {known['tgt_lang']} "
                    f"only; leave {name} out or give {known[name]!r}."
                )

    def preprocess(self, text: str, truncation=True) -> dict[str, torch.Tensor]:
        """The source's ids, cut at `input_limit` unless `truncation` is False (a cut is logged once)."""
        _check_text(text)
        limit = self.input_limit() if truncation else None
        if limit is not None and len(text) > limit * MAX_CHARACTERS_PER_TOKEN:  # a huge string costs no more than this
            text = text[: limit * MAX_CHARACTERS_PER_TOKEN]
        encoding = self.tokenizer(text, return_tensors="pt", truncation=bool(truncation), max_length=limit)
        if limit is not None and encoding["input_ids"].shape[1] >= limit:
            logger.warning_once(
                f"A source of {limit} tokens or more is cut at {limit} (the tokenizer's model_max_length); pass "
                "truncation=False to translate it whole."
            )
        return {"input_ids": encoding["input_ids"], "attention_mask": encoding["attention_mask"]}

    def input_limit(self) -> int:
        """Where a source is cut by default: the tokenizer's `model_max_length`, at most MAX_OUTPUT_TOKENS (a
        tokenizer that sets none says 10**30)."""
        return min(int(self.tokenizer.model_max_length), MAX_OUTPUT_TOKENS)

    def _forward(self, model_inputs: dict[str, torch.Tensor], **generate_kwargs) -> dict[str, torch.Tensor]:
        input_ids, attention_mask = model_inputs["input_ids"], model_inputs["attention_mask"]
        prepared = self._prepare_generate_kwargs(generate_kwargs)
        set_params = self._get_set_generation_params(prepared)
        check_output_length(set_params, self.max_output_tokens)
        if "max_length" not in set_params:  # input + 50 unless given, at most what the positions can represent
            requested, limit = set_params.get("max_new_tokens"), self.max_output_tokens
            length = output_length(attention_mask, self.model.config, requested, limit)
            prepared = self._prepare_generate_kwargs(generate_kwargs, max_new_tokens=length)
        output_ids = self.model.generate(input_ids=input_ids, attention_mask=attention_mask, **prepared)
        # (batch * sequences per input, length) -> (batch, sequences per input, length), unbatched per input
        return {"output_ids": output_ids.reshape(input_ids.shape[0], -1, output_ids.shape[-1])}

    def postprocess(
        self,
        model_outputs: dict[str, torch.Tensor],
        with_text: bool = True,
        with_ids: bool = False,
        clean_up_tokenization_spaces: bool | None = None,
    ) -> list[dict]:
        """One dict per returned sequence: `translation_text`, and/or `translation_token_ids` (`return_tensors`). The
        text is decoded as the tokenizer's `decode` does (`clean_up_tokenization_spaces`: the tokenizer's own setting
        unless given), as every other way of translating with the model does."""
        records = []
        for ids in model_outputs["output_ids"][0]:
            record = {"translation_token_ids": ids} if with_ids else {}
            if with_text:
                record["translation_text"] = self.tokenizer.decode(
                    ids, skip_special_tokens=True, clean_up_tokenization_spaces=clean_up_tokenization_spaces
                )
            records.append(record)
        return records
