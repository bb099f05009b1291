"""Shared fixtures: a tiny config and model (as transformers' own model testers use), a model that memorised four
pairs and its saved folder, a finished tiny training run, a small line-aligned corpus, the converter's foreign sources
(an OPUS-MT folder, an FSMT folder and its conversion, a fairseq checkpoint). Fixtures need no import; the plain
helpers and constants are in helpers.py (`from .helpers import ...`), the converter's in sources.py."""

import gzip
import json
import os
import shutil
import signal
from pathlib import Path

import pytest
import torch
from accelerate.state import AcceleratorState

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

from .helpers import CARD_VALUES, SIGNALLED_RUN, SOURCES, TARGETS, TINY, save_tiny_model_folder, train


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


@pytest.fixture(autouse=True)
def process_state_left_as_it_was():
    """What a test changes for its whole worker changes the tests after it there: torch's thread count (a CTranslate2
    Translator made here sets it, as the two share torch's OpenMP runtime) makes later in-process training runs
    compute other floats than the fresh processes they are compared with; an Accelerator's state left behind (one
    a process) refuses a later test's other precision; a stop signal's handler left by a training run turns Ctrl-C into
    a request. The test that leaves any of them changed fails, by name, and they are put back so that the next tests
    run as they would have."""
    found = process_state()
    yield
    left = process_state()
    torch.set_num_threads(found["torch threads"])
    if not found["an Accelerator's state"]:
        AcceleratorState._reset_state(reset_partial_state=True)
    for number in STOP_SIGNALS:
        signal.signal(number, found[number.name])
    assert left == found, f"the test left the worker with {left}, not {found}"


STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)


def process_state() -> dict:
    state = {"torch threads": torch.get_num_threads(), "an Accelerator's state": bool(AcceleratorState._shared_state)}
    return state | {number.name: signal.getsignal(number) for number in STOP_SIGNALS}


@pytest.fixture(autouse=True)
def allocator_left_as_it_is(monkeypatch):
    """`translate` run in this process (`run_in_this_process`) would set glibc's malloc for the whole test worker
    (mechanics/memory.py), and later tests that train in this process would run on another allocator than the runs
    they are compared with. Its own effect is tested in fresh interpreters (tests/test_memory.py)."""
    monkeypatch.setattr("vanilla_transformer.commands.translate.keep_freed_memory", lambda: False)


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

    from vanilla_transformer.data.tokenization import SPECIAL_TOKENS
    from vanilla_transformer.hub.model_folder import save_model_folder

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


@pytest.fixture(scope="session")
def folder(tmp_path_factory) -> Path:
    """A saved model folder of a random tiny model (save_tiny_model_folder) with a model card's values. Its embeddings
    have unit variance (init_std 1), so that its outputs depend on its inputs."""
    return save_tiny_model_folder(tmp_path_factory.mktemp("saved") / "model", CARD_VALUES, init_std=1.0)


@pytest.fixture(scope="session")
def model_and_tokenizer(folder):
    """`folder` loaded as users load it, with eager attention (whose weights attention maps draw)."""
    from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

    model = AutoModelForSeq2SeqLM.from_pretrained(folder, attn_implementation="eager").eval()
    return model, AutoTokenizer.from_pretrained(folder)


@pytest.fixture(scope="session")
def finished_run(tmp_path_factory) -> Path:
    """A finished tiny run of the training script (4 steps, checkpoints at 2 and 4); copy it before changing it."""
    output_dir = tmp_path_factory.mktemp("finished") / "run"
    train(output_dir, "--max_steps", "4", "--save_steps", "2")
    return output_dir


@pytest.fixture(scope="session")
def uninterrupted_run(tmp_path_factory) -> Path:
    """The tiny run of SIGNALLED_RUN, from start to end; copy it before changing it."""
    output_dir = tmp_path_factory.mktemp("uninterrupted") / "run"
    train(output_dir, *SIGNALLED_RUN)
    return output_dir


@pytest.fixture
def folder_with_a_layer_too_many(tmp_path) -> Path:
    """A saved tiny model folder whose config.json has one encoder layer more than its weights hold."""
    folder = save_tiny_model_folder(tmp_path / "model")
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, "encoder_layers": config["encoder_layers"] + 1}))
    return folder


@pytest.fixture(params=[0o022, 0o027], ids=["umask-022", "umask-027"])
def umask(request) -> int:
    """Run the test under this umask (the usual 022, then 027), the process's own restored afterwards."""
    previous = os.umask(request.param)
    yield request.param
    os.umask(previous)


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


@pytest.fixture(scope="module")
def marian_vocabulary(tmp_path_factory):
    """OPUS-MT's tokenizer files (tests/sources.py), made once a test module."""
    from .sources import make_marian_vocabulary

    return make_marian_vocabulary(tmp_path_factory.mktemp("marian_vocabulary"))


@pytest.fixture(scope="module")
def marian_source(marian_vocabulary, tmp_path_factory) -> Path:
    """An OPUS-MT-like folder (swish), for the tests that need one source."""
    from .sources import write_marian

    return write_marian(tmp_path_factory.mktemp("marian_source") / "source", marian_vocabulary)


@pytest.fixture
def marian_copy(marian_source, tmp_path) -> Path:
    """A copy of a Marian source folder to change."""
    return Path(shutil.copytree(marian_source, tmp_path / "source"))


@pytest.fixture(scope="module")
def fairseq_files(tmp_path_factory) -> tuple[Path, Path]:
    """dict.txt and bpecodes of fairseq's WMT recipes (tests/sources.py), made once a test module."""
    from .sources import moses_bpe_corpus

    return moses_bpe_corpus(tmp_path_factory.mktemp("fairseq_files"))


@pytest.fixture(scope="module")
def fsmt_model(fairseq_files):
    """FSMT with random weights over the joined dictionary: the FSMT source, and the fairseq checkpoint's weights."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    from .sources import HEADS, SIZES, fairseq_symbols, scramble

    size = len(fairseq_symbols(fairseq_files[0]))
    config = FSMTConfig(
        langs=["en", "de"],
        src_vocab_size=size,
        tgt_vocab_size=size,
        **SIZES,
        **HEADS,
        max_position_embeddings=128,
        activation_function="relu",
        scale_embedding=True,
        tie_word_embeddings=True,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
        forced_eos_token_id=2,
    )
    return scramble(FSMTForConditionalGeneration(config), seed=1)


@pytest.fixture(scope="module")
def fsmt_folder(fsmt_model, fairseq_files, tmp_path_factory) -> Path:
    """`fsmt_model` saved as an FSMT folder with its tokenizer's files."""
    from .sources import write_fsmt_tokenizer

    folder = tmp_path_factory.mktemp("fsmt") / "source"
    fsmt_model.save_pretrained(folder)
    write_fsmt_tokenizer(folder, *fairseq_files)
    return folder


@pytest.fixture(scope="module")
def fsmt(fsmt_folder, tmp_path_factory):
    """(source model, source tokenizer, converted model, converted tokenizer, converted folder) for FSMT."""
    from transformers import FSMTForConditionalGeneration, FSMTTokenizer

    from vanilla_transformer.converters.convert import convert
    from vanilla_transformer.data.tokenization import load_tokenizer

    from .sources import converted_model

    output = convert(fsmt_folder, tmp_path_factory.mktemp("fsmt_converted") / "converted")
    return (
        FSMTForConditionalGeneration.from_pretrained(fsmt_folder).eval(),
        FSMTTokenizer.from_pretrained(fsmt_folder),
        converted_model(output),
        load_tokenizer(output),
        output,
    )


@pytest.fixture(scope="module")
def fairseq_checkpoint(fsmt_model, fairseq_files, tmp_path_factory) -> Path:
    """A fairseq checkpoint of `fsmt_model`'s weights (model.pt, dict.txt, bpecodes: tests/sources.py's
    write_fairseq)."""
    from .sources import write_fairseq

    return write_fairseq(tmp_path_factory.mktemp("fairseq") / "wmt", fsmt_model, fairseq_files)


@pytest.fixture(scope="module")
def served(folder):
    """A server of `folder` (greedy, 4 tokens out: decoding that takes no time) with a 50 ms wait for a batch."""
    from .helpers import Served

    server = Served(folder, "--num_beams", 1, "--max_new_tokens", 4, "--max_wait_ms", 50)
    yield server
    server.stop()
