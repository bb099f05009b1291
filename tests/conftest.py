"""Shared fixtures and helpers: a tiny config and model (as transformers' own model testers use), the training script
run in a subprocess, a saved model folder, a small line-aligned corpus. Test files import helpers from here
(`from .conftest import ...`); fixtures need no import."""

import gzip
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer import hub
from vanilla_transformer.tokenization import train_shared_tokenizer

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


@pytest.fixture(autouse=True, scope="session")
def private_hf_home(tmp_path_factory):
    """Training runs in subprocesses cache their prepared corpora under $HF_HOME: keep them out of the user's cache."""
    previous = os.environ.get("HF_HOME")
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("hf_home"))
    yield
    if previous is None:
        del os.environ["HF_HOME"]
    else:
        os.environ["HF_HOME"] = previous


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tiny models run fastest on one thread: on a shared 2-core CPU, several threads mostly wait for each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_config() -> VanillaTransformerConfig:
    return VanillaTransformerConfig(**TINY)


@pytest.fixture
def tiny_model(tiny_config) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(0)
    return VanillaTransformerForConditionalGeneration(tiny_config).eval()


@pytest.fixture(scope="session")
def memorising_model():
    """A tiny model trained in the test to translate four sources into their reverses (then </s>). Each next token
    depends on the position and the tokens decoded before it, so decoding without the past (a dropped cache, or one
    rebuilt every step) gives other tokens: a random model, which repeats one token, cannot tell the difference.
    Returns the model, the sources (4, 7) and the memorised targets (4, 8)."""
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**TINY, dropout=0.0))
    sources = torch.randint(4, TINY["vocab_size"], (4, 7), generator=torch.Generator().manual_seed(3))
    targets = torch.cat([sources.flip(1), torch.full((4, 1), model.config.eos_token_id)], dim=1)
    optimizer = torch.optim.Adam(model.parameters(), lr=3e-3)
    for _ in range(600):
        output = model(input_ids=sources, labels=targets)
        if torch.equal(output.logits.argmax(-1), targets) and output.loss < 0.05:
            break
        output.loss.backward()
        optimizer.step()
        optimizer.zero_grad()
    else:
        raise AssertionError("the tiny model did not memorise its four pairs")
    return model.eval(), sources, targets


@pytest.fixture
def source_batch(tiny_config):
    """Two right-padded source sentences: the second has 3 padding positions."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, tiny_config.vocab_size, (2, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 6:] = tiny_config.pad_token_id
    attention_mask[1, 6:] = 0
    return input_ids, attention_mask


@pytest.fixture(scope="session")
def memorising_folder(memorising_model, tmp_path_factory):
    """The memorising model saved as a Hub-ready folder, with a word-level tokenizer that spells token i as "w{i}":
    its four sources read as sentences ("w40 w7 ..."), and the page or the API must give back their reverses. It
    decodes greedily by default (generation_config.json): beam search with a length penalty may end one of the
    memorised sentences a word early. Returns the folder, the four source sentences and their four translations."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from vanilla_transformer.hub import save_model_folder
    from vanilla_transformer.tokenization import SPECIAL_TOKENS

    model, sources, targets = memorising_model
    vocab = {token: index for index, token in enumerate(SPECIAL_TOKENS)}
    vocab.update({f"w{index}": index for index in range(len(SPECIAL_TOKENS), model.config.vocab_size)})
    backend = Tokenizer(models.WordLevel(vocab, unk_token="<unk>"))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    card_values = {"source_lang": "en", "target_lang": "de", "data": "four memorised pairs"}
    folder = tmp_path_factory.mktemp("memorising") / "model"
    save_model_folder(model, tokenizer, folder, card_values, decoding={"num_beams": 1})
    spell = lambda ids: " ".join(f"w{index}" for index in ids if index != model.config.eos_token_id)  # noqa: E731
    return folder, [spell(row.tolist()) for row in sources], [spell(row.tolist()) for row in targets]


# --- the training script in a subprocess ----------------------------------------------------------------------


ROOT = Path(__file__).resolve().parents[1]
TINY_RUN = (
    "--synthetic_pairs 400 --d_model 32 --ffn_dim 64 --layers 1 --heads 2 --vocab_size 300 --max_tokens 600 "
    "--warmup_steps 10 --eval_steps 1000 --logging_steps 1 --eval_batch_size 16 --num_beams 2"
).split()


def train(output_dir, *arguments, processes: int = 1, timeout: int = 300, check: bool = True):
    """Run the training script in a subprocess (through `accelerate launch` for several processes)."""
    if processes > 1:
        # `--cpu` would run ONE process whatever --num_processes says (accelerate 1.x); without GPUs,
        # `--multi_gpu` starts torchrun and Accelerate falls back to CPU processes with the gloo backend.
        port = str(29500 + os.getpid() % 1000)
        one_machine = "--num_machines 1 --mixed_precision no --dynamo_backend no".split()
        launcher = [sys.executable, "-m", "accelerate.commands.launch", "--multi_gpu"]
        launcher += ["--num_processes", str(processes), *one_machine, "--main_process_port", port]
    else:
        launcher = [sys.executable]
    command = [*launcher, str(ROOT / "train_accelerate.py"), "--output_dir", str(output_dir), *TINY_RUN, *arguments]
    environment = {**os.environ, "HF_HUB_OFFLINE": "1", "OMP_NUM_THREADS": "1", "TOKENIZERS_PARALLELISM": "false"}
    result = subprocess.run(command, capture_output=True, text=True, timeout=timeout, cwd=ROOT, env=environment)
    if check:
        assert result.returncode == 0, result.stdout[-2000:] + result.stderr[-4000:]
    return result


def logged_losses(output_dir) -> dict[int, float]:
    lines = (Path(output_dir) / "train_log.jsonl").read_text().splitlines()
    return {record["step"]: record["loss"] for record in map(json.loads, lines)}


# Makes the project's own modules unimportable, as on a machine that only has the saved folder.
BLOCK_PROJECT_IMPORTS = textwrap.dedent(
    """
    import sys
    BLOCKED = {"configuration_vanilla_transformer", "modeling_vanilla_transformer",
               "pipeline_vanilla_transformer", "fast_paths_vanilla_transformer", "vanilla_transformer",
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
        env={"HF_HUB_OFFLINE": "1", "PATH": "/usr/bin:/bin", "HOME": str(cwd), "OMP_NUM_THREADS": "1"},
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
    return hub.save_model_folder(random_tiny_model(len(tokenizer), **model_overrides), tokenizer, folder, card_values)


def random_ids(config, shape, seed=0):
    return torch.randint(4, config.vocab_size, shape, generator=torch.Generator().manual_seed(seed))


SOURCES = [f"the {adjective} dog number {i} sees a cat" for i, adjective in enumerate(["red", "small", "old"] * 20)]
TARGETS = [
    f"ter {adjective} hunt nummer {i} sihet aine katse" for i, adjective in enumerate(["rod", "klin", "alt"] * 20)
]


@pytest.fixture
def corpus_dir(tmp_path):
    """Line-aligned files: gzipped train with an empty line and an over-long pair, plain validation."""
    folder = tmp_path / "corpus"
    folder.mkdir()
    long_source, long_target = " ".join(["word"] * 80), "kurz"
    train_en = [*SOURCES[:30], "", long_source, *SOURCES[30:]]
    train_de = [*TARGETS[:30], "leer", long_target, *TARGETS[30:]]
    (folder / "train.en.gz").write_bytes(gzip.compress(("\n".join(train_en) + "\n").encode()))
    (folder / "train.de.gz").write_bytes(gzip.compress(("\n".join(train_de) + "\n").encode()))
    (folder / "val.en").write_text(f"{long_source}\nthe red dog sleeps\n")
    (folder / "val.de").write_text(f"{long_target}\nter roder hunt slafet\n")
    return folder
