"""fairseq `transformer` checkpoints (with dict.txt and bpecodes) converted to the logits, tokens and tokenization of
FSMT fed the same weights and of fairseq itself, or refused by name where the model cannot represent them.

Where fairseq is installed, the checkpoint is also checked against fairseq's own TransformerModel: `fairseq-fixed`
(PyPI) builds from source here in about 2 minutes (`pip install --no-deps --no-build-isolation`, with cython), but it
needs hydra-core, omegaconf and scikit-learn, so it is no dev dependency and that test skips without it. What fairseq
itself writes is in tests/fixtures/fairseq_train: a checkpoint fairseq-train wrote, the same with its `cfg` an
omegaconf DictConfig, and fairseq's own logits on a batch, made by tests/fixtures/make_fairseq_checkpoint.sh in an
environment with fairseq.
"""

import argparse
import io
import json
import sys
import types
from pathlib import Path

import pytest
import torch
from sacremoses import MosesDetokenizer
from subword_nmt.apply_bpe import BPE
from transformers import FSMTConfig, FSMTForConditionalGeneration

from vanilla_transformer.converters import convert as conversion
from vanilla_transformer.converters.convert import convert
from vanilla_transformer.converters.core import ConversionError
from vanilla_transformer.data.tokenization import load_tokenizer

from .sources import (
    SENTENCES,
    TOLERANCE,
    check_same_generation,
    converted_model,
    fairseq_args,
    fairseq_state,
    fairseq_symbols,
    fake_omegaconf,
    logits_difference,
    padded_batch,
    wmt_preprocessing,
    write_fairseq,
)

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
        langs=["en", "de"],
        src_vocab_size=size,
        tgt_vocab_size=size,
        d_model=16,
        encoder_layers=2,
        decoder_layers=2,
        encoder_ffn_dim=32,
        decoder_ffn_dim=32,
        encoder_attention_heads=2,
        decoder_attention_heads=2,
        max_position_embeddings=64,
        activation_function="relu",
        scale_embedding=True,
        tie_word_embeddings=True,
        dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
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


@pytest.fixture(scope="module")
def fairseq(fairseq_checkpoint, fsmt_model, tmp_path_factory):
    """The fairseq checkpoint converted; its reference is FSMT fed the same weights (`fsmt_model`)."""
    output = convert(fairseq_checkpoint, tmp_path_factory.mktemp("fairseq_converted") / "converted")
    return fsmt_model, None, converted_model(output), load_tokenizer(output), output


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


@pytest.mark.parametrize("name", ["dict.txt", "bpecodes"])
def test_a_dictionary_or_codes_that_are_not_utf8_are_one_refusal_naming_the_file(
    fsmt_model, fairseq_files, tmp_path, name
):
    checkpoint = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files)
    (checkpoint.parent / name).write_bytes(b"\xff\xfe\x00 binary \x80\x81")
    with pytest.raises(ConversionError, match=f"{name} is not UTF-8 text"):
        convert(checkpoint, tmp_path / "out", source_lang="en", target_lang="de")
