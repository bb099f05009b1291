"""Shared test helpers: plain functions and constants that test modules import (`from .helpers import ...`); the
fixtures are in conftest.py. A tiny config and model (as transformers' own model testers use), the training script run
in this process or a new one, code run without the project, a saved model folder, checkpoints and prepared folders as
our code writes them, a small corpus."""

import contextlib
import hashlib
import io
import json
import logging
import os
import signal
import socket
import subprocess
import sys
import textwrap
import time
import traceback
import warnings
from pathlib import Path

import torch
from accelerate.state import AcceleratorState
from safetensors.torch import save_file

import train_accelerate
from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.data.tokenization import train_shared_tokenizer
from vanilla_transformer.hub.model_folder import save_model_folder
from vanilla_transformer.training import checkpoint_folders

TINY = dict(
    vocab_size=61,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=32,
)


# --- the training script ----------------------------------------------------------------------


ROOT = Path(__file__).resolve().parents[1]
TINY_RUN = (
    "--synthetic_pairs 400 --d_model 32 --ffn_dim 64 --layers 1 --heads 2 --vocab_size 300 --max_tokens 600 "
    "--warmup_steps 10 --eval_steps 1000 --logging_steps 1 --eval_batch_size 16 --num_beams 2"
).split()


def train(output_dir, *arguments, processes: int = 1, timeout: int = 300, check: bool = True, fresh: bool = False):
    """The training script on a tiny run; a CompletedProcess. One process runs in this one (`run_in_this_process`:
    the same `main` as the command, without a new interpreter's 4-5 s of imports and exit); several, or `fresh`, in
    a new interpreter (through `accelerate launch` for several processes)."""
    arguments = ["--output_dir", str(output_dir), *TINY_RUN, *map(str, arguments)]
    if processes == 1 and not fresh:
        result = run_in_this_process(train_accelerate.main, arguments)
    else:
        result = subprocess.run(
            [*launcher(processes), str(ROOT / "train_accelerate.py"), *arguments],
            capture_output=True,
            text=True,
            timeout=timeout,
            cwd=ROOT,
            env={**os.environ, **OFFLINE},
        )
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


# what every process a test starts runs with: never the network, one thread (2 cores shared by 2 test workers)
OFFLINE = {"HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}


def launcher(processes: int) -> list[str]:
    if processes == 1:
        return [sys.executable]
    # `--cpu` would run ONE process whatever --num_processes says (accelerate 1.x); without GPUs,
    # `--multi_gpu` starts torchrun and Accelerate falls back to CPU processes with the gloo backend.
    port = str(29500 + os.getpid() % 1000)
    one_machine = "--num_machines 1 --mixed_precision no --dynamo_backend no".split()
    command = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"]
    return [*command, "--num_processes", str(processes), *one_machine, "--main_process_port", port]


def run_in_this_process(main, argv: list[str]) -> subprocess.CompletedProcess:
    """A command's `main(argv)` run here as a subprocess would run it: its exit status, and what it wrote to stdout
    and stderr (prints, progress bars, warnings and the libraries' log lines, an uncaught error's traceback). The
    accelerator's state and the signal handlers it set are reset afterwards."""
    stdout, stderr = io.StringIO(), io.StringIO()
    handlers = signal.getsignal(signal.SIGINT), signal.getsignal(signal.SIGTERM)
    previous = {handler: handler.setStream(stderr) for handler in stream_handlers()}
    try:
        with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(stderr), warnings.catch_warnings():
            warnings.simplefilter("default")  # as a fresh interpreter shows them: once per place
            try:
                returncode = main(argv) or 0
            except SystemExit as exit:
                returncode = exit.code if isinstance(exit.code, int) else 1
                if isinstance(exit.code, str):
                    print(exit.code, file=sys.stderr)
            except Exception:  # noqa: BLE001 - as the interpreter reports an uncaught error
                traceback.print_exc()
                returncode = 1
    finally:
        for handler, stream in previous.items():
            handler.setStream(stream)
        AcceleratorState._reset_state(reset_partial_state=True)
        signal.signal(signal.SIGINT, handlers[0])
        signal.signal(signal.SIGTERM, handlers[1])
    return subprocess.CompletedProcess(argv, returncode, stdout.getvalue(), stderr.getvalue())


def stream_handlers() -> list[logging.StreamHandler]:
    """The log handlers that hold a stream of their own (the libraries' handlers to stderr, bound when created)."""
    loggers = [logging.getLogger(), *(logging.getLogger(name) for name in list(logging.root.manager.loggerDict))]
    handlers = dict.fromkeys(handler for logger in loggers for handler in getattr(logger, "handlers", []))
    return [
        handler
        for handler in handlers
        if isinstance(handler, logging.StreamHandler)
        and not isinstance(handler, logging.FileHandler)
        and not isinstance(getattr(type(handler), "stream", None), property)  # logging's last resort: sys.stderr
    ]


# A run whose only regular checkpoint is its last step's (averaged alone): a stop checkpoint at any earlier step that
# were pruned, counted or averaged like a regular one would change its final weights.
SIGNALLED_RUN = ("--max_steps", "40", "--save_steps", "1000", "--save_total_limit", "0", "--average_last", "3")


def train_until_signalled(output_dir, *arguments, signals=(signal.SIGTERM,), after_steps: int = 3):
    """Run the training script in a subprocess and send it `signals` (0.1 s apart) once it has logged `after_steps`
    steps; returns the step it stopped at (its newest checkpoint's) and its output. It must exit 0 (a stop)."""
    command = [sys.executable, str(ROOT / "train_accelerate.py"), "--output_dir", str(output_dir), *TINY_RUN]
    environment = {**os.environ, **OFFLINE}
    process = subprocess.Popen(
        [*command, *arguments], cwd=ROOT, env=environment, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True
    )
    log, deadline = Path(output_dir) / "train_log.jsonl", time.time() + 120
    while time.time() < deadline and (not log.is_file() or len(log.read_text().splitlines()) < after_steps):
        time.sleep(0.05)
    for number in signals:
        process.send_signal(number)
        time.sleep(0.1)
    output, _ = process.communicate(timeout=120)
    assert process.returncode == 0 and "[stop] a stop signal" in output, output[-3000:]
    return checkpoint_folders.checkpoint_step(
        checkpoint_folders.latest_checkpoint(Path(output_dir) / "checkpoints")
    ), output


def logged_losses(output_dir) -> dict[int, float]:
    lines = (Path(output_dir) / "train_log.jsonl").read_text().splitlines()
    return {record["step"]: record["loss"] for record in map(json.loads, lines)}


# Makes the project's own modules unimportable, as on a machine that only has the saved folder.
BLOCK_PROJECT_IMPORTS = textwrap.dedent(
    """
    import sys
    BLOCKED = {"configuration_vanilla_transformer", "modeling_vanilla_transformer",
               "pipeline_vanilla_transformer", "generate_vanilla_transformer", "vanilla_transformer",
               "train_accelerate"}
    class BlockProject:
        @staticmethod
        def find_spec(name, path=None, target=None):
            if name.split(".")[0] in BLOCKED:
                raise ImportError(f"{name} is blocked: a Hub user does not have this project installed")
    sys.meta_path.insert(0, BlockProject)
    """
)


def run_without_the_project(code: str, cwd) -> str:
    """Run `code` in a fresh Python process that cannot import this project; return its stdout."""
    result = subprocess.run(
        [sys.executable, "-c", BLOCK_PROJECT_IMPORTS + textwrap.dedent(code)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=300,
        env={**OFFLINE, "PATH": "/usr/bin:/bin", "HOME": str(cwd), "OMP_NUM_THREADS": "1"},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    return result.stdout


ENGLISH = [
    "the house is small",
    "the cat sleeps on the warm mat",
    "a dog runs through the green park",
    "my sister reads a long book",
    "we eat bread and cheese",
    "the children play in the garden",
    "the old man walks to the station",
    "she drinks coffee every morning",
    "the train is late again",
    "two birds sing in the tree",
    "he opens the window",
    "the river flows into the sea",
    "they build a new bridge",
    "the teacher writes on the board",
    "a woman sells flowers at the market",
]
GERMAN = [
    "das haus ist klein",
    "die katze schläft auf der warmen matte",
    "ein hund läuft durch den grünen park",
    "meine schwester liest ein langes buch",
    "wir essen brot und käse",
    "die kinder spielen im garten",
    "der alte mann geht zum bahnhof",
    "sie trinkt jeden morgen kaffee",
    "der zug hat wieder verspätung",
    "zwei vögel singen im baum",
    "er öffnet das fenster",
    "der fluss fließt ins meer",
    "sie bauen eine neue brücke",
    "der lehrer schreibt an die tafel",
    "eine frau verkauft blumen auf dem markt",
]
CARD_VALUES = {"source_lang": "en", "target_lang": "de", "dataset": "wmt14", "test_bleu": 27.3, "test_chrf": 55.1}


def train_tiny_tokenizer():
    return train_shared_tokenizer(ENGLISH + GERMAN, vocab_size=300)


def random_tiny_model(vocab_size: int, **overrides) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(0)
    sizes = {**TINY, "max_position_embeddings": 64}
    del sizes["vocab_size"]
    return VanillaTransformerForConditionalGeneration(
        VanillaTransformerConfig(vocab_size=vocab_size, **{**sizes, **overrides})
    ).eval()


def save_tiny_model_folder(folder: Path, card_values: dict | None = None, **model_overrides) -> Path:
    """A complete saved folder (save_model_folder) of a random tiny model with a tokenizer trained on 30 sentences."""
    tokenizer = train_tiny_tokenizer()
    return save_model_folder(random_tiny_model(len(tokenizer), **model_overrides), tokenizer, folder, card_values)


def random_ids(config, shape, seed=0):
    return torch.randint(4, config.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


SOURCES = [f"the {adjective} dog number {i} sees a cat" for i, adjective in enumerate(["red", "small", "old"] * 20)]
TARGETS = [
    f"ter {adjective} hunt nummer {i} sihet aine katse" for i, adjective in enumerate(["rod", "klin", "alt"] * 20)
]


def digest(path: Path) -> str:
    return hashlib.sha256(path.read_bytes()).hexdigest()


def snapshot(folder: Path) -> dict[str, str]:
    """Every file under `folder` with its sha256."""
    return {str(path.relative_to(folder)): digest(path) for path in sorted(folder.rglob("*")) if path.is_file()}


def fake_checkpoint(root: Path, step: int, run_id: str | None, stop: bool = False) -> Path:
    """A finalized checkpoint folder of run `run_id` at `step`: weights and a trainer state, no optimizer; `stop`:
    saved because a signal stopped the run."""
    staging = checkpoint_folders.staging_dir(root, step)
    staging.mkdir(parents=True)
    save_file({"weight": torch.full((2,), float(step))}, str(staging / checkpoint_folders.WEIGHTS_NAME))
    state = {"run_id": run_id, "step": step, **({"stop": True} if stop else {})}
    (staging / checkpoint_folders.TRAINER_STATE).write_text(json.dumps(state))
    return checkpoint_folders.finalize_checkpoint(staging, checkpoint_folders.checkpoint_dir(root, step))


def prepared_folder(corpus_dir: Path, output: Path) -> Path:
    """A folder written by the prepare command from the test corpus (the corpus_dir fixture)."""
    from vanilla_transformer.commands import prepare as prepare_command  # the commands: only where a test needs them

    prepare_command.main(
        [
            "--data_dir",
            str(corpus_dir),
            "--validation_split",
            "val",
            "--vocab_size",
            "300",
            "--output_dir",
            str(output),
        ]
    )
    return output


def model_with_attention(attn_implementation: str, **overrides) -> VanillaTransformerForConditionalGeneration:
    """A fresh tiny model; its own config, since `_from_config` writes the implementation into the config."""
    torch.manual_seed(0)
    config = VanillaTransformerConfig(**{**TINY, **overrides})
    return VanillaTransformerForConditionalGeneration._from_config(
        config, attn_implementation=attn_implementation
    ).eval()


def free_port() -> int:
    """A loopback port nothing listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


# --- translate ------------------------------------------------------------------------------------

FAST = ["--num_beams", "1", "--max_new_tokens", "4", "--device", "cpu"]  # decoding that takes no time


def corpus_lines(count: int) -> list[str]:
    return [f"{ENGLISH[i % len(ENGLISH)]} {ENGLISH[(7 * i) % len(ENGLISH)]}" for i in range(count)]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("".join(line + "\n" for line in lines), encoding="utf-8")
    return path


def translate(*argv) -> subprocess.CompletedProcess:
    """The translate command, run in this process (`run_in_this_process`)."""
    from vanilla_transformer.commands.translate import main

    return run_in_this_process(main, [str(arg) for arg in argv])


def stopped_run(folder, source_file, output, monkeypatch, *flags) -> None:
    """A run of `source_file` into `output` stopped after its first chunk (Ctrl-C)."""
    from vanilla_transformer.serving import corpus

    real = corpus.pieces_of
    calls = []

    def stop_at_the_second_chunk(*args):
        if calls:
            raise KeyboardInterrupt
        calls.append(1)
        return real(*args)

    monkeypatch.setattr(corpus, "pieces_of", stop_at_the_second_chunk)
    result = translate(folder, "--input", source_file, "--output", output, "--buffer_size", 10, *FAST, *flags)
    assert result.returncode == 130, result.stderr
    monkeypatch.setattr(corpus, "pieces_of", real)


# --- serve ----------------------------------------------------------------------------------------


class Served:
    """A `vanilla-transformer serve` process on 127.0.0.1: its URL, and its stderr lines as they come."""

    def __init__(self, folder, *flags):
        import threading

        argv = [sys.executable, "-m", "vanilla_transformer", "serve", str(folder), "--port", "0"]
        argv += ["--languages", "en-de", *map(str, flags)]
        self.process = subprocess.Popen(
            argv, stderr=subprocess.PIPE, text=True, cwd=ROOT, env={**os.environ, **OFFLINE}
        )
        self.log, self.url = [], None
        for line in self.process.stderr:
            self.log.append(line)
            if line.startswith("serving "):
                self.url = line.split(" on ")[1].split()[0]
                break
        if self.url is None:
            raise RuntimeError("the server did not start:\n" + "".join(self.log))
        threading.Thread(target=lambda: self.log.extend(self.process.stderr), daemon=True).start()

    def request(self, path: str, body=None, headers: dict | None = None, method: str | None = None, timeout=60):
        """(status, headers, the JSON answer or the text) of one request; a dict body is sent as JSON."""
        import urllib.error
        import urllib.request

        headers = dict(headers or {})
        if isinstance(body, dict | list):
            body, headers["Content-Type"] = json.dumps(body).encode(), "application/json"
        request = urllib.request.Request(self.url + path, data=body, headers=headers, method=method)
        try:
            with urllib.request.urlopen(request, timeout=timeout) as response:
                status, answer, got = response.status, response.read(), dict(response.headers)
        except urllib.error.HTTPError as error:
            status, answer, got = error.code, error.read(), dict(error.headers)
        try:
            return status, got, json.loads(answer)
        except ValueError:
            return status, got, answer.decode("utf-8", "replace")

    def metric(self, name: str) -> float:
        """The sum of a Prometheus series' values (all its labels)."""
        _, _, text = self.request("/metrics")
        return sum(float(line.split()[-1]) for line in text.splitlines() if line.startswith(name))

    def stop(self) -> int:
        if self.process.poll() is None:
            self.process.terminate()
        return self.process.wait(timeout=60)


def headless_chromium(flags, reason_extra: str, browser_log: bool = False):
    """Debian's Chromium through selenium with `flags`, or the test skipped naming what is missing (`reason_extra`:
    the extra that brings selenium). `browser_log`: keep the page's console for the test to read."""
    import shutil

    import pytest

    chromium, chromedriver = shutil.which("chromium") or shutil.which("chromium-browser"), shutil.which("chromedriver")
    if not (chromium and chromedriver):
        pytest.skip("no Chromium: apt-get install chromium chromium-driver (Debian's browser and its driver)")
    webdriver = pytest.importorskip(
        "selenium.webdriver", reason=f"the browser test needs selenium: pip install -e '.[{reason_extra}]'"
    )
    from selenium.webdriver.chrome.service import Service

    options = webdriver.ChromeOptions()
    options.binary_location = chromium
    for flag in flags:
        options.add_argument(flag)
    if browser_log:
        options.set_capability("goog:loggingPrefs", {"browser": "ALL"})
    return webdriver.Chrome(options=options, service=Service(chromedriver))
