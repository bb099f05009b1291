"""The translation server's HTTP side (`vanilla-transformer serve`): a Starlette app whose concurrent requests share
batches.

It runs one `batcher.Batcher` a model and device, so that the sentences of concurrent requests share batches; a
request goes to the model's least loaded device.

- LibreTranslate's API: `POST /translate` (JSON or a form: `q` a string or a list, `source`, `target`, `format`
  `text` or `html`, `api_key`) answers `{"translatedText": ...}`; `GET|POST /languages`. Errors are
  `{"error": "..."}`, as LibreTranslate's.
- The native `POST /v1/translate`: `{"texts": [...], "source", "target", "num_beams", "max_new_tokens",
  "split_sentences"}` answers each translation with its source tokens.
- `GET /health` (the process is up), `GET /ready` (the models are loaded, the queues below their bound, not
  draining), `GET /metrics` (Prometheus' text format, `prometheus_client`).

A request's texts are split into sentences (`split_sentences`, the server's default unless the request says) and cut
to the model's positions as `translate` cuts them, and joined back as `translate` joins them: the same line gives the
same translation. Limits: the body's bytes (413), the texts and characters a request (413), the queue's tokens (503
with Retry-After), the time a request may wait (504); a bad field is a 400 naming it. No response carries a
traceback, and the access log (one JSON line a request on stderr) carries neither a key nor a text.

Why Starlette and uvicorn: the ASGI framework and server that FastAPI itself runs on, maintained, small, and enough
here (five routes, no schema generation); uvicorn's graceful shutdown is what the drain on SIGTERM builds on.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from urllib.parse import parse_qs

from prometheus_client import CONTENT_TYPE_LATEST, CollectorRegistry, Counter, Gauge, Histogram, generate_latest
from starlette.applications import Starlette
from starlette.requests import Request
from starlette.responses import JSONResponse, Response
from starlette.routing import Route

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.serving.batcher import Batcher, Options, QueueFull, Stopped
from vanilla_transformer.serving.batches import Pieces
from vanilla_transformer.serving.markup import html_texts
from vanilla_transformer.serving.sentences import split_sentences

DRAINED_BODIES = 8  # a body refused for its size is read and dropped up to this many times the limit, then cut off
CLOSE = {"Connection": "close"}
RETRY = {"Retry-After": "1"}  # a 503's: the queue is full, or the server stops (another replica answers)


@dataclass(frozen=True)
class Limits:
    """What one request may ask of the server; each default stated once (the command's flags read them)."""

    max_body_bytes: int = 1 << 20  # 1 MiB
    max_texts: int = 128  # strings in one request
    max_characters: int = 100_000  # characters in one request, all its strings together
    timeout: float = 60.0  # seconds a request may wait for its translations (504 after)
    max_beams: int = 8  # the largest num_beams a request may ask (pipeline's MAX_BEAMS bounds the command's)
    max_new_tokens: int = 512


@dataclass
class ServedModel:
    """One model folder as the server serves it: its language pair, its backend (which encodes), a batcher for each
    device it runs on."""

    source: str
    target: str
    backend: object  # batches.TranslationBackend
    batchers: list[Batcher]
    split_sentences: bool = False

    @property
    def pair(self) -> str:
        return f"{self.source}-{self.target}"

    def least_loaded(self) -> Batcher:
        return min(self.batchers, key=lambda batcher: batcher.queued_tokens)

    def depth(self) -> int:
        return sum(batcher.depth for batcher in self.batchers)

    def queued_tokens(self) -> int:
        return sum(batcher.queued_tokens for batcher in self.batchers)

    def below_bound(self) -> bool:
        return any(batcher.queued_tokens < batcher.max_queue_tokens for batcher in self.batchers)


class RequestError(VanillaTransformerError):
    """A request the server refuses: its HTTP status and the message the client gets."""

    def __init__(self, status: int, message: str, headers: dict | None = None):
        super().__init__(message)
        self.status, self.headers = status, headers or {}


@dataclass
class ServerState:
    models: list[ServedModel]
    limits: Limits
    keys: Sequence[str] = ()
    draining: bool = False
    in_flight: int = 0
    registry: CollectorRegistry = field(default_factory=CollectorRegistry)

    def __post_init__(self):
        registry = self.registry
        self.requests = Counter("vt_requests", "requests answered", ["endpoint", "status"], registry=registry)
        self.latency = Histogram(
            "vt_request_seconds",
            "request latency",
            ["endpoint"],
            registry=registry,
            buckets=(0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60),
        )
        self.rejections = Counter("vt_rejections", "requests refused, by reason", ["reason"], registry=registry)
        self.batch_sentences = Histogram(
            "vt_batch_sentences",
            "sentences a batch",
            ["model"],
            registry=registry,
            buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256),
        )
        self.batch_tokens = Histogram(
            "vt_batch_tokens",
            "source tokens a batch, padding counted",
            ["model"],
            registry=registry,
            buckets=(16, 64, 256, 1000, 2000, 4000, 8000, 16000),
        )
        self.target_tokens = Counter("vt_target_tokens", "target tokens generated", ["model"], registry=registry)
        self.queue_sentences = Gauge("vt_queue_sentences", "sentences waiting", ["model"], registry=registry)
        self.queue_tokens = Gauge("vt_queue_tokens", "source tokens waiting", ["model"], registry=registry)
        models, self.models = self.models, []
        for model in models:
            self.add(model)

    @property
    def batchers(self) -> list[Batcher]:
        """Every model's queues."""
        return [batcher for model in self.models for batcher in model.batchers]

    def add(self, model: ServedModel) -> None:
        """Serve `model` (its queue's gauges included)."""
        self.models.append(model)
        self.queue_sentences.labels(model.pair).set_function(model.depth)
        self.queue_tokens.labels(model.pair).set_function(model.queued_tokens)

    def on_batch(self, pair: str):
        """The metrics' hook for a model's batcher (`Batcher.on_batch`)."""

        def record(sentences: int, tokens: int, target_tokens: int, seconds: float) -> None:
            self.batch_sentences.labels(pair).observe(sentences)
            self.batch_tokens.labels(pair).observe(tokens)
            self.target_tokens.labels(pair).inc(target_tokens)

        return record

    def ready(self) -> bool:
        return not self.draining and all(model.below_bound() for model in self.models)


# --- reading a request ----------------------------------------------------------------------------------------


async def read_body(request: Request, limit: int) -> bytes:
    """The body, refused (413) past `limit` bytes before more is read. After the refusal uvicorn reads the rest of
    the body to keep the connection, which a client that sends its whole body before reading the answer needs (closed
    early, it gets a reset instead of the 413). That reading is bounded: a body declared over DRAINED_BODIES times the
    limit, or one without a declared length, is refused with the connection closed, so it is never read."""
    message = f"the body is over {limit:,} bytes"
    declared = request.headers.get("content-length")
    if declared is not None and declared.isdigit() and int(declared) > limit:
        raise RequestError(413, message, CLOSE if int(declared) > DRAINED_BODIES * limit else None)
    body = bytearray()
    async for chunk in request.stream():
        body += chunk
        if len(body) > limit:
            raise RequestError(413, message, CLOSE)
    return bytes(body)


def parse_fields(request: Request, body: bytes) -> dict:
    """The request's fields: a JSON object, or a form (application/x-www-form-urlencoded, LibreTranslate's clients';
    a repeated `q` is a list)."""
    kind = request.headers.get("content-type", "").split(";")[0].strip().lower()
    try:
        text = body.decode("utf-8")
    except UnicodeDecodeError as error:
        raise RequestError(400, f"the body is not UTF-8 (byte {error.start})") from None
    if kind == "application/x-www-form-urlencoded":
        form = parse_qs(text, keep_blank_values=True, max_num_fields=10_000)
        return {name: values[0] if len(values) == 1 else values for name, values in form.items()}
    if kind not in ("application/json", ""):
        raise RequestError(415, f"the body is {kind}: send application/json or application/x-www-form-urlencoded")
    try:
        fields = json.loads(text) if text.strip() else {}
    except ValueError as error:
        raise RequestError(400, f"the body is not JSON: {error}") from None
    if not isinstance(fields, dict):
        raise RequestError(400, f"the body is a JSON {type(fields).__name__}, not an object")
    return fields


def texts_field(fields: dict, name: str, limits: Limits) -> tuple[list[str], bool]:
    """The field `name`'s texts (a string or a list of strings) and whether it was one string; 400 or 413."""
    value = fields.get(name)
    if value is None:
        raise RequestError(400, f"{name}: missing (a string or a list of strings)")
    one = isinstance(value, str)
    texts = [value] if one else value
    if not isinstance(texts, list) or not all(isinstance(text, str) for text in texts):
        raise RequestError(400, f"{name}: a string or a list of strings, not {type(value).__name__}")
    if len(texts) > limits.max_texts:
        raise RequestError(413, f"{name}: {len(texts):,} strings, over the {limits.max_texts:,} a request may send")
    characters = sum(map(len, texts))
    if characters > limits.max_characters:
        raise RequestError(413, f"{name}: {characters:,} characters, over the {limits.max_characters:,} a request")
    return texts, one


def whole_request_field(fields: dict, name: str, high: int) -> int | None:
    value = fields.get(name)
    if value is None:
        return None
    if isinstance(value, str) and value.isdigit():  # a form's values are strings
        value = int(value)
    if isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= high:
        raise RequestError(400, f"{name}: an integer from 1 to {high}, got {value!r}")
    return value


def flag_field(fields: dict, name: str, default: bool) -> bool:
    value = fields.get(name, default)
    if isinstance(value, str) and value.lower() in ("true", "false"):
        value = value.lower() == "true"
    if not isinstance(value, bool):
        raise RequestError(400, f"{name}: true or false, got {value!r}")
    return value


def check_key(state: ServerState, request: Request, fields: dict) -> None:
    """With keys, a translation needs one: the `api_key` field or `Authorization: Bearer KEY` (403 otherwise). Each
    key is compared in constant time, and all of them, whichever matches."""
    if not state.keys:
        return
    given = fields.get("api_key")
    authorization = request.headers.get("authorization", "")
    if not given and authorization.lower().startswith("bearer "):
        given = authorization[len("bearer ") :].strip()
    if not isinstance(given, str) or not given:
        raise RequestError(403, "an API key is needed: api_key, or Authorization: Bearer KEY")
    matched = False
    for key in state.keys:
        matched |= hmac.compare_digest(given.encode("utf-8", "surrogatepass"), key.encode("utf-8"))
    if not matched:
        raise RequestError(403, "the API key is not valid")


def model_for(state: ServerState, fields: dict) -> ServedModel:
    """The model of the request's `source` and `target` (`source: auto` or none: the one model, if it is one)."""
    source, target = fields.get("source", "auto"), fields.get("target")
    for name, value in (("source", source), ("target", target)):
        if value is not None and not isinstance(value, str):
            raise RequestError(400, f"{name}: a language code, not {type(value).__name__}")
    served = ", ".join(model.pair for model in state.models)
    candidates = [
        model for model in state.models if source in ("auto", model.source) and target in (None, model.target)
    ]
    if len(candidates) == 1:
        return candidates[0]
    if not candidates:
        raise RequestError(400, f"no model translates {source} to {target}: this server serves {served}")
    raise RequestError(400, f"give source and target: this server serves {served}")


# --- translating ---------------------------------------------------------------------------------------------


def split_and_tokenize(
    model: ServedModel, texts: list[str], split: bool
) -> tuple[list[list[tuple[str, str]]], Pieces]:
    """Each text's sentences (or the text whole), and their pieces as the backend's token ids: `translate`'s."""
    if split:
        units = [split_sentences(text, model.source) if text.strip() else [] for text in texts]
    else:
        units = [[(text, "")] if text.strip() else [] for text in texts]
    flat = [sentence for unit in units for sentence, _ in unit]
    return units, Pieces(model.backend, flat, model.backend.max_source_tokens)


def joined(units: list[list[tuple[str, str]]], translations: list[str]) -> list[str]:
    """Each text's translation, its sentences' joined as they were (`corpus.translate_chunks`')."""
    texts, position = [], 0
    for unit in units:
        parts = translations[position : position + len(unit)]
        texts.append("".join(text + space for text, (_, space) in zip(parts, unit, strict=True)).rstrip())
        position += len(unit)
    return texts


async def translate(
    state: ServerState, request: Request, model: ServedModel, texts: list[str], options: Options, split: bool
) -> tuple[list[str], list[int]]:
    """The texts' translations through the model's queue, and each text's source tokens; 503 when the queue is full
    or the server drains, 504 past the timeout; a client gone takes its sentences out of the queue."""
    units, pieces = await asyncio.to_thread(split_and_tokenize, model, texts, split)
    loop = asyncio.get_running_loop()
    done = loop.create_future()

    def finished(job) -> None:
        loop.call_soon_threadsafe(lambda: done.done() or done.set_result(job))

    try:
        batcher = model.least_loaded()
        job = batcher.submit(pieces.encoded, options, finished)
    except QueueFull as error:
        state.rejections.labels("queue_full").inc()
        raise RequestError(503, f"the server is busy ({error}): try again", RETRY) from None
    except Stopped:
        state.rejections.labels("draining").inc()
        raise RequestError(503, "the server is stopping: try another replica", RETRY) from None
    gone = asyncio.ensure_future(disconnected(request))
    try:
        await asyncio.wait({done, gone}, timeout=state.limits.timeout, return_when=asyncio.FIRST_COMPLETED)
    finally:
        gone.cancel()
    if not done.done():
        batcher.cancel(job)
        reason = "client_gone" if gone.done() and not gone.cancelled() else "timeout"
        state.rejections.labels(reason).inc()
        raise RequestError(504, f"no translation within {state.limits.timeout:g} seconds: try again, or send less")
    if isinstance(job.error, Stopped):  # the drain ran out of time before its turn
        state.rejections.labels("draining").inc()
        raise RequestError(503, "the server stopped before this request's turn: try another replica", RETRY)
    if job.error is not None:
        state.rejections.labels("error").inc()
        raise RequestError(500, f"the model failed on this request ({type(job.error).__name__})")
    per_piece = list(job.translations)
    translations = pieces.join(per_piece)
    tokens = [0] * len(texts)
    owners = [index for index, unit in enumerate(units) for _ in unit]
    for owner, ids in zip((owners[piece] for piece in pieces.owners), pieces.encoded, strict=True):
        tokens[owner] += len(ids)
    return joined(units, translations), tokens


async def disconnected(request: Request) -> None:
    """Return when the client goes (its body already read, the next message is the disconnect)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


def translation_request(
    state: ServerState, request: Request, fields: dict, name: str
) -> tuple[ServedModel, list[str], bool]:
    """What a translation endpoint checks first: the key, that the server is not draining, the model of the request,
    and the texts of the field `name` (and whether it was one string)."""
    check_key(state, request, fields)
    refuse_while_draining(state)
    model = model_for(state, fields)
    texts, one = texts_field(fields, name, state.limits)
    return model, texts, one


def log_texts(log: dict, model: ServedModel, texts: list[str]) -> None:
    """The access log line's account of a translation request: its model and how much it sent (no text)."""
    log |= {"model": model.pair, "texts": len(texts), "characters": sum(map(len, texts))}


# --- the endpoints -------------------------------------------------------------------------------------------


def endpoint(name: str, needs_body: bool = True):
    """A handler wrapped with what every endpoint does: the in-flight count, the limits' and errors' answers, the
    metrics, and the access log line (no text, no key)."""

    def wrap(handler):
        async def run(request: Request) -> Response:
            state: ServerState = request.app.state.server
            started, status, log = time.monotonic(), 500, {}
            state.in_flight += 1
            try:
                fields = {}
                if needs_body and request.method == "POST":
                    fields = parse_fields(request, await read_body(request, state.limits.max_body_bytes))
                response = await handler(request, state, fields, log)
            except RequestError as error:
                if error.status == 413:
                    state.rejections.labels("too_large").inc()
                response = JSONResponse({"error": str(error)}, error.status, headers=error.headers)
            except Exception as error:  # noqa: BLE001 - a client never gets a traceback; the server keeps serving
                log["failure"] = type(error).__name__
                response = JSONResponse({"error": "the server failed on this request"}, 500)
            finally:
                state.in_flight -= 1
            status = response.status_code
            seconds = time.monotonic() - started
            state.requests.labels(name, str(status)).inc()
            state.latency.labels(name).observe(seconds)
            line = {"time": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()), "method": request.method}
            line |= {"path": request.url.path, "status": status, "ms": round(seconds * 1000, 1), **log}
            print(json.dumps(line), file=sys.stderr, flush=True)
            return response

        return run

    return wrap


@endpoint("translate")
async def libretranslate(request: Request, state: ServerState, fields: dict, log: dict) -> Response:
    model, texts, one = translation_request(state, request, fields, "q")
    kind = fields.get("format", "text")
    if kind not in ("text", "html"):
        raise RequestError(400, f"format: text or html, got {kind!r}")
    log_texts(log, model, texts)
    if kind == "html":
        try:
            fragments = [html_texts(text) for text in texts]
        except ValueError as error:
            raise RequestError(400, f"q: {error}") from None
        inner = [piece for pieces, _ in fragments for piece in pieces]
        translated, _ = await translate(state, request, model, inner, Options(), model.split_sentences)
        results, position = [], 0
        for pieces, rebuild in fragments:
            results.append(rebuild(translated[position : position + len(pieces)]))
            position += len(pieces)
    else:
        results, _ = await translate(state, request, model, texts, Options(), model.split_sentences)
    return JSONResponse({"translatedText": results[0] if one else results})


@endpoint("v1_translate")
async def native(request: Request, state: ServerState, fields: dict, log: dict) -> Response:
    model, texts, _ = translation_request(state, request, fields, "texts")
    options = Options(
        whole_request_field(fields, "num_beams", state.limits.max_beams),
        whole_request_field(fields, "max_new_tokens", state.limits.max_new_tokens),
    )
    split = flag_field(fields, "split_sentences", model.split_sentences)
    log_texts(log, model, texts)
    translations, tokens = await translate(state, request, model, texts, options, split)
    answers = [{"text": text, "source_tokens": count} for text, count in zip(translations, tokens, strict=True)]
    return JSONResponse({"model": model.pair, "translations": answers})


@endpoint("languages")
async def languages(request: Request, state: ServerState, fields: dict, log: dict) -> Response:
    from vanilla_transformer.serving.demo import language_name

    targets: dict[str, list[str]] = {}
    for model in state.models:
        targets.setdefault(model.source, []).append(model.target)
    return JSONResponse(
        [{"code": code, "name": language_name(code), "targets": sorted(set(to))} for code, to in targets.items()]
    )


@endpoint("health", needs_body=False)
async def health(request: Request, state: ServerState, fields: dict, log: dict) -> Response:
    return JSONResponse({"status": "ok"})


@endpoint("ready", needs_body=False)
async def ready(request: Request, state: ServerState, fields: dict, log: dict) -> Response:
    if state.ready():
        return JSONResponse({"status": "ready", "models": [model.pair for model in state.models]})
    return JSONResponse({"status": "draining" if state.draining else "busy"}, 503)


async def metrics(request: Request) -> Response:
    return Response(generate_latest(request.app.state.server.registry), media_type=CONTENT_TYPE_LATEST)


def refuse_while_draining(state: ServerState) -> None:
    if state.draining:
        state.rejections.labels("draining").inc()
        raise RequestError(503, "the server is stopping: try another replica", RETRY)


def create_app(state: ServerState) -> Starlette:
    app = Starlette(
        routes=[
            Route("/translate", libretranslate, methods=["POST"]),
            Route("/languages", languages, methods=["GET", "POST"]),
            Route("/v1/translate", native, methods=["POST"]),
            Route("/health", health, methods=["GET"]),
            Route("/ready", ready, methods=["GET"]),
            Route("/metrics", metrics, methods=["GET"]),
        ]
    )
    app.state.server = state
    return app
