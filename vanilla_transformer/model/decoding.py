"""`ModelBackend`: translation of batches of source token ids through a model's `generate()`.

It is the one decoding under the translate command, the demo, `translate_sentences` (all through
`serving/batches.translate_texts`, which batches texts by tokens and cuts what is too long) and the training's
evaluation (which batches a prepared corpus itself, the same batches on every process).
"""

import copy
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor

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

# Batches decoded at once on a CPU by a backend given 2 threads or more, each by a worker of its share of the threads.
# A decoder step is some 200 small operations: while one worker spends its Python, transformers' and torch's dispatch
# time on them (about 11 ms a step at the OPUS-MT size, 72 rows), the other's products use the second core. On 2
# cores, at the OPUS-MT size, 2 workers of one thread decode 1.14-1.18x as fast as one worker of two threads (1.17x on
# the translate command; other model sizes 1.07-1.39x, a tiny model 0.96x), the same text (docs/BENCHMARKS.md,
# "Translating a corpus"). A third worker gains nothing there, and each adds a batch's memory and another thread
# taking Python's lock.
CPU_WORKERS = 2


class ModelBackend:
    """Translation with a loaded model through `generate()`: `encode` gives source token ids, `translate` a batch of
    them (one translation each, and the target tokens generated). Decoding follows the model's generation config, with
    `num_beams` and `max_new_tokens` given here on top (None: the config's beam, and the config's length where it sets
    one, else section 6.1's input + 50). The text is decoded as the tokenizer's `batch_decode` does.

    `threads` > 1 on a CPU: `translate_batches` decodes CPU_WORKERS batches at once, each by a worker of threads //
    CPU_WORKERS torch threads (None: one batch at a time, on torch's threads as they are set)."""

    def __init__(
        self,
        model,
        tokenizer,
        num_beams: int | None = None,
        max_new_tokens: int | None = None,
        threads: int | None = None,
        **kwargs,
    ):
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
        self.threads = threads
        self.workers = min(CPU_WORKERS, threads) if threads and model.device.type == "cpu" else 1

    def with_decoding(self, num_beams: int | None = None, max_new_tokens: int | None = None) -> "ModelBackend":
        """A backend on the same model that decodes with this beam or output length (None: this one's)."""
        kwargs = dict(self.generate_kwargs) | ({"num_beams": num_beams} if num_beams is not None else {})
        length = max_new_tokens if max_new_tokens is not None else self.max_new_tokens
        return ModelBackend(self.model, self.tokenizer, max_new_tokens=length, threads=self.threads, **kwargs)

    def encode(self, texts: Sequence[str]) -> list[list[int]]:
        return self.tokenizer(list(texts), verbose=False)["input_ids"]

    def count(self, text: str) -> int:
        return len(self.tokenizer(text, verbose=False)["input_ids"])

    def translate(self, batch: list[list[int]]) -> tuple[list[str], int]:
        """One batch's translations and the target tokens generated."""
        with sdpa_kernel(DECODING_ATTENTION):
            return self.decode(self.generate(self.inputs(batch)))

    def translate_batches(self, batches: Iterable[list[list[int]]]) -> Iterator[tuple[list[str], int]]:
        """`translate` of each batch, in order; with several workers, as many batches decoded at once (CPU_WORKERS),
        and one more waiting for the first worker free. The tokenizer runs in this thread, generate() in the workers.
        """
        if self.workers == 1:
            yield from map(self.translate, batches)
            return
        threads = torch.get_num_threads()
        # torch's thread count is a thread's own: each worker sets its share once, when it starts
        pool = ThreadPoolExecutor(
            self.workers, initializer=torch.set_num_threads, initargs=(self.threads // self.workers,)
        )
        pending = deque()
        try:
            with sdpa_kernel(DECODING_ATTENTION):  # the process's choice, not a thread's: made here for the workers
                for batch in batches:
                    pending.append(pool.submit(self.generate, self.inputs(batch)))
                    if len(pending) > self.workers:
                        yield self.decode(pending.popleft().result())
                while pending:
                    yield self.decode(pending.popleft().result())
        finally:
            pool.shutdown(wait=False, cancel_futures=True)  # on an error: the batches waiting are not started
            torch.set_num_threads(threads)  # the default a new thread takes, which the workers' setting changed

    def inputs(self, batch: list[list[int]]) -> dict:
        """The batch padded, on the model's device: generate()'s inputs."""
        padded = self.tokenizer.pad({"input_ids": batch}, padding=True, return_tensors="pt")
        return {name: padded[name].to(self.model.device) for name in ("input_ids", "attention_mask")}

    def generate(self, inputs: dict) -> torch.Tensor:
        """The output token ids of generate() on `inputs` (the class docstring)."""
        lengths = length_arguments(
            inputs["attention_mask"], self.model.config, self.model.generation_config, self.max_new_tokens
        )
        self.model.eval()
        with torch.inference_mode():  # sdpa's kernels: chosen by the caller (`translate`, `translate_batches`)
            if self.beams == 1 or getattr(self.model.generation_config, "cache_implementation", None) is not None:
                return self.model.generate(**inputs, **lengths, **self.generate_kwargs)
            # the first step and the source's keys and values once a sentence, not once a beam (beam_cache.py)
            encoded = self.model.get_encoder()(**inputs)
            with sentence_beam_cache(self.model) as cache:
                return self.model.generate(
                    **inputs, encoder_outputs=encoded, cache=cache, **lengths, **self.generate_kwargs, **self.search
                )  # generate() then encodes nothing

    def decode(self, output_ids: torch.Tensor) -> tuple[list[str], int]:
        """The texts of generate()'s output ids, and how many of them are not special tokens."""
        is_special = torch.isin(output_ids, torch.tensor(sorted(self.special_ids), device=output_ids.device))
        return self.tokenizer.batch_decode(output_ids, skip_special_tokens=True), int((~is_special).sum())
