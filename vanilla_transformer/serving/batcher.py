"""The server's queue of sentences, one a model, decoded by worker threads in token-budget batches across requests.

Each request's translations come back in its order; a batch is cut as `translate` cuts a chunk.

A batch is the oldest sentence waiting and, of those with the same decoding options, the closest to its length, while
`n * longest * beams <= max_tokens` (`batches.token_batches`' budget, padding counted) and, where given,
`n <= max_sentences`. A free worker forms one as soon as it is full or its oldest sentence has waited `max_wait`
seconds, and at once when the last batch held one request: a batch waits for company only while requests arrive
together, so a lone client is never held back, and a lone request on a server that has not decoded yet waits no
longer than `max_wait`. The oldest is in every batch, which keeps every wait bounded. `across_requests=False` batches each request alone (what LibreTranslate and the FastAPI
wrappers do; the benchmark's baseline).

The queue is bounded in tokens: `submit` refuses (`QueueFull`) past `max_queue_tokens`, so memory stays bounded
however many requests arrive. A job cancelled (its client gone, its time up) takes its sentences not yet in a batch
out of the queue. `close` refuses new jobs (`Stopped`), lets the workers finish what was accepted, and `join` waits;
`abandon` also fails the jobs still waiting (`Stopped`), for a drain out of time.
This module imports neither torch nor transformers: a backend (`batches.TranslationBackend`) decodes.
"""

from __future__ import annotations

import threading
import time
from collections import Counter, deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field

from vanilla_transformer.mechanics.errors import VanillaTransformerError


class QueueFull(VanillaTransformerError):
    """The queue holds `max_queue_tokens` already: try again later."""


class Stopped(VanillaTransformerError):
    """The batcher is closing (the server drains): no new job is taken."""


@dataclass(frozen=True)
class Options:
    """A request's decoding options (None: the backend's own, the folder's generation_config.json)."""

    num_beams: int | None = None
    max_new_tokens: int | None = None


class Job:
    """One request's sentences (token ids) and, as batches finish, their translations. `on_done(job)` is called once,
    from a worker thread, when every translation is in, or at the first error (`error`)."""

    def __init__(self, count: int, on_done: Callable[[Job], None]):
        self.translations: list[str | None] = [None] * count
        self.remaining, self.target_tokens, self.error, self.cancelled = count, 0, None, False
        self.on_done, self.lock = on_done, threading.Lock()
        self.waiting: dict[int, _Item] = {}  # its sentences in the queue, by index (the batcher's, under its lock)

    def add(self, index: int, translation: str) -> None:
        with self.lock:
            if self.translations[index] is None:
                self.translations[index], self.remaining = translation, self.remaining - 1
            done = self.remaining == 0 and self.error is None
        if done:
            self.on_done(self)

    def fail(self, error: BaseException) -> None:
        with self.lock:
            first, self.error = self.error is None, self.error or error
        if first:
            self.on_done(self)


@dataclass
class _Item:
    job: Job
    index: int
    ids: list[int]
    options: Options
    arrived: float = field(default_factory=time.monotonic)


class Batcher:
    """One model's queue and its `workers` threads (see the module docstring). `backend_for(options)` gives the
    backend that decodes a batch with `options` (the model's own for `Options()`); `beams(options)` its beam width.
    `on_worker_start` runs first in each worker thread (torch's thread count is a thread's own); `on_batch(sentences,
    tokens, target_tokens, seconds)` after each batch, for the metrics."""

    def __init__(
        self,
        backend_for: Callable[[Options], object],
        max_tokens: int,
        max_wait: float,
        max_queue_tokens: int,
        workers: int = 1,
        on_worker_start: Callable[[], None] | None = None,
        on_batch: Callable[[int, int, int, float], None] | None = None,
        across_requests: bool = True,
        max_sentences: int | None = None,
    ):
        self.backend_for, self.max_tokens, self.max_wait = backend_for, max_tokens, max_wait
        self.max_sentences = max_sentences
        self.across_requests = across_requests
        self.max_queue_tokens, self.on_batch = max_queue_tokens, on_batch
        self.queue: deque[_Item] = deque()  # in arrival order; a cancelled job's sentences leave it lazily
        self.queued_tokens, self.waiting, self.busy, self.closing = 0, 0, 0, False  # tokens, sentences waiting
        self.lengths: dict[object, Counter[int]] = {}  # the lengths waiting, by what may share a batch (`share_key`)
        self.company = across_requests  # whether the last batch held several requests: then the next waits for more
        self.condition = threading.Condition()

        def work() -> None:
            if on_worker_start is not None:
                on_worker_start()
            self.work()

        self.threads = [threading.Thread(target=work, name=f"batcher-{n}", daemon=True) for n in range(workers)]
        for thread in self.threads:
            thread.start()

    def submit(self, encoded: Sequence[list[int]], options: Options, on_done: Callable[[Job], None]) -> Job:
        """Queue one request's sentences; QueueFull past `max_queue_tokens`, Stopped once closing. A job with no
        sentences is done at once."""
        job = Job(len(encoded), on_done)
        tokens = sum(map(len, encoded))
        with self.condition:
            if self.closing:
                raise Stopped("the server is stopping: no new request is taken")
            if self.waiting and self.queued_tokens + tokens > self.max_queue_tokens:
                raise QueueFull(f"the queue holds {self.queued_tokens:,} tokens, its bound {self.max_queue_tokens:,}")
            now = time.monotonic()
            items = [_Item(job, index, list(ids), options, now) for index, ids in enumerate(encoded)]
            self.queue.extend(items)
            self.tally(items, 1)
            self.condition.notify_all()
        if not encoded:
            on_done(job)
        return job

    def cancel(self, job: Job) -> None:
        """Take the job's sentences not yet in a batch out of the queue."""
        with self.condition:
            job.cancelled = True
            self.tally(list(job.waiting.values()), -1)

    @property
    def depth(self) -> int:
        """The sentences waiting."""
        return self.waiting

    def close(self) -> None:
        """Take no new job; the workers finish the queue, then stop."""
        with self.condition:
            self.closing = True
            self.condition.notify_all()

    def abandon(self) -> None:
        """Close, and fail (`Stopped`) each job that still has sentences waiting: what a drain could not finish in
        its time is refused, not cut off. The batches being decoded finish."""
        with self.condition:
            self.closing = True
            jobs = list(dict.fromkeys(item.job for item in self.queue if not item.job.cancelled))
            self.tally([item for job in jobs for item in job.waiting.values()], -1)
            self.queue.clear()
            self.condition.notify_all()
        for job in jobs:
            job.fail(Stopped("the server stopped before this request's turn"))

    def join(self, timeout: float | None = None) -> bool:
        """Wait for the workers to stop (after `close`); whether they did within `timeout`."""
        deadline = None if timeout is None else time.monotonic() + timeout
        for thread in self.threads:
            thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))
        return not any(thread.is_alive() for thread in self.threads)

    def idle(self) -> bool:
        """Nothing queued and nothing being decoded."""
        with self.condition:
            return not self.waiting and not self.busy

    def work(self) -> None:
        while (items := self.next_batch()) is not None:
            options = items[0].options
            started = time.monotonic()
            try:
                backend = self.backend_for(options)
                texts, target_tokens = backend.translate([item.ids for item in items])
            except Exception as error:  # noqa: BLE001 - the requests get the error; the server keeps serving
                for item in items:
                    item.job.fail(error)
            else:
                for item, text in zip(items, texts, strict=True):
                    item.job.add(item.index, text)
                if self.on_batch is not None:
                    tokens = len(items) * max(len(item.ids) for item in items)
                    self.on_batch(len(items), tokens, target_tokens, time.monotonic() - started)
            finally:
                with self.condition:
                    self.busy -= 1
                    self.condition.notify_all()

    def next_batch(self) -> list[_Item] | None:
        """Wait for a batch to form (full, its oldest sentence `max_wait` old, or at once after a batch of one
        request) and take it; None once closing and the queue is empty."""
        with self.condition:
            while True:
                while self.queue and self.queue[0].job.cancelled:
                    self.queue.popleft()
                if self.queue:
                    oldest = self.queue[0]
                    wait = oldest.arrived + self.max_wait - time.monotonic()
                    if wait <= 0 or self.closing or not self.company or self.fills(oldest):
                        break
                    self.condition.wait(wait)
                elif self.closing:
                    return None
                else:
                    self.condition.wait()
            items = self.take(oldest)
            self.company = self.across_requests and len({id(item.job) for item in items}) > 1
            self.busy += 1
            return items

    def fits(self, count: int, longest: int, options: Options) -> bool:
        too_many = self.max_sentences is not None and count > self.max_sentences
        return not too_many and count * longest * self.beams(options) <= self.max_tokens

    def beams(self, options: Options) -> int:
        return options.num_beams or self.backend_for(Options()).beams

    def share_key(self, item: _Item) -> object:
        """What the sentences that may share a batch have in common: the options (and the request, without
        `across_requests`: one request at a time, as LibreTranslate serves)."""
        return item.options if self.across_requests else (item.options, id(item.job))

    def tally(self, items: list[_Item], sign: int) -> None:
        """Count `items` into the queue's tallies (sign 1) or out of them (-1): tokens, sentences, and lengths by
        `share_key`, so that `fills` reads them instead of the queue (a deep queue made each submit cost its depth)."""
        for item in items:
            key, length = self.share_key(item), len(item.ids)
            lengths = self.lengths.setdefault(key, Counter())
            lengths[length] += sign
            if not lengths[length]:
                del lengths[length]
                if not lengths:
                    del self.lengths[key]
            if sign > 0:
                item.job.waiting[item.index] = item
            else:
                item.job.waiting.pop(item.index, None)
            self.queued_tokens += sign * length
            self.waiting += sign

    def fills(self, oldest: _Item) -> bool:
        """Whether the sentences waiting that may share `oldest`'s batch fill it: with one more as long as their
        longest, they would not fit (then the batch formed from them is full)."""
        lengths = self.lengths[self.share_key(oldest)]
        return not self.fits(sum(lengths.values()) + 1, max(lengths), oldest.options)

    def take(self, oldest: _Item) -> list[_Item]:
        """The batch, out of the queue: `oldest`, then the sentences that may share its batch, closest to its length
        first (arrival order among equals), while they fit. Lengths alike pad little, so more sentences fit the budget:
        on 2,000 Multi30k sentences waiting together, batches taken in arrival order take 1.5x the time of batches of
        like lengths (docs/BENCHMARKS.md, "Serving"). The oldest is in every batch, so every wait stays bounded."""
        options, size, key = oldest.options, len(oldest.ids), self.share_key(oldest)
        others = [
            item
            for item in self.queue
            if item is not oldest and not item.job.cancelled and self.share_key(item) == key
        ]
        taken, longest = [oldest], size
        for item in sorted(others, key=lambda item: abs(len(item.ids) - size)):
            if self.fits(len(taken) + 1, max(longest, len(item.ids)), options):
                taken.append(item)
                longest = max(longest, len(item.ids))
        chosen = {id(item) for item in taken}
        self.queue = deque(item for item in self.queue if id(item) not in chosen and not item.job.cancelled)
        self.tally(taken, -1)
        return taken
