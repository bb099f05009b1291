"""vanilla-transformer serve MODEL_DIR [MODEL_DIR ...]: translate over HTTP (LibreTranslate's API and a native one).

The sentences of concurrent requests are batched together: one queue a model, `translate`'s token budget.

  vanilla-transformer serve runs/base/model --port 5000
  curl -s localhost:5000/translate -H 'Content-Type: application/json' \\
      -d '{"q": "A dog runs.", "source": "en", "target": "de"}'

Each folder serves its language pair: its tokenizer_config.json's source_lang and target_lang, else its model card's
`language:` list; `--languages en-de fr-en` names them, one a folder, where a folder does not. A request's sentences
wait at most --max_wait_ms for a batch to fill. The server listens on 127.0.0.1 unless --host says otherwise; with
--api_keys FILE (one key a line) every translation needs a key. SIGTERM drains: /ready and new requests answer 503 at
once, the requests accepted are answered (within --drain_seconds), then the process exits 0. With --devices, each
model runs on each device, a queue each, and a request goes to the least loaded. The endpoints, limits and metrics:
docs/SERVING.md.
"""

import argparse
import os
import signal
import socket
import sys
import threading
import time
from collections.abc import Sequence
from pathlib import Path

from vanilla_transformer.commands.flags import (
    add_deprecated_alias,
    add_settings_flags,
    at_least,
    command_parser,
    positive_float,
)
from vanilla_transformer.commands.runner import UsageError, command, need
from vanilla_transformer.commands.translate import (
    add_backend_flags,
    check_backend_flags,
    make_backend,
    resolve_device,
    the_export,
)
from vanilla_transformer.serving.settings import DEFAULT_BATCH_TOKENS, CorpusSettings, DecodingSettings

MAX_WAIT_MS = 5.0  # a lone request's longest wait for others to share its batch
MAX_QUEUE_TOKENS = 200_000  # source tokens waiting, a model: about 10,000 Multi30k sentences, a few MB
DRAIN_SECONDS = 30.0  # Kubernetes' default grace period
SERVED_BUDGET = {  # a batch of the server's: the token budget bounds it with --batch_size too, unlike translate's
    "default": DEFAULT_BATCH_TOKENS,
    "help": f"source tokens x beams a batch (default: {DEFAULT_BATCH_TOKENS}, with --batch_size too)",
}


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = serve_parser()
    args = parser.parse_args(argv)
    if args.devices and args.device:
        parser.error("give --device or --devices, not both")
    if args.languages and len(args.languages) != len(args.model_dirs):
        parser.error(f"--languages names {len(args.languages)} pairs for {len(args.model_dirs)} folders: one each")
    for flag in ("ctranslate2_dir", "onnx_dir"):
        if getattr(args, flag) and len(args.model_dirs) > 1:
            parser.error(f"--{flag} is one folder's export: serve one MODEL_DIR with it")
    check_backend_flags(parser, args)
    for pair in args.languages or ():
        if pair.count("-") != 1 or not all(pair.split("-")):
            parser.error(f"--languages {pair}: a pair is SRC-TGT, as en-de")
    return args


def serve_parser() -> argparse.ArgumentParser:
    from vanilla_transformer.serving.server import Limits

    limits = Limits()
    parser = command_parser("vanilla-transformer serve", __doc__)
    parser.add_argument("model_dirs", nargs="+", metavar="MODEL_DIR", help="saved model folders, one a language pair")
    parser.add_argument("--languages", nargs="+", metavar="SRC-TGT", help="each folder's pair, in their order")
    parser.add_argument("--host", default="127.0.0.1", help="the address to listen on (default: this machine only)")
    parser.add_argument("--port", type=at_least(0, 65535), default=5000, help="0: a free port, printed")
    parser.add_argument("--api_keys", help="a file of keys, one a line: every translation then needs one")
    group = parser.add_argument_group("batching and limits")
    add_settings_flags(
        group,
        CorpusSettings,
        ["max_batch_tokens", "batch_size"],
        max_batch_tokens=SERVED_BUDGET,
        batch_size={"help": "sentences a batch, at most (bounds a batch's memory when many short sentences wait)"},
    )
    add_deprecated_alias(group, "--max_tokens", "--max_batch_tokens")  # until the release after 0.1
    group.add_argument("--max_wait_ms", type=positive_float, default=MAX_WAIT_MS, help="a batch's longest wait")
    group.add_argument(
        "--max_queue_tokens", type=at_least(1), default=MAX_QUEUE_TOKENS, help="source tokens waiting (then 503)"
    )
    group.add_argument("--max_body_bytes", type=at_least(1), default=limits.max_body_bytes, help="then 413")
    group.add_argument("--max_texts", type=at_least(1), default=limits.max_texts, help="strings a request (413)")
    group.add_argument(
        "--max_characters", type=at_least(1), default=limits.max_characters, help="characters a request (413)"
    )
    group.add_argument("--timeout", type=positive_float, default=limits.timeout, help="seconds a request (then 504)")
    group.add_argument(
        "--drain_seconds", type=positive_float, default=DRAIN_SECONDS, help="on SIGTERM, to answer those accepted"
    )
    group.add_argument(
        "--batch_across_requests",
        choices=["on", "off"],
        default="on",
        help="off: each request's sentences batched alone, one request at a time a worker (a baseline to measure)",
    )
    add_settings_flags(group, CorpusSettings, ["split_sentences"])
    add_settings_flags(group, DecodingSettings)
    add_backend_flags(parser)
    parser.add_argument(
        "--devices", nargs="+", help="several devices (cuda:0 cuda:1 ...): each model on each, a queue each"
    )
    return parser


def read_keys(path: str) -> list[str]:
    """The keys of --api_keys FILE, one a line (blank lines and # comments skipped); an error naming the file."""
    try:
        lines = Path(path).read_text(encoding="utf-8").splitlines()
    except (OSError, UnicodeDecodeError) as error:
        raise UsageError(f"--api_keys {path}: cannot be read ({error})") from None
    keys = [line.strip() for line in lines if line.strip() and not line.lstrip().startswith("#")]
    if not keys:
        raise UsageError(f"--api_keys {path} holds no key: one a line")
    return keys


def folder_languages(folder: str) -> tuple[str, str] | None:
    """A folder's pair: tokenizer_config.json's source_lang and target_lang, else its model card's two languages."""
    from vanilla_transformer.model.loading import read_json_file
    from vanilla_transformer.serving.demo import card_languages

    config = read_json_file(Path(folder) / "tokenizer_config.json") or {}
    if isinstance(config.get("source_lang"), str) and isinstance(config.get("target_lang"), str):
        return config["source_lang"], config["target_lang"]
    pair = card_languages(Path(folder))
    return None if pair == ("source", "target") else pair


def serve_models(args: argparse.Namespace, devices: list[str], on_batch) -> list:
    """Each folder loaded on each device, with a batcher each."""
    from vanilla_transformer.serving.server import ServedModel

    models = []
    for number, folder in enumerate(args.model_dirs):
        pair = args.languages[number].split("-") if args.languages else folder_languages(folder)
        if pair is None:
            raise UsageError(f"{folder} does not say its languages: name them with --languages SRC-TGT")
        one = argparse.Namespace(**{**vars(args), "model_dir": folder})
        export, backends, batchers = the_export(one), [], []
        for device in devices:
            backends.append(make_backend(one, device, export, not backends))
            batchers.append(batcher_of(backends[-1], args, on_batch(f"{pair[0]}-{pair[1]}")))
        models.append(ServedModel(pair[0], pair[1], backends[0], batchers, args.split_sentences))
    return models


def batcher_of(backend, args: argparse.Namespace, on_batch):
    """A batcher decoding with `backend` (and, for a request's own beam or length, its `with_decoding` copies)."""
    import torch

    from vanilla_transformer.serving.batcher import Batcher, Options

    variants = {Options(): backend}

    def backend_for(options):
        if options not in variants:
            variants[options] = backend.with_decoding(options.num_beams, options.max_new_tokens)
        return variants[options]

    workers = backend.workers if args.backend == "model" else 1  # CTranslate2 splits a batch among its own
    share = max(1, torch.get_num_threads() // workers)  # torch's threads, shared among the workers
    return Batcher(
        backend_for,
        args.max_batch_tokens,
        args.max_wait_ms / 1000,
        args.max_queue_tokens,
        workers,
        on_worker_start=lambda: torch.set_num_threads(share),
        on_batch=on_batch,
        across_requests=args.batch_across_requests == "on",
        max_sentences=args.batch_size,
    )


def run(args: argparse.Namespace) -> None:
    need("uvicorn", "serve", "vanilla-transformer serve")
    import uvicorn

    from vanilla_transformer.serving.server import Limits, ServerState, create_app

    keys = read_keys(args.api_keys) if args.api_keys else []
    devices = [resolve_device(device) for device in args.devices or [args.device or "cpu"]]
    listening = listening_socket(args.host, args.port)
    limits = Limits(args.max_body_bytes, args.max_texts, args.max_characters, args.timeout)
    state = ServerState([], limits, keys)
    for model in serve_models(args, devices, state.on_batch):
        state.add(model)
    config = uvicorn.Config(
        create_app(state), log_level="warning", access_log=False, timeout_graceful_shutdown=args.drain_seconds
    )
    pairs, port = ", ".join(model.pair for model in state.models), listening.getsockname()[1]
    ready = f"serving {pairs} on http://{args.host}:{port} (SIGTERM drains, then exits)"
    DrainingServer(config, state, args.drain_seconds, ready).run(sockets=[listening])
    stop_batchers(state, args.drain_seconds)


def listening_socket(host: str, port: int) -> socket.socket:
    """The server's socket, listening before the models load (connections wait in the backlog until uvicorn
    accepts). It is a TCP socket by its protocol number and has TCP_NODELAY, which its connections inherit: asyncio
    sets TCP_NODELAY only on sockets that name IPPROTO_TCP, and without it Nagle's algorithm held each response's body
    back until the client's delayed acknowledgement of its head, 40 ms a request on a kept-alive connection."""
    listening = socket.socket(
        socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_STREAM, socket.IPPROTO_TCP
    )
    listening.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listening.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    try:
        listening.bind((host, port))
        listening.listen(2048)
    except OSError as error:
        raise UsageError(f"--host {host} --port {port}: cannot listen there ({error.strerror})") from None
    return listening


def stop_batchers(state, seconds: float) -> None:
    """Once uvicorn has stopped: the batchers end the batches they are decoding (within `seconds`), so that no thread
    is inside torch or CTranslate2 while the interpreter exits (that aborts the process, SIGABRT, instead of exit 0).
    A batch still decoding then (a second signal stopped uvicorn at once) is left, and the process exits 1."""
    deadline = time.monotonic() + seconds
    for batcher in state.batchers:
        batcher.abandon()
    if not all(batcher.join(max(0.0, deadline - time.monotonic())) for batcher in state.batchers):
        print("a batch was still being decoded: stopped without it", file=sys.stderr, flush=True)
        os._exit(1)


class DrainingServer:
    """uvicorn's server with the drain first: on SIGTERM (or Ctrl-C), /ready and new translations answer 503 at
    once, the batchers finish what they accepted, and uvicorn stops when no request is in flight or after
    `drain_seconds`: what is still queued then is answered 503 (`Batcher.abandon`), and the requests in the batches
    being decoded get their translations. A second signal stops at once. `ready` is said once the server accepts (its
    signal handlers set)."""

    def __new__(cls, config, state, drain_seconds: float, ready: str):
        import uvicorn

        class Server(uvicorn.Server):
            async def startup(self, sockets=None):
                await super().startup(sockets=sockets)
                print(ready, file=sys.stderr, flush=True)

            def handle_exit(self, sig, frame):
                if state.draining:
                    return super().handle_exit(sig, frame)
                state.draining = True
                for batcher in state.batchers:
                    batcher.close()
                threading.Thread(target=self.drain, args=(sig, frame), daemon=True).start()

            def drain(self, sig, frame):
                deadline = time.monotonic() + drain_seconds
                while time.monotonic() < deadline and (
                    state.in_flight or not all(batcher.idle() for batcher in state.batchers)
                ):
                    time.sleep(0.05)
                for batcher in state.batchers:
                    batcher.abandon()
                super().handle_exit(sig, frame)

        return Server(config)


@command
def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    # uvicorn raises the SIGTERM it drained on again once it has stopped: by then the drain is done, exit 0
    previous = signal.signal(signal.SIGTERM, lambda signum, frame: None)
    try:
        run(args)
    finally:
        signal.signal(signal.SIGTERM, previous)
    return 0
