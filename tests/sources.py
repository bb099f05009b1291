"""Tiny foreign sources for the converter's tests, and how a converted model is compared with its source: shared by
tests/test_convert_*.py, tests/test_opus_mt_folder.py and the fixtures in tests/conftest.py.

The sources are built here, offline, with random weights: a MarianMTModel folder (OPUS-MT's layout: a SentencePiece
vocabulary trained here, source.spm, target.spm and vocab.json; swish and ReLU; a nonzero final_logits_bias), an
FSMTForConditionalGeneration folder, and a fairseq checkpoint (`args` and a state dict under fairseq's names, saved
with torch.save) with its dict.txt and subword-nmt BPE codes. The random weights are drawn so that the outputs depend
on every token and position (`scramble`): a model at transformers' initialisation repeats one token whatever it reads.
"""

import argparse
import collections
import io
import json
import os
import shutil
import sys
import types
from pathlib import Path

import sentencepiece
import torch
from sacremoses import MosesPunctNormalizer, MosesTokenizer
from subword_nmt.apply_bpe import BPE
from subword_nmt.learn_bpe import learn_bpe
from transformers import FSMTForConditionalGeneration, MarianConfig, MarianMTModel

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.data.toy_task import synthetic_translation_pairs

# Multi30k-like sentences with punctuation, digits, accents, quotes, dashes and abbreviations
MULTI30K_LIKE = [
    "Two young, White males are outside near many bushes.",
    "A man in an orange hat starring at something.",
    "Zwei Männer stehen am Herd und bereiten Essen zu.",
    "Ein Mädchen im Café trinkt 2 Tassen Kaffee – sehr heiß!",
    "Les élèves, âgés de 12 ans, étudient à l'école.",
    "A dog runs (fast) through 3.5 km of snow; it's cold.",
    "\"Look!\" she said: 'the 1st place is ours.'",
    "Mr. Smith paid $20 for 2-3 apples at 9:30 a.m.",
    "Größe: 1,80 m – Gewicht: 75 kg.",
    "A well-known e-mail address: info@example.com",
    "Is this the end...? No!",
    "Señor Núñez über-cool naïve façade.",
    "Four kids—two boys and two girls—play soccer in 2017.",
    "„Guten Morgen“, sagt die Frau zu ihren 3 Hunden.",
    "The café's menu lists crème brûlée for €4.50.",
    "Ein Junge (7) springt über 10 Pfützen; er lacht.",
    "Workers in yellow vests repair the road at 100% speed!",
    "Eine Gruppe von Menschen steht vor einem Iglu.",
    "A brown dog is running after the black dog.",
    "Zwei Hunde spielen im Schnee, während es schneit.",
    "A little girl climbs into a wooden playhouse.",
    "Ein kleines Mädchen klettert in ein Spielhaus aus Holz.",
    "Someone in a blue shirt and hat is standing on stairs and leaning against a window.",
    "Jemand mit einem blauen Hemd und Hut steht auf der Treppe.",
    "A woman, wearing a 'Save the Earth' t-shirt, smiles.",
    "Öl, Äpfel & Übungen: 1. Teil, 2. Teil.",
    "What?! 42 dogs... at 5 o'clock?",
    "Le garçon mange 3 crêpes à Noël.",
    "An older man plays a 12-string guitar on 5th Avenue.",
    "Ein älterer Mann spielt Gitarre auf der Straße.",
]
SENTENCES = [text for pair in synthetic_translation_pairs(150, seed=1) for text in pair] + MULTI30K_LIKE
SIZES = dict(d_model=32, encoder_layers=2, decoder_layers=2, encoder_ffn_dim=64, decoder_ffn_dim=64)
HEADS = dict(encoder_attention_heads=4, decoder_attention_heads=4)


def scramble(model: torch.nn.Module, seed: int = 0) -> torch.nn.Module:
    """Random weights with which outputs depend on the tokens and positions read: a model at transformers'
    initialisation, or any random model whose output projection is its input embedding, mostly repeats the token it
    just read (the residual carries that token's embedding to the logits). So the embeddings' rows have one norm, and
    the gain of the decoder's last LayerNorm is negative. The position tables are kept: they are the sinusoids."""
    generator = torch.Generator().manual_seed(seed)
    last_norm = f"decoder.layers.{model.config.decoder_layers - 1}.final_layer_norm.weight"
    with torch.no_grad():
        for name, parameter in model.named_parameters():
            if "embed_positions" in name:
                continue
            noise = torch.randn(parameter.shape, generator=generator)
            if "layer_norm" in name:
                sign = -1 if name.endswith(last_norm) else 1
                parameter.copy_(sign * (1 + 0.2 * noise) if name.endswith("weight") else 0.2 * noise)
            elif "embed_tokens" in name or "shared" in name or "lm_head" in name:
                parameter.copy_(1.5 * noise / noise.norm(dim=1, keepdim=True))
            elif parameter.dim() == 2:
                parameter.copy_(noise / parameter.shape[1] ** 0.5)
            else:
                parameter.copy_(0.2 * noise)
    return model.eval()


def train_sentencepiece(texts: list[str], path: Path, vocab_size: int) -> list[str]:
    """A unigram SentencePiece model trained on `texts`, written to `path`; returns its pieces."""
    model = io.BytesIO()
    with open(os.devnull, "w") as quiet:
        sentencepiece.SentencePieceTrainer.train(
            sentence_iterator=iter(texts),
            model_writer=model,
            vocab_size=vocab_size,
            model_type="unigram",
            character_coverage=1.0,
            hard_vocab_limit=False,
            logstream=quiet,
        )
    path.write_bytes(model.getvalue())
    processor = sentencepiece.SentencePieceProcessor(model_file=str(path))
    return [processor.id_to_piece(index) for index in range(processor.get_piece_size())]


def make_marian_vocabulary(folder: Path) -> Path:
    """OPUS-MT's tokenizer files: a SentencePiece model per language and one vocab.json over both (</s> 0, <unk> 1,
    <pad> last), as MarianTokenizer reads them."""
    folder.mkdir(parents=True, exist_ok=True)
    pairs = synthetic_translation_pairs(300, seed=2)
    pieces = train_sentencepiece([s for s, _ in pairs] + MULTI30K_LIKE, folder / "source.spm", 160)
    pieces += train_sentencepiece([t for _, t in pairs] + MULTI30K_LIKE, folder / "target.spm", 160)
    vocabulary = {"</s>": 0, "<unk>": 1}
    for piece in pieces:
        vocabulary.setdefault(piece, len(vocabulary)) if piece not in ("<s>", "<pad>") else None
    vocabulary["<pad>"] = len(vocabulary)
    (folder / "vocab.json").write_text(json.dumps(vocabulary, ensure_ascii=False))
    (folder / "tokenizer_config.json").write_text(json.dumps({"source_lang": "en", "target_lang": "de"}))
    (folder / "README.md").write_text("---\nlicense: cc-by-4.0\n---\n# opus-mt-tiny\n")
    return folder


def write_marian(folder: Path, vocabulary: Path, activation: str = "swish", **overrides) -> Path:
    """A MarianMTModel folder of OPUS-MT's layout with random weights and a nonzero final_logits_bias; OPUS-MT's
    bos_token_id 0 with swish, MarianConfig's None with ReLU."""
    shutil.copytree(vocabulary, folder)
    size = len(json.loads((folder / "vocab.json").read_text()))
    settings = dict(
        vocab_size=size,
        **SIZES,
        **HEADS,
        max_position_embeddings=128,
        activation_function=activation,
        scale_embedding=True,
        pad_token_id=size - 1,
        decoder_start_token_id=size - 1,
        eos_token_id=0,
        forced_eos_token_id=0,
        bos_token_id=0 if activation == "swish" else None,
    )
    config = MarianConfig(**{**settings, **overrides})
    model = scramble(MarianMTModel(config))
    model.final_logits_bias.copy_(
        0.5 * torch.randn(model.final_logits_bias.shape, generator=torch.Generator().manual_seed(5))
    )
    model.generation_config.num_beams = 4  # OPUS-MT's folders decode with beams
    model.save_pretrained(folder)
    return folder


# --- FSMT and fairseq sources ---------------------------------------------------------------------------------------


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


def fairseq_args(**overrides) -> argparse.Namespace:
    """A fairseq transformer's `args` as its checkpoints store them."""
    settings = dict(
        arch="transformer",
        task="translation",
        source_lang="en",
        target_lang="de",
        encoder_embed_dim=32,
        decoder_embed_dim=32,
        encoder_ffn_embed_dim=64,
        decoder_ffn_embed_dim=64,
        encoder_layers=2,
        decoder_layers=2,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
        encoder_normalize_before=False,
        decoder_normalize_before=False,
        encoder_learned_pos=False,
        decoder_learned_pos=False,
        share_all_embeddings=True,
        share_decoder_input_output_embed=True,
        activation_fn="relu",
        dropout=0.3,
        attention_dropout=0.1,
        activation_dropout=0.0,
        max_source_positions=128,
        max_target_positions=128,
        adaptive_softmax_cutoff=None,
        no_scale_embedding=False,
        no_token_positional_embeddings=False,
        layernorm_embedding=False,
        decoder_output_dim=32,
        decoder_input_dim=32,
        lr=[0.0005],
        optimizer="adam",
    )
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


# --- a converted model against its source ------------------------------------------------------------------------

NEW_TOKENS = 10  # generated tokens compared
TOLERANCE = 1e-5  # the largest logit difference from the source, float32


def converted_model(folder: Path) -> VanillaTransformerForConditionalGeneration:
    return VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()


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
            input_ids=batch["input_ids"],
            attention_mask=batch["attention_mask"],
            num_beams=num_beams,
            max_new_tokens=NEW_TOKENS,
            do_sample=False,
            length_penalty=1.0,
            early_stopping=False,
        )


def check_same_generation(pair, tokenizer, num_beams: int, sentences=MULTI30K_LIKE[4:10]) -> None:
    source, _, ours, _, _ = pair
    batch = tokenizer(sentences, return_tensors="pt", padding=True)
    expected = generated(source, batch, num_beams)
    distinct = [len(set(row[1:])) for row in expected.tolist()]
    assert len({tuple(row) for row in expected.tolist()}) > 1 and max(distinct) > 3, "the random source repeats itself"
    assert torch.equal(generated(ours, batch, num_beams), expected)
