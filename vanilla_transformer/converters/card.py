"""The model card (README.md) of a converted folder: the source, its license, the conversion and what the model is."""

import json
from string import Template

from torch import nn

from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS
from vanilla_transformer.converters.core import Source

CARD_TEMPLATE = Template("""---
language: $language
license: $license
library_name: transformers
pipeline_tag: translation
tags:
- translation
- transformer
- vanilla-transformer
- custom_code
$base_model---

# $title

The Transformer of ["Attention Is All You Need"](https://arxiv.org/abs/1706.03762) (Vaswani et al., 2017) as a
`transformers` model with custom code (the vanilla-transformer project), holding the weights of **$source**, a
$kind model that translates **$source_lang → $target_lang**. It was not trained here: `vanilla-transformer convert`
copied the weights, with nothing approximated; on a padded probe batch its logits differed from the source model's by
$difference (float32).

- Source: $source ($kind); its license, as its card records it: **$license_text**. The weights are the source's: its
  license and terms apply, and its card describes the data, the training and the scores its publishers measured.
- Converted by `vanilla-transformer convert` (`vanilla_transformer/converters/convert.py`), for transformers
  $transformers_range.

## Architecture

| | |
|---|---|
| d_model | $d_model |
| layers (encoder / decoder) | $encoder_layers / $decoder_layers |
| attention heads | $attention_heads |
| feed-forward inner size d_ff | $ffn_dim |
| activation | $activation |
| positions | sinusoidal, $position_layout layout, $position_frequencies frequencies, from position $position_offset |
| output bias | $lm_head_bias |
| $vocabulary |
| parameters | $parameters |

Post-LN layers and $embeddings; the layout, frequencies and first position of the sinusoids, the activation and the output bias are the
source's choices, recorded in config.json. Tokenizer: the source's own ($tokenizer), which gives its ids and text.
Decoding: $decoding (generation_config.json, as the source decodes).

## Usage

```python
from transformers import pipeline

translator = pipeline("translation", model="$model_id", trust_remote_code=True)
print(translator("$example"))
```

or `vanilla-transformer translate FOLDER < source.txt`, `vanilla-transformer demo FOLDER`, and
`vanilla-transformer export-ctranslate2 FOLDER OUTPUT` like any model of the project.
""")


def decoding_line(generation: dict) -> str:
    """The decoding of a generation_config.json's settings, in words."""
    beams = generation.get("num_beams") or 1
    if beams == 1:
        line = "greedy search"
    else:
        line = f"beam search with beam size {beams} and length penalty {generation.get('length_penalty', 1.0)}"
    if generation.get("max_new_tokens") is not None:
        return f"{line}, at most {generation['max_new_tokens']} new tokens"
    if generation.get("max_length") is not None:
        return f"{line}, at most {generation['max_length']} tokens"
    return f"{line}, at most input length + 50 tokens"


def conversion_card(model: nn.Module, source: Source, difference: float, generation: dict) -> str:
    """README.md of a converted folder: the source, its license, the conversion and what the model is; its decoding
    from `generation`, the folder's generation_config.json."""
    config = model.config
    languages = [language for language in source.languages if language]
    decoding = decoding_line(generation)
    if config.share_encoder_decoder_embeddings:
        vocabulary = f"shared vocabulary | {config.vocab_size} tokens"
        embeddings = (
            "one embedding matrix for the encoder input, the decoder input and the output projection, as in\nthe paper"
        )
    else:
        vocabulary = f"vocabularies (source / target) | {config.vocab_size} / {config.decoder_vocab_size} tokens"
        embeddings = (
            "separate source and target vocabularies, as the source has: the encoder's embedding matrix, and\none "
            "for the decoder input and the output projection"
        )
    base_model = f"base_model: {json.dumps(source.hub_id)}\n" if source.hub_id else ""
    name = plain_text(source.name)
    return CARD_TEMPLATE.substitute(
        language=json.dumps(languages, ensure_ascii=False),
        license=json.dumps(source.license or "unknown"),
        base_model=base_model,
        title=f"{name.split('/')[-1]} (vanilla-transformer)",
        source=name,
        kind=source.kind,
        source_lang=source.languages[0] or "?",
        target_lang=source.languages[1] or "?",
        difference=f"{difference:.2g}",
        license_text=source.license or "not recorded",
        transformers_range=SUPPORTED_TRANSFORMERS,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        attention_heads=config.encoder_attention_heads,
        ffn_dim=config.encoder_ffn_dim,
        activation=config.activation_function,
        position_layout=config.position_layout,
        position_frequencies=config.position_frequencies,
        position_offset=config.position_offset,
        lm_head_bias="a learned bias (Marian's final_logits_bias)" if config.lm_head_bias else "none",
        vocabulary=vocabulary,
        embeddings=embeddings,
        parameters=f"{model.num_parameters():,}",
        tokenizer=type(source.tokenizer).__name__,
        decoding=decoding,
        model_id="your-username/model-id",
        example="The house is small.",
    )


def plain_text(text: str, limit: int = 200) -> str:
    """A name from the source (a folder's name, a Hub id) as card text: one line, no HTML or Markdown markup, at
    most `limit` characters; the name is the user's, but whoever reads the card on the Hub is not."""
    line = " ".join(str(text).split())
    line = "".join(f"\\{character}" if character in "\\`*_{}[]<>()#+!|" else character for character in line)
    return line if len(line) <= limit else line[: limit - 1] + "…"
