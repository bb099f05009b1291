"""`vanilla-transformer convert`: published models of the paper's architecture, converted exactly or refused by name.

The sources are built here, offline, with random weights: a MarianMTModel folder (OPUS-MT's layout: a SentencePiece
vocabulary trained here, source.spm, target.spm and vocab.json; swish and ReLU; a nonzero final_logits_bias), an
FSMTForConditionalGeneration folder, and a fairseq checkpoint (`args` and a state dict under fairseq's names, saved
with torch.save) with its dict.txt and subword-nmt BPE codes. The random weights are drawn so that the outputs depend
on every token and position (`scramble`): a model at transformers' initialisation repeats one token whatever it reads.

The fairseq checkpoint is checked against FSMT (transformers' port of fairseq's transformer) fed the same weights, and
against fairseq's own TransformerModel where fairseq is installed: `fairseq-fixed` (PyPI) builds from source here in
about 2 minutes (`pip install --no-deps --no-build-isolation`, with cython), but it needs hydra-core, omegaconf and
scikit-learn, so it is no dev dependency and the fairseq test skips without it. What fairseq itself writes is in
tests/fixtures/fairseq_train: a checkpoint fairseq-train wrote, the same with its `cfg` an omegaconf DictConfig, and
fairseq's own logits on a batch, made by tests/fixtures/make_fairseq_checkpoint.sh in an environment with fairseq.
"""

import argparse
import collections
import io
import json
import os
import re
import shutil
import socket
import subprocess
import sys
import tempfile
import types
from pathlib import Path

import pytest
import safetensors.torch
import torch
from sacremoses import MosesDetokenizer, MosesPunctNormalizer, MosesTokenizer
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe
from transformers import (
    AutoModelForSeq2SeqLM,
    FSMTConfig,
    FSMTForConditionalGeneration,
    FSMTTokenizer,
    MarianMTModel,
    MarianTokenizer,
)

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.commands.convert import main
from vanilla_transformer.converters import convert as conversion
from vanilla_transformer.converters.convert import convert
from vanilla_transformer.converters.core import ConversionError, Problems
from vanilla_transformer.converters.untrusted import check_sizes, hub_patterns
from vanilla_transformer.data.tokenization import load_tokenizer
from vanilla_transformer.data.toy_task import synthetic_translation_pairs
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.model.loading import MAX_LAYERS, ModelFolderError, check_folder_sizes
from vanilla_transformer.serving.translate import load_model_and_tokenizer, translate_sentences

from .helpers import run_in_this_process
from .sources import HEADS, MULTI30K_LIKE, SENTENCES, SIZES, scramble, train_sentencepiece, write_marian

NEW_TOKENS = 10
TOLERANCE = 1e-5


class TrainingMeter:
    """A class a fairseq checkpoint might pickle (fairseq's meters): not on the converter's allow-list."""


class StopwatchMeter(TrainingMeter):
    """Another."""


# --- the sources -------------------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def marian_separate_vocabularies(tmp_path_factory) -> Path:
    """The tokenizer files of an OPUS-MT model with separate vocabularies (MarianTokenizer's `separate_vocabs`): a
    SentencePiece model per language, vocab.json over the source's pieces and target_vocab.json over the target's,
    of another size (</s> 0, <unk> 1, <pad> 2 in both)."""
    folder = tmp_path_factory.mktemp("marian_separate_vocabularies")
    pairs = synthetic_translation_pairs(300, seed=2)
    sides = (
        ("source", [s for s, _ in pairs], 160, "vocab.json"),
        ("target", [t for _, t in pairs], 110, "target_vocab.json"),
    )
    for side, texts, size, vocabulary_file in sides:
        pieces = train_sentencepiece(texts + MULTI30K_LIKE, folder / f"{side}.spm", size)
        vocabulary = {"</s>": 0, "<unk>": 1, "<pad>": 2}
        for piece in pieces:
            vocabulary.setdefault(piece, len(vocabulary)) if piece != "<s>" else None
        (folder / vocabulary_file).write_text(json.dumps(vocabulary, ensure_ascii=False))
    settings = {"source_lang": "en", "target_lang": "de", "separate_vocabs": True}
    (folder / "tokenizer_config.json").write_text(json.dumps(settings))
    (folder / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n# opus-mt-tc-tiny\n")
    return folder


def moses_bpe_corpus(folder: Path) -> tuple[Path, Path]:
    """dict.txt and bpecodes as fairseq's WMT recipes make them: Moses punctuation normalization and tokenization
    (-a), subword-nmt BPE learned on both languages, one joined dictionary of the BPE'd text ("symbol count", most
    frequent first)."""
    corpus = []
    for language, texts in (("en", [s for s, _ in synthetic_translation_pairs(150, seed=1)]), ("de", SENTENCES)):
        corpus += [wmt_preprocessing(text, language) for text in texts + MULTI30K_LIKE]
    codes = io.StringIO()
    learn_bpe(io.StringIO("\n".join(corpus)), codes, 250, min_frequency=2)
    (folder / "bpecodes").write_text(codes.getvalue(), encoding="utf-8")
    bpe = BPE(io.StringIO(codes.getvalue()))
    counts = collections.Counter(piece for line in corpus for piece in bpe.process_line(line).split())
    (folder / "dict.txt").write_text("".join(f"{symbol} {count}\n" for symbol, count in counts.most_common()))
    return folder / "dict.txt", folder / "bpecodes"


def wmt_preprocessing(text: str, language: str) -> str:
    """The Moses steps of fairseq's WMT data preparation: normalize punctuation, remove non-printing characters,
    tokenize aggressively (-a) with escaping."""
    normalizer = MosesPunctNormalizer(language, pre_replace_unicode_punct=True, post_remove_control_chars=True)
    return MosesTokenizer(language).tokenize(
        normalizer.normalize(text), aggressive_dash_splits=True, return_str=True, escape=True
    )


def fairseq_symbols(dictionary: Path) -> list[str]:
    """fairseq's Dictionary by id: <s>, <pad>, </s>, <unk>, then dict.txt's symbols."""
    return ["<s>", "<pad>", "</s>", "<unk>"] + [line.rsplit(" ", 1)[0] for line in dictionary.read_text().splitlines()]


@pytest.fixture(scope="module")
def fairseq_files(tmp_path_factory) -> tuple[Path, Path]:
    return moses_bpe_corpus(tmp_path_factory.mktemp("fairseq_files"))


@pytest.fixture(scope="module")
def fsmt_model(fairseq_files) -> FSMTForConditionalGeneration:
    """FSMT with random weights over the joined dictionary: the FSMT source, and the fairseq checkpoint's weights."""
    size = len(fairseq_symbols(fairseq_files[0]))
    config = FSMTConfig(
        langs=["en", "de"], src_vocab_size=size, tgt_vocab_size=size, **SIZES, **HEADS, max_position_embeddings=128,
        activation_function="relu", scale_embedding=True, tie_word_embeddings=True, pad_token_id=1, bos_token_id=0,
        eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2,
    )  # fmt: skip
    return scramble(FSMTForConditionalGeneration(config), seed=1)


def write_fsmt_tokenizer(folder: Path, dictionary: Path, codes: Path, target_size: int | None = None) -> None:
    """FSMTTokenizer's files: the dictionary with word ends marked "</w>" (continued subwords lose "@@"), merges; with
    `target_size`, a target dictionary of its own, the first `target_size` symbols."""
    vocabulary = {}
    for index, symbol in enumerate(fairseq_symbols(dictionary)):
        special = index < 4
        vocabulary[symbol if special else symbol.removesuffix("@@") if symbol.endswith("@@") else f"{symbol}</w>"] = (
            index
        )
    target = vocabulary if target_size is None else dict(list(vocabulary.items())[:target_size])
    for name, symbols in (("vocab-src.json", vocabulary), ("vocab-tgt.json", target)):
        (folder / name).write_text(json.dumps(symbols, ensure_ascii=False))
    merges = [line for line in codes.read_text().splitlines() if not line.startswith("#version")]
    (folder / "merges.txt").write_text("\n".join(merges) + "\n")
    (folder / "tokenizer_config.json").write_text(json.dumps({"langs": ["en", "de"], "model_max_length": 128}))


@pytest.fixture(scope="module")
def fsmt_folder(fsmt_model, fairseq_files, tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("fsmt") / "source"
    fsmt_model.save_pretrained(folder)
    write_fsmt_tokenizer(folder, *fairseq_files)
    return folder


@pytest.fixture(scope="module")
def fsmt_separate_folder(fairseq_files, tmp_path_factory) -> Path:
    """An FSMT folder with two dictionaries of different sizes, random weights, as the WMT19 models are: their config
    says `tie_word_embeddings: false` (transformers 5 would tie the encoder's embedding to the decoder's otherwise),
    and their weights hold the decoder's input embedding again as its output projection."""
    size = len(fairseq_symbols(fairseq_files[0]))
    target_size = size - 37
    config = FSMTConfig(
        langs=["en", "de"], src_vocab_size=size, tgt_vocab_size=target_size, **SIZES, **HEADS,
        max_position_embeddings=128, activation_function="relu", scale_embedding=True, tie_word_embeddings=False,
        pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2, forced_eos_token_id=2,
    )  # fmt: skip
    folder = tmp_path_factory.mktemp("fsmt_separate") / "source"
    model = scramble(FSMTForConditionalGeneration(config), seed=2)
    with torch.no_grad():
        model.model.decoder.output_projection.weight.copy_(model.model.decoder.embed_tokens.weight)
    model.save_pretrained(folder)
    write_fsmt_tokenizer(folder, *fairseq_files, target_size=target_size)
    return folder


def fairseq_args(**overrides) -> argparse.Namespace:
    """A fairseq transformer's `args` as its checkpoints store them."""
    settings = dict(
        arch="transformer", task="translation", source_lang="en", target_lang="de", encoder_embed_dim=32,
        decoder_embed_dim=32, encoder_ffn_embed_dim=64, decoder_ffn_embed_dim=64, encoder_layers=2, decoder_layers=2,
        encoder_attention_heads=4, decoder_attention_heads=4, encoder_normalize_before=False,
        decoder_normalize_before=False, encoder_learned_pos=False, decoder_learned_pos=False,
        share_all_embeddings=True, share_decoder_input_output_embed=True, activation_fn="relu", dropout=0.3,
        attention_dropout=0.1, activation_dropout=0.0, max_source_positions=128, max_target_positions=128,
        adaptive_softmax_cutoff=None, no_scale_embedding=False, no_token_positional_embeddings=False,
        layernorm_embedding=False, decoder_output_dim=32, decoder_input_dim=32, lr=[0.0005], optimizer="adam",
    )  # fmt: skip
    return argparse.Namespace(**{**settings, **overrides})


def fairseq_state(fsmt: FSMTForConditionalGeneration) -> dict[str, torch.Tensor]:
    """FSMT's weights under fairseq's names (FSMT's are fairseq's with a "model." in front), plus what fairseq keeps
    beside them: version counters and the sinusoid buffers."""
    state = {key.removeprefix("model."): tensor.clone() for key, tensor in fsmt.state_dict().items()}
    state = {key: tensor for key, tensor in state.items() if "embed_positions" not in key}
    for side in ("encoder", "decoder"):
        state[f"{side}.version"] = torch.tensor([3.0])
        state[f"{side}.embed_positions._float_tensor"] = torch.tensor([1.0])
    return state


def write_fairseq(folder: Path, fsmt, fairseq_files, args=None, state=None, **save) -> Path:
    """model.pt (`args`, `model` and the training state a checkpoint keeps), dict.txt and bpecodes in `folder`."""
    folder.mkdir(parents=True, exist_ok=True)
    for path in fairseq_files:
        shutil.copy(path, folder / path.name)
    checkpoint = {
        "args": fairseq_args() if args is None else args,
        "model": fairseq_state(fsmt) if state is None else state,
        "optimizer_history": [{"criterion_name": "LabelSmoothedCrossEntropyCriterion", "num_updates": 1000}],
        "extra_state": {"epoch": 3, "val_loss": 3.25, "train_iterator": {"epoch": 3, "iterations_in_epoch": 7}},
        "last_optimizer_state": {"state": {}, "param_groups": [{"lr": 0.0005, "betas": (0.9, 0.98)}]},
    }
    torch.save(checkpoint, folder / "model.pt", **save)
    return folder / "model.pt"


@pytest.fixture(scope="module")
def fairseq_checkpoint(fsmt_model, fairseq_files, tmp_path_factory) -> Path:
    return write_fairseq(tmp_path_factory.mktemp("fairseq") / "wmt", fsmt_model, fairseq_files)


FAIRSEQ_TRAIN = Path(__file__).parent / "fixtures" / "fairseq_train"
FAIRSEQ_TRAIN_SENTENCES = [
    "the man sees a dog",
    "a small red ball near the house",
    "big cat runs under the blue street",
]


def fsmt_fed(checkpoint: Path) -> FSMTForConditionalGeneration:
    """FSMT built from a fairseq-train checkpoint's weights (tied embeddings) and the sizes it was trained with."""
    with torch.serialization.safe_globals([argparse.Namespace]):
        weights = torch.load(checkpoint, weights_only=True)["model"]
    size = weights["encoder.embed_tokens.weight"].shape[0]
    config = FSMTConfig(
        langs=["en", "de"], src_vocab_size=size, tgt_vocab_size=size, d_model=16, encoder_layers=2, decoder_layers=2,
        encoder_ffn_dim=32, decoder_ffn_dim=32, encoder_attention_heads=2, decoder_attention_heads=2,
        max_position_embeddings=64, activation_function="relu", scale_embedding=True, tie_word_embeddings=True,
        dropout=0.0, pad_token_id=1, bos_token_id=0, eos_token_id=2, decoder_start_token_id=2,
    )  # fmt: skip
    reference = FSMTForConditionalGeneration(config).eval()
    state = {
        f"model.{key}": tensor for key, tensor in weights.items() if not key.endswith(("version", "_float_tensor"))
    }
    result = reference.load_state_dict(state, strict=False)
    assert not result.unexpected_keys and all("embed_positions" in key for key in result.missing_keys)
    return reference


@pytest.fixture(scope="module", params=["checkpoint_last.pt", "checkpoint_dictconfig.pt"])
def fairseq_train(request, tmp_path_factory):
    """A checkpoint fairseq-train wrote (fairseq 0.12: `cfg` a plain dict), and the same with `cfg` the omegaconf
    DictConfig fairseq loads it as (fairseq 0.10's layout), converted; the reference is FSMT fed its weights."""
    checkpoint = FAIRSEQ_TRAIN / request.param
    if not checkpoint.is_file():
        pytest.skip(f"{checkpoint} is missing: make it with tests/fixtures/make_fairseq_checkpoint.sh (needs fairseq)")
    output = convert(checkpoint, tmp_path_factory.mktemp("fairseq_train") / "converted")
    return (
        fsmt_fed(FAIRSEQ_TRAIN / "checkpoint_last.pt"),
        None,
        converted_model(output),
        load_tokenizer(output),
        output,
    )


# --- the conversions ---------------------------------------------------------------------------------------------


def converted_model(folder: Path) -> VanillaTransformerForConditionalGeneration:
    return VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()


@pytest.fixture(scope="module")
def marian_source(marian_vocabulary, tmp_path_factory) -> Path:
    """An OPUS-MT-like folder (swish), for the tests that need one source."""
    return write_marian(tmp_path_factory.mktemp("marian_source") / "source", marian_vocabulary)


@pytest.fixture(scope="module", params=["swish", "relu"])
def marian(request, marian_vocabulary, tmp_path_factory):
    """(source model, source tokenizer, converted model, converted tokenizer, converted folder) for OPUS-MT."""
    base = tmp_path_factory.mktemp(f"marian_{request.param}")
    source = write_marian(base / "source", marian_vocabulary, activation=request.param)
    output = convert(source, base / "converted")
    return (
        MarianMTModel.from_pretrained(source).eval(), MarianTokenizer.from_pretrained(source),
        converted_model(output), load_tokenizer(output), output,
    )  # fmt: skip


@pytest.fixture(scope="module")
def marian_separate(marian_separate_vocabularies, tmp_path_factory):
    """The `marian` tuple for an OPUS-MT model with separate vocabularies."""
    base = tmp_path_factory.mktemp("marian_separate")
    target_size = len(json.loads((marian_separate_vocabularies / "target_vocab.json").read_text()))
    source = write_marian(
        base / "source", marian_separate_vocabularies, share_encoder_decoder_embeddings=False,
        decoder_vocab_size=target_size, pad_token_id=2, decoder_start_token_id=2,
    )  # fmt: skip
    output = convert(source, base / "converted")
    return (
        MarianMTModel.from_pretrained(source).eval(), MarianTokenizer.from_pretrained(source),
        converted_model(output), load_tokenizer(output), output,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fsmt_separate(fsmt_separate_folder, tmp_path_factory):
    output = convert(fsmt_separate_folder, tmp_path_factory.mktemp("fsmt_separate_converted") / "converted")
    return (
        FSMTForConditionalGeneration.from_pretrained(fsmt_separate_folder).eval(),
        FSMTTokenizer.from_pretrained(fsmt_separate_folder), converted_model(output), load_tokenizer(output), output,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fsmt(fsmt_folder, tmp_path_factory):
    output = convert(fsmt_folder, tmp_path_factory.mktemp("fsmt_converted") / "converted")
    return (
        FSMTForConditionalGeneration.from_pretrained(fsmt_folder).eval(), FSMTTokenizer.from_pretrained(fsmt_folder),
        converted_model(output), load_tokenizer(output), output,
    )  # fmt: skip


@pytest.fixture(scope="module")
def fairseq(fairseq_checkpoint, fsmt_model, tmp_path_factory):
    """The fairseq checkpoint converted; its reference is FSMT fed the same weights (`fsmt_model`)."""
    output = convert(fairseq_checkpoint, tmp_path_factory.mktemp("fairseq_converted") / "converted")
    return fsmt_model, None, converted_model(output), load_tokenizer(output), output


def padded_batch(tokenizer, model) -> dict[str, torch.Tensor]:
    """Four sentences of different lengths (right-padded) and decoder inputs: the decoder start, then ordinary ids."""
    batch = tokenizer(MULTI30K_LIKE[:4], return_tensors="pt", padding=True)
    assert (batch["attention_mask"] == 0).any()
    config = model.config
    generator = torch.Generator().manual_seed(3)
    ordinary = torch.tensor([i for i in range(4, config.decoder_vocab_size) if i != config.pad_token_id])
    body = ordinary[torch.randint(len(ordinary), (4, 8), generator=generator)]
    start = torch.full((4, 1), config.decoder_start_token_id)
    return {**batch, "decoder_input_ids": torch.cat([start, body], dim=1)}


def logits_difference(pair, batch) -> float:
    """The largest difference between the source's and the converted model's logits. The decoder inputs are not
    padded, so every decoder position counts; the sources' padding is masked out of attention by both models (fairseq
    and FSMT number the positions of padding otherwise than we do, which cannot reach the tokens' outputs)."""
    source, _, ours, _, _ = pair
    with torch.inference_mode():
        expected = source(**batch, use_cache=False).logits  # FSMT applies its causal mask only without the cache
        actual = ours(**batch).logits
    return (expected - actual).abs().max().item()


def generated(model, batch, num_beams: int) -> torch.Tensor:
    """`model`'s tokens for `batch`, with the beam settings given (the converted folder's own are checked apart: a
    fairseq conversion decodes as the paper, FSMT by transformers' defaults)."""
    with torch.inference_mode():
        return model.generate(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], num_beams=num_beams,
            max_new_tokens=NEW_TOKENS, do_sample=False, length_penalty=1.0, early_stopping=False,
        )  # fmt: skip


def check_same_generation(pair, tokenizer, num_beams: int, sentences=MULTI30K_LIKE[4:10]) -> None:
    source, _, ours, _, _ = pair
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    expected = generated(source, batch, num_beams)
    distinct = [len(set(row[1:])) for row in expected.tolist()]
    assert len({tuple(row) for row in expected.tolist()}) > 1 and max(distinct) > 3, "the random source repeats itself"
    assert torch.equal(generated(ours, batch, num_beams), expected)


# --- OPUS-MT (Marian) ----------------------------------------------------------------------------------------------


def test_converted_opus_mt_gives_marians_logits_within_1e_5_on_a_padded_batch(marian):
    assert logits_difference(marian, padded_batch(marian[1], marian[2])) < TOLERANCE


@pytest.mark.parametrize("num_beams", [1, 4])
def test_converted_opus_mt_generates_marians_tokens(marian, num_beams):
    check_same_generation(marian, marian[1], num_beams)


def test_converted_opus_mt_keeps_marians_tokenizer_ids_and_text(marian):
    _, theirs, _, ours, _ = marian
    assert type(ours).__name__ == "MarianTokenizer"
    expected = theirs(SENTENCES)["input_ids"]
    assert ours(SENTENCES)["input_ids"] == expected
    assert ours(text_target=SENTENCES)["input_ids"] == theirs(text_target=SENTENCES)["input_ids"]
    decoded = theirs.batch_decode(expected, skip_special_tokens=True)
    assert ours.batch_decode(expected, skip_special_tokens=True) == decoded
    assert sum(text == sentence for text, sentence in zip(decoded, SENTENCES, strict=True)) > len(SENTENCES) // 2


def test_converted_opus_mt_tokenizer_loads_in_a_fresh_process_without_asking_to_run_code(marian):
    """load_tokenizer, as the CTranslate2 backend and a library user call it, before any registration of the model
    type: the folder's MarianTokenizer, without AutoTokenizer's question about the folder's custom code."""
    *_, output = marian
    code = "import sys; from vanilla_transformer.data.tokenization import load_tokenizer as f; print(type(f(sys.argv[1])).__name__)"
    result = subprocess.run(
        [sys.executable, "-c", code, str(output)], capture_output=True, text=True, stdin=subprocess.DEVNULL,
        env={**os.environ, "HF_HUB_OFFLINE": "1"}, timeout=120,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "MarianTokenizer"
    assert "custom code" not in result.stdout + result.stderr


def test_converted_opus_mt_records_marians_choices_and_decoding(marian):
    _, _, ours, _, folder = marian
    config = ours.config
    assert (config.position_layout, config.position_frequencies, config.position_offset) == ("sin_cos", "paper", 0)
    assert config.lm_head_bias and config.pad_token_id == config.decoder_start_token_id == config.vocab_size - 1
    generation = json.loads((folder / "generation_config.json").read_text())
    assert generation["num_beams"] == 4 and generation["length_penalty"] == 1.0
    assert generation["forced_eos_token_id"] == 0


# --- separate vocabularies: OPUS-MT's `separate_vocabs`, FSMT's two dictionaries -----------------------------------


@pytest.fixture(scope="module", params=["marian", "fsmt"])
def separate(request, marian_separate, fsmt_separate):
    return {"marian": marian_separate, "fsmt": fsmt_separate}[request.param]


def test_separate_vocabularies_convert_to_separate_matrices_of_the_sources_sizes(separate):
    source, _, ours, _, _ = separate
    source_size, target_size = (
        (source.config.vocab_size, source.config.decoder_vocab_size)
        if isinstance(source, MarianMTModel)
        else (source.config.src_vocab_size, source.config.tgt_vocab_size)
    )
    assert source_size != target_size
    config = ours.config
    assert not config.share_encoder_decoder_embeddings and config.tie_word_embeddings
    assert (config.vocab_size, config.decoder_vocab_size) == (source_size, target_size)
    assert ours.model.encoder.embed_tokens.weight.shape[0] == source_size
    assert ours.lm_head.weight.data_ptr() == ours.model.decoder.embed_tokens.weight.data_ptr()


def test_separate_vocabularies_give_the_sources_logits_within_1e_5_on_a_padded_batch(separate):
    assert logits_difference(separate, padded_batch(separate[1], separate[2])) < TOLERANCE


@pytest.mark.parametrize("num_beams", [1, 4])
def test_separate_vocabularies_generate_the_sources_tokens(separate, num_beams):
    check_same_generation(separate, separate[1], num_beams)


def test_separate_vocabularies_keep_the_sources_ids_for_text_and_text_target(separate):
    _, theirs, _, ours, _ = separate
    assert type(ours) is type(theirs)
    assert ours(SENTENCES)["input_ids"] == theirs(SENTENCES)["input_ids"]
    targets = ours(text_target=SENTENCES)["input_ids"]
    assert targets == theirs(text_target=SENTENCES)["input_ids"]
    if isinstance(
        theirs, MarianTokenizer
    ):  # its target side reads the other vocabulary (FSMT's encodes as the source)
        assert targets != ours(SENTENCES)["input_ids"]
    assert ours.batch_decode(targets, skip_special_tokens=True) == theirs.batch_decode(
        targets, skip_special_tokens=True
    )


@pytest.mark.parametrize("num_beams", [1, 4])
def test_separate_vocabularies_translate_through_ctranslate2_as_the_converted_model(separate, tmp_path, num_beams):
    """The export writes the tokenizer's source and target vocabularies; the CTranslate2 backend reads the sources
    through the one and its translations through the other, and gives generate()'s ids (the same lengths)."""
    pytest.importorskip("ctranslate2")
    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2
    from vanilla_transformer.serving.ctranslate2_backend import CTranslate2Backend

    _, _, ours, tokenizer, folder = separate
    export = convert_to_ctranslate2(folder, tmp_path / "ct2")
    backend = CTranslate2Backend(folder, tokenizer, export, num_beams=num_beams, max_new_tokens=NEW_TOKENS)
    backend.options["min_decoding_length"] = NEW_TOKENS  # both decode NEW_TOKENS tokens: no early end to compare
    backend.forced_end = False  # nor a forced </s> in the last place
    texts, _ = backend.translate(backend.encode(MULTI30K_LIKE[4:10]))
    batch = tokenizer(MULTI30K_LIKE[4:10], return_tensors="pt", padding=True)
    with torch.inference_mode():
        expected = ours.generate(
            **batch, num_beams=num_beams, min_new_tokens=NEW_TOKENS, max_new_tokens=NEW_TOKENS, do_sample=False,
            length_penalty=1.0, forced_eos_token_id=None, bad_words_ids=None, renormalize_logits=True,
        )  # fmt: skip
    assert texts == tokenizer.batch_decode(expected, skip_special_tokens=True)
    assert len(set(texts)) > 1


def test_the_card_of_separate_vocabularies_gives_both_sizes(separate):
    _, _, ours, _, folder = separate
    card = (folder / "README.md").read_text()
    config = ours.config
    assert f"| vocabularies (source / target) | {config.vocab_size} / {config.decoder_vocab_size} tokens |" in card
    assert "shared vocabulary" not in card and "separate source and target vocabularies" in card


def test_a_tokenizer_whose_vocabularies_are_not_the_models_is_refused_naming_the_fields(marian_copy, tmp_path):
    settings = json.loads((marian_copy / "tokenizer_config.json").read_text())
    (marian_copy / "tokenizer_config.json").write_text(json.dumps({**settings, "separate_vocabs": True}))
    shutil.copy(marian_copy / "vocab.json", marian_copy / "target_vocab.json")
    with pytest.raises(ConversionError, match="separate_vocabs True while config.json has share_encoder_decoder"):
        convert(marian_copy, tmp_path / "out")


# --- FSMT and fairseq --------------------------------------------------------------------------------------------


def test_converted_fsmt_gives_fsmts_logits_within_1e_5_on_a_padded_batch(fsmt):
    assert logits_difference(fsmt, padded_batch(fsmt[1], fsmt[2])) < TOLERANCE


@pytest.mark.parametrize("num_beams", [1, 4])
def test_converted_fsmt_generates_fsmts_tokens(fsmt, num_beams):
    check_same_generation(fsmt, fsmt[1], num_beams)


def test_converted_fsmt_keeps_fsmts_tokenizer_ids_and_text(fsmt):
    _, theirs, _, ours, _ = fsmt
    assert type(ours).__name__ == "FSMTTokenizer"
    expected = theirs(SENTENCES)["input_ids"]
    assert ours(SENTENCES)["input_ids"] == expected
    assert ours.batch_decode(expected, skip_special_tokens=True) == theirs.batch_decode(
        expected, skip_special_tokens=True
    )


def test_converted_fairseq_checkpoint_gives_the_logits_of_fsmt_fed_the_same_weights(fairseq):
    assert logits_difference(fairseq, padded_batch(fairseq[3], fairseq[2])) < TOLERANCE


@pytest.mark.parametrize("num_beams", [1, 4])
def test_converted_fairseq_checkpoint_generates_the_tokens_of_fsmt_fed_the_same_weights(fairseq, num_beams):
    check_same_generation(fairseq, fairseq[3], num_beams)


def test_converted_fairseq_checkpoint_gives_the_logits_of_fairseq_itself(fairseq, fairseq_checkpoint):
    pytest.importorskip("fairseq")
    from importlib import import_module

    Dictionary = import_module("fairseq.data").Dictionary  # noqa: N806
    TransformerModel = import_module("fairseq.models.transformer").TransformerModel  # noqa: N806
    dictionary = Dictionary.load(str(fairseq_checkpoint.parent / "dict.txt"))
    task = types.SimpleNamespace(source_dictionary=dictionary, target_dictionary=dictionary)
    state = torch.load(fairseq_checkpoint, weights_only=False)  # our own file, written by this test
    model = TransformerModel.build_model(state["args"], task)
    model.load_state_dict(state["model"])
    batch = padded_batch(fairseq[3], fairseq[2])
    with torch.inference_mode():
        expected = model.eval()(batch["input_ids"], batch["attention_mask"].sum(1), batch["decoder_input_ids"])[0]
        actual = fairseq[2](**batch).logits
    assert (expected - actual).abs().max().item() < TOLERANCE


def test_a_fairseq_train_checkpoint_converts_to_fairseqs_own_logits_and_ids(fairseq_train):
    """fairseq's own model's logits and its dictionary's ids (subword-nmt, then Dictionary.encode_line), recorded by
    make_fairseq_checkpoint.sh on a right-padded batch."""
    recorded = torch.load(FAIRSEQ_TRAIN / "fairseq_logits.pt", weights_only=True)
    _, _, ours, tokenizer, _ = fairseq_train
    ids = tokenizer(
        ["the man sees a dog", "a small red ball near the house", "cat"], return_tensors="pt", padding=True
    )
    assert torch.equal(ids["input_ids"], recorded["input_ids"])
    with torch.inference_mode():
        logits = ours(**ids, decoder_input_ids=recorded["decoder_input_ids"]).logits
    assert (logits - recorded["logits"]).abs().max().item() < TOLERANCE


def test_a_fairseq_train_checkpoint_gives_the_logits_of_fsmt_fed_its_weights(fairseq_train):
    assert logits_difference(fairseq_train, padded_batch(fairseq_train[3], fairseq_train[2])) < TOLERANCE


@pytest.mark.parametrize("num_beams", [1, 4])
def test_a_fairseq_train_checkpoint_generates_the_tokens_of_fsmt_fed_its_weights(fairseq_train, num_beams):
    check_same_generation(fairseq_train, fairseq_train[3], num_beams, FAIRSEQ_TRAIN_SENTENCES)


def test_fairseq_tokenizer_gives_the_ids_and_text_of_moses_and_subword_nmt(fairseq, fairseq_files):
    """The ids of fairseq's WMT pipeline (Moses normalization and tokenization, subword-nmt, the dictionary, </s>) and
    its detokenized text. FSMTTokenizer normalizes punctuation as WMT's data preparation did (e.g. "–" becomes "-"),
    which fairseq's hub interface (Moses tokenization alone) leaves out: the two differ only on such characters."""
    ours = fairseq[3]
    symbols = fairseq_symbols(fairseq_files[0])
    index = {symbol: i for i, symbol in enumerate(symbols)}
    bpe = BPE(io.StringIO(fairseq_files[1].read_text()))
    detokenizer = MosesDetokenizer("de")
    for sentence in SENTENCES:
        pieces = bpe.process_line(wmt_preprocessing(sentence, "en")).split()
        expected = [index.get(piece, 3) for piece in pieces] + [2]
        assert ours(sentence)["input_ids"] == expected, sentence
        text = " ".join(symbols[i] for i in expected if i > 3).replace("@@ ", "")
        assert ours.decode(expected, skip_special_tokens=True) == detokenizer.detokenize(text.split())


def test_fairseq_checkpoints_with_older_names_convert_to_the_same_model(fairseq, fsmt_model, fairseq_files, tmp_path):
    """Checkpoints before fairseq 0.9: one in_proj_weight per attention (rows q, k, v), layer_norms.N, zip or not."""
    state = fairseq_state(fsmt_model)
    for key in [key for key in state if key.endswith("q_proj.weight") or key.endswith("q_proj.bias")]:
        prefix, kind = key.rsplit(".q_proj.", 1)
        parts = [state.pop(f"{prefix}.{name}.{kind}") for name in ("q_proj", "k_proj", "v_proj")]
        state[f"{prefix}.in_proj_{kind}"] = torch.cat(parts)
    for key in [key for key in state if key.startswith("encoder.layers.") and "_layer_norm." in key]:
        number = "0" if ".self_attn_layer_norm." in key else "1"
        state[key.replace(key.split(".")[3], f"layer_norms.{number}")] = state.pop(key)
    path = write_fairseq(
        tmp_path / "old", fsmt_model, fairseq_files, state=state, _use_new_zipfile_serialization=False
    )
    ours = converted_model(convert(path, tmp_path / "converted"))
    expected = fairseq[2].state_dict()
    assert all(torch.equal(tensor, expected[key]) for key, tensor in ours.state_dict().items())


def test_a_fairseq_cfg_saved_as_a_plain_dict_converts(fsmt_model, fairseq_files, tmp_path):
    """fairseq 0.12's checkpoints: `cfg` as a plain dict with model and task sections."""
    args = vars(fairseq_args())
    cfg = {"model": args, "task": {"source_lang": "en", "target_lang": "de"}, "common": {"fp16": True}}
    path = write_fairseq(tmp_path / "cfg", fsmt_model, fairseq_files, args=None)
    state = torch.load(path, weights_only=False)  # our own file
    del state["args"]
    torch.save({**state, "cfg": cfg}, path)
    assert converted_model(convert(path, tmp_path / "converted")).config.encoder_layers == 2


# --- refusals ----------------------------------------------------------------------------------------------------


def edited_config(folder: Path, **changes) -> Path:
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


@pytest.fixture
def marian_copy(marian_source, tmp_path) -> Path:
    """A copy of a Marian source folder to change."""
    return Path(shutil.copytree(marian_source, tmp_path / "source"))


@pytest.mark.parametrize(
    "changes, named",
    [
        ({"normalize_before": True}, "normalize_before is True"),
        ({"static_position_embeddings": False}, "static_position_embeddings is False"),
        ({"normalize_embedding": True}, "normalize_embedding is True"),
        ({"activation_function": "quick_gelu"}, "activation_function is 'quick_gelu'"),
        ({"vocab_size": 10**9}, "vocab_size is 1000000000"),
        ({"share_encoder_decoder_embeddings": False, "decoder_vocab_size": 10**9}, "decoder_vocab_size is 1000000000"),
        ({"d_model": 0}, "d_model is 0"),
    ],
)
def test_a_marian_config_the_model_cannot_represent_is_refused_naming_the_field(marian_copy, tmp_path, changes, named):
    with pytest.raises(ConversionError, match=named):
        convert(edited_config(marian_copy, **changes), tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_every_problem_of_a_marian_config_is_named_at_once_one_a_line(marian_copy, tmp_path):
    changes = {"normalize_before": True, "static_position_embeddings": False, "activation_function": "quick_gelu"}
    with pytest.raises(ConversionError) as refused:
        convert(edited_config(marian_copy, **changes), tmp_path / "out")
    lines = str(refused.value).splitlines()
    assert lines[0] == "the source cannot be converted exactly, for 3 reasons:"
    named = ["normalize_before is True", "static_position_embeddings is False", "activation_function is 'quick_gelu'"]
    assert [[name for name in named if name in line] for line in lines[1:]] == [[name] for name in named]
    assert refused.value.problems == lines[1:]
    assert not (tmp_path / "out").exists()


def test_a_file_that_stops_the_checks_is_named_with_the_problems_found_before_it(marian_copy, tmp_path):
    (marian_copy / "source.spm").unlink()
    with pytest.raises(ConversionError) as refused:
        convert(edited_config(marian_copy, d_model=0, normalize_before=True), tmp_path / "out")
    problems = refused.value.problems
    assert len(problems) == 3 and "d_model is 0" in problems[0] and "normalize_before is True" in problems[1]
    assert problems[2] == f"{marian_copy / 'source.spm'} is missing"


def test_an_output_projection_of_its_own_is_refused(marian_vocabulary, tmp_path):
    source = write_marian(tmp_path / "untied", marian_vocabulary, tie_word_embeddings=False)
    with pytest.raises(ConversionError, match=r"embed_tokens\.weight differ \(Marian.s `tie_word_embeddings: false`"):
        convert(source, tmp_path / "out")


def test_fairseq_with_separate_dictionaries_is_refused(fairseq_checkpoint, tmp_path):
    lines = (fairseq_checkpoint.parent / "dict.txt").read_text().splitlines()
    (tmp_path / "dict.de.txt").write_text("\n".join([lines[1], lines[0], *lines[2:]]) + "\n")
    with pytest.raises(ConversionError, match="separate source and target dictionaries"):
        convert(
            fairseq_checkpoint,
            tmp_path / "out",
            dictionary=[fairseq_checkpoint.parent / "dict.txt", tmp_path / "dict.de.txt"],
        )


@pytest.mark.parametrize(
    "args, extra, named",
    [
        ({"encoder_normalize_before": True}, {}, "encoder_normalize_before is True, which means pre-LN"),
        ({"decoder_normalize_before": True}, {}, "decoder_normalize_before is True"),
        ({"layernorm_embedding": True}, {}, "layernorm_embedding is True"),
        ({}, {"encoder.layernorm_embedding.weight": torch.ones(32)}, "encoder.layernorm_embedding.weight"),
        ({}, {"decoder.layer_norm.weight": torch.ones(32)}, "decoder.layer_norm.weight"),
        ({"encoder_learned_pos": True}, {}, "encoder_learned_pos is True"),
        ({"adaptive_softmax_cutoff": "5000,20000"}, {}, "adaptive_softmax_cutoff"),
        ({"activation_fn": "linear"}, {}, "activation_fn is 'linear'"),
    ],
)
def test_a_fairseq_architecture_the_model_cannot_represent_is_refused(
    fsmt_model, fairseq_files, tmp_path, args, extra, named
):
    state = {**fairseq_state(fsmt_model), **extra}
    path = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files, args=fairseq_args(**args), state=state)
    with pytest.raises(ConversionError, match=named):
        convert(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_every_problem_of_a_fairseq_checkpoint_is_named_at_once(fsmt_model, fairseq_files, tmp_path):
    args = fairseq_args(encoder_normalize_before=True, adaptive_softmax_cutoff="5000,20000", activation_fn="linear")
    state = {**fairseq_state(fsmt_model), "decoder.embed_positions.weight": torch.ones(130, 32)}
    path = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files, args=args, state=state)
    with pytest.raises(ConversionError) as refused:
        convert(path, tmp_path / "out")
    named = [
        "decoder.embed_positions.weight: learned positions",
        "encoder_normalize_before is True",
        "adaptive_softmax_cutoff is '5000,20000'",
        "activation_fn is 'linear'",
    ]
    assert [[name for name in named if name in problem] for problem in refused.value.problems] == [[n] for n in named]


def test_an_output_projection_that_differs_from_the_embeddings_is_refused(fsmt_model, fairseq_files, tmp_path):
    state = fairseq_state(fsmt_model)
    state["decoder.output_projection.weight"] = state["decoder.output_projection.weight"] + 1
    path = write_fairseq(
        tmp_path / "wmt", fsmt_model, fairseq_files, args=fairseq_args(share_all_embeddings=False), state=state
    )
    with pytest.raises(ConversionError, match="decoder.output_projection.weight differ"):
        convert(path, tmp_path / "out")


@pytest.mark.parametrize("zip_format", [True, False])
def test_a_checkpoint_needing_an_unlisted_class_is_refused_naming_it(fsmt_model, fairseq_files, tmp_path, zip_format):
    args = fairseq_args()
    args.meter = TrainingMeter()
    path = write_fairseq(
        tmp_path / "wmt", fsmt_model, fairseq_files, args=args, _use_new_zipfile_serialization=zip_format
    )
    with pytest.raises(ConversionError, match=r"needs tests\.test_convert\.TrainingMeter to be unpickled"):
        convert(path, tmp_path / "out")


def test_every_unlisted_class_of_a_zip_checkpoint_is_named_at_once(fsmt_model, fairseq_files, tmp_path):
    args = fairseq_args()
    args.meters = [TrainingMeter(), StopwatchMeter()]
    path = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files, args=args)
    with pytest.raises(
        ConversionError, match=r"needs tests\.test_convert\.StopwatchMeter, tests\.test_convert\.Train"
    ):
        convert(path, tmp_path / "out")


@pytest.mark.parametrize(
    "change, named",
    [
        (lambda layers: layers.update(rotary=torch.ones(4)), "has no place for: rotary"),
        (
            lambda layers: layers.pop("decoder.layers.1.fc2.bias"),
            "lacks weights the model needs: decoder.layers.1.fc2.bias",
        ),
        (
            lambda layers: layers.update({"encoder.layers.0.fc1.weight": torch.ones(3, 3)}),
            r"fc1.weight has shape \[3, 3\]",
        ),
    ],
)
def test_a_source_weight_left_over_missing_or_of_another_shape_is_refused_naming_it(
    fairseq_checkpoint, tmp_path, change, named
):
    source = conversion.read_source(fairseq_checkpoint, None, None, (None, None), None, tmp_path)
    change(source.layers)
    with pytest.raises(ConversionError, match=named):
        conversion.build_model(source)


def leave_marker(path: str) -> None:
    Path(path).touch()


class RunsCode:
    """Unpickling it would call leave_marker(marker): what a malicious checkpoint does, with a harmless function."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return leave_marker, (self.marker,)


@pytest.mark.parametrize("zip_format", [True, False])
def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(
    fsmt_model, fairseq_files, tmp_path, zip_format
):
    marker = tmp_path / "code-ran"
    path = write_fairseq(
        tmp_path / "wmt", fsmt_model, fairseq_files, args=RunsCode(marker), _use_new_zipfile_serialization=zip_format
    )
    with pytest.raises(ConversionError, match=r"needs tests\.test_convert\.leave_marker"):
        convert(path, tmp_path / "out")
    assert not marker.exists()


class SubclassedOrderedDict(collections.OrderedDict):
    """A container subclass: a class of its own, not on the allow-list."""


class RunsShell:
    """Unpickling it would run a shell command (os.system) that leaves a marker."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


def fake_omegaconf(monkeypatch) -> type:
    """A class pickled under omegaconf's DictConfig name, with its state layout (`_metadata`, `_parent`, `_content`):
    omegaconf is not installed here."""
    module = types.ModuleType("omegaconf.dictconfig")

    class DictConfig:
        def __init__(self, content):
            self._metadata, self._parent, self._content = None, None, content

    DictConfig.__module__, DictConfig.__qualname__, module.DictConfig = module.__name__, "DictConfig", DictConfig
    monkeypatch.setitem(sys.modules, "omegaconf", types.ModuleType("omegaconf"))
    monkeypatch.setitem(sys.modules, module.__name__, module)
    return DictConfig


@pytest.mark.parametrize("zip_format", [True, False])
@pytest.mark.parametrize(
    "inside, named",
    [
        (lambda marker: RunsShell(marker), f"{os.system.__module__}.system"),  # posix.system
        (lambda marker: SubclassedOrderedDict(a=1), "tests.test_convert.SubclassedOrderedDict"),
    ],
)
def test_an_omegaconf_cfg_holding_any_other_class_is_refused_naming_it_and_runs_nothing(
    fsmt_model, fairseq_files, tmp_path, monkeypatch, zip_format, inside, named
):
    DictConfig = fake_omegaconf(monkeypatch)  # noqa: N806
    marker = tmp_path / "code-ran"
    path = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files)
    state = torch.load(path, weights_only=False)  # our own file
    cfg = DictConfig({"model": DictConfig(vars(fairseq_args())), "common": DictConfig({"x": inside(marker)})})
    torch.save({**state, "args": None, "cfg": cfg}, path, _use_new_zipfile_serialization=zip_format)
    with pytest.raises(ConversionError, match=rf"{re.escape(str(path))} needs {re.escape(named)}"):
        convert(path, tmp_path / "out")
    assert not marker.exists() and not (tmp_path / "out").exists()


def test_an_omegaconf_cfg_of_omegaconfs_layout_converts_without_omegaconf(
    fairseq, fsmt_model, fairseq_files, tmp_path, monkeypatch
):
    DictConfig = fake_omegaconf(monkeypatch)  # noqa: N806
    path = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files)
    state = torch.load(path, weights_only=False)  # our own file
    cfg = DictConfig({"model": DictConfig(vars(fairseq_args())), "task": DictConfig({"source_lang": "en"})})
    torch.save({**state, "args": None, "cfg": cfg}, path)
    monkeypatch.delitem(sys.modules, "omegaconf.dictconfig")
    monkeypatch.delitem(sys.modules, "omegaconf")
    ours = converted_model(convert(path, tmp_path / "converted"))
    assert "omegaconf" not in sys.modules
    expected = fairseq[2].state_dict()
    assert all(torch.equal(tensor, expected[key]) for key, tensor in ours.state_dict().items())


# --- the written folder and the command --------------------------------------------------------------------------


def test_the_command_writes_a_folder_that_loads_with_trust_remote_code_and_translates(marian_source, tmp_path, capsys):
    assert main([str(marian_source), str(tmp_path / "out")]) == 0
    assert capsys.readouterr().out.strip() == str(tmp_path / "out")
    model = AutoModelForSeq2SeqLM.from_pretrained(tmp_path / "out", trust_remote_code=True).eval()
    source, tokenizer = (
        MarianMTModel.from_pretrained(marian_source).eval(),
        MarianTokenizer.from_pretrained(marian_source),
    )
    batch = tokenizer(MULTI30K_LIKE[:3], return_tensors="pt", padding=True)
    expected = generated(source, batch, 1)
    assert torch.equal(generated(model, batch, 1), expected)
    model, tokenizer = load_model_and_tokenizer(tmp_path / "out")
    texts = translate_sentences(model, tokenizer, MULTI30K_LIKE[:3], num_beams=1, max_new_tokens=NEW_TOKENS)
    assert texts == tokenizer.batch_decode(expected, skip_special_tokens=True)


def test_translating_a_converted_fsmt_folder_prints_no_length_warning_per_batch(fsmt, tmp_path):
    """FSMT's folders set max_length: the command decodes by it without transformers' warning about two lengths."""
    from vanilla_transformer.commands.translate import main as translate

    lines = tmp_path / "lines.en"
    lines.write_text("".join(f"{sentence}\n" for sentence in (SENTENCES * 3)[:12]), encoding="utf-8")
    result = run_in_this_process(translate, [str(fsmt[4]), "--input", str(lines), "--batch_size", "4"])
    assert result.returncode == 0, result.stderr
    assert len(result.stdout.splitlines()) == 12
    assert "max_length" not in result.stderr, result.stderr


def test_the_translation_pipeline_translates_with_a_converted_folder(fsmt):
    from transformers import pipeline

    translator = pipeline("translation", model=str(fsmt[4]), trust_remote_code=True)
    batch = fsmt[1]([MULTI30K_LIKE[0]], return_tensors="pt")
    expected = fsmt[1].decode(generated(fsmt[0], batch, 1)[0], skip_special_tokens=True)
    assert translator(MULTI30K_LIKE[0], num_beams=1, max_new_tokens=NEW_TOKENS) == [{"translation_text": expected}]


def test_the_command_refuses_a_non_empty_output_folder_and_writes_nothing(fsmt_folder, tmp_path, capsys):
    output = tmp_path / "out"
    output.mkdir()
    (output / "notes.txt").write_text("my work")
    assert main([str(fsmt_folder), str(output)]) == 1
    assert "is not empty" in capsys.readouterr().err
    assert sorted(path.name for path in output.iterdir()) == ["notes.txt"]
    assert main([str(fsmt_folder), str(output), "--overwrite"]) == 1
    assert "not a previous conversion (it holds notes.txt)" in capsys.readouterr().err


def test_an_output_folder_that_is_holds_or_is_inside_the_source_folder_is_refused(marian_source, tmp_path):
    for output in (marian_source, marian_source / "converted", marian_source.parent):
        with pytest.raises(ConversionError, match="(is|holds|is inside) the source's folder"):
            convert(marian_source, output, overwrite=True)
    assert not (marian_source / "converted").exists()


def test_a_conversion_refusal_is_one_of_the_projects_refusals_and_still_a_value_error(marian_source):
    with pytest.raises(VanillaTransformerError, match="(is|holds|is inside) the source's folder"):
        convert(marian_source, marian_source, overwrite=True)
    assert issubclass(ConversionError, VanillaTransformerError) and issubclass(ConversionError, ValueError)


def test_a_checkpoint_converts_into_a_new_folder_beside_it_but_never_over_its_folder(fairseq_checkpoint, tmp_path):
    folder = Path(shutil.copytree(fairseq_checkpoint.parent, tmp_path / "wmt"))
    assert convert(folder / "model.pt", folder / "converted").is_dir()
    with pytest.raises(ConversionError, match=r"not a previous conversion \(it holds bpecodes"):
        convert(folder / "model.pt", folder, overwrite=True)


def test_overwrite_replaces_a_previous_conversion(fsmt, fsmt_folder, tmp_path):
    output = Path(shutil.copytree(fsmt[4], tmp_path / "out"))  # a conversion, unchanged: its record still holds
    (output / "model.safetensors").unlink()
    (output / "model.safetensors").write_bytes((fsmt[4] / "model.safetensors").read_bytes())  # replaced by the same
    before = (output / "model.safetensors").stat().st_ino
    assert main([str(fsmt_folder), str(output), "--overwrite"]) == 0
    assert (output / "model.safetensors").stat().st_ino != before  # written again
    assert (output / ".vanilla_transformer_conversion.json").is_file()


def test_overwrite_never_replaces_a_trained_models_folder_of_the_same_file_names(fsmt, fsmt_folder, tmp_path, capsys):
    """A folder of the names a conversion writes, with a vanilla-transformer config.json (a trained model's Hub
    files), but no record of a conversion: --overwrite refuses it and leaves every file as it was."""
    output = Path(shutil.copytree(fsmt[4], tmp_path / "trained"))
    (output / ".vanilla_transformer_conversion.json").unlink()
    before = {path: path.read_bytes() for path in output.rglob("*") if path.is_file()}
    assert main([str(fsmt_folder), str(output), "--overwrite"]) == 1
    assert "no readable record of a conversion" in capsys.readouterr().err
    assert {path: path.read_bytes() for path in output.rglob("*") if path.is_file()} == before


def test_overwrite_never_replaces_a_conversion_edited_since(fsmt, fsmt_folder, tmp_path, capsys):
    output = Path(shutil.copytree(fsmt[4], tmp_path / "out"))
    config = {**json.loads((output / "config.json").read_text()), "dropout": 0.5}
    (output / "config.json").write_text(json.dumps(config))
    assert main([str(fsmt_folder), str(output), "--overwrite"]) == 1
    assert "config.json has " in capsys.readouterr().err  # another size than the conversion wrote
    assert json.loads((output / "config.json").read_text())["dropout"] == 0.5


def meanwhile(monkeypatch, change):
    """Run `change()` while a conversion runs: after its output folder was checked, before it is written."""
    checked = conversion.check_against_reference

    def check_then_change(*args):
        difference = checked(*args)
        change()
        return difference

    monkeypatch.setattr(conversion, "check_against_reference", check_then_change)


def test_a_folder_another_writer_filled_meanwhile_is_left_as_it_is(fsmt_folder, tmp_path, monkeypatch, capsys):
    """Two converts (or a convert and a training run) into one new folder: the second to finish replaces nothing."""
    output = tmp_path / "out"
    meanwhile(monkeypatch, lambda: (output.mkdir(), (output / "model.safetensors").write_bytes(b"theirs")))
    assert main([str(fsmt_folder), str(output)]) == 1
    assert "was written by someone else meanwhile" in capsys.readouterr().err
    assert [path.name for path in output.iterdir()] == ["model.safetensors"]
    assert (output / "model.safetensors").read_bytes() == b"theirs"
    assert not list(tmp_path.glob(".out.incomplete-*"))  # our staging folder is gone


def test_a_file_put_into_a_previous_conversion_meanwhile_stops_overwrite(
    fsmt, fsmt_folder, tmp_path, monkeypatch, capsys
):
    output = Path(shutil.copytree(fsmt[4], tmp_path / "out"))  # a previous conversion: --overwrite may replace it
    before = (output / "model.safetensors").stat().st_ino
    meanwhile(monkeypatch, lambda: (output / "notes.txt").write_text("mine"))
    assert main([str(fsmt_folder), str(output), "--overwrite"]) == 1
    assert "changed while it was written (it holds notes.txt)" in capsys.readouterr().err
    assert (output / "notes.txt").read_text() == "mine"
    assert (output / "model.safetensors").stat().st_ino == before


def dead_pid() -> int:
    """The id of a process that ran here and ended."""
    ended = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    return int(ended.stdout)


def test_what_a_killed_conversion_left_is_removed_and_a_live_ones_kept(fsmt_folder, tmp_path, monkeypatch):
    """kill -9 leaves the staging folder beside the output, what it renamed aside and its scratch folder: the next
    convert on this machine removes them, and leaves a running conversion's alone."""
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "tmp"))
    (tmp_path / "tmp").mkdir()
    host, dead, alive = socket.gethostname(), dead_pid(), os.getpid()
    left = [
        tmp_path / f".out.incomplete-{host}-{dead}-0123456789ab",
        tmp_path / f".out.incomplete-{host}-{dead}-0123456789ab.replaced",
        tmp_path / "tmp" / f"vanilla-transformer-convert-{host}-{dead}-x1y2z3",
    ]
    running = [
        tmp_path / f".out.incomplete-{host}-{alive}-ba9876543210",
        tmp_path / "tmp" / f"vanilla-transformer-convert-{host}-{alive}-a1b2c3",
        tmp_path / f".out.incomplete-elsewhere-{dead}-0123456789ab",
    ]
    for path in left + running:
        path.mkdir()
        (path / "model.safetensors").write_bytes(b"partial")
    assert main([str(fsmt_folder), str(tmp_path / "out")]) == 0
    assert not any(path.exists() for path in left)
    assert all(path.exists() for path in running)


@pytest.mark.parametrize(
    ("field", "value", "named"),
    [
        ("encoder_attention_heads", 3, "must be divisible by num_heads"),
        ("eos_token_id", 10**6, "`eos_token_id` (1000000) must be a token id"),
    ],
)
def test_a_source_config_the_model_cannot_take_is_one_error_line(marian_source, tmp_path, field, value, named, capsys):
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    config = {**json.loads((source / "config.json").read_text()), field: value}
    (source / "config.json").write_text(json.dumps(config))
    assert main([str(source), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert error.strip().splitlines()[-1].startswith("error: ") and named in error and "Traceback" not in error, error
    assert not (tmp_path / "out").exists()


class Payload:
    """What a hostile pytorch_model.bin pickles: unpickling it would run `os.system`."""

    def __reduce__(self):
        return (os.system, ("touch ran",))


def test_a_pickled_pytorch_model_bin_is_one_error_line_and_never_runs(marian_source, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    weights = {name: tensor for name, tensor in safetensors.torch.load_file(source / "model.safetensors").items()}
    (source / "model.safetensors").unlink()
    torch.save({**weights, "payload": Payload()}, source / "pytorch_model.bin")
    assert main([str(source), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert (
        error.strip().splitlines()[-1].startswith("error: ") and "pytorch_model.bin holds more than tensors" in error
    ), error
    assert "Traceback" not in error and not (tmp_path / "ran").exists()


def lying_safetensors(path: Path, lie: str) -> None:
    """Rewrite the safetensors file at `path` with a header that lies about its data in one way."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8 : 8 + size]), raw[8 + size :]
    name = next(key for key in header if key != "__metadata__")
    entry = header[name]
    if lie == "header longer than the file":
        path.write_bytes((len(raw) * 2).to_bytes(8, "little") + raw[8:])
        return
    if lie == "header not JSON":
        text = b"{not json" + b" " * (size - 9)
        path.write_bytes(size.to_bytes(8, "little") + text + data)
        return
    if lie == "offsets past the data":
        entry["data_offsets"] = [entry["data_offsets"][0], len(data) + 4096]
    elif lie == "shape larger than its bytes":
        entry["shape"] = [dimension * 1000 for dimension in entry["shape"]]
    elif lie == "unknown dtype":
        entry["dtype"] = "Q13"
    elif lie == "negative shape":
        entry["shape"] = [-1, *entry["shape"][1:]]
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


SAFETENSORS_LIES = [
    "header longer than the file",
    "header not JSON",
    "offsets past the data",
    "shape larger than its bytes",
    "unknown dtype",
    "negative shape",
]


@pytest.mark.parametrize("lie", SAFETENSORS_LIES)
def test_a_lying_safetensors_header_is_one_error_line(marian_source, tmp_path, lie, capsys):
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    lying_safetensors(source / "model.safetensors", lie)
    assert main([str(source), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert (
        error.strip().splitlines()[-1].startswith("error: ")
        and "model.safetensors" in error
        and "Traceback" not in error
    ), error
    assert len(error.strip().splitlines()) <= 3, error


def test_the_card_names_the_source_its_license_and_the_conversion(marian):
    card = (marian[4] / "README.md").read_text()  # the source's README.md says cc-by-4.0
    front = card.split("---\n")[1]
    assert 'license: "cc-by-4.0"' in front and 'language: ["en", "de"]' in front
    body = card.split("---\n", 2)[2]
    assert "Marian (OPUS-MT)" in body and "vanilla-transformer convert" in body and "cc-by-4.0" in body
    assert "**source**" in body and str(marian[4].parent) not in body  # the source folder by its name, not its path


def test_a_hub_id_is_downloaded_with_only_the_files_the_conversion_reads(marian_source, monkeypatch, tmp_path):
    import huggingface_hub

    source, calls = marian_source, []
    files = [path.name for path in source.iterdir()] + ["pytorch_model.bin", "tf_model.h5", "rust_model.ot"]
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo_id, revision=None: files)

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        calls.append((repo_id, revision, sorted(allow_patterns)))
        return str(source)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    folder = convert("Helsinki-NLP/opus-mt-tiny", tmp_path / "out", revision="main")
    assert calls[0][:2] == ("Helsinki-NLP/opus-mt-tiny", "main")
    assert "model.safetensors" in calls[0][2] and "pytorch_model.bin" not in calls[0][2]
    assert 'base_model: "Helsinki-NLP/opus-mt-tiny"' in (folder / "README.md").read_text()


def test_offline_a_hub_id_converts_from_the_local_cache(marian_source, monkeypatch, tmp_path):
    import huggingface_hub
    from huggingface_hub.errors import OfflineModeIsEnabled

    def offline(repo_id, revision=None):
        raise OfflineModeIsEnabled("offline mode is enabled")

    calls = []
    monkeypatch.setattr(huggingface_hub, "list_repo_files", offline)
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", lambda repo_id, **kwargs: calls.append(kwargs) or str(marian_source)
    )
    assert (convert("Helsinki-NLP/opus-mt-tiny", tmp_path / "out") / "model.safetensors").is_file()
    assert "*.safetensors" in calls[0]["allow_patterns"]


def test_hub_weights_are_safetensors_where_there_are_some_else_pytorch_model_bin():
    common = ["config.json", "README.md", "source.spm", "tf_model.h5", "rust_model.ot", "flax_model.msgpack"]
    assert hub_patterns([*common, "pytorch_model.bin"]) == [
        "config.json",
        "README.md",
        "source.spm",
        "pytorch_model.bin",
    ]
    assert hub_patterns([*common, "pytorch_model.bin", "model.safetensors"])[-1] == "model.safetensors"


def test_a_converted_model_that_computes_otherwise_than_the_source_is_refused_before_writing(
    marian_copy, tmp_path, monkeypatch
):
    build = conversion.build_model

    def build_wrong(source):  # a mapping error: one attention's W^K and W^V swapped
        model = build(source)
        attention = model.model.decoder.layers[0].encoder_attn
        with torch.no_grad():
            key = attention.k_proj.weight.clone()
            attention.k_proj.weight.copy_(attention.v_proj.weight)
            attention.v_proj.weight.copy_(key)
        return model

    monkeypatch.setattr(conversion, "build_model", build_wrong)
    with pytest.raises(ConversionError, match="logits differ from the source's"):
        convert(marian_copy, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_the_ctranslate2_export_of_a_converted_opus_mt_decodes_marians_tokens(marian, tmp_path):
    ctranslate2 = pytest.importorskip("ctranslate2")
    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2

    source, tokenizer, _, _, folder = marian
    translator = ctranslate2.Translator(convert_to_ctranslate2(folder, tmp_path / "ct2"), intra_threads=1)
    special = json.loads((tmp_path / "ct2" / "config.json").read_text())
    assert special["unk_token"] == "<unk>" and special["decoder_start_token"] == "<pad>"  # Marian's, not ours
    batch = tokenizer(MULTI30K_LIKE[4:8], return_tensors="pt", padding=True)
    expected = generated(source, batch, 1)
    tokens = [tokenizer.convert_ids_to_tokens(tokenizer(text)["input_ids"]) for text in MULTI30K_LIKE[4:8]]
    results = translator.translate_batch(tokens, beam_size=1, max_decoding_length=NEW_TOKENS)
    for result, row in zip(results, expected.tolist(), strict=True):
        ids = tokenizer.convert_tokens_to_ids(result.hypotheses[0])
        until_eos = row[1 : row.index(0)] if 0 in row else row[1:]  # generate() forces </s> (0) at the last step
        assert ids[: len(until_eos)] == until_eos and len(ids) >= len(until_eos)


def converted_folder(source: str, request, tmp_path) -> Path:
    if source == "marian":
        return convert(request.getfixturevalue("marian_source"), tmp_path / "converted")
    return request.getfixturevalue("fsmt")[4]


@pytest.mark.parametrize("source", ["marian", "fsmt"])
def test_a_converted_folder_is_a_complete_hub_folder_whose_upload_holds_its_tokenizer(source, request, tmp_path):
    from vanilla_transformer.hub.model_folder import check_model_folder, files_to_upload

    folder = converted_folder(source, request, tmp_path)
    assert check_model_folder(folder) == []
    tokenizer_files = {"marian": {"source.spm", "target.spm", "vocab.json"}, "fsmt": {"vocab-src.json", "merges.txt"}}
    assert tokenizer_files[source] <= set(files_to_upload(folder))


@pytest.mark.parametrize("source", ["marian", "fsmt"])
def test_a_converted_folders_stock_tokenizer_has_a_fingerprint_of_its_vocabulary(source, request, tmp_path):
    """What --evaluate_only and a prepared corpus compare: the stock tokenizers have no `tokenizers` backend."""
    import shutil

    from vanilla_transformer.data.prepare import tokenizer_fingerprint

    folder = converted_folder(source, request, tmp_path)
    fingerprint = tokenizer_fingerprint(load_tokenizer(folder))
    assert fingerprint == tokenizer_fingerprint(load_tokenizer(folder))
    changed = shutil.copytree(folder, tmp_path / "changed")
    vocabulary = changed / ("vocab.json" if source == "marian" else "vocab-src.json")
    entries = json.loads(vocabulary.read_text())
    first, second = list(entries)[-2:]
    entries[first], entries[second] = entries[second], entries[first]
    vocabulary.write_text(json.dumps(entries))
    if source == "fsmt":
        (changed / "vocab-tgt.json").write_text(json.dumps(entries))
    assert tokenizer_fingerprint(load_tokenizer(changed)) != fingerprint


@pytest.mark.parametrize("field", ["encoder_layers", "decoder_layers"])
def test_the_converters_layer_limit_is_the_loaders(tmp_path, field):
    """A stack the converter takes is one the loader takes, and one layer more is refused by both."""
    sizes = {
        "vocab_size": 100,
        "d_model": 8,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 1,
        "decoder_attention_heads": 1,
        "encoder_ffn_dim": 8,
        "decoder_ffn_dim": 8,
        "max_position_embeddings": 16,
    }
    for layers, accepted in ((MAX_LAYERS, True), (MAX_LAYERS + 1, False)):
        problems = Problems()
        check_sizes({**sizes, field: layers}, "source", problems)
        (tmp_path / "config.json").write_text(json.dumps({**sizes, field: layers}))
        try:
            check_folder_sizes(tmp_path)
            loads = True
        except ModelFolderError:
            loads = False
        assert (not problems.found) == accepted == loads, (layers, problems.found)


def test_a_config_claiming_over_a_billion_weights_over_tiny_ones_is_refused_before_building(marian_source, tmp_path):
    """1.28e9 weights claimed (feed-forward layers of 5,000,000) over a tiny model's: refused from config.json alone,
    by the loader's bound, before transformers builds the source model (5 GB)."""
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(
        json.dumps({**config, "encoder_ffn_dim": 5_000_000, "decoder_ffn_dim": 5_000_000})
    )
    with pytest.raises(ConversionError, match="config.json"):
        convert(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


# --- what a source may carry into the converted folder -------------------------------------------------------------


def test_a_source_file_linked_out_of_the_source_folder_is_refused_and_nothing_is_written(marian_source, tmp_path):
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    secrets = tmp_path / "home" / ".docker" / "config.json"
    secrets.parent.mkdir(parents=True)
    settings = json.loads((source / "tokenizer_config.json").read_text())
    secrets.write_text(json.dumps({**settings, "auths": {"registry": {"auth": "c2VjcmV0"}}}))
    (source / "tokenizer_config.json").unlink()
    (source / "tokenizer_config.json").symlink_to(secrets)
    with pytest.raises(
        ConversionError, match="tokenizer_config.json is a symbolic link to .*outside the source folder"
    ):
        convert(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["dict.txt", "bpecodes"])
def test_a_fairseq_file_beside_the_checkpoint_linked_out_of_its_folder_is_refused(
    fsmt_model, fairseq_files, tmp_path, name
):
    path = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files)
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    (path.parent / name).rename(outside)
    (path.parent / name).symlink_to(outside)
    with pytest.raises(ConversionError, match=f"{name} is a symbolic link to .*outside the source folder"):
        convert(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_keys_a_tokenizer_does_not_take_are_not_carried_into_the_converted_folder(marian_source, tmp_path):
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    settings = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps({**settings, "auths": {"registry": "secret"}}))
    output = convert(source, tmp_path / "out")
    written = json.loads((output / "tokenizer_config.json").read_text())
    assert "auths" not in written
    assert written["tokenizer_class"] and written["eos_token"] == settings.get("eos_token", written["eos_token"])


def test_a_hub_snapshot_may_link_into_its_repositorys_blobs_only(tmp_path):
    from vanilla_transformer.converters.untrusted import check_no_link_leaves

    repo = tmp_path / "models--user--model"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_text("{}")
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(repo / "blobs" / "abc")
    check_no_link_leaves(snapshot, allowed_root=repo)  # the cache's own layout
    (tmp_path / "elsewhere").write_text("{}")
    (snapshot / "vocab.json").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConversionError, match="vocab.json is a symbolic link"):
        check_no_link_leaves(snapshot, allowed_root=repo)


@pytest.mark.parametrize("field", ["max_position_embeddings", "vocab_size"])
def test_the_converters_table_bounds_are_the_loaders(tmp_path, field):
    """A position table is bounded at its peak (float64 with temporaries, 24 bytes an entry), an embedding matrix in
    float32, by the same limit as the loader's: a folder convert writes is one translate loads."""
    from vanilla_transformer.model.loading import MAX_TABLE_BYTES, POSITION_TABLE_BYTES

    d_model = 512
    per_entry = POSITION_TABLE_BYTES if field == "max_position_embeddings" else 4
    sizes = {
        "vocab_size": 1000, "d_model": d_model, "encoder_layers": 1, "decoder_layers": 1, "encoder_attention_heads": 8,
        "decoder_attention_heads": 8, "encoder_ffn_dim": 8, "decoder_ffn_dim": 8, "max_position_embeddings": 16,
    }  # fmt: skip
    limit = MAX_TABLE_BYTES // (per_entry * d_model)
    for rows, accepted in ((limit, True), (limit + 1, False)):
        problems = Problems()
        check_sizes({**sizes, field: rows}, "source", problems)
        (tmp_path / "config.json").write_text(json.dumps({**sizes, field: rows}))
        try:
            check_folder_sizes(tmp_path)
            loads = True
        except ModelFolderError:
            loads = False
        assert (not problems.found) == accepted == loads, (rows, problems.found)


def test_a_duplicated_merge_keeps_its_first_rank_as_subword_nmt_does(tmp_path):
    """subword-nmt ranks a duplicated merge by its first line, FSMTTokenizer by its last: the written merges.txt
    gives subword-nmt's segmentation."""
    from subword_nmt.apply_bpe import BPE
    from transformers import FSMTTokenizer

    from vanilla_transformer.converters.fairseq import fsmt_merges

    codes = "#version: 0.2\na b\nb c</w>\na b\n"  # "a b" first at rank 0, again after "b c</w>"
    (tmp_path / "bpecodes").write_text(codes)
    (tmp_path / "merges.txt").write_text(fsmt_merges(tmp_path / "bpecodes"))
    vocabulary = tmp_path / "vocab.json"
    vocabulary.write_text(json.dumps({token: i for i, token in enumerate(["<s>", "<pad>", "</s>", "<unk>"])}))
    tokenizer = FSMTTokenizer(["en", "de"], str(vocabulary), str(vocabulary), str(tmp_path / "merges.txt"))
    assert BPE(io.StringIO(codes)).process_line("abc") == "ab@@ c"
    assert tokenizer.bpe("abc") == "ab c</w>"


def test_merges_given_more_than_once_are_said(tmp_path, caplog):
    from vanilla_transformer.converters.fairseq import fsmt_merges

    (tmp_path / "bpecodes").write_text("#version: 0.2\n" + "a b\n" * 1000 + "b c</w>\n")
    assert fsmt_merges(tmp_path / "bpecodes") == "a b\nb c</w>\n"
    assert "holds 999 merge(s) more than once: each keeps its first rank" in caplog.text


def test_empty_bpe_codes_are_refused(tmp_path):
    from vanilla_transformer.converters.fairseq import fsmt_merges

    (tmp_path / "bpecodes").write_text("#version: 0.2\n")
    with pytest.raises(ConversionError, match="holds no merges"):
        fsmt_merges(tmp_path / "bpecodes")


def test_a_source_folders_name_goes_into_the_card_as_plain_text(marian_source, tmp_path):
    source = Path(shutil.copytree(marian_source, tmp_path / "m<img src=x onerror=alert(1)>\nodel"))
    card = (convert(source, tmp_path / "out") / "README.md").read_text()
    assert not re.search(r"(?<!\\)<img", card)  # no tag a Markdown renderer would show as HTML
    assert "m\\<img src=x onerror=alert\\(1\\)\\> odel" in card  # escaped, and on one line


def test_separate_vocabularies_translate_the_same_through_the_pipeline_translate_and_the_demo(separate):
    """Downstream of the conversion: the pipeline, `translate`'s library function and the demo give generate()'s
    text for a folder with two vocabularies."""
    from pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline
    from vanilla_transformer.serving.demo import load_translator, translate_text
    from vanilla_transformer.serving.translate import load_model_and_tokenizer, translate_sentences

    _, _, _, _, folder = separate
    model, tokenizer = load_model_and_tokenizer(folder)
    sentences = MULTI30K_LIKE[4:7]
    with torch.inference_mode():
        ids = model.generate(**tokenizer(sentences, return_tensors="pt", padding=True), num_beams=1, max_new_tokens=8)
    expected = tokenizer.batch_decode(ids, skip_special_tokens=True)
    assert translate_sentences(model, tokenizer, sentences, num_beams=1, max_new_tokens=8) == expected
    pipeline = VanillaTransformerTranslationPipeline(model=model, tokenizer=tokenizer, device=-1)
    assert [pipeline(text, num_beams=1, max_new_tokens=8)[0]["translation_text"] for text in sentences] == expected
    translator = load_translator(str(folder))
    translator.model.generation_config.max_new_tokens = 8
    assert translate_text(translator, "\n".join(sentences), 1, 1.0)[0].splitlines() == expected


def test_a_tensor_that_repeats_its_storage_is_refused_before_it_is_copied(fsmt_model, fairseq_files, tmp_path):
    """A stride-0 view saves a few bytes and would become gigabytes once copied: refused, naming the tensor."""
    state = fairseq_state(fsmt_model)
    state["encoder.layers.0.fc1.bias"] = torch.zeros(1).expand(2 * 10**9)
    checkpoint = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files, state=state)
    assert checkpoint.stat().st_size < 10 * 2**20
    with pytest.raises(
        ConversionError, match=r"model.encoder.layers.0.fc1.bias holds 2,000,000,000 values over a storage of 1"
    ):
        convert(checkpoint, tmp_path / "out", source_lang="en", target_lang="de")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "abuse",
    [
        {"max_source_positions": "many"},
        {"encoder_embed_dim": [32]},
        {"dropout": "high"},
        {"activation_fn": 5},
        {"encoder_attention_heads": True},
        {"source_lang": ["en"]},
    ],
    ids=str,
)
def test_a_hand_made_namespace_of_wrong_types_is_one_error_line(fsmt_model, fairseq_files, tmp_path, abuse, capsys):
    """A checkpoint's `args` hold what anyone pickled: a value of the wrong type is named, never a traceback."""
    checkpoint = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files, args=fairseq_args(**abuse))
    assert main([str(checkpoint), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert error.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in error, error
    assert next(iter(abuse)) in error, error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is not a torch checkpoint: it is empty"),
        (b'{"model": {}}', "is not a torch checkpoint: it is neither a zip archive nor a pickle"),
        (b"hello world\n", "is not a torch checkpoint: it is neither a zip archive nor a pickle"),
        (b"\x80\x02" + bytes(range(256)) * 8, "is not a readable torch checkpoint"),
    ],
    ids=["empty", "json", "text", "garbled pickle"],
)
def test_a_file_that_is_no_checkpoint_is_one_error_line(tmp_path, capsys, content, message):
    (tmp_path / "model.pt").write_bytes(content)
    code = main([str(tmp_path / "model.pt"), str(tmp_path / "out"), "--source_lang", "en", "--target_lang", "de"])
    error = capsys.readouterr().err
    assert code == 1 and error.startswith("error: ") and error.count("\n") == 1, error
    assert message in error


def out_of_range(folder: Path) -> None:
    vocabulary = json.loads((folder / "vocab.json").read_text())
    vocabulary[next(iter(vocabulary))] = 99999
    (folder / "vocab.json").write_text(json.dumps(vocabulary))


@pytest.mark.parametrize(
    "damage, message",
    [
        (lambda folder: (folder / "vocab.json").write_text("[1, 2, 3]"), "vocab.json is not a vocabulary"),
        (lambda folder: (folder / "vocab.json").write_text('"abc"'), "vocab.json is not a vocabulary"),
        (lambda folder: (folder / "vocab.json").write_text("{not json"), "vocab.json is not valid JSON"),
        (lambda folder: (folder / "source.spm").write_bytes(b"no model"), "source.spm is not a SentencePiece model"),
        (out_of_range, "vocab.json has ids outside the model's vocabulary of"),
    ],
    ids=["vocab list", "vocab string", "vocab invalid", "spm garbage", "ids out of range"],
)
def test_broken_opus_mt_tokenizer_files_are_one_error_naming_the_file(marian_source, tmp_path, damage, message):
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    damage(source)
    with pytest.raises(ConversionError, match=message):
        convert(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["dict.txt", "bpecodes"])
def test_a_dictionary_or_codes_that_are_not_utf8_are_one_refusal_naming_the_file(
    fsmt_model, fairseq_files, tmp_path, name
):
    checkpoint = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files)
    (checkpoint.parent / name).write_bytes(b"\xff\xfe\x00 binary \x80\x81")
    with pytest.raises(ConversionError, match=f"{name} is not UTF-8 text"):
        convert(checkpoint, tmp_path / "out", source_lang="en", target_lang="de")
