"""The core of every conversion, whatever the source's format: the source as read, our model built from it, and the
check of the two.

What a reader makes of a source is a `Source`: our config's fields, the weights under fairseq's layer names, one
embedding matrix, the tokenizer, the source model as transformers runs it. `build_model` builds our model from it with
every weight placed, and `check_against_reference` checks the two on a padded probe batch. A source the paper's model
cannot hold exactly is refused with a `ConversionError` naming the field (or file) and its value.
"""

from dataclasses import dataclass, field
from typing import Any

import torch
from torch import nn

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.mechanics.errors import VanillaTransformerError

MARIAN_TOKENIZER_FILES = ("source.spm", "target.spm", "vocab.json", "target_vocab.json")
FSMT_TOKENIZER_FILES = ("vocab-src.json", "vocab-tgt.json", "merges.txt")
SOURCE_TOKENIZER_FILES = (
    "tokenizer_config.json",
    "special_tokens_map.json",
    *MARIAN_TOKENIZER_FILES,
    *FSMT_TOKENIZER_FILES,
)
LOGITS_TOLERANCE = 1e-4  # the check of the converted model against the source, relative to the logits' scale
POSITIONS_TOLERANCE = 1e-3  # a stored sinusoid table: float32 tables drift ~1e-7 per position from exact ones


class ConversionError(VanillaTransformerError, ValueError):
    """The source cannot be converted exactly, or the output folder cannot be written; the message says why: every
    problem found, one a line (`problems`)."""

    def __init__(self, *problems: str):
        self.problems = list(problems)
        heading = (
            f"the source cannot be converted exactly, for {len(problems)} reasons:\n" if len(problems) > 1 else ""
        )
        super().__init__(heading + "\n".join(problems))


class Problems:
    """The problems of a source collected, to be refused all at once: on leaving the block, one ConversionError names
    every problem `add`ed, one a line; a ConversionError raised in the block (a problem that makes further checks
    meaningless, such as a file that cannot be read) comes out with the problems collected before it.

        with Problems() as problems:
            refuse(config, CONFIG_REFUSALS, where, problems)
            check_sizes(sizes, where, problems)
    """

    def __init__(self) -> None:
        self.found: list[str] = []

    def add(self, problem: str) -> None:
        self.found.append(problem)

    def __enter__(self) -> "Problems":
        return self

    def __exit__(self, kind, error, traceback) -> None:
        if isinstance(error, ConversionError) and self.found:
            raise ConversionError(*self.found, *error.problems) from None
        if error is None and self.found:
            raise ConversionError(*self.found)


@dataclass
class Source:
    """A model read for conversion: our config's fields, its weights under fairseq's layer names
    ("encoder.layers.0.self_attn.q_proj.weight", ...), its one embedding matrix (with separate vocabularies, the
    encoder's, and `decoder_embedding` the decoder's input and output projection), its tokenizer and decoding, what
    the card says about it, and the source model as transformers runs it (what the conversion is checked against)."""

    kind: str
    name: str
    fields: dict[str, Any]
    layers: dict[str, torch.Tensor]
    embedding: torch.Tensor
    tokenizer: Any
    reference: nn.Module
    logits_bias: torch.Tensor | None = None
    decoder_embedding: torch.Tensor | None = None
    decoding: dict[str, Any] = field(default_factory=dict)
    languages: tuple[str | None, str | None] = (None, None)
    license: str | None = None
    hub_id: str | None = None
    dtype: torch.dtype = torch.float32  # the source's weights' (the reference and our model are checked in float32)


def refuse(settings: dict[str, Any], refusals: dict[str, tuple[Any, str]], where: str, problems: Problems) -> None:
    """A problem for every field of `settings` whose value is not the one `refusals` allows."""
    for name, (allowed, meaning) in refusals.items():
        if name in settings and settings[name] != allowed:
            problems.add(
                f"{where}: {name} is {settings[name]!r}, which means {meaning}; the paper's model (and this "
                f"converter) needs {allowed!r}"
            )


def one_embedding(
    embeddings: dict[str, torch.Tensor],
    why: str,
    problems: Problems,
    roles: str = "the encoder input, the decoder input and the output projection",
) -> torch.Tensor:
    """The one matrix all of `embeddings` (`roles`: encoder input, decoder input, output projection) hold; a problem
    naming two that differ, with `why` (the source's field that allows it)."""
    names = sorted(embeddings)
    first = embeddings[names[0]]
    for name in names[1:]:
        if embeddings[name].shape != first.shape or not torch.equal(embeddings[name], first):
            problems.add(f"the source's {names[0]} and {name} differ ({why}): the model has one matrix for {roles}")
            break
    return first.detach()


def check_position_tables(
    tables: dict[str, torch.Tensor], d_model: int, layout: str, frequencies: str, offset: int, problems: Problems
) -> None:
    """A problem for a source whose position tables are not the sinusoids our config describes (learned ones, another
    layout): rows `offset` and up must be the table of positions `offset`, `offset` + 1, ... (FSMT's first rows are
    unused: fairseq numbers positions from padding id + 1)."""
    from modeling_vanilla_transformer import sinusoidal_position_table

    for name, table in tables.items():
        rows = table.shape[0] - offset
        if table.dim() != 2 or table.shape[1] != d_model or rows < 1:
            problems.add(f"the source's {name} has shape {list(table.shape)}, not a position table")
            continue
        expected = sinusoidal_position_table(rows, d_model, layout, frequencies, offset)
        difference = (table[offset:].float() - expected).abs().max().item()
        if difference > POSITIONS_TOLERANCE:
            problems.add(
                f"the source's {name} is not the {layout} sinusoid table with {frequencies} frequencies from position "
                f"{offset} (it differs by {difference:.3g}): learned or other positions, which this model cannot hold"
            )


def is_embedding(key: str) -> bool:
    """Whether our state dict's `key` is the shared embedding matrix (or one of its tied names)."""
    return key.endswith(("embed_tokens.weight", "shared.weight")) or key == "lm_head.weight"


def source_embedding(key: str, source: Source) -> torch.Tensor:
    """The source's matrix for our embedding `key`: the one matrix, or with separate vocabularies the decoder's for
    the decoder's input and the output projection."""
    if source.decoder_embedding is not None and (key == "lm_head.weight" or key.startswith("model.decoder.")):
        return source.decoder_embedding
    return source.embedding


def fairseq_name(key: str) -> str:
    """Our state dict's layer `key` under fairseq's (FSMT's, Marian's) name: "model." and "feed_forward." dropped."""
    return key.removeprefix("model.").replace(".feed_forward.", ".")


def weights_problem(left_over: list[str], missing: list[str]) -> str:
    parts = []
    if left_over:
        parts.append(f"the source has weights the paper's model has no place for: {', '.join(sorted(left_over)[:6])}")
    if missing:
        parts.append(f"the source lacks weights the model needs: {', '.join(sorted(missing)[:6])}")
    return "; ".join(parts) + " (an architecture other than the paper's)"


def build_model(source: Source) -> VanillaTransformerForConditionalGeneration:
    """Our model with the source's weights: every key of our state dict (read at run time) filled from the source,
    every source weight used; one ConversionError naming every weight left over, missing, or of another shape."""
    try:
        config = VanillaTransformerConfig(**source.fields)
    except Exception as error:  # noqa: BLE001 - ValueError, TypeError, huggingface_hub's field validation errors
        reason = " ".join(str(error).split())[:400]
        raise ConversionError(f"the source's settings make no valid config: {reason}") from None
    model = VanillaTransformerForConditionalGeneration(config)
    state, missing, used = {}, [], set()
    with Problems() as problems:
        for key, tensor in model.state_dict().items():
            if is_embedding(key):
                value = source_embedding(key, source)
            elif key == "lm_head.bias":
                value = source.logits_bias
            else:
                value = source.layers.get(fairseq_name(key))
                used.add(fairseq_name(key))
            if value is None:
                missing.append(fairseq_name(key))
            elif value.shape != tensor.shape:
                problems.add(
                    f"the source's {fairseq_name(key)} has shape {list(value.shape)}, ours {list(tensor.shape)}"
                )
            else:
                state[key] = value.to(tensor.dtype)
        if missing or set(source.layers) - used:
            problems.add(weights_problem(sorted(set(source.layers) - used), missing))
    result = model.load_state_dict(state, strict=False)
    if result.missing_keys or result.unexpected_keys:
        raise ConversionError(f"the model did not take the weights: {result}")
    check_ties(model, source)
    return model.eval()


def check_ties(model: nn.Module, source: Source) -> None:
    """Every name of an embedding matrix must hold the source's matrix (tied or copied): the paper's one matrix, or
    with separate vocabularies the encoder's and the decoder's (its input and output projection)."""
    state = model.state_dict()
    names = [key for key in state if is_embedding(key)]
    if differing := [key for key in names if not torch.equal(state[key], source_embedding(key, source))]:
        raise ConversionError(f"the converted model's {differing[0]} is not the source's: the embeddings came untied")


def probe_batch(config, generator_seed: int = 0) -> dict[str, torch.Tensor]:
    """Two sources (the second padded) and decoder inputs of ordinary tokens, for the check against the source."""
    special = {config.pad_token_id, config.eos_token_id, config.bos_token_id, config.decoder_start_token_id, 3}
    generator = torch.Generator().manual_seed(generator_seed)

    def pick(vocab_size: int, *shape: int) -> torch.Tensor:
        ordinary = torch.tensor([index for index in range(vocab_size) if index not in special][:4096])
        return ordinary[torch.randint(len(ordinary), shape, generator=generator)]

    input_ids, attention_mask = pick(config.vocab_size, 2, 9), torch.ones(2, 9, dtype=torch.long)
    input_ids[:, -1] = config.eos_token_id
    input_ids[1, 5], input_ids[1, 6:], attention_mask[1, 6:] = config.eos_token_id, config.pad_token_id, 0
    decoder_input_ids = torch.cat(
        [torch.full((2, 1), config.decoder_start_token_id), pick(config.decoder_vocab_size, 2, 6)], dim=1
    )
    return {"input_ids": input_ids, "attention_mask": attention_mask, "decoder_input_ids": decoder_input_ids}


def check_against_reference(model: nn.Module, source: Source) -> float:
    """The largest difference between the converted model's logits and the source model's on a padded probe batch;
    ConversionError when over LOGITS_TOLERANCE (relative to the logits' scale). The decoder inputs have no padding."""
    batch = probe_batch(model.config)
    with torch.inference_mode():
        ours = model(**batch).logits
        # FSMT builds its causal mask only without the cache: with use_cache it expects one token at a time
        theirs = source.reference(**batch, use_cache=False).logits
    if ours.shape != theirs.shape:
        raise ConversionError(
            f"the converted model gives logits of shape {list(ours.shape)}, the source {list(theirs.shape)}"
        )
    difference = (ours - theirs).abs().max().item()
    if not difference <= LOGITS_TOLERANCE * max(1.0, theirs.abs().max().item()):
        raise ConversionError(
            f"the converted model's logits differ from the source's by {difference:.3g} on a probe batch: the source "
            "computes something the paper's model does not"
        )
    return difference
