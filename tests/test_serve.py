"""`vanilla-transformer serve`: the queue that batches the sentences of concurrent requests (in this process, on a
backend that spells words backwards), then a real server process on 127.0.0.1: the answers `translate` gives,
LibreTranslate's API through a client written by others, HTML, the limits, keys, a client gone, and the drain on
SIGTERM."""

import json
import signal
import socket
import threading
import time

import pytest

from vanilla_transformer.serving.batcher import Batcher, Options, QueueFull, Stopped

from .helpers import FAST, Served, corpus_lines, translate, write_lines


class ReversingBackend:
    """Translates a sentence of ids into its ids reversed, as text; records each batch."""

    beams, max_source_tokens = 1, 64

    def __init__(self, fail_on: int | None = None):
        self.batches, self.fail_on = [], fail_on

    def translate(self, batch):
        self.batches.append(batch)
        if self.fail_on is not None and any(self.fail_on in ids for ids in batch):
            raise RuntimeError("the model failed")
        return [" ".join(map(str, reversed(ids))) for ids in batch], sum(map(len, batch))


def batcher_of(backend, **kwargs) -> Batcher:
    settings = {"max_tokens": 1000, "max_wait": 0.05, "max_queue_tokens": 10_000} | kwargs
    return Batcher(lambda options: backend, **settings)


def run_jobs(batcher, requests):
    """Submit each request (a list of id lists) at once; wait for all; their jobs."""
    done = threading.Semaphore(0)
    jobs = [batcher.submit(encoded, Options(), lambda job: done.release()) for encoded in requests]
    for _ in jobs:
        assert done.acquire(timeout=30)
    return jobs


def test_the_sentences_of_concurrent_requests_share_batches_and_each_request_gets_its_own_in_order():
    backend = ReversingBackend()
    batcher = batcher_of(backend)
    requests = [[[n, n + 1], [n, n + 2, n + 3]] for n in range(0, 200, 10)]
    jobs = run_jobs(batcher, requests)
    assert len(backend.batches) < len(requests)
    for job, encoded in zip(jobs, requests, strict=True):
        assert job.error is None
        assert job.translations == [" ".join(map(str, reversed(ids))) for ids in encoded]


def test_without_batching_across_requests_a_batch_holds_one_requests_sentences():
    backend = ReversingBackend()
    batcher = batcher_of(backend, across_requests=False)
    requests = [[[n, n + 1], [n, n + 2]] for n in range(0, 50, 10)]
    run_jobs(batcher, requests)
    assert sorted(map(sorted, backend.batches)) == sorted(map(sorted, requests))


def test_a_batch_holds_at_most_the_token_budget_padding_counted():
    backend = ReversingBackend()
    run_jobs(batcher_of(backend, max_tokens=12), [[[1] * length] for length in (2, 5, 3, 1, 4, 6, 2)])
    assert all(len(batch) * max(map(len, batch)) <= 12 for batch in backend.batches if len(batch) > 1)


def test_a_batch_takes_the_oldest_sentence_and_those_closest_to_its_length():
    backend = ReversingBackend()
    lengths = [10, 2, 10, 2, 10, 2]  # in arrival order, one request: all waiting together
    run_jobs(batcher_of(backend, max_tokens=30, max_wait=0.5), [[[length] * length for length in lengths]])
    assert [sorted(map(len, batch)) for batch in backend.batches] == [[10, 10, 10], [2, 2, 2]]


def test_a_batch_holds_at_most_batch_size_sentences_whatever_the_token_budget_allows():
    backend = ReversingBackend()
    run_jobs(batcher_of(backend, max_tokens=1000, max_sentences=3), [[[n] for n in range(7)]])
    assert sorted(map(len, backend.batches)) == [1, 3, 3]


def test_a_full_batch_is_decoded_at_once_without_waiting_for_more():
    backend = ReversingBackend()
    started = time.monotonic()
    run_jobs(batcher_of(backend, max_tokens=4, max_wait=600), [[[1, 2], [3, 4], [5, 6], [7, 8]]])
    assert time.monotonic() - started < 60  # never the 600 s a sentence may wait for a batch to fill
    assert [len(batch) for batch in backend.batches] == [2, 2]


def test_after_a_batch_of_one_request_a_lone_request_is_decoded_without_waiting():
    backend = ReversingBackend()
    batcher = batcher_of(backend, max_tokens=4, max_wait=600)
    run_jobs(batcher, [[[1, 2], [3, 4]]])  # fills a batch alone: decoded at once
    started = time.monotonic()
    run_jobs(batcher, [[[5]]])  # far from full: a batch of one request before it, so no wait for company
    assert time.monotonic() - started < 60


def test_after_a_batch_of_several_requests_a_lone_request_waits_for_company():
    backend = ReversingBackend()
    batcher = batcher_of(backend, max_tokens=4, max_wait=600)
    run_jobs(batcher, [[[1, 2]], [[3, 4]]])  # two requests fill a batch together
    batcher.submit([[5]], Options(), lambda job: None)
    time.sleep(0.3)
    assert batcher.depth == 1 and len(backend.batches) == 1


def test_requests_with_other_decoding_options_never_share_a_batch():
    backend = ReversingBackend()
    batcher = batcher_of(backend)
    done = threading.Semaphore(0)
    batcher.submit([[1, 2]], Options(num_beams=2), lambda job: done.release())
    batcher.submit([[3, 4]], Options(), lambda job: done.release())
    assert done.acquire(timeout=30) and done.acquire(timeout=30)
    assert sorted(backend.batches) == [[[1, 2]], [[3, 4]]]


def test_the_queue_refuses_past_its_token_bound_and_a_cancelled_request_leaves_it():
    batcher = batcher_of(ReversingBackend(), max_wait=600, max_tokens=10**6, max_queue_tokens=5)
    first = batcher.submit([[1, 2, 3]], Options(), lambda job: None)
    with pytest.raises(QueueFull):
        batcher.submit([[4, 5, 6]], Options(), lambda job: None)
    batcher.cancel(first)
    assert batcher.depth == 0 and batcher.queued_tokens == 0
    batcher.submit([[4, 5, 6]], Options(), lambda job: None)


def test_a_cancelled_requests_sentences_are_never_decoded():
    backend = ReversingBackend()
    batcher = batcher_of(backend, max_wait=600)
    finished = []
    first = batcher.submit([[4, 5]], Options(), finished.append)
    gone = batcher.submit([[1, 2], [3]], Options(), finished.append)
    last = batcher.submit([[6]], Options(), finished.append)
    batcher.cancel(gone)
    batcher.close()
    assert batcher.join(timeout=30)
    assert sorted(map(sorted, backend.batches)) == [[[4, 5], [6]]] and finished == [first, last]


def test_closing_refuses_new_requests_and_finishes_those_accepted():
    backend = ReversingBackend()
    batcher = batcher_of(backend, max_wait=600)
    finished = []
    batcher.submit([[1, 2]], Options(), finished.append)
    batcher.close()
    with pytest.raises(Stopped):
        batcher.submit([[3]], Options(), finished.append)
    assert batcher.join(timeout=30)
    assert [job.translations for job in finished] == [["2 1"]]


class BlockingBackend(ReversingBackend):
    """A ReversingBackend whose batches wait for `release`."""

    def __init__(self):
        super().__init__()
        self.release = threading.Event()

    def translate(self, batch):
        self.release.wait(timeout=30)
        return super().translate(batch)


def a_batch_decoding_and_a_job_waiting(backend):
    """A batcher decoding one job's batch on `backend` while a second job waits: the batcher and the two jobs."""
    batcher = batcher_of(backend, max_wait=0)
    finished = []
    running = batcher.submit([[1, 2]], Options(), finished.append)
    while batcher.depth:  # the worker has taken it
        time.sleep(0.01)
    waiting = batcher.submit([[3]], Options(), finished.append)
    return batcher, running, waiting


def test_abandoning_fails_the_jobs_still_waiting_and_lets_the_running_batch_finish():
    backend = BlockingBackend()
    batcher, running, waiting = a_batch_decoding_and_a_job_waiting(backend)
    batcher.abandon()
    assert isinstance(waiting.error, Stopped) and batcher.depth == 0 and batcher.queued_tokens == 0
    backend.release.set()
    assert batcher.join(timeout=30)
    assert running.error is None and running.translations == ["2 1"]


def test_a_batch_still_decoding_past_the_bound_when_the_server_stops_ends_the_process_with_1(monkeypatch):
    from types import SimpleNamespace

    from vanilla_transformer.commands import serve

    backend = BlockingBackend()
    batcher, _, _ = a_batch_decoding_and_a_job_waiting(backend)
    exits = []
    monkeypatch.setattr(serve.os, "_exit", exits.append)
    serve.stop_batchers(SimpleNamespace(batchers=[batcher]), 0.2)
    backend.release.set()
    assert exits == [1]
    serve.stop_batchers(SimpleNamespace(batchers=[batcher]), 30)
    assert exits == [1]  # once the batch has ended, the batchers stop and nothing exits early


def test_a_failed_batch_fails_its_requests_and_the_next_batches_are_decoded():
    batcher = batcher_of(ReversingBackend(fail_on=99), max_tokens=2)
    failed, fine = run_jobs(batcher, [[[99, 1]], [[2, 3]]])
    assert isinstance(failed.error, RuntimeError) and fine.error is None and fine.translations == ["3 2"]


def test_a_request_goes_to_the_least_loaded_device():
    from vanilla_transformer.serving.server import ServedModel

    busy, free = (batcher_of(ReversingBackend(), max_wait=600) for _ in range(2))
    busy.submit([[1, 2, 3]], Options(), lambda job: None)
    model = ServedModel("en", "de", ReversingBackend(), [busy, free])
    assert model.least_loaded() is free and model.queued_tokens() == 3


# --- a server process -----------------------------------------------------------------------------------------


def translated_by_the_command(folder, tmp_path, lines) -> list[str]:
    source = write_lines(tmp_path / "lines.en", lines)
    result = translate(folder, "--input", source, *FAST)
    assert result.returncode == 0, result.stderr
    return result.stdout.splitlines()


@pytest.mark.slow
def test_64_concurrent_requests_share_batches_and_each_answer_is_what_translate_gives(served, folder, tmp_path):
    lines = corpus_lines(64)
    answers = [None] * 64
    batches = served.metric("vt_batch_sentences_count")

    def ask(index):
        answers[index] = served.request("/translate", {"q": lines[index], "source": "en", "target": "de"})

    threads = [threading.Thread(target=ask, args=(index,)) for index in range(64)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=120)
    assert all(status == 200 for status, _, _ in answers), answers
    assert [answer["translatedText"] for _, _, answer in answers] == translated_by_the_command(folder, tmp_path, lines)
    assert served.metric("vt_batch_sentences_count") - batches < 64


@pytest.mark.slow
def test_the_native_endpoint_gives_each_translation_with_its_source_tokens(served, folder, tmp_path):
    lines = corpus_lines(3)
    status, _, answer = served.request("/v1/translate", {"texts": lines, "source": "en", "target": "de"})
    assert status == 200, answer
    assert [item["text"] for item in answer["translations"]] == translated_by_the_command(folder, tmp_path, lines)
    assert all(item["source_tokens"] > 0 for item in answer["translations"])


@pytest.mark.slow
def test_a_libretranslate_client_written_by_others_translates_and_lists_languages(served, folder, tmp_path):
    from libretranslatepy import LibreTranslateAPI

    client = LibreTranslateAPI(served.url)
    [expected] = translated_by_the_command(folder, tmp_path, ["the red dog sees a cat"])
    assert client.translate("the red dog sees a cat", "en", "de") == expected
    assert client.languages() == [{"code": "en", "name": "English", "targets": ["de"]}]


@pytest.mark.slow
def test_html_keeps_its_tags_and_attributes_and_translates_the_text_between(served, folder, tmp_path):
    html = '<p class="note" data-id="7">the red dog <a href="/x?a=1&amp;b=2">sees a cat</a></p>'
    status, _, answer = served.request("/translate", {"q": html, "format": "html", "target": "de"})
    assert status == 200, answer
    first, second = translated_by_the_command(folder, tmp_path, ["the red dog", "sees a cat"])
    assert answer["translatedText"] == (
        f'<p class="note" data-id="7">{first} <a href="/x?a=1&amp;b=2">{second}</a></p>'
    )


@pytest.mark.slow
@pytest.mark.parametrize(
    ("body", "headers", "status", "says"),
    [
        (b'{"q": "a dog", ', {"Content-Type": "application/json"}, 400, "the body is not JSON"),
        (b'{"q": "a \xff dog"}', {"Content-Type": "application/json"}, 400, "the body is not UTF-8"),
        ({"q": 7}, {}, 400, "q: a string or a list of strings"),
        ({"texts": ["a dog"], "num_beams": 0}, {}, 400, "num_beams: an integer from 1 to"),
        ({"q": "a dog", "source": "fr", "target": "de"}, {}, 400, "this server serves en-de"),
        ({"q": "a dog", "format": "pdf"}, {}, 400, "format: text or html"),
        ({"q": ["a dog"] * 100_000}, {}, 413, "over the 128 a request may send"),
        ({"q": "a dog " * 20_000}, {}, 413, "characters, over the 100,000"),
        (b"q=a+dog", {"Content-Type": "text/csv"}, 415, "send application/json"),
    ],
    ids=["bad-json", "bad-utf8", "q-type", "num-beams", "pair", "format", "texts", "characters", "type"],
)
def test_a_bad_request_gets_its_status_and_names_the_problem_and_the_server_keeps_serving(
    served, body, headers, status, says
):
    path = "/v1/translate" if isinstance(body, dict) and "texts" in body else "/translate"
    got, _, answer = served.request(path, body, headers, method="POST")
    assert got == status and says in answer["error"], answer
    assert served.request("/translate", {"q": "a dog\0 with a NUL"})[0] == 200


@pytest.mark.slow
def test_a_slow_client_sending_its_headers_does_not_hold_up_the_others(served):
    host, port = served.url.removeprefix("http://").split(":")
    slow = socket.create_connection((host, int(port)))
    try:
        slow.sendall(b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-")
        assert served.request("/translate", {"q": "a dog"}, timeout=20)[0] == 200
    finally:
        slow.close()


@pytest.fixture(scope="module")
def timing_out(folder, tmp_path_factory):
    """A server with keys, a 40-token queue, a 2 s wait for a batch to fill and a 0.5 s timeout: a lone request
    waits in the queue until its time is up."""
    keys = tmp_path_factory.mktemp("keys") / "keys.txt"
    keys.write_text("secret-key-two\n")
    server = Served(
        folder, *FAST[:4], "--api_keys", keys, "--max_queue_tokens", 40, "--max_wait_ms", 2000, "--timeout", 0.5
    )
    yield server
    server.stop()


@pytest.mark.slow
@pytest.mark.parametrize("given", ["none", "wrong", "wrong-bearer"])
def test_without_a_valid_key_a_translation_is_refused(timing_out, given):
    body = {"q": "a confidential sentence"}
    headers = {}
    if given == "wrong":
        body["api_key"] = "guess"
    elif given == "wrong-bearer":
        headers["Authorization"] = "Bearer guess"
    status, _, answer = timing_out.request("/translate", body, headers)
    assert status == 403 and "API key" in answer["error"]


@pytest.mark.slow
def test_a_request_that_waits_past_the_timeout_gets_504_and_the_logs_hold_neither_key_nor_text(timing_out):
    body = {"q": "a confidential sentence", "api_key": "secret-key-two"}
    status, _, answer = timing_out.request("/translate", body)
    assert status == 504 and "within 0.5 seconds" in answer["error"]
    status, _, _ = timing_out.request("/translate", {"q": "a dog"}, {"Authorization": "Bearer secret-key-two"})
    assert status == 504  # the key was taken: the request reached the queue
    time.sleep(0.2)
    log = "".join(timing_out.log)
    assert '"status": 504' in log and "secret-key-two" not in log and "confidential" not in log


@pytest.mark.slow
def test_past_the_queues_bound_a_request_gets_503_with_retry_after(timing_out):
    long = " ".join(["the red dog sees a cat"] * 5)  # about 30 tokens: a second one is over the 40
    first = threading.Thread(target=timing_out.request, args=("/translate", {"q": long, "api_key": "secret-key-two"}))
    first.start()
    time.sleep(0.2)
    status, headers, answer = timing_out.request("/translate", {"q": long, "api_key": "secret-key-two"})
    first.join()
    assert status == 503 and headers.get("retry-after") == "1" and "busy" in answer["error"]


@pytest.mark.slow
def test_a_client_that_goes_takes_its_sentences_out_of_the_queue(timing_out):
    host, port = timing_out.url.removeprefix("http://").split(":")
    body = json.dumps({"q": "a dog", "api_key": "secret-key-two"}).encode()
    gone = timing_out.metric('vt_rejections_total{reason="client_gone"}')
    client = socket.create_connection((host, int(port)))
    client.sendall(
        b"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
        + f"Content-Length: {len(body)}\r\n\r\n".encode()
        + body
    )
    time.sleep(0.1)
    client.close()
    time.sleep(0.2)  # before its 0.5 s timeout
    assert timing_out.metric("vt_queue_sentences") == 0
    assert timing_out.metric('vt_rejections_total{reason="client_gone"}') == gone + 1


def requests_in_flight(server, count: int) -> tuple[list, list[threading.Thread]]:
    """`count` translation requests sent at once, a thread each: the list their answers go into, and the threads."""
    answers = []
    threads = [
        threading.Thread(target=lambda n=n: answers.append(server.request("/translate", {"q": f"a dog {n}"})))
        for n in range(count)
    ]
    for thread in threads:
        thread.start()
    return answers, threads


@pytest.mark.slow
def test_sigterm_answers_every_accepted_request_refuses_new_ones_and_exits_0(folder):
    server = Served(folder, *FAST[:4], "--max_wait_ms", 300, "--devices", "cpu", "cpu")  # two queues to drain
    try:
        answers, threads = requests_in_flight(server, 50)
        time.sleep(0.15)
        server.process.send_signal(signal.SIGTERM)
        time.sleep(0.02)
        ready = server.request("/ready")
        late = server.request("/translate", {"q": "a late dog"})
        for thread in threads:
            thread.join(timeout=60)
        assert server.process.wait(timeout=60) == 0
    finally:
        server.stop()
    assert sorted(status for status, _, _ in answers) == [200] * 50
    assert ready[0] == 503 and late[0] == 503 and late[1].get("retry-after") == "1"


@pytest.mark.slow
def test_what_the_drain_cannot_finish_in_time_is_answered_503_and_the_process_still_exits_0(folder):
    server = Served(folder, *FAST, "--batch_size", 1, "--drain_seconds", 0.2)  # one sentence a batch: a slow drain
    try:
        answers, threads = requests_in_flight(server, 200)
        time.sleep(0.3)
        server.process.send_signal(signal.SIGTERM)
        for thread in threads:
            thread.join(timeout=60)
        assert server.process.wait(timeout=60) == 0
    finally:
        server.stop()
    refused = [headers for status, headers, _ in answers if status == 503]
    assert len(answers) == 200 and {status for status, _, _ in answers} <= {200, 503}
    assert refused and all(headers.get("retry-after") == "1" for headers in refused)
    assert "Traceback" not in "".join(server.log)


def test_keys_in_a_file_are_read_one_a_line_and_a_file_without_one_is_refused(tmp_path):
    from vanilla_transformer.commands.runner import UsageError
    from vanilla_transformer.commands.serve import read_keys

    keys = tmp_path / "keys.txt"
    keys.write_text("# comment\n\n  alpha \nbeta\n")
    assert read_keys(str(keys)) == ["alpha", "beta"]
    keys.write_text("# only a comment\n")
    with pytest.raises(UsageError, match="holds no key"):
        read_keys(str(keys))


def test_the_server_listens_on_this_machine_only_unless_told(folder):
    from vanilla_transformer.commands.serve import parse_args

    assert parse_args([str(folder)]).host == "127.0.0.1"


def raw_post(url: str, body: bytes) -> socket.socket:
    """A connection that has sent one POST /translate of `body` (JSON), its answer not read."""
    host, port = url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    head = (
        f"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {len(body)}\r\n\r\n"
    )
    client.sendall(head.encode() + body)
    return client


@pytest.mark.slow
def test_10000_queued_requests_keep_the_servers_memory_bounded_and_leave_with_their_clients(folder):
    psutil = pytest.importorskip("psutil")
    # batches form only when full (a budget no queue reaches) or after a minute: every request waits in the queue
    server = Served(
        folder, *FAST[:4], "--max_batch_tokens", 10**7, "--max_wait_ms", 60_000, "--max_queue_tokens", 10**7
    )
    clients = []
    try:
        process = psutil.Process(server.process.pid)
        idle = process.memory_info().rss
        clients = [raw_post(server.url, json.dumps({"q": f"the red dog {n}"}).encode()) for n in range(10_000)]
        deadline = time.monotonic() + 120
        while server.metric("vt_queue_sentences") < 10_000 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert server.metric("vt_queue_sentences") == 10_000
        assert process.memory_info().rss - idle < 300 * 2**20  # 216 MB here: about 22 KB a request waiting
        for client in clients:
            client.close()
        deadline = time.monotonic() + 60
        while server.metric("vt_queue_sentences") > 0 and time.monotonic() < deadline:
            time.sleep(0.5)
        assert server.metric("vt_queue_sentences") == 0
        assert server.request("/health")[0] == 200
    finally:
        for client in clients:
            client.close()
        server.stop()


def send_body_of(url: str, size: int) -> tuple[str, int]:
    """A POST /translate declaring `size` bytes: the answer read after the head (a body too large is refused on its
    declared length), then the body sent as far as the server takes it: (the answer, the bytes sent)."""
    host, port = url.removeprefix("http://").split(":")
    client = socket.create_connection((host, int(port)))
    head = f"POST /translate HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\nContent-Length: {size}\r\n\r\n"
    client.sendall(head.encode())
    client.settimeout(30)
    answer = b""
    while b"}" not in answer and (received := client.recv(4096)):  # the head and the JSON error, maybe two segments
        answer += received
    chunk, sent = b"x" * 2**20, 0
    try:
        while sent < size:
            client.sendall(chunk)
            sent += len(chunk)
    except OSError:  # the server closed the connection
        pass
    finally:
        client.close()
    return answer.decode("latin-1"), sent


@pytest.mark.slow
def test_a_body_over_the_limit_is_refused_on_its_declared_length_and_the_server_keeps_serving(served):
    answer, _ = send_body_of(served.url, 2 << 20)
    assert answer.startswith("HTTP/1.1 413") and "the body is over 1,048,576 bytes" in answer
    assert served.request("/translate", {"q": "a dog"})[0] == 200


@pytest.mark.slow
def test_a_100_mb_body_is_refused_and_the_connection_closed_before_the_body_is_read(served):
    answer, sent = send_body_of(served.url, 100 * 2**20)
    assert answer.startswith("HTTP/1.1 413") and "connection: close" in answer.lower()
    assert sent < 100 * 2**20
    assert served.request("/translate", {"q": "a dog"})[0] == 200


def test_the_servers_connections_send_each_response_at_once_without_waiting_for_an_acknowledgement():
    from vanilla_transformer.commands.serve import listening_socket

    listening = listening_socket("127.0.0.1", 0)
    client = socket.create_connection(listening.getsockname())
    accepted, _ = listening.accept()
    try:
        assert accepted.proto == socket.IPPROTO_TCP  # asyncio sets TCP_NODELAY on such sockets only
        assert accepted.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY) != 0
    finally:
        for each in (accepted, client, listening):
            each.close()
