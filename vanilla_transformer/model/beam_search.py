"""generate()'s beam search, with each step's best candidates found without three passes over all of them.

At every step of transformers' beam search (generate() with num_beams > 1 and no sampling), each sentence has
beams x vocabulary candidates: a beam's running score plus a token's log-probability. generate() copies the logits,
takes their log-softmax, applies the logits processors, adds every beam's score to each of its vocabulary's
log-probabilities (a new beams x vocabulary tensor) and takes the top 2 x beams of each sentence with `torch.topk` over
all of them. At the OPUS-MT size (58,101 tokens; 16 sentences at beam 4 are 64 rows) the copy, the add and the top-k
are three passes over 15 MB at every step: generate()'s add and top-k take 5.33 ms a step, where `top_candidates`
takes 1.13 ms, and a whole translation runs 1.07x faster (docs/BENCHMARKS.md, "Translating a corpus").

`beam_search` is generate()'s beam search given to generate() as its `custom_generate` callable, the library's public
way to replace the decoding loop: generate() still prepares the inputs, the logits processors and the stopping
criteria. Two things differ, neither what it returns:

- the log-softmax reads the logits where the model left them (no copy);
- `top_candidates` finds the best candidates from each row's maximum per block of 256 tokens (one vectorised pass):
  only the tokens of a row's best blocks can be among its best tokens, and only a row's best tokens among its
  sentence's best candidates, so the beams' scores are added to those only. The values are the same sums as the
  whole add's, and where the best are all different (checked at every step) torch.topk of the whole add can only
  give the same values, tokens and order. Where two are equal (or NaN), which one torch.topk puts first is its own
  affair, so that step is computed as generate() computes it.

Everything else is generate()'s beam search (transformers 5.24): the same operations in the same order, so the result
is generate()'s to the bit (tests/test_beam_search.py compares them with end tokens, length penalties, every early
stopping mode and the processors the commands use).

With the cache of model/beam_cache.py (`SentenceBeamCache`, the translate command's), the first step, where each
sentence's beams are one row num_beams times, runs once a sentence (`first_step_once_a_sentence`): the same products
on a quarter of the rows at beam 4. Its rows get generate()'s bits wherever the matrix library gives a row the same
bits whatever rows it is multiplied beside: so oneDNN and MKL do from 8 rows up on this project's CPUs, not always
on 1 or 2 rows. So that path keeps generate()'s tokens (tests/test_translate_corpus.py), not always its bits.
"""

import torch
from transformers.modeling_outputs import BaseModelOutput

from vanilla_transformer.model.beam_cache import SentenceBeamCache

BLOCK = 256  # tokens per block: one row's 58,101 log-probabilities become 226 maxima


def top_candidates(log_probs: torch.Tensor, beam_scores: torch.Tensor, k: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The k best of each sentence's candidates `log_probs` (sentences x beams rows of the vocabulary) + `beam_scores`
    (sentences x beams), as values and indices into the flattened beams x vocabulary: what torch.topk of the whole sum
    gives (the module docstring)."""
    sentences, beams = beam_scores.shape
    rows, vocab = log_probs.shape
    n = k + 1  # one more than needed: a tie at the k-th place shows
    blocks = vocab // BLOCK
    if blocks >= n and log_probs.stride(-1) == 1:
        maxima = log_probs[:, : blocks * BLOCK].unflatten(1, (blocks, BLOCK)).amax(-1)
        starts = maxima.topk(n, sorted=False).indices * BLOCK
        tokens = (starts[:, :, None] + torch.arange(BLOCK, device=starts.device)).flatten(1)
        tail = torch.arange(blocks * BLOCK, vocab, device=starts.device).expand(rows, -1)
        tokens = torch.cat([tokens, tail], 1)
        row_best, picked = log_probs.gather(1, tokens).topk(n, sorted=False)
        sums = (row_best + beam_scores.reshape(rows, 1)).view(sentences, beams * n)
        flat = tokens.gather(1, picked) + torch.arange(beams, device=starts.device).repeat(sentences)[:, None] * vocab
        values, best = sums.topk(n)
        if not (values.isnan().any() or (values[:, :-1] == values[:, 1:]).any()):
            return values[:, :k], flat.view(sentences, beams * n).gather(1, best[:, :k])
    whole = (log_probs.view(sentences, beams, vocab) + beam_scores[:, :, None]).view(sentences, -1)
    return torch.topk(whole, k)


def _gather(tensor: torch.Tensor, indices: torch.Tensor) -> torch.Tensor:
    """tensor[s, indices[s, j], ...]: the beams `indices` names, per sentence."""
    return tensor.take_along_dim(indices.view(*indices.shape, *[1] * (tensor.dim() - 2)), dim=1)


class BeamState:
    """The search's state for sentences x beams (the running and the finished beams) and its update at a step."""

    def __init__(self, input_ids: torch.Tensor, config, stopping_criteria):
        self.beams, self.prompt_length = config.num_beams, input_ids.shape[1]
        self.sentences, self.length = input_ids.shape[0] // self.beams, self.prompt_length
        self.config, self.stopping_criteria, device = config, stopping_criteria, input_ids.device
        ends = config._eos_token_tensor
        # k = 2 x beams candidates, or (ends + 1) x beams: enough for num_beams running beams if the best all end
        self.keep = max(2, 1 + (ends.shape[0] if ends is not None else 0)) * self.beams
        self.top_beams = torch.arange(self.keep, device=device) < self.beams
        fill = config._pad_token_tensor or ends[0] if ends is not None else -1
        self.running = torch.full(
            (self.sentences, self.beams, config.max_length), fill, dtype=torch.int64, device=device
        )
        self.running[:, :, : self.length] = input_ids.view(self.sentences, self.beams, -1)
        self.finished = self.running.clone()
        self.running_scores = torch.zeros((self.sentences, self.beams), device=device)
        self.running_scores[:, 1:] = -1e9  # the first step: only the first beam's candidates (all beams are equal)
        self.finished_scores = torch.full((self.sentences, self.beams), -1e9, device=device)
        self.is_finished = torch.zeros((self.sentences, self.beams), dtype=torch.bool, device=device)
        self.can_improve = torch.ones((self.sentences, 1), dtype=torch.bool, device=device)
        shape = (self.sentences, self.beams, config.max_length - self.length)
        self.running_origins = torch.full(shape, -1, dtype=torch.int32, device=device)  # each token's beam, per step
        self.finished_origins = self.running_origins.clone()

    def candidates(self, log_probs: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
        """The step's k best continuations: scores, sequences, origins, and whether each meets a stopping criterion."""
        scores, indices = top_candidates(log_probs, self.running_scores, self.keep)
        vocab, step = log_probs.shape[-1], self.length - self.prompt_length
        beam = indices // vocab
        origins, sequences = _gather(self.running_origins, beam), _gather(self.running, beam)
        sequences[:, :, self.length] = indices % vocab
        origins[:, :, step] = beam + torch.arange(self.sentences, device=beam.device).view(-1, 1) * self.beams
        ended = self.stopping_criteria(sequences[:, :, : self.length + 1].flatten(0, 1), None)
        return scores, sequences, origins, ended.view(self.sentences, self.keep)

    def advance(self, scores, sequences, origins, ended) -> torch.Tensor:
        """Keeps the best beams that go on and the best that ended; gives the rows the cache keeps (beam_idx)."""
        running_scores = scores + ended.to(torch.float32) * -1.0e9
        going_on = torch.topk(running_scores, k=self.beams)[1]
        self.running, self.running_scores = _gather(sequences, going_on), _gather(running_scores, going_on)
        self.running_origins = _gather(origins, going_on)
        self._keep_finished(scores, sequences, origins, ended)
        beam_idx = self.running_origins[..., self.length - self.prompt_length].flatten(0, 1)
        self.length += 1
        self._update_can_improve()
        return beam_idx

    def _keep_finished(self, scores, sequences, origins, ended) -> None:
        config = self.config
        just_ended = ended & self.top_beams[None, :]  # only the best num_beams of the k may end
        scores = scores / ((self.length + 1 - self.prompt_length) ** config.length_penalty)
        full = torch.all(self.is_finished, axis=-1, keepdims=True) & (config.early_stopping is True)
        scores += full.to(torch.float32) * -1.0e9
        scores += (~self.can_improve).to(torch.float32) * -1.0e9
        scores += (~just_ended) * -1.0e9
        merged_scores = torch.cat((self.finished_scores, scores), dim=1)
        best = torch.topk(merged_scores, k=self.beams)[1]
        self.finished = _gather(torch.cat((self.finished, sequences), dim=1), best)
        self.finished_scores = _gather(merged_scores, best)
        self.finished_origins = _gather(torch.cat((self.finished_origins, origins), dim=1), best)
        self.is_finished = _gather(torch.cat((self.is_finished, just_ended), dim=1), best)

    def _update_can_improve(self) -> None:
        """Whether a running beam may still beat the worst finished one (generate()'s early stopping heuristic)."""
        config = self.config
        if config.early_stopping == "never" and config.length_penalty > 0.0:
            best_length = config.max_length - self.prompt_length
        else:
            best_length = self.length - self.prompt_length
        best_running = self.running_scores[:, :1] / (best_length**config.length_penalty)
        worst_finished = torch.where(self.is_finished, torch.min(self.finished_scores, dim=1, keepdim=True)[0], -1.0e9)
        self.can_improve = self.can_improve & torch.any(best_running > worst_finished, dim=-1, keepdim=True)

    def done(self, ended: torch.Tensor) -> bool:
        all_full = torch.all(self.is_finished) & (self.config.early_stopping is True)
        return not bool(torch.any(self.can_improve) & ~all_full & ~torch.all(ended))

    def sequences(self) -> torch.Tensor:
        """Each sentence's best finished sequence, as long as the longest of them."""
        generated = (self.finished_origins[:, 0] + 1).bool().sum(dim=1).max()
        return self.finished[:, 0, : self.prompt_length + generated]


def unsupported_settings(config) -> list[str]:
    """The settings of a generation config, with num_beams > 1, that `beam_search` does not reproduce."""
    unsupported = {
        "do_sample": config.do_sample,
        "return_dict_in_generate": config.return_dict_in_generate,
        "low_memory": config.low_memory,
        "num_return_sequences > 1": config.num_return_sequences != 1,
        "prefill_chunk_size": config.prefill_chunk_size is not None,
    }
    return [name for name, on in unsupported.items() if on]


def beam_search(model, input_ids, logits_processor, stopping_criteria, generation_config, synced_gpus=False, **kwargs):
    """generate()'s beam search, as a `custom_generate` callable (the module docstring): generate() calls it with the
    decoder's prompt (sentences x beams rows), its processors, stopping criteria and config, and the model's inputs
    (encoder output and mask repeated for the beams, the cache). Returns the sequences, one a sentence."""
    unsupported = unsupported_settings(generation_config)
    unsupported += ["synced_gpus"] * bool(synced_gpus)
    unsupported += ["decoder_attention_mask"] * (kwargs.get("decoder_attention_mask") is not None)
    if unsupported:
        raise ValueError(f"beam_search does not support {', '.join(unsupported)}: use generate() without it")
    beams = BeamState(input_ids, generation_config, stopping_criteria)
    tokens, outputs = input_ids, first_step_once_a_sentence(model, input_ids, beams.beams, kwargs)
    if outputs is None:
        inputs = model.prepare_inputs_for_generation(input_ids, is_first_iteration=True, **kwargs)
    while True:
        if outputs is None:
            outputs = model(**inputs, return_dict=True)
        if "cache" in outputs:
            kwargs["cache"] = outputs.cache
        logits = outputs.logits[:, -1, :].to(dtype=torch.float32, device=input_ids.device)  # no copy if already so
        outputs = None
        log_probs = torch.nn.functional.log_softmax(logits, dim=-1)
        if log_probs.shape[0] != tokens.shape[0]:  # the first step, once a sentence: the same for all its beams
            log_probs = log_probs.repeat_interleave(beams.beams, dim=0)
        log_probs = logits_processor(tokens, log_probs)
        del logits
        candidates = beams.candidates(log_probs)
        beam_idx = beams.advance(*candidates)
        if kwargs.get("cache") is not None:
            kwargs["cache"].reorder_cache(beam_idx)
        if beams.done(candidates[3]):
            return beams.sequences()
        tokens = beams.running[:, :, : beams.length].flatten(0, 1)
        inputs = model.prepare_inputs_for_generation(tokens, next_sequence_length=1, **kwargs)


def first_step_once_a_sentence(model, input_ids, num_beams: int, kwargs: dict):
    """The model's outputs for the first step on one row a sentence, with the cache then holding each sentence's rows
    for its beams; None where the inputs are not those this is sure for (the first step then runs as generate() runs
    it).

    At the first step a sentence's beams are one row num_beams times: the same prompt, the same source. generate()
    computes that row num_beams times; with an empty `SentenceBeamCache` (model/beam_cache.py) it is computed once.
    generate() gives the prompt, the encoder output and its mask repeated for the beams; one row a sentence of each is
    what generate() gives a batch of those sentences at beam 1."""
    cache, encoder = kwargs.get("cache"), kwargs.get("encoder_outputs")
    if (
        num_beams == 1
        or not isinstance(cache, SentenceBeamCache)
        or cache.get_seq_length()
        or any(cache.is_updated.values())
    ):
        return None
    if not isinstance(encoder, BaseModelOutput) or encoder.hidden_states or encoder.attentions:
        return None
    batch_sized = [name for name, value in kwargs.items() if isinstance(value, torch.Tensor) and value.dim()]
    if set(batch_sized) - {"attention_mask"}:
        return None  # an input this does not know how to take one row a sentence of
    one = slice(None, None, num_beams)
    one_a_sentence = {name: kwargs[name][one] for name in batch_sized}
    one_a_sentence["encoder_outputs"] = BaseModelOutput(last_hidden_state=encoder.last_hidden_state[one])
    inputs = model.prepare_inputs_for_generation(input_ids[one], is_first_iteration=True, **kwargs | one_a_sentence)
    outputs = model(**inputs, return_dict=True)
    outputs.cache.repeat_for_beams(num_beams)
    return outputs
