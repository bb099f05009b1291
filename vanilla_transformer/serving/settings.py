"""A translation run's settings and choices, each default stated once (the `translate` command's flags read them).
This module imports neither torch nor transformers, so that `vanilla-transformer translate --help` answers at once."""

from dataclasses import dataclass

BATCH_SIZE = 32  # sentences translated together, by default, outside a corpus run (the demo, translate_sentences)
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the model's weights and computation (`translate.DTYPES`)


def folder_max_new_tokens(generation: dict) -> int | None:
    """The output length a folder's generation_config.json sets, as both backends decode it: its max_new_tokens, or
    its max_length less the decoder's start token; None where it sets neither (section 6.1's input + 50)."""
    if generation.get("max_new_tokens") is not None:
        return generation["max_new_tokens"]
    return generation["max_length"] - 1 if generation.get("max_length") is not None else None


@dataclass(frozen=True)
class CorpusSettings:
    """How a corpus is cut and batched. Each default is stated here once (the command's flags read them)."""

    buffer_size: int = 200  # units a chunk: sorted together, recorded together (a kill loses at most one a process)
    max_tokens: int | None = 4000  # source tokens x beams a batch, padding counted (docs/BENCHMARKS.md)
    batch_size: int | None = None  # sentences a batch, at most (None: the token budget alone)
    split_sentences: bool = False
    language: str = "en"  # the source language, for the sentence splitter
    max_source_tokens: int | None = None  # longer sentences are cut into pieces (None: the model's positions)
    log_every: float = 60.0  # seconds between progress lines when stderr is not a terminal
