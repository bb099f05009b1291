"""`ModelBackend`: translation of batches of source token ids through a model's `generate()`, the one decoding
under the translate command, the demo, `translate_sentences` (all through `serving/batches.translate_texts`, which
batches texts by tokens and cuts what is too long) and the training's evaluation (which batches a prepared corpus
itself, the same batches on every process).
"""

import copy
from collections.abc import Sequence

import torch
from torch.nn.attention import SDPBackend, sdpa_kernel

from pipeline_vanilla_transformer import length_arguments
from vanilla_transformer.model.beam_cache import sentence_beam_cache
from vanilla_transformer.model.beam_search import beam_search, unsupported_settings

# The kernels scaled_dot_product_attention may pick while decoding: every one but cuDNN's. A corpus's batches bring new
# shapes at every step (a batch's size and sources, each step's key length), and cuDNN's attention builds a plan for
# each new shape: on an H100 with torch 2.11, 78 lines/s against 765 without it (docs/BENCHMARKS.md, "On a GPU").
# Other devices' choices (the CPU's flash kernel or the math one, an XPU's own kernel) are not changed.
DECODING_ATTENTION = [
    SDPBackend.FLASH_ATTENTION,
    SDPBackend.EFFICIENT_ATTENTION,
    SDPBackend.MATH,
    SDPBackend.OVERRIDEABLE,
]


class ModelBackend:
    """Translation with a loaded model through `generate()`: `encode` gives source token ids, `translate` a batch of
    them (one translation each, and the target tokens generated). Decoding follows the model's generation config, with
    `num_beams` and `max_new_tokens` given here on top (None: the config's beam, and the config's length where it sets
    one, else section 6.1's input + 50). The text is decoded as the tokenizer's `batch_decode` does."""

    def __init__(self, model, tokenizer, num_beams: int | None = None, max_new_tokens: int | None = None, **kwargs):
        if kwargs.setdefault("num_return_sequences", 1) != 1:
            raise ValueError(
                "a translation is one sentence per source: num_return_sequences must be 1, got "
                f"{kwargs['num_return_sequences']!r}."
            )
        if num_beams is not None:
            kwargs["num_beams"] = num_beams
        self.model, self.tokenizer, self.max_new_tokens, self.generate_kwargs = (
            model,
            tokenizer,
            max_new_tokens,
            kwargs,
        )
        settings = copy.deepcopy(model.generation_config)  # the config generate() will decode with
        settings.update(**kwargs)
        self.beams = settings.num_beams or 1
        # generate()'s beam search with fewer passes over the log-probabilities (beam_search.py), where it applies
        self.search = {} if self.beams == 1 or unsupported_settings(settings) else {"custom_generate": beam_search}
        self.max_source_tokens = model.config.max_position_embeddings
        self.special_ids = set(tokenizer.all_special_ids)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer(list(texts), verbose=False)["input_ids"]

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, verbose=False)["input_ids"])

    def translate(self, batch: list[list[int]]) -> tuple[list[str], int]:
        padded = self.tokenizer.pad({"input_ids": batch}, padding=True, return_tensors="pt")
        inputs = {name: padded[name].to(self.model.device) for name in ("input_ids", "attention_mask")}
        lengths = length_arguments(
            inputs["attention_mask"], self.model.config, self.model.generation_config, self.max_new_tokens
        )
        self.model.eval()
        with torch.inference_mode(), sdpa_kernel(DECODING_ATTENTION):
            if self.beams == 1 or getattr(self.model.generation_config, "cache_implementation", None) is not None:
                output_ids = self.model.generate(**inputs, **lengths, **self.generate_kwargs)
            else:  # the first step and the source's keys and values once a sentence, not once a beam (beam_cache.py)
                encoded = self.model.get_encoder()(**inputs)
                with sentence_beam_cache(self.model) as cache:
                    output_ids = self.model.generate(
                        **inputs,
                        encoder_outputs=encoded,
                        cache=cache,
                        **lengths,
                        **self.generate_kwargs,
                        **self.search,
                    )  # generate() then encodes nothing
        is_special = torch.isin(output_ids, torch.tensor(sorted(self.special_ids), device=output_ids.device))
        return self.tokenizer.batch_decode(output_ids, skip_special_tokens=True), int((~is_special).sum())
