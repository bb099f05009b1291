"""Tiny foreign sources for the converter's tests (OPUS-MT folders, their SentencePiece vocabularies, random
weights whose outputs depend on what they read): shared by tests/test_convert.py and tests/test_opus_mt_folder.py."""

import io
import json
import os
import shutil
from pathlib import Path

import sentencepiece
import torch
from transformers import MarianConfig, MarianMTModel

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
            sentence_iterator=iter(texts), model_writer=model, vocab_size=vocab_size, model_type="unigram",
            character_coverage=1.0, hard_vocab_limit=False, logstream=quiet,
        )  # fmt: skip
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
        vocab_size=size, **SIZES, **HEADS, max_position_embeddings=128, activation_function=activation,
        scale_embedding=True, pad_token_id=size - 1, decoder_start_token_id=size - 1, eos_token_id=0,
        forced_eos_token_id=0, bos_token_id=0 if activation == "swish" else None,
    )  # fmt: skip
    config = MarianConfig(**{**settings, **overrides})
    model = scramble(MarianMTModel(config))
    model.final_logits_bias.copy_(
        0.5 * torch.randn(model.final_logits_bias.shape, generator=torch.Generator().manual_seed(5))
    )
    model.generation_config.num_beams = 4  # OPUS-MT's folders decode with beams
    model.save_pretrained(folder)
    return folder
