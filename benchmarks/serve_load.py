"""Serving under load: `vanilla-transformer serve` batching the sentences of concurrent requests (a), the same server
one request at a time (b: `--batch_across_requests off`, as LibreTranslate and the FastAPI wrappers serve), and
`vanilla-transformer translate` offline on the same sentences (c).

The load generator is closed-loop: C clients (aiohttp, in this process) each send one sentence a request
(LibreTranslate's `POST /translate`) and the next once answered, for --seconds at each concurrency C of
--concurrency. The sentences are Multi30k's test_2016_flickr.en, in order, cycling. Requests/s counts the answers
within the window; target tokens/s is the server's own count (`vt_target_tokens_total` on /metrics) over the window;
the latency percentiles cover every request sent within the window, those answered after it included (the window is
followed by a wait for them). Where C exceeds what (b) answers in the window, its latencies are those of the first
wave, not of a steady state. The load generator shares the machine's cores with the server: each row gives the cores
that the client and the server kept busy over the window (CPU seconds / window seconds), which (c) has to itself,
and the mean sentences a batch (`vt_batch_sentences` on /metrics).

Also measured, per model and backend:
- `direct`: the backend called directly (`translate([ids])`, in a process of its own, loaded as the server loads it)
  on the first --direct sentences, each call right after the server's answer to the same sentence (`paired_latency`);
- `offline` (c): the translate command on --sentences sentences with the same backend flags; its lines/s and tokens/s
  are the engine's own clock (the command's summary line), loading left out as the server's window leaves it out;
- `queued`: --queued requests sent at once to a server that may queue them all, its peak RSS against its idle RSS
  after 10 s of full batches (C=256: the memory that decoding full batches takes, and keeps for reuse, is the idle
  server's; what more the queue takes is the figure), and against its peak during those 10 s.

The models: the OPUS-MT-sized converted model with random weights and a fixed output length (`--new_tokens`, as
benchmarks/translate_corpus.py builds it), and a trained model folder (`--trained DIR`, for example the one
benchmarks/train_multi30k.sh writes) decoding with its own generation_config.json.

Usage:
    python benchmarks/serve_load.py --trained /tmp/multi30k-model --output serve_load.json
    python benchmarks/serve_load.py --tiny --seconds 3 --concurrency 1 8 --queued 500   # checks that it runs
"""

import argparse
import asyncio
import contextlib
import json
import re
import shlex
import signal
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import aiohttp
import psutil

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))  # run from a checkout without installing

from common import (  # noqa: E402
    SUMMARY,
    build_folders,
    describe_machine,
    environment,
    machine,
    read_lines,
    tree_rss,
    uptime,
    write_lines,
)

SENTENCES = ROOT.parent / "shared" / "data" / "multi30k" / "test_2016_flickr.en.gz"
TARGET_TOKENS = re.compile(r"^vt_target_tokens_total\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)
BATCHES = re.compile(r"^vt_batch_sentences_count\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)
BATCHED = re.compile(r"^vt_batch_sentences_sum\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)
QUEUED = re.compile(r"^vt_queue_sentences\{[^}]*\} ([0-9.e+]+)$", re.MULTILINE)
SERVING = re.compile(r"serving .* on http://127\.0\.0\.1:(\d+)")
POLL_SECONDS = 0.1


class Server:
    """`vanilla-transformer serve FOLDER` in a process of its own on a free port, its process tree's RSS polled."""

    def __init__(self, folder: Path, flags: list[str], log: Path, threads: int):
        command = [sys.executable, "-m", "vanilla_transformer", "serve", str(folder), "--port", "0", *flags]
        self.log = open(log, "w")  # noqa: SIM115 - closed in stop()
        self.process = subprocess.Popen(  # a native crash dumps the Python stacks into the log
            command,
            cwd=ROOT,
            env=environment(threads) | {"PYTHONFAULTHANDLER": "1"},
            stdout=self.log,
            stderr=subprocess.STDOUT,
        )
        self.log_path = log
        self.watched, self.peak, self.running = psutil.Process(self.process.pid), 0, True
        self.poller = threading.Thread(target=self.poll, daemon=True)
        self.poller.start()
        deadline = time.monotonic() + 600
        while not (found := SERVING.search(log.read_text(errors="replace"))):
            if self.process.poll() is not None or time.monotonic() > deadline:
                raise SystemExit(f"the server did not start: {' '.join(command)}\n{log.read_text()[-3000:]}")
            time.sleep(POLL_SECONDS)
        self.url = f"http://127.0.0.1:{found.group(1)}"

    def poll(self) -> None:
        while self.running:
            self.peak = max(self.peak, tree_rss(self.watched))
            time.sleep(POLL_SECONDS)

    def rss(self) -> int:
        return tree_rss(self.watched)

    def cpu_seconds(self) -> float:
        times = self.watched.cpu_times()
        return times.user + times.system

    def __enter__(self) -> "Server":
        return self

    def __exit__(self, kind, error, trace) -> None:
        self.stop(failed=kind is not None)

    def stop(self, failed: bool = False) -> None:
        """SIGTERM, and a wait for the drain. Its log goes with the temporary folder: where the server had exited
        already, or a step failed against it, its exit code and the log's tail are printed."""
        self.running = False
        died = self.process.poll()
        if died is None:
            self.process.send_signal(signal.SIGTERM)
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait()
        self.log.close()
        if died is not None or failed:
            tail = self.log_path.read_text(errors="replace")[-4000:]
            how = f"had exited (code {died}) before it was stopped" if died is not None else "was running"
            print(f"the server {how}; its log ends:\n{tail}", file=sys.stderr)


async def metric(session: aiohttp.ClientSession, url: str, pattern: re.Pattern) -> float:
    async with session.get(f"{url}/metrics") as response:
        return sum(float(value) for value in pattern.findall(await response.text()))


async def request(session: aiohttp.ClientSession, url: str, sentence: str) -> bool:
    body = {"q": sentence, "source": "auto"}  # the one model served
    async with session.post(f"{url}/translate", json=body) as response:
        await response.read()
        return response.status == 200


async def closed_loop(url: str, sentences: list[str], concurrency: int, seconds: float) -> dict:
    """C clients for `seconds`, then a wait for the requests still out: requests/s and tokens/s within the window,
    latency percentiles of every request sent, and each request's (sentence index, seconds)."""
    latencies, errors, answered, counter = [], 0, 0, iter(range(10**9))
    connector = aiohttp.TCPConnector(limit=0)
    async with aiohttp.ClientSession(connector=connector, timeout=aiohttp.ClientTimeout(total=None)) as session:
        tokens_before = await metric(session, url, TARGET_TOKENS)
        batches_before = [await metric(session, url, pattern) for pattern in (BATCHES, BATCHED)]
        start = time.monotonic()
        end = start + seconds

        async def client() -> None:
            nonlocal errors, answered
            while time.monotonic() < end:
                number = next(counter)
                sent = time.monotonic()
                ok = await request(session, url, sentences[number % len(sentences)])
                now = time.monotonic()
                latencies.append((number, now - sent))
                errors += not ok
                answered += now <= end

        async def window_tokens() -> float:
            await asyncio.sleep(seconds)
            return await metric(session, url, TARGET_TOKENS) - tokens_before

        *_, tokens = await asyncio.gather(*(client() for _ in range(concurrency)), window_tokens())
        counts = zip((BATCHES, BATCHED), batches_before, strict=True)
        batches, batched = [await metric(session, url, pattern) - before for pattern, before in counts]
    finished = time.monotonic() - start
    ordered = sorted(seconds_ for _, seconds_ in latencies)
    percentile = lambda share: ordered[min(len(ordered) - 1, int(share * len(ordered)))] * 1000  # noqa: E731
    return {
        "requests": len(latencies),
        "errors": errors,
        "requests_per_second": answered / seconds,
        "target_tokens_per_second": tokens / seconds,
        "p50_ms": percentile(0.50),
        "p95_ms": percentile(0.95),
        "p99_ms": percentile(0.99),
        "batch_sentences": batched / batches if batches else 0.0,  # the mean, window and wait together
        "by_sentence": sorted(latencies),
        "seconds": finished,
    }


async def warm_up(url: str, sentences: list[str], count: int) -> None:
    async with aiohttp.ClientSession() as session:
        for sentence in sentences[:count]:
            await request(session, url, sentence)


async def flood(server: Server, sentences: list[str], count: int, settle: float) -> dict:
    """`count` requests sent at once; the server's peak RSS while they wait, against its RSS before. Connections
    beyond the listening backlog that the kernel resets (the server keeps running) are counted, not fatal."""
    idle = server.rss()
    connector = aiohttp.TCPConnector(limit=0)
    timeout = aiohttp.ClientTimeout(total=None)
    async with (
        aiohttp.ClientSession(connector=connector, timeout=timeout) as session,
        aiohttp.ClientSession(timeout=timeout) as polling,
    ):
        tasks = [
            asyncio.ensure_future(request(session, server.url, sentences[n % len(sentences)])) for n in range(count)
        ]
        server.peak, deepest, deadline = 0, 0.0, time.monotonic() + settle
        while time.monotonic() < deadline:
            await asyncio.sleep(0.5)
            with contextlib.suppress(aiohttp.ClientError):
                deepest = max(deepest, await metric(polling, server.url, QUEUED))
        peak = server.peak
        reset = sum(task.done() and not task.cancelled() and task.exception() is not None for task in tasks)
        for task in tasks:
            task.cancel()
        await asyncio.gather(*tasks, return_exceptions=True)
    sizes = {"idle_mb": idle / 2**20, "peak_mb": peak / 2**20}
    return {"requests": count, "connections_reset": reset, "deepest_queue": deepest, **sizes}


def direct_worker(args: argparse.Namespace) -> None:
    """The backend as the server loads it, called directly: for each line `THREADS INDEX` on stdin, one
    `translate([ids])` of the INDEX-th of the first --direct sentences on THREADS of torch's threads, its seconds
    printed (after one warm-up call on each thread count)."""
    import torch

    from vanilla_transformer.commands.serve import parse_args as serve_args
    from vanilla_transformer.commands.translate import make_backend, the_export

    served = serve_args([args.worker_folder, *args.worker_flags])
    served.model_dir = args.worker_folder  # as serve gives each folder its own settings
    backend = make_backend(served, "cpu", the_export(served), True)
    ids = backend.encode(read_lines(SENTENCES, args.direct))
    for count in {1, torch.get_num_threads()}:
        torch.set_num_threads(count)
        backend.translate([ids[0]])
    print(torch.get_num_threads(), getattr(backend, "workers", 1) if served.backend == "model" else 1, flush=True)
    for line in sys.stdin:
        threads, index = map(int, line.split())
        torch.set_num_threads(threads)
        started = time.monotonic()
        backend.translate([ids[index]])
        print(time.monotonic() - started, flush=True)


async def paired_latency(args: argparse.Namespace, url: str, folder: Path, flags: list[str]) -> dict:
    """Latency at C=1 against the direct calls, interleaved: for each of the first --direct sentences, a request to
    the server (idle otherwise), then the backend called directly in a process of its own on a server worker's share
    of torch's threads (the model backend's two workers have one thread each on 2 cores: the difference is the
    server's own overhead) and on all of them (what calling the backend alone gives). Interleaving puts both under
    the same machine conditions: on this machine the same call's time drifted by a third between runs minutes apart."""
    command = [sys.executable, __file__, "--worker", "direct", "--worker_folder", str(folder), "--direct"]
    command += [str(args.direct), "--worker_flags", *flags]
    worker = subprocess.Popen(
        command, cwd=ROOT, env=environment(args.threads), stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True
    )
    try:
        threads, workers = map(int, worker.stdout.readline().split())

        def call(count: int, index: int) -> float:
            worker.stdin.write(f"{count} {index}\n")
            worker.stdin.flush()
            return float(worker.stdout.readline())

        sentences, timed = read_lines(SENTENCES, args.direct), {"served": [], "share": [], "all": []}
        async with aiohttp.ClientSession() as session:
            for index, sentence in enumerate(sentences):
                started = time.monotonic()
                await request(session, url, sentence)
                timed["served"].append(time.monotonic() - started)
                timed["share"].append(call(max(1, threads // workers), index))
                timed["all"].append(call(threads, index))
    finally:
        worker.stdin.close()
        worker.wait(timeout=60)
    row = {
        "mode": "direct",
        "sentences": len(timed["served"]),
        "served_p50_ms": statistics.median(timed["served"]) * 1000,
    }
    for name in ("share", "all"):
        ratios = [served / direct for served, direct in zip(timed["served"], timed[name], strict=True)]
        row[f"direct_{name}_p50_ms"] = statistics.median(timed[name]) * 1000
        row[f"served_over_direct_{name}"] = statistics.median(ratios)
    return row


def offline(args: argparse.Namespace, folder: Path, flags: list[str], work: Path) -> dict:
    """(c): the translate command on the sentences; the engine's own lines/s and tokens/s."""
    lines = read_lines(SENTENCES, args.sentences)
    source, output = write_lines(work / "offline.en", lines), work / "offline.de"
    command = [sys.executable, "-m", "vanilla_transformer", "translate", str(folder), "--input", str(source)]
    command += ["--output", str(output), "--overwrite", *[flag for flag in flags if flag != "--split_sentences"]]
    done = subprocess.run(command, cwd=ROOT, env=environment(args.threads), capture_output=True, text=True)
    found = SUMMARY.findall(done.stderr)
    if done.returncode != 0 or not found:
        raise SystemExit(f"translate failed:\n{done.stderr[-3000:]}")
    count, _, tokens, seconds = found[-1]
    return {"lines_per_second": int(count) / float(seconds), "target_tokens_per_second": int(tokens) / float(seconds)}


def measure(args: argparse.Namespace, name: str, folder: Path, flags: list[str], work: Path, queued: bool) -> list:
    """The rows of one model and backend: (a) and (b) at each concurrency, direct, offline, and (once) queued."""
    sentences, rows = read_lines(SENTENCES, args.sentences), []
    for mode in ("on", "off"):
        served = [*flags, *args.server_flags, "--batch_across_requests", mode, "--timeout", "600"]
        with Server(folder, served, work / "serve.log", 2) as server:
            asyncio.run(warm_up(server.url, sentences, 8))
            for concurrency in args.concurrency:
                server.peak, server_cpu, client_cpu = 0, server.cpu_seconds(), time.process_time()
                row = asyncio.run(closed_loop(server.url, sentences, concurrency, args.seconds))
                row |= {"model": name, "mode": mode, "concurrency": concurrency, "peak_mb": server.peak / 2**20}
                busy = row.pop("seconds")  # the window and the wait for the requests still out
                row["server_cores"] = (server.cpu_seconds() - server_cpu) / busy
                row["client_cores"] = (time.process_time() - client_cpu) / busy
                print(
                    f"  {name} {' '.join(flags)} batch_across_requests={mode} C={concurrency}: "
                    f"{row['requests_per_second']:.1f} req/s, p50 {row['p50_ms']:.0f} ms",
                    flush=True,
                )
                rows.append(row)
            if mode == "on" and args.direct:
                rows.append({"model": name, **asyncio.run(paired_latency(args, server.url, folder, flags))})
    rows.append({"model": name, "mode": "offline", **offline(args, folder, flags, work)})
    if queued:
        limit = ["--max_queue_tokens", str(10**9), "--timeout", "600"]
        with Server(folder, [*flags, *args.server_flags, *limit], work / "queued.log", 2) as server:
            server.peak = 0
            asyncio.run(closed_loop(server.url, sentences, 256, 10))  # full batches: their memory is the idle's
            full_load = {"full_load_peak_mb": server.peak / 2**20}
            flooded = asyncio.run(flood(server, sentences, args.queued, 30))
            rows.append({"model": name, "mode": "queued", **flooded, **full_load})
    return rows


def table(rows: list[dict]) -> str:
    lines = [
        "| model | backend | mode | C | requests/s | target tokens/s | p50 ms | p95 ms | p99 ms | errors | peak MB "
        "| server / client cores | sentences a batch |",
        "|---|---|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        if row["mode"] in ("on", "off"):
            lines.append(
                f"| {row['model']} | {row['backend']} | {'(a) batched' if row['mode'] == 'on' else '(b) one at a time'} "
                f"| {row['concurrency']} | {row['requests_per_second']:.1f} | {row['target_tokens_per_second']:,.0f} "
                f"| {row['p50_ms']:,.0f} | {row['p95_ms']:,.0f} | {row['p99_ms']:,.0f} | {row['errors']} "
                f"| {row['peak_mb']:,.0f} | {row['server_cores']:.2f} / {row['client_cores']:.2f} "
                f"| {row['batch_sentences']:.1f} |"
            )
        elif row["mode"] == "offline":
            lines.append(
                f"| {row['model']} | {row['backend']} | (c) translate | - | {row['lines_per_second']:.1f} "
                f"| {row['target_tokens_per_second']:,.0f} | | | | | | | |"
            )
    return "\n".join(lines)


def targets(rows: list[dict]) -> list[str]:
    """The issue's three targets, read off the rows."""
    said = []
    for model, backend in dict.fromkeys((row["model"], row["backend"]) for row in rows):
        mine = [row for row in rows if row["model"] == model and row["backend"] == backend]
        at = {(row["mode"], row.get("concurrency")): row for row in mine}
        if ("on", 64) in at and ("off", 64) in at:
            batched, alone = at["on", 64]["requests_per_second"], at["off", 64]["requests_per_second"]
            offline_ = next(row for row in mine if row["mode"] == "offline")["lines_per_second"]
            said.append(f"{model} {backend}: at C=64, (a) {batched / alone:.2f}x (b), {batched / offline_:.2f}x (c)")
        for row in mine:
            if row["mode"] == "direct":
                said.append(
                    f"{model} {backend}: at C=1 (served p50 {row['served_p50_ms']:.0f} ms), served/direct latency "
                    f"{row['served_over_direct_share']:.2f}x on a "
                    f"worker's share of the threads (direct p50 {row['direct_share_p50_ms']:.0f} ms), "
                    f"{row['served_over_direct_all']:.2f}x on all (direct p50 {row['direct_all_p50_ms']:.0f} ms)"
                )
            if row["mode"] == "queued":
                said.append(
                    f"{model} {backend}: {row['requests']} requests queued ({row['connections_reset']} reset; deepest queue "
                    f"{row['deepest_queue']:.0f}): peak {row['peak_mb']:.0f} MB, idle {row['idle_mb']:.0f} MB, "
                    f"+{row['peak_mb'] - row['idle_mb']:.0f} MB (peak at C=256 {row['full_load_peak_mb']:.0f} MB)"
                )
    return said


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--trained", help="a trained model folder (its own decoding); default: none")
    parser.add_argument("--tiny", action="store_true", help="the converted model at its tiny size (a quick check)")
    parser.add_argument("--no_opus_mt", action="store_true", help="leave the OPUS-MT-sized random model out")
    parser.add_argument("--backends", nargs="+", default=["model", "ctranslate2"], choices=["model", "ctranslate2"])
    parser.add_argument("--compute_type", default="int8", help="the CTranslate2 backend's (int8: the CPU fast path)")
    parser.add_argument("--concurrency", type=int, nargs="+", default=[1, 8, 64, 256])
    parser.add_argument("--seconds", type=float, default=20.0, help="the window at each concurrency")
    parser.add_argument("--sentences", type=int, default=1000, help="Multi30k sentences sent (cycling) and offline")
    parser.add_argument("--new_tokens", type=int, default=24, help="the random model's fixed output length")
    parser.add_argument("--direct", type=int, default=50, help="sentences of the direct calls (0: none)")
    parser.add_argument("--queued", type=int, default=10_000, help="requests of the queued-memory step (0: skip)")
    parser.add_argument("--threads", type=int, default=2, help="torch's threads in the server")
    parser.add_argument(
        "--server_flags", type=shlex.split, default=[], help='more flags of serve: --server_flags="--batch_size 64"'
    )
    parser.add_argument("--output", help="also write every figure (and the machine) to this JSON file")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    parser.add_argument("--worker_folder", help=argparse.SUPPRESS)
    parser.add_argument("--worker_flags", nargs=argparse.REMAINDER, default=[], help=argparse.SUPPRESS)
    return parser.parse_args(argv)


def main(argv=None) -> None:
    args = parse_args(argv)
    if args.worker == "direct":
        return direct_worker(args)
    info = machine()
    print(describe_machine(info), "\nbefore:", uptime(), flush=True)
    rows = []
    with tempfile.TemporaryDirectory(prefix="serve-load-") as work_dir:
        work = Path(work_dir)
        models = []
        if not args.no_opus_mt:
            size = "tiny" if args.tiny else "opus-mt"
            _, folders = build_folders(work / "opus-mt", size, args.new_tokens, args.threads)
            models.append((f"{size} random", folders["ours"], ["--max_new_tokens", str(args.new_tokens)]))
        if args.trained:
            models.append(("trained", Path(args.trained), []))
        for name, folder, flags in models:
            for backend in args.backends:
                backend_flags = ["--backend", backend] + (
                    ["--compute_type", args.compute_type] if backend == "ctranslate2" else []
                )
                measured = measure(args, name, folder, flags + backend_flags, work, args.queued > 0)
                label = backend + (f" {args.compute_type}" if backend == "ctranslate2" else "")
                rows += [row | {"backend": label} for row in measured]
    print("after:", uptime())
    print(table(rows))
    print("\n".join(targets(rows)))
    if args.output:
        kept = [{key: value for key, value in row.items() if key != "by_sentence"} for row in rows]
        Path(args.output).write_text(json.dumps({"machine": info, "rows": kept}, indent=2) + "\n")


if __name__ == "__main__":
    sys.exit(main())
