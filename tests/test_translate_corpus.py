"""Translating a corpus: token batches, chunks recorded and resumed byte for byte, several processes, documents,
datasets in and out, the CTranslate2 backend, progress."""

import json
import os
import random
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from vanilla_transformer.commands import translate as translate_command
from vanilla_transformer.commands.translate import main
from vanilla_transformer.model.decoding import ModelBackend
from vanilla_transformer.serving import corpus
from vanilla_transformer.serving.batches import token_batches, translate_groups, translate_texts

from .helpers import ENGLISH, FAST, OFFLINE, corpus_lines, launcher, stopped_run, translate, write_lines

ROOT = Path(__file__).resolve().parent.parent


class WordBackend:
    """A backend that "translates" a sentence into its words reversed, and records the batches it is given."""

    def __init__(self, beams: int = 2, max_source_tokens: int = 64):
        self.beams, self.max_source_tokens, self.batches, self.words = beams, max_source_tokens, [], {}

    def encode(self, texts):
        return [[self.words.setdefault(word, len(self.words)) for word in text.split()] + [-1] for text in texts]

    def count(self, text):
        return len(text.split()) + 1

    def translate(self, batch):
        self.batches.append(batch)
        spelled = {index: word for word, index in self.words.items()}
        return [" ".join(spelled[index] for index in reversed(ids[:-1])) for ids in batch], sum(map(len, batch))

    def translate_batches(self, batches):
        return map(self.translate, batches)


def test_token_batches_stay_within_the_budget_and_take_every_sentence_once():
    lengths = [random.Random(seed).randint(1, 60) for seed in range(500)]
    for budget, beams in ((200, 1), (1000, 4), (64, 2)):
        batches = token_batches(lengths, max_tokens=budget, beams=beams)
        assert sorted(index for batch in batches for index in batch) == list(range(len(lengths)))
        for batch in batches:
            assert len(batch) == 1 or len(batch) * max(lengths[i] for i in batch) * beams <= budget
        assert max(map(len, batches)) > 1  # batches are filled, not one sentence each


def test_token_batches_with_a_sentence_count_hold_at_most_that_many():
    batches = token_batches([5] * 100, max_tokens=10_000, max_sentences=32)
    assert [len(batch) for batch in batches] == [32, 32, 32, 4]


def test_token_batched_translation_keeps_the_input_order():
    backend, texts = WordBackend(), corpus_lines(60) + ["", "  "]
    result = translate_texts(backend, texts, max_tokens=120)
    assert result.texts == [" ".join(reversed(text.split())) for text in texts]
    assert len(backend.batches) > 1 and all(len(batch) < len(texts) for batch in backend.batches)


class Overlap:
    """A forward pre-hook for a model's encoder, which runs once a batch in the worker that decodes it: how many
    batches were being encoded at once, the torch threads of the worker, and whether cuDNN's attention was on."""

    def __init__(self):
        self.lock, self.running, self.seen, self.cudnn = threading.Lock(), set(), [], []

    def __call__(self, module, args, kwargs):
        import torch

        with self.lock:
            self.running.add(threading.get_ident())
            self.seen.append((len(self.running), torch.get_num_threads()))
        time.sleep(0.1)
        self.cudnn.append(torch.backends.cuda.cudnn_sdp_enabled())  # meanwhile, another worker may have ended
        time.sleep(0.2)  # long enough for another worker to start its batch meanwhile
        with self.lock:
            self.running.discard(threading.get_ident())


class LookingAheadBackend(WordBackend):
    """A WordBackend that takes every batch it is given before it gives back the first translation."""

    def translate_batches(self, batches):
        return map(self.translate, list(batches))


@pytest.mark.parametrize("backend_class", [WordBackend, LookingAheadBackend])
def test_groups_are_each_batched_alone_and_given_back_in_order(backend_class):
    """A corpus's chunks stream to the backend as one sequence of batches, but each chunk is batched as it would be
    alone, and each comes back whole and in order, blank ones included, however far ahead the backend reads."""
    groups = [corpus_lines(30), [], ["", "  "], corpus_lines(45)[7:], ["one", "two words"]]
    backend, alone = backend_class(), WordBackend()
    given_back = list(translate_groups(backend, iter(groups), max_tokens=120))
    assert [result.texts for result in given_back] == [
        translate_texts(alone, group, max_tokens=120).texts for group in groups
    ]
    assert backend.batches == alone.batches  # the same batches, none of them mixing two groups
    assert [result.target_tokens for result in given_back][1:3] == [0, 0]


def test_batches_without_a_budget_are_refused_rather_than_given_a_hidden_default():
    with pytest.raises(ValueError, match="give batch_size"):
        translate_texts(WordBackend(), ["one"])


def test_a_sentence_over_the_model_is_cut_at_punctuation_into_pieces_that_fit():
    backend = WordBackend(max_source_tokens=8)
    text = "one two three four five six , seven eight nine ten ; eleven twelve"
    result = translate_texts(backend, [text, "short one"], batch_size=2)
    assert result.cut == 1
    assert all(len(ids) <= 8 for batch in backend.batches for ids in batch)
    # cut after "," (the clauses after it fit together), each piece reversed by the backend, joined by their space
    assert result.texts[0] == ", six five four three two one twelve eleven ; ten nine eight seven"
    assert result.texts[1] == "one short"


def test_the_model_backend_decodes_without_cudnn_attention_and_leaves_the_kernels_as_they_were(
    model_and_tokenizer, monkeypatch
):
    """cuDNN's attention builds a plan for every new shape: a corpus's decoding ran 10x slower with it on an H100."""
    import torch

    model, tokenizer = model_and_tokenizer
    generate, seen = model.generate, []

    def recording(*args, **kwargs):
        seen.append((torch.backends.cuda.cudnn_sdp_enabled(), torch.backends.cuda.flash_sdp_enabled()))
        return generate(*args, **kwargs)

    monkeypatch.setattr(model, "generate", recording)
    before = torch.backends.cuda.cudnn_sdp_enabled()
    translate_texts(ModelBackend(model, tokenizer, 1, 4), ENGLISH[:2], max_tokens=40)
    assert seen and all(kernels == (False, True) for kernels in seen)
    assert torch.backends.cuda.cudnn_sdp_enabled() == before


def test_the_model_backend_gives_what_generate_gives(model_and_tokenizer):
    import torch

    model, tokenizer = model_and_tokenizer
    sentences = ENGLISH[:5]
    translations = translate_texts(ModelBackend(model, tokenizer, 1, 6), sentences, max_tokens=40).texts
    with torch.no_grad():
        for sentence, translation in zip(sentences, translations, strict=True):
            ids = model.generate(**tokenizer([sentence], return_tensors="pt"), num_beams=1, max_new_tokens=6)
            assert translation == tokenizer.decode(ids[0], skip_special_tokens=True)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
@pytest.mark.parametrize("num_beams", [2, 4])
def test_the_model_backends_beam_search_gives_generates_tokens_with_the_source_cache_once_a_sentence(
    model_and_tokenizer, num_beams, attention, monkeypatch
):
    """Beam search with the cache that holds the encoder-decoder attention's keys and values, computed once a
    sentence, and leaves them in place (model/beam_cache.py): generate()'s own tokens on a padded batch of sentences of
    different lengths; the self-attention cache is reordered at every step, the source's never. With sdpa the cache
    holds them once a sentence and the attention reads them so; with eager attention once a beam."""
    from contextlib import contextmanager

    import torch
    from transformers.cache_utils import DynamicCache

    from vanilla_transformer.model import decoding
    from vanilla_transformer.model.beam_cache import SENTENCE_BEAMS_ATTENTION, sentence_beam_cache

    model, tokenizer = model_and_tokenizer
    monkeypatch.setattr(model.config, "_attn_implementation", attention)  # the module's model gets its own back
    sentences = [ENGLISH[i] + " " + ENGLISH[(3 * i) % len(ENGLISH)] * (i % 3) for i in range(8)]
    made, moved, implementations = [], [], set()

    @contextmanager
    def recorded(*args):
        with sentence_beam_cache(*args) as cache:
            made.append(cache)
            yield cache

    monkeypatch.setattr(decoding, "sentence_beam_cache", recorded)
    reorder = DynamicCache.reorder_cache
    monkeypatch.setattr(
        DynamicCache, "reorder_cache", lambda cache, index: (moved.append(cache), reorder(cache, index))
    )
    source_rows, encodings = [], []  # the rows each encoder-decoder attention's key projection sees; encoder runs
    layers = model.get_decoder().layers
    hooks = [
        layer.encoder_attn.k_proj.register_forward_hook(lambda _, args, __: source_rows.append(len(args[0])))
        for layer in layers
    ]
    hooks.append(layers[0].register_forward_hook(lambda *_: implementations.add(model.config._attn_implementation)))
    hooks.append(model.get_encoder().register_forward_hook(lambda *_: encodings.append(True)))
    backend = ModelBackend(model, tokenizer, num_beams, 8)
    try:
        texts, _ = backend.translate(backend.encode(sentences))
    finally:
        for hook in hooks:
            hook.remove()
    assert source_rows == [len(sentences)] * len(layers)  # once, a row a sentence, not a beam
    assert encodings == [True]  # generate() encodes nothing again
    assert len(made) == 1 and len(moved) >= 7  # a reorder after every step but the last
    assert all(cache is made[0].self_attention_cache for cache in moved)
    cached_rows = {len(layer.keys) for layer in made[0].cross_attention_cache.layers}
    assert cached_rows == {len(sentences) if attention == "sdpa" else len(sentences) * num_beams}
    # generate() with the attention that reads a source once, from the first step on
    assert implementations == ({SENTENCE_BEAMS_ATTENTION} if attention == "sdpa" else {"eager"})
    assert model.config._attn_implementation == attention  # as it was after the call
    monkeypatch.setattr(decoding, "sentence_beam_cache", sentence_beam_cache)
    monkeypatch.setattr(DynamicCache, "reorder_cache", reorder)
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    with torch.no_grad():
        ids = model.generate(**batch, num_beams=num_beams, max_new_tokens=8)  # with the same attention
    assert texts == tokenizer.batch_decode(ids, skip_special_tokens=True)


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_model_backends_beam_search_takes_the_first_step_once_a_sentence(
    model_and_tokenizer, attention, monkeypatch
):
    """At the first step a sentence's beams are one row num_beams times: the backend's decoder computes it once a
    sentence, then every step on a row a beam (the tokens are generate()'s: the test above)."""
    model, tokenizer = model_and_tokenizer
    monkeypatch.setattr(model.config, "_attn_implementation", attention)
    sentences, rows = ENGLISH[:6], []
    decoder = model.get_decoder()
    hook = decoder.register_forward_pre_hook(
        lambda _, __, kwargs: rows.append(len(kwargs["input_ids"])), with_kwargs=True
    )
    backend = ModelBackend(model, tokenizer, 4, 5)
    try:
        backend.translate(backend.encode(sentences))
    finally:
        hook.remove()
    assert rows == [len(sentences)] + [len(sentences) * 4] * (len(rows) - 1) and len(rows) > 2


@pytest.mark.parametrize("attention", ["sdpa", "eager"])
def test_the_model_backend_given_two_threads_decodes_two_batches_at_once_with_one_workers_text(
    model_and_tokenizer, attention, monkeypatch
):
    """On a CPU, a backend given 2 threads decodes 2 batches at once, each in a worker of one torch thread, and gives
    the translations of one worker, in input order; torch's thread count is as it was after."""
    import torch

    model, tokenizer = model_and_tokenizer
    monkeypatch.setattr(model.config, "_attn_implementation", attention)
    sentences = [ENGLISH[i % len(ENGLISH)] + " " + ENGLISH[(5 * i) % len(ENGLISH)] * (i % 3) for i in range(23)]
    one = translate_texts(ModelBackend(model, tokenizer, 4, 6), sentences, max_tokens=120).texts
    threads, backend, watch = torch.get_num_threads(), ModelBackend(model, tokenizer, 4, 6, threads=2), Overlap()
    kernels = torch.backends.cuda.cudnn_sdp_enabled()  # the process's, not a thread's: the workers share them
    hook = model.get_encoder().register_forward_pre_hook(watch, with_kwargs=True)
    torch.set_num_threads(2)  # the tests' one thread (conftest) is what a worker takes unless set
    try:
        two = translate_texts(backend, sentences, max_tokens=120).texts
        after = [torch.get_num_threads()]
        fresh = threading.Thread(target=lambda: after.append(torch.get_num_threads()))
        fresh.start()
        fresh.join()  # a thread started after takes the caller's count, not the workers'
    finally:
        hook.remove()
        torch.set_num_threads(threads)
    assert backend.workers == 2 and len(watch.seen) > 4  # several batches
    assert max(at_once for at_once, _ in watch.seen) == 2 and {threads for _, threads in watch.seen} == {1}
    assert two == one and len(set(one)) > 3
    assert after == [2, 2] and model.config._attn_implementation == attention
    assert torch.backends.cuda.cudnn_sdp_enabled() == kernels and not any(watch.cudnn)


def test_two_workers_start_the_next_chunk_while_the_last_batch_of_one_is_decoded(model_and_tokenizer):
    """Chunks of one batch each still keep both workers busy: the next chunk's batch starts beside the last one of
    the chunk before, and each chunk comes back as it would alone."""
    model, tokenizer = model_and_tokenizer
    chunks = [ENGLISH[:3], ENGLISH[3:6], ENGLISH[6:9]]
    alone = [translate_texts(ModelBackend(model, tokenizer, 2, 5), chunk, max_tokens=400).texts for chunk in chunks]
    watch = Overlap()
    hook = model.get_encoder().register_forward_pre_hook(watch, with_kwargs=True)
    try:
        streamed = translate_groups(ModelBackend(model, tokenizer, 2, 5, threads=2), chunks, max_tokens=400)
        streamed = [result.texts for result in streamed]
    finally:
        hook.remove()
    assert len(watch.seen) == 3 and max(at_once for at_once, _ in watch.seen) == 2
    assert streamed == alone


def test_a_workers_error_reaches_the_caller_and_the_batches_waiting_are_not_decoded(model_and_tokenizer):
    import torch

    model, tokenizer = model_and_tokenizer
    backend, started = ModelBackend(model, tokenizer, 2, 4, threads=2), []
    generate = backend.generate

    def failing_second(inputs):
        started.append(len(inputs["input_ids"]))
        if len(started) == 2:
            raise RuntimeError("out of memory in batch 2")
        return generate(inputs)

    backend.generate = failing_second
    threads = torch.get_num_threads()
    with pytest.raises(RuntimeError, match="batch 2"):
        translate_texts(backend, [ENGLISH[i % len(ENGLISH)] for i in range(40)], max_tokens=24)
    assert 2 <= len(started) < 10  # of 20 batches
    assert torch.get_num_threads() == threads


def test_the_command_gives_the_model_backend_torchs_threads(folder, tmp_path, monkeypatch):
    """The command's model backend decodes with the process's threads (OMP_NUM_THREADS, default the cores), in as many
    workers as ModelBackend makes of them."""
    import torch

    made, init = [], ModelBackend.__init__

    def recorded(backend, *args, **kwargs):
        init(backend, *args, **kwargs)
        made.append(backend)

    monkeypatch.setattr(ModelBackend, "__init__", recorded)
    result = translate(folder, "--input", write_lines(tmp_path / "lines.en", corpus_lines(3)), *FAST)
    assert result.returncode == 0, result.stderr
    assert [backend.threads for backend in made] == [torch.get_num_threads()]


@pytest.fixture(scope="module")
def source_file(tmp_path_factory) -> Path:
    return write_lines(tmp_path_factory.mktemp("corpus") / "source.en", corpus_lines(120))


@pytest.fixture(scope="module")
def uninterrupted(folder, source_file, tmp_path_factory) -> bytes:
    """The output of one uninterrupted run with --buffer_size 10 (12 chunks)."""
    output = tmp_path_factory.mktemp("reference") / "out.de"
    result = translate(folder, "--input", source_file, "--output", output, "--buffer_size", 10, *FAST)
    assert result.returncode == 0, result.stderr
    assert "translated 120 lines" in result.stderr and "0 of 12 chunks resumed" in result.stderr
    assert not Path(f"{output}.partial").exists()  # removed once the output is whole
    return output.read_bytes()


def test_a_stopped_run_continues_without_translating_a_finished_chunk_again(
    folder, source_file, uninterrupted, tmp_path, monkeypatch
):
    output = tmp_path / "out.de"
    argv = [folder, "--input", source_file, "--output", output, "--buffer_size", 10, *FAST]
    taken, real_pieces, real_translate = [], corpus.pieces_of, ModelBackend.translate

    def stop_at_the_fourth_chunk(units, settings):  # a chunk is taken once the one before is recorded (1 thread)
        if len(taken) == 3:
            raise KeyboardInterrupt
        taken.append(units)
        return real_pieces(units, settings)

    sentences_given = []

    def counting(self, batch):
        sentences_given.append(len(batch))
        return real_translate(self, batch)

    monkeypatch.setattr(corpus, "pieces_of", stop_at_the_fourth_chunk)
    stopped = translate(*argv)
    assert stopped.returncode == 130 and "the same command continues" in stopped.stderr
    assert len(list(Path(f"{output}.partial").glob("chunk-*.jsonl"))) == 3 and not output.exists()

    monkeypatch.setattr(corpus, "pieces_of", real_pieces)
    monkeypatch.setattr(ModelBackend, "translate", counting)
    resumed = translate(*argv)
    assert resumed.returncode == 0, resumed.stderr
    assert "3 of 12 chunks resumed" in resumed.stderr
    assert sum(sentences_given) == 120 - 30  # the model saw only the unfinished chunks' sentences
    assert output.read_bytes() == uninterrupted


@pytest.mark.slow
@pytest.mark.parametrize(
    ("stop", "after_chunks", "threads"),
    [(signal.SIGKILL, 1, 1), (signal.SIGKILL, 7, 1), (signal.SIGTERM, 4, 1), (signal.SIGTERM, 4, 2)],
)
def test_a_killed_or_terminated_run_then_the_same_command_gives_the_uninterrupted_bytes(
    folder, source_file, uninterrupted, tmp_path, stop, after_chunks, threads
):
    """A run stopped by kill -9 or SIGTERM, then the same command: the uninterrupted run's bytes. Also with 2 threads,
    whose 2 workers are each decoding a batch when SIGTERM comes (the uninterrupted bytes are 1 thread's)."""
    output = tmp_path / "out.de"
    command = [sys.executable, "-m", "vanilla_transformer", "translate", str(folder), "--input", str(source_file)]
    command += ["--output", str(output), "--buffer_size", "10", *FAST]
    environment = {**os.environ, **OFFLINE, "OMP_NUM_THREADS": str(threads)}
    process = subprocess.Popen(command, cwd=ROOT, env=environment, stderr=subprocess.PIPE, text=True)
    partial = Path(f"{output}.partial")
    deadline = time.monotonic() + 120
    while len(list(partial.glob("chunk-*.jsonl"))) < after_chunks and process.poll() is None:
        assert time.monotonic() < deadline
        time.sleep(0.005)
    process.send_signal(stop)
    stderr = process.communicate(timeout=60)[1]
    if stop == signal.SIGTERM:
        assert process.returncode == 130 and "the same command continues" in stderr
    assert not output.exists()
    finished = len(list(partial.glob("chunk-*.jsonl")))
    assert after_chunks <= finished < 12
    resumed = subprocess.run(command, cwd=ROOT, env=environment, capture_output=True, text=True, timeout=120)
    assert resumed.returncode == 0, resumed.stderr
    assert f"{finished} of 12 chunks resumed" in resumed.stderr
    assert output.read_bytes() == uninterrupted


@pytest.mark.slow
def test_two_processes_under_accelerate_write_the_bytes_of_one(folder, source_file, uninterrupted, tmp_path):
    output = tmp_path / "out.de"
    command = [*launcher(2), "-m", "vanilla_transformer", "translate", str(folder), "--input", str(source_file)]
    command += ["--output", str(output), "--buffer_size", "10", *FAST]
    result = subprocess.run(
        command, cwd=ROOT, env={**os.environ, **OFFLINE}, capture_output=True, text=True, timeout=300
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert result.stderr.count("translated 120 lines") == 1  # the first process sums up the run
    assert output.read_bytes() == uninterrupted


@pytest.mark.slow
def test_two_machines_sharing_a_filesystem_write_the_bytes_of_one(folder, source_file, uninterrupted, tmp_path):
    """Two `accelerate launch`es on loopback, one CPU process each (configs/accelerate/multi_node_ddp.yaml), the same
    command with their --machine_rank: the first machine's process writes the one output."""
    output, port = tmp_path / "out.de", str(29900 + os.getpid() % 90)
    config = ROOT / "configs" / "accelerate" / "multi_node_ddp.yaml"
    machines = []
    for rank in (0, 1):
        command = [sys.executable, "-m", "accelerate.commands.launch", "--config_file", str(config)]
        command += ["--machine_rank", str(rank), "--main_process_ip", "127.0.0.1", "--main_process_port", port]
        command += ["--num_processes", "2", "--mixed_precision", "no", "-m", "vanilla_transformer", "translate"]
        command += [str(folder), "--input", str(source_file), "--output", str(output), "--buffer_size", "10", *FAST]
        log = open(tmp_path / f"machine{rank}.log", "w")  # noqa: SIM115 - the child keeps its own descriptor
        machines.append(
            subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT, cwd=ROOT, env={**os.environ, **OFFLINE})
        )
        log.close()
    codes = [machine.wait(timeout=300) for machine in machines]
    logs = [(tmp_path / f"machine{rank}.log").read_text() for rank in (0, 1)]
    assert codes == [0, 0], logs[0][-2000:] + logs[1][-2000:]
    assert "translated 120 lines" in logs[0] and "translated 120 lines" not in logs[1]
    assert output.read_bytes() == uninterrupted


def test_a_changed_setting_or_input_is_refused_by_name_and_overwrite_starts_again(
    folder, source_file, tmp_path, monkeypatch
):
    output = tmp_path / "out.de"
    stopped_run(folder, source_file, output, monkeypatch)
    argv = [folder, "--input", source_file, "--output", output, "--buffer_size", 10, *FAST]
    changed = translate(*argv, "--num_beams", "2")  # the last --num_beams counts
    assert changed.returncode == 1 and "--num_beams was 1, now 2" in changed.stderr and "--overwrite" in changed.stderr
    other_input = write_lines(tmp_path / "other.en", corpus_lines(121))
    changed = translate(folder, "--input", other_input, "--output", output, "--buffer_size", 10, *FAST)
    assert changed.returncode == 1
    assert f"the input {other_input} is not the one this run began with (then 120 units" in changed.stderr
    again = translate(*argv, "--overwrite")
    assert again.returncode == 0 and "0 of 12 chunks resumed" in again.stderr


def test_an_existing_output_is_replaced_only_with_overwrite(folder, source_file, tmp_path):
    output = tmp_path / "out.de"
    output.write_text("the user's file\n")
    refused = translate(folder, "--input", source_file, "--output", output, *FAST)
    assert refused.returncode == 1 and f"--output {output} exists: add --overwrite" in refused.stderr
    assert output.read_text() == "the user's file\n"
    assert translate(folder, "--input", source_file, "--output", output, "--overwrite", *FAST).returncode == 0
    assert output.read_text(encoding="utf-8").count("\n") == 120


def test_output_onto_the_file_that_stdin_reads_never_destroys_it(folder, tmp_path):
    sources = write_lines(tmp_path / "sources.txt", corpus_lines(30))
    before = sources.read_bytes()
    command = [sys.executable, "-m", "vanilla_transformer", "translate", str(folder), "--output", str(sources), *FAST]
    with open(sources, "rb") as stdin:
        result = subprocess.run(command, stdin=stdin, cwd=ROOT, env={**os.environ, **OFFLINE}, capture_output=True)
    assert result.returncode == 2 and b"is the input file" in result.stderr
    assert sources.read_bytes() == before


def test_a_hard_link_to_the_input_is_the_input(tmp_path, capsys):
    sources = write_lines(tmp_path / "sources.txt", ["the red dog"])
    os.link(sources, tmp_path / "link.txt")
    with pytest.raises(SystemExit):
        main(["model", "--input", str(sources), "--output", str(tmp_path / "link.txt")])
    assert "is the input file" in capsys.readouterr().err


def test_a_line_over_max_line_bytes_is_named_before_it_is_read_whole(folder, tmp_path):
    huge = tmp_path / "huge.txt"
    huge.write_bytes(b"the red dog\n" + b"the red dog " * 200_000 + b"\nthe end\n")
    result = translate(folder, "--input", huge, "--output", tmp_path / "out.txt", *FAST)
    assert result.returncode == 1
    assert f"line 2 of {huge} is over 1,048,576 bytes" in result.stderr and "--max_line_bytes" in result.stderr


def long_sentence(tokenizer, tokens: int) -> str:
    words = []
    while len(tokenizer(" ".join(words))["input_ids"]) < tokens:
        words += ["the", "red", "dog", "sees", "a", "small", "cat", ","] * 50
    return " ".join(words)


def test_a_document_keeps_its_paragraphs_blank_lines_and_scripts(folder, model_and_tokenizer, tmp_path):
    _, tokenizer = model_and_tokenizer
    document = [
        "The house is small. The cat sleeps on the warm mat.",
        "A dog runs through the green park.",
        "",
        "",
        long_sentence(tokenizer, 3000) + ".",
        "",
        "これはペンです。あれは本です。",
        "",
        "Собака бежит. Кошка спит.",
        "مرحبا بالعالم. كيف حالك؟",
    ]
    source, output = write_lines(tmp_path / "book.txt", document), tmp_path / "book.de"
    result = translate(folder, "--input", source, "--output", output, "--split_sentences", "--paragraphs", *FAST)
    assert result.returncode == 0, result.stderr
    lines = output.read_text(encoding="utf-8").split("\n")
    assert lines[-1] == "" and len(lines) - 1 == 8  # 4 paragraphs and 4 blank lines, one line each
    assert [line == "" for line in lines[:-1]] == [False, True, True, False, True, False, True, False]
    assert "1 sentence(s) over the model's length cut into pieces" in result.stderr
    assert "(10 sentences," in result.stderr  # 3 + 1 + 2 + 4: the paragraphs' sentences, Japanese included


def dataset_file(tmp_path: Path, suffix: str) -> Path:
    import datasets

    rows = datasets.Dataset.from_dict({"id": list(range(30)), "text": corpus_lines(30)})
    path = tmp_path / f"rows{suffix}"
    rows.to_parquet(str(path)) if suffix == ".parquet" else rows.to_json(str(path), lines=True)
    return path


@pytest.mark.parametrize(
    ("suffix", "output_name", "streaming"),
    [(".parquet", "out.jsonl", False), (".parquet", "out.parquet", True), (".jsonl", "out_folder", False)],
)
def test_a_dataset_gets_a_translation_column_as_text_lines_would(folder, tmp_path, suffix, output_name, streaming):
    import datasets

    data, output = dataset_file(tmp_path, suffix), tmp_path / output_name
    flags = ["--streaming"] if streaming else []
    result = translate(folder, "--data_files", data, "--column", "text", "--output", output, *flags, *FAST)
    assert result.returncode == 0, result.stderr
    assert "translated 30 rows" in result.stderr
    text_output = tmp_path / "lines.de"
    lines = write_lines(tmp_path / "lines.en", corpus_lines(30))
    assert translate(folder, "--input", lines, "--output", text_output, *FAST).returncode == 0
    if output.suffix == ".jsonl":
        rows = [json.loads(line) for line in output.read_text(encoding="utf-8").splitlines()]
    elif output.suffix == ".parquet":
        rows = datasets.Dataset.from_parquet(str(output)).to_list()
    else:
        rows = datasets.load_from_disk(str(output)).to_list()
    assert [row["id"] for row in rows] == list(range(30)) and [row["text"] for row in rows] == corpus_lines(30)
    assert [row["translation"] for row in rows] == text_output.read_text(encoding="utf-8").splitlines()


def test_a_dataset_named_by_its_folder_reads_as_its_files(folder, tmp_path):
    """--dataset_name takes what `datasets.load_dataset` takes: a Hub name in the local cache, or a local folder."""
    data = tmp_path / "dataset"
    data.mkdir()
    dataset_file(data, ".parquet")
    by_name = translate(folder, "--dataset_name", data, "--column", "text", "--output", tmp_path / "a.jsonl", *FAST)
    by_files = translate(
        folder, "--data_files", data / "rows.parquet", "--column", "text", "--output", tmp_path / "b.jsonl", *FAST
    )
    assert by_name.returncode == 0 == by_files.returncode, by_name.stderr + by_files.stderr
    assert (tmp_path / "a.jsonl").read_bytes() == (tmp_path / "b.jsonl").read_bytes()


def test_a_dataset_without_the_column_is_named(folder, tmp_path):
    data = dataset_file(tmp_path, ".parquet")
    result = translate(folder, "--data_files", data, "--column", "sentence", "--output", tmp_path / "o.jsonl", *FAST)
    assert result.returncode == 1 and "--column sentence: the dataset" in result.stderr and "id, text" in result.stderr


def test_the_ctranslate2_backend_gives_what_its_own_translate_batch_gives(folder, tmp_path):
    pytest.importorskip("ctranslate2")
    import ctranslate2

    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2
    from vanilla_transformer.data.tokenization import load_tokenizer
    from vanilla_transformer.serving.ctranslate2_backend import CTranslate2Backend

    export = convert_to_ctranslate2(folder, tmp_path / "ct2")
    tokenizer = load_tokenizer(folder)
    backend = CTranslate2Backend(folder, tokenizer, export, num_beams=2, max_new_tokens=6)
    sentences = ENGLISH[:6]
    ours = translate_texts(backend, sentences, max_tokens=60).texts
    translator = ctranslate2.Translator(str(export), intra_threads=1)
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(sentence)["input_ids"]) for sentence in sentences]
    results = translator.translate_batch(
        tokens, beam_size=2, max_decoding_length=6, length_penalty=0.6, max_input_length=0
    )
    theirs = [
        tokenizer.decode(tokenizer.convert_tokens_to_ids(result.hypotheses[0]), skip_special_tokens=True)
        for result in results
    ]
    assert ours == theirs and len(set(ours)) > 1


def test_the_ctranslate2_backend_in_int8_splits_each_batch_between_one_thread_workers_in_order(folder, tmp_path):
    """In int8 on a CPU, `threads` one-thread workers each decode every `threads`-th sentence of a batch: the same
    translations, in the same order, as one worker given the whole batch."""
    pytest.importorskip("ctranslate2")
    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2
    from vanilla_transformer.data.tokenization import load_tokenizer
    from vanilla_transformer.serving.ctranslate2_backend import CTranslate2Backend

    export, tokenizer = convert_to_ctranslate2(folder, tmp_path / "ct2"), load_tokenizer(folder)
    backends = [
        CTranslate2Backend(folder, tokenizer, export, compute_type="int8", threads=threads, num_beams=2)
        for threads in (1, 3)
    ]
    assert [backend.workers for backend in backends] == [1, 3]
    float32 = CTranslate2Backend(folder, tokenizer, export, compute_type="float32", threads=3)
    assert float32.workers == 1  # no gain in float32, and a loss with MKL_NUM_THREADS set (the backend's docstring)
    sentences = [ENGLISH[i % len(ENGLISH)] + " " + ENGLISH[(5 * i) % len(ENGLISH)] * (i % 3) for i in range(11)]
    one, three = (translate_texts(backend, sentences, max_tokens=10_000).texts for backend in backends)
    assert one == three and len(set(one)) > 3


def test_the_ctranslate2_backend_leaves_torchs_thread_count_as_it_was(folder, tmp_path):
    """CTranslate2 sets its threads in the OpenMP runtime it shares with torch; the caller's torch keeps its own."""
    pytest.importorskip("ctranslate2")
    import torch

    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2
    from vanilla_transformer.data.tokenization import load_tokenizer
    from vanilla_transformer.serving.ctranslate2_backend import CTranslate2Backend

    threads = torch.get_num_threads()
    backend = CTranslate2Backend(
        folder, load_tokenizer(folder), convert_to_ctranslate2(folder, tmp_path / "ct2"), threads=threads + 1
    )
    assert torch.get_num_threads() == threads
    assert len(translate_texts(backend, ENGLISH[:2], max_tokens=60).texts) == 2
    assert torch.get_num_threads() == threads


def test_the_command_keeps_freed_memory_for_decoding(folder, tmp_path, monkeypatch):
    """Decoding's large tensors reuse freed memory (tests/test_memory.py): the command asks for it itself."""
    asked = []
    monkeypatch.setattr(translate_command, "keep_freed_memory", lambda: asked.append(True))
    result = translate(folder, "--input", write_lines(tmp_path / "lines.en", corpus_lines(3)), *FAST)
    assert result.returncode == 0, result.stderr
    assert asked == [True] and len(result.stdout.splitlines()) == 3


@pytest.mark.slow
def test_the_ctranslate2_backend_is_made_once_beside_the_folder_and_runs_the_command(folder, tmp_path):
    pytest.importorskip("ctranslate2")
    import shutil

    model = shutil.copytree(folder, tmp_path / "model")
    lines = write_lines(tmp_path / "lines.en", corpus_lines(20))
    for run in range(2):
        output = tmp_path / f"out{run}.de"
        result = translate(model, "--input", lines, "--output", output, "--backend", "ctranslate2", *FAST)
        assert result.returncode == 0, result.stderr
    exports = list(tmp_path.glob("model.ctranslate2-*"))
    assert len(exports) == 1 and (exports[0] / "model.bin").is_file()
    assert (tmp_path / "out0.de").read_bytes() == (tmp_path / "out1.de").read_bytes()
    assert len((tmp_path / "out0.de").read_text(encoding="utf-8").splitlines()) == 20


def test_the_ctranslate2_backend_translates_stdin_to_stdout_as_to_a_file(folder, tmp_path, monkeypatch):
    pytest.importorskip("ctranslate2")
    import io
    import shutil

    model = shutil.copytree(folder, tmp_path / "model")
    lines = write_lines(tmp_path / "lines.en", corpus_lines(12))
    to_file = translate(model, "--input", lines, "--output", tmp_path / "out.de", "--backend", "ctranslate2", *FAST)
    assert to_file.returncode == 0, to_file.stderr
    monkeypatch.setattr(sys, "stdin", io.StringIO(lines.read_text(encoding="utf-8")))
    to_stdout = translate(model, "--backend", "ctranslate2", *FAST)
    assert to_stdout.returncode == 0, to_stdout.stderr
    assert to_stdout.stdout == (tmp_path / "out.de").read_text(encoding="utf-8")


class Terminal:
    """stderr as a terminal shows it."""

    def __init__(self):
        import io

        self.buffer = io.StringIO()

    def write(self, text):
        return self.buffer.write(text)

    def flush(self):
        pass

    def isatty(self):
        return True


def test_progress_is_a_bar_on_a_terminal_and_timed_lines_elsewhere(folder, source_file, tmp_path, monkeypatch):
    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    argv = [folder, "--input", source_file, "--buffer_size", 10, *FAST]
    assert main([str(arg) for arg in [*argv, "--output", tmp_path / "a.de"]]) == 0
    shown = terminal.buffer.getvalue()
    assert "translating: 100%" in shown and "120/120" in shown and "target tok/s" in shown
    monkeypatch.undo()
    logged = translate(*argv, "--output", tmp_path / "b.de", "--log_every", "0.000001")
    lines = [line for line in logged.stderr.splitlines() if line.startswith("translated ") and "lines/s" in line]
    assert len(lines) >= 10 and "/120 (" in lines[0] and "left" in lines[0] and "translating:" not in logged.stderr
    assert logged.stderr.strip().splitlines()[-1].startswith("translated 120 lines (120 sentences,")


@pytest.mark.slow
@pytest.mark.parametrize("source", ["/dev/zero", "nul-file"])
def test_an_endless_or_huge_line_is_refused_within_a_bounded_address_space(folder, tmp_path, source):
    """`--input /dev/zero` (one line that never ends) and a 64 MiB file of NULs: the command refuses the line after
    --max_line_bytes, in a process whose address space is its own at start plus 1 GiB (reading the line whole would
    raise MemoryError there instead)."""
    if source == "nul-file":
        source = tmp_path / "nul.txt"
        with open(source, "wb") as file:
            file.truncate(64 * 2**20)
    code = (
        "import resource, sys\n"
        "from vanilla_transformer.commands.translate import main\n"
        "size = int(open('/proc/self/statm').read().split()[0]) * resource.getpagesize()\n"
        "resource.setrlimit(resource.RLIMIT_AS, (size + 2**30, resource.getrlimit(resource.RLIMIT_AS)[1]))\n"
        f"sys.exit(main([{str(folder)!r}, '--input', {str(source)!r}, '--output', {str(tmp_path / 'out.txt')!r}, "
        "'--num_beams', '1', '--max_new_tokens', '4', '--device', 'cpu']))"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=300, env={**os.environ, **OFFLINE}
    )
    assert result.returncode == 1, result.stderr[-2000:]
    assert "line 1 of" in result.stderr and "is over 1,048,576 bytes" in result.stderr
    assert "MemoryError" not in result.stderr
