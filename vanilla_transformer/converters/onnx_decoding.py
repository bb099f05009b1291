"""Decoding over an ONNX export (`onnx_graphs.py`) with ONNX Runtime: greedy and beam search that give generate()'s
tokens.

They serve the export's check (`onnx_check.py`) and `serving/onnx_backend.py`.

The search is the project's: beam search is `model/beam_search.py`'s state and update (`BeamState`, generate()'s beam
search to the bit), fed the log-probabilities of the ONNX decoder; greedy search is generate()'s loop (the logits
processors, then the best token; a finished sentence gets padding). The logits processors are transformers' own,
built for the generation settings a model folder sets (`processors`); any other active setting is refused by name.
With `use_cache` the decoder runs the with-past branch after the first step (each step one new token, the beams'
past reordered as generate() reorders its cache); without it, the no-past branch on the whole prefix at every step.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import torch

from vanilla_transformer.converters.onnx_graphs import DECODER, ENCODER, PAST_KINDS, past_names
from vanilla_transformer.model.beam_search import BeamState

# generate()'s settings that change which tokens come out, and the values with which they change nothing
INACTIVE = {"do_sample": False, "num_return_sequences": 1, "encoder_no_repeat_ngram_size": 0, "diversity_penalty": 0.0}
INACTIVE |= {
    "begin_suppress_tokens": None,
    "forced_bos_token_id": None,
    "sequence_bias": None,
    "exponential_decay_length_penalty": None,
}


@dataclass
class Decoding:
    """What decides the tokens: a folder's generation_config.json as generate() reads it (`from_generation`)."""

    decoder_start: int
    eos: list[int]
    pad: int | None
    num_beams: int = 1
    length_penalty: float = 1.0
    early_stopping: bool | str = False
    forced_eos: int | None = None
    bad_words_ids: list = field(default_factory=list)
    min_length: int = 0
    min_new_tokens: int = 0
    no_repeat_ngram_size: int = 0
    repetition_penalty: float = 1.0
    suppress_tokens: list = field(default_factory=list)

    @classmethod
    def from_generation(cls, generation: dict, config: dict) -> Decoding:
        """The settings of `generation` (generation_config.json) over `config` (config.json); ValueError naming a
        setting this search does not reproduce."""
        unsupported = [name for name, value in INACTIVE.items() if generation.get(name, value) not in (value, [], {})]
        if unsupported:
            raise ValueError(f"the ONNX search does not reproduce generation_config.json's {', '.join(unsupported)}")
        value = lambda name, default: generation[name] if generation.get(name) is not None else default  # noqa: E731
        eos = value("eos_token_id", config.get("eos_token_id"))
        return cls(
            decoder_start=value("decoder_start_token_id", config["decoder_start_token_id"]),
            eos=[] if eos is None else [eos] if isinstance(eos, int) else list(eos),
            pad=value("pad_token_id", config.get("pad_token_id")),
            num_beams=value("num_beams", 1),
            length_penalty=value("length_penalty", 1.0),
            early_stopping=value("early_stopping", False),
            forced_eos=value("forced_eos_token_id", None),
            bad_words_ids=value("bad_words_ids", []),
            min_length=value("min_length", 0),
            min_new_tokens=value("min_new_tokens", 0),
            no_repeat_ngram_size=value("no_repeat_ngram_size", 0),
            repetition_penalty=value("repetition_penalty", 1.0),
            suppress_tokens=value("suppress_tokens", []),
        )


def processors(decoding: Decoding, max_length: int):
    """transformers' logits processors for `decoding`, in generate()'s order (max_length counts the start token)."""
    from transformers.generation import logits_process as lp

    eos, found = decoding.eos or None, lp.LogitsProcessorList()
    if decoding.repetition_penalty != 1.0:
        found.append(lp.RepetitionPenaltyLogitsProcessor(decoding.repetition_penalty))
    if decoding.no_repeat_ngram_size:
        found.append(lp.NoRepeatNGramLogitsProcessor(decoding.no_repeat_ngram_size))
    if decoding.bad_words_ids:
        found.append(lp.NoBadWordsLogitsProcessor(decoding.bad_words_ids, eos))
    if decoding.min_length and eos:
        found.append(lp.MinLengthLogitsProcessor(decoding.min_length, eos))
    if decoding.min_new_tokens and eos:
        found.append(lp.MinNewTokensLengthLogitsProcessor(1, decoding.min_new_tokens, eos))
    if decoding.forced_eos is not None:
        found.append(lp.ForcedEOSTokenLogitsProcessor(max_length, decoding.forced_eos))
    if decoding.suppress_tokens:
        found.append(lp.SuppressTokensLogitsProcessor(decoding.suppress_tokens))
    return found


class OnnxModel:
    """An export's two sessions: `encode` and `step` (the merged decoder, with or without the past)."""

    def __init__(self, folder: str | Path, suffix: str = "", threads: int = 0, optimize: bool = True):
        import onnxruntime

        options = onnxruntime.SessionOptions()
        options.intra_op_num_threads = threads
        if not optimize:
            options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
        onnx_dir = Path(folder) / "onnx"
        self.encoder, self.decoder = (
            onnxruntime.InferenceSession(
                str(onnx_dir / name.replace(".onnx", f"{suffix}.onnx")), options, providers=["CPUExecutionProvider"]
            )
            for name in (ENCODER, DECODER)
        )
        past = [item for item in self.decoder.get_inputs() if item.name.startswith("past_key_values.")]
        self.names = [item.name for item in past]
        self.layers = len(past) // 4
        self.heads, self.head_dim = past[0].shape[1], past[0].shape[3]
        self.float = np.float16 if "float16" in past[0].type else np.float32

    def encode(self, input_ids: np.ndarray, attention_mask: np.ndarray) -> np.ndarray:
        return self.encoder.run(None, {"input_ids": input_ids, "attention_mask": attention_mask})[0]

    def step(self, input_ids, attention_mask, hidden, past: list | None) -> tuple[np.ndarray, list]:
        """The decoder's logits (float32) for `input_ids` and its cache after them; `past` None: the no-past branch."""
        feeds = {"input_ids": input_ids, "encoder_attention_mask": attention_mask, "encoder_hidden_states": hidden}
        empty = np.zeros((input_ids.shape[0], self.heads, 0, self.head_dim), self.float)
        feeds |= dict(zip(self.names, past or [empty] * len(self.names), strict=True))
        feeds["use_cache_branch"] = np.array([past is not None])
        logits, *present = self.decoder.run(None, feeds)
        return logits.astype(np.float32, copy=False), present


def stopping(decoding: Decoding, max_length: int):
    """generate()'s stopping criteria: the length reached, or the last token an end."""
    ends = torch.tensor(decoding.eos or [-1])

    def ended(sequences: torch.Tensor, _scores=None) -> torch.Tensor:
        done = torch.isin(sequences[:, -1], ends)
        return done | (sequences.shape[1] >= max_length)

    return ended


def _next_logits(model: OnnxModel, tokens: torch.Tensor, mask, hidden, past, use_cache: bool):
    if use_cache and past is not None:
        logits, past = model.step(tokens[:, -1:].numpy(), mask, hidden, past)
    else:
        logits, past = model.step(tokens.numpy(), mask, hidden, None)
    return torch.from_numpy(logits[:, -1, :].copy()), (past if use_cache else None)


def greedy(model: OnnxModel, input_ids, attention_mask, decoding: Decoding, max_length: int, use_cache=True):
    """generate()'s greedy search: the sequences (start token first, padding after an end)."""
    hidden = model.encode(input_ids, attention_mask)
    tokens = torch.full((input_ids.shape[0], 1), decoding.decoder_start, dtype=torch.int64)
    process, ended = processors(decoding, max_length), stopping(decoding, max_length)
    unfinished, past = torch.ones(input_ids.shape[0], dtype=torch.bool), None
    pad = decoding.pad if decoding.pad is not None else (decoding.eos or [0])[0]
    while True:
        logits, past = _next_logits(model, tokens, attention_mask, hidden, past, use_cache)
        chosen = process(tokens, logits).argmax(-1)
        if decoding.eos:
            chosen = torch.where(unfinished, chosen, pad)
        tokens = torch.cat([tokens, chosen[:, None]], dim=1)
        unfinished &= ~ended(tokens)
        if not unfinished.any():
            return tokens


def onnx_beam_search(model: OnnxModel, input_ids, attention_mask, decoding: Decoding, max_length: int, use_cache=True):
    """generate()'s beam search (model/beam_search.py's `BeamState`): each sentence's best sequence."""
    beams = decoding.num_beams
    hidden = np.repeat(model.encode(input_ids, attention_mask), beams, axis=0)
    mask = np.repeat(attention_mask, beams, axis=0)
    tokens = torch.full((input_ids.shape[0] * beams, 1), decoding.decoder_start, dtype=torch.int64)
    eos = torch.tensor(decoding.eos) if decoding.eos else None
    settings = SimpleNamespace(
        num_beams=beams,
        max_length=max_length,
        length_penalty=decoding.length_penalty,
        early_stopping=decoding.early_stopping,
        _eos_token_tensor=eos,
        _pad_token_tensor=None if decoding.pad is None else torch.tensor(decoding.pad),
    )
    state, process, past = (
        BeamState(tokens, settings, stopping(decoding, max_length)),
        processors(decoding, max_length),
        None,
    )
    while True:
        logits, past = _next_logits(model, tokens, mask, hidden, past, use_cache)
        log_probs = process(tokens, torch.nn.functional.log_softmax(logits, dim=-1))
        candidates = state.candidates(log_probs)
        order = state.advance(*candidates).numpy()
        if past is not None:  # the encoder's keys and values are the same in each beam of a sentence: kept as they are
            past = [
                value[order] if PAST_KINDS[index % 4].startswith("decoder") else value
                for index, value in enumerate(past)
            ]
        if state.done(candidates[3]):
            return state.sequences()
        tokens = state.running[:, :, : state.length].flatten(0, 1)


def search(model: OnnxModel, input_ids, attention_mask, decoding: Decoding, max_length: int, use_cache=True):
    """The sequences of `decoding`'s search (beam or greedy) for a padded batch (numpy int64 ids and mask)."""
    run = onnx_beam_search if decoding.num_beams > 1 else greedy
    return run(model, input_ids, attention_mask, decoding, max_length, use_cache)


__all__ = ["Decoding", "OnnxModel", "past_names", "processors", "search"]
