"""The paper's output length for a plain `generate()` of a saved model folder.

Hub-facing: every saved model folder holds this file as `custom_generate/generate.py`, the hook transformers offers a
repository for its own decoding: `from_pretrained(folder, trust_remote_code=True)` makes the model's `generate()` this
function. It decodes as `GenerationMixin.generate` does, with one difference: when neither the call nor the folder's
generation_config.json sets a length (`max_new_tokens` or `max_length`), the output may take section 6.1's input
length + 50 tokens (ending early at </s>), where transformers' own fallback, 20 tokens, cuts translations mid-sentence;
and it refuses a `num_beams` or `num_return_sequences` under 1 by name (transformers divides by it).
It imports only torch and transformers; the length is the model's `paper_max_new_tokens`.
"""

import torch
from transformers import GenerationMixin

LENGTH_SETTINGS = ("max_new_tokens", "max_length")


def generate(inputs: torch.Tensor | None = None, generation_config=None, *, model, **kwargs):
    """`GenerationMixin.generate(model, ...)`, with the paper's output length where no length is set. transformers
    passes `model` by keyword (`model.generate` is this function with `model` bound), so that the caller's arguments
    keep generate()'s positions."""
    config = generation_config if generation_config is not None else model.generation_config
    for name in ("num_beams", "num_return_sequences"):  # GenerationMixin divides by num_beams: a ZeroDivisionError
        value = kwargs.get(name, getattr(config, name, None))
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
            raise ValueError(f"`{name}` must be a positive integer, got {value!r}.")
    if all(kwargs.get(name) is None and getattr(config, name, None) is None for name in LENGTH_SETTINGS):
        if (mask := source_mask(inputs, kwargs)) is not None:
            kwargs["max_new_tokens"] = model.paper_max_new_tokens(mask)
    return GenerationMixin.generate(model, inputs, generation_config, **kwargs)


def source_mask(inputs: torch.Tensor | None, kwargs: dict) -> torch.Tensor | None:
    """The (batch, source length) mask of the sources a generate() call translates, from whatever it was given."""
    if kwargs.get("attention_mask") is not None:
        return kwargs["attention_mask"]
    encoder_outputs = kwargs.get("encoder_outputs")
    for source in (
        inputs,
        kwargs.get("input_ids"),
        kwargs.get("inputs_embeds"),
        encoder_outputs and encoder_outputs[0],
    ):
        if isinstance(source, torch.Tensor) and source.dim() >= 2:
            return torch.ones(source.shape[:2], dtype=torch.long)
    return None
