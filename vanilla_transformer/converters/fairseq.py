"""fairseq `transformer` checkpoints, with their dictionary and BPE codes (the checkpoint itself is read by
fairseq_checkpoint.py, which runs none of its code). Older names (fused `in_proj_weight`, `layer_norms.N`) are read as
fairseq 0.9 and later load them.

The tokenizer is transformers' `FSMTTokenizer`, its files built from the dictionary and BPE codes as transformers' own
FSMT conversion builds them (a continued subword "xy@@" becomes "xy", a word end "xy" becomes "xy</w>"; fairseq's four
special symbols keep ids 0-3). Its ids are those of fairseq's WMT data preparation (Moses normalize-punctuation,
remove-non-printing-char, tokenizer -a, then subword-nmt); fairseq's hub interface tokenizes without the
normalization, so it gives other ids on the characters normalization changes (e.g. "–" becomes "-"), and the same ids
elsewhere. The reference the converted model is checked against is FSMT, transformers' port of fairseq's model, fed
the same weights.
"""

import argparse
import json
import logging
import re
from pathlib import Path
from typing import Any

import torch
from torch import nn

from vanilla_transformer.converters.core import (
    FSMT_TOKENIZER_FILES,
    ConversionError,
    Problems,
    Source,
    one_embedding,
    refuse,
    weights_problem,
)
from vanilla_transformer.converters.fairseq_checkpoint import load_fairseq_checkpoint
from vanilla_transformer.converters.untrusted import SIZE_LIMITS, beside, check_sizes, read_text
from vanilla_transformer.model.loading import MAX_MODEL_BYTES

logger = logging.getLogger(__name__)

FAIRSEQ_SPECIALS = ("<s>", "<pad>", "</s>", "<unk>")  # a fairseq Dictionary's first four symbols: bos, pad, eos, unk
FAIRSEQ_REFUSALS = {
    "encoder_normalize_before": (False, "pre-LN encoder layers"),
    "decoder_normalize_before": (False, "pre-LN decoder layers"),
    "layernorm_embedding": (False, "a LayerNorm on the embeddings"),
    "encoder_learned_pos": (False, "learned encoder positions"),
    "decoder_learned_pos": (False, "learned decoder positions"),
    "no_token_positional_embeddings": (False, "no positions at all"),
    "adaptive_input": (False, "adaptive input embeddings"),
    "adaptive_softmax_cutoff": (None, "an adaptive softmax"),
    "cross_self_attention": (False, "cross+self attention"),
    "no_cross_attention": (False, "a decoder without encoder-decoder attention"),
}
FAIRSEQ_ACTIVATIONS = {
    "relu": "relu",
    "gelu": "gelu",
    "gelu_accurate": "gelu_new",
    "gelu_fast": "gelu_new",
    "tanh": "tanh",
}
# what every fairseq transformer is, whatever its settings say: sinusoids (all sines, then all cosines) of fairseq's
# frequencies counted from the position after the padding id, tied embeddings, no output bias, and FAIRSEQ_SPECIALS' ids
FAIRSEQ_LAYOUT = {
    "position_embedding_type": "sinusoidal",
    "position_layout": "sin_cos",
    "position_frequencies": "fairseq",
    "position_offset": 2,
    "lm_head_bias": False,
    "tie_word_embeddings": True,
    "layer_norm_eps": 1e-5,
    "pad_token_id": 1,
    "bos_token_id": 0,
    "eos_token_id": 2,
    "decoder_start_token_id": 2,
    "forced_eos_token_id": 2,
}
LEGACY_NORMS = {
    "encoder": {"0": "self_attn_layer_norm", "1": "final_layer_norm"},
    "decoder": {"0": "self_attn_layer_norm", "1": "encoder_attn_layer_norm", "2": "final_layer_norm"},
}


def read_fairseq(path: Path, dictionary, bpe_codes, languages, scratch: Path) -> Source:
    """A fairseq transformer checkpoint, its dictionary (one, or the source's and the target's, which must be the
    same) and BPE codes (default: dict.txt, dict.SRC.txt and dict.TGT.txt, bpecodes beside it). One ConversionError
    names every problem found in its settings, weights and dictionary."""
    state = load_fairseq_checkpoint(path)
    settings = fairseq_settings(state, path)
    languages = tuple(
        given or settings.get(name) for given, name in zip(languages, ("source_lang", "target_lang"), strict=True)
    )
    named = all(isinstance(language, str) and language for language in languages)
    with Problems() as problems:
        if not named:
            problems.add(
                f"{path}: its settings name no source_lang and target_lang: give --source_lang and --target_lang"
            )
        layers, embeddings = fairseq_weights(state, problems)
        if not embeddings:
            raise ConversionError(f"{path}: the checkpoint's model has no encoder.embed_tokens.weight")
        why = "fairseq's share_all_embeddings / share_decoder_input_output_embed were off"
        embedding = one_embedding(embeddings, why, problems)
        fields = fairseq_fields(settings, layers, embedding, f"{path} (settings)", problems)
        # the dictionary files beside the checkpoint are named after the languages
        symbols = (
            fairseq_dictionary(dictionary_files(path, dictionary, languages), embedding, problems) if named else []
        )
    codes = bpe_codes if bpe_codes is not None else beside(path.parent, "bpecodes")
    tokenizer = tokenizer_from_fairseq(symbols, Path(codes), languages, fields["max_position_embeddings"], scratch)
    reference = fsmt_reference(fields, layers, embedding, languages)
    card_name = f"{path.parent.name}/{path.name}" if path.parent.name else path.name
    # the paper's decoding (Ott et al. 2018 report their BLEU with it), and </s> at the last step as fairseq forces it
    decoding = {"forced_eos_token_id": fields["eos_token_id"]}
    return Source(
        "fairseq",
        card_name,
        fields,
        layers,
        embedding,
        tokenizer,
        reference,
        decoding=decoding,
        languages=languages,
        dtype=embedding.dtype,
    )


# the settings read from a checkpoint, with the types fairseq gives them: anything else in a pickle is refused
INTEGER, NUMBER, TEXT = ("an integer", (int,)), ("a number", (int, float)), ("a string", (str,))
SETTING_TYPES = {
    **{f"{side}_{name}": INTEGER for side in ("encoder", "decoder") for name in ("embed_dim", "ffn_embed_dim")},
    **{f"{side}_{name}": INTEGER for side in ("encoder", "decoder") for name in ("layers", "attention_heads")},
    "max_source_positions": INTEGER,
    "max_target_positions": INTEGER,
    **{name: NUMBER for name in ("dropout", "attention_dropout", "activation_dropout", "relu_dropout")},
    "activation_fn": TEXT,
    "source_lang": TEXT,
    "target_lang": TEXT,
    "no_scale_embedding": ("true or false", (bool,)),
}


def fairseq_settings(state: dict, path: Path) -> dict[str, Any]:
    """A fairseq checkpoint's model settings: `args` (an argparse.Namespace), or `cfg` (fairseq 0.10 and later: a plain
    dict, or an omegaconf DictConfig read as one) and its `model` section (a dict, or an argparse.Namespace for the
    architectures fairseq registers without a dataclass), with its `task`'s languages. The settings this converter
    reads must have fairseq's types (SETTING_TYPES): one ConversionError names every one that has not."""
    settings = None
    if isinstance(state.get("args"), argparse.Namespace):
        settings = vars(state["args"])
    elif isinstance(cfg := state.get("cfg"), dict):
        model, task = (
            vars(part) if isinstance(part, argparse.Namespace) else part for part in map(cfg.get, ("model", "task"))
        )
        task = task if isinstance(task, dict) else {}
        if isinstance(model, dict):
            settings = {**{name: task.get(name) for name in ("source_lang", "target_lang")}, **model}
    if settings is not None:
        with Problems() as problems:
            for name, (kind, types) in SETTING_TYPES.items():
                value = settings.get(name)
                wrong_bool = isinstance(value, bool) and bool not in types
                if value is not None and (wrong_bool or not isinstance(value, types)):
                    problems.add(f"{path}: the setting {name} is {value!r:.80}, not {kind}")
        return settings
    raise ConversionError(
        f"{path} has neither `args` (an argparse.Namespace) nor `cfg` with a `model` section: its architecture is "
        "unknown"
    )


def modern_names(weights: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    """Older fairseq names as fairseq 0.9 and later load them: one `in_proj_weight`/`in_proj_bias` per attention
    (rows q, k, v) into q_proj, k_proj, v_proj; a layer's `layer_norms.N` into its named LayerNorms."""
    renamed = {}
    for key, tensor in weights.items():
        norm = re.fullmatch(r"(encoder|decoder)(\.layers\.\d+\.)layer_norms\.(\d)\.(weight|bias)", key)
        fused = re.fullmatch(r"(.+)\.in_proj_(weight|bias)", key)
        if norm and norm[3] in LEGACY_NORMS[norm[1]]:
            renamed[f"{norm[1]}{norm[2]}{LEGACY_NORMS[norm[1]][norm[3]]}.{norm[4]}"] = tensor
        elif fused and tensor.shape[0] % 3 == 0:
            for part, rows in zip(("q_proj", "k_proj", "v_proj"), tensor.chunk(3), strict=True):
                renamed[f"{fused[1]}.{part}.{fused[2]}"] = rows
        else:
            renamed[key] = tensor
    return renamed


def fairseq_weights(state: dict, problems: Problems) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """A fairseq state dict as (layers, embeddings), in float32; version counters and the sinusoid buffers (which
    fairseq recomputes) dropped, a problem for each table of learned positions."""
    layers, embeddings, values = {}, {}, 0
    for key, tensor in modern_names(state["model"]).items():
        if not isinstance(tensor, torch.Tensor):
            raise ConversionError(f"the checkpoint's model.{key} is a {type(tensor).__name__}, not a tensor")
        stored = tensor.untyped_storage().nbytes() // max(tensor.element_size(), 1)
        if tensor.numel() > stored:  # a view that repeats its storage (stride 0): tiny on disk, huge once copied
            raise ConversionError(
                f"the checkpoint's model.{key} holds {tensor.numel():,} values over a storage of {stored:,}: "
                "a checkpoint of weights stores every value it holds"
            )
        values += tensor.numel()
        if values * 4 > MAX_MODEL_BYTES:
            raise ConversionError(
                f"the checkpoint's weights hold over {MAX_MODEL_BYTES // 4:,} values, the most a model folder may "
                "have (the loader's limit)"
            )
        if key in ("encoder.version", "decoder.version") or key.endswith("embed_positions._float_tensor"):
            continue
        if key.endswith("embed_positions.weight"):
            problems.add(f"the checkpoint has {key}: learned positions, which the paper's model does not have")
            continue
        names = ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight")
        target = embeddings if key in names or key == "decoder.embed_out" else layers
        target[key] = tensor.detach().float()
    return layers, embeddings


def fairseq_fields(
    settings: dict, layers: dict, embedding: torch.Tensor, where: str, problems: Problems
) -> dict[str, Any]:
    """Our config's fields for a fairseq transformer: sizes from its weights (checked against its settings), heads,
    activation and dropouts from its settings; a problem for each setting the model cannot hold."""
    refuse(settings, FAIRSEQ_REFUSALS, where, problems)
    heads = {side: settings.get(f"{side}_attention_heads") for side in ("encoder", "decoder")}
    missing = [f"{side}_attention_heads" for side, value in heads.items() if not isinstance(value, int)]
    for name in missing:
        problems.add(f"{where}: the settings have no {name}, which the weights cannot tell")
    count = lambda side: len({key.split(".")[2] for key in layers if key.startswith(f"{side}.layers.")})  # noqa: E731
    positions = max(settings.get(f"max_{side}_positions") or 1024 for side in ("source", "target"))
    fields = {
        "vocab_size": embedding.shape[0],
        "d_model": embedding.shape[1],
        "encoder_layers": count("encoder"),
        "decoder_layers": count("decoder"),
        "encoder_attention_heads": heads["encoder"],
        "decoder_attention_heads": heads["decoder"],
        "max_position_embeddings": positions,
    }
    for side in ("encoder", "decoder"):
        fc1 = layers.get(f"{side}.layers.0.fc1.weight")
        fields[f"{side}_ffn_dim"] = fc1.shape[0] if fc1 is not None else settings.get(f"{side}_ffn_embed_dim")
        for name, value in ((f"{side}_embed_dim", fields["d_model"]), (f"{side}_layers", fields[f"{side}_layers"])):
            if settings.get(name) not in (None, value):
                problems.add(f"{where}: {name} is {settings[name]!r} but the weights have {value}")
    check_sizes({name: value for name, value in fields.items() if name not in missing}, where, problems)
    activation = settings.get("activation_fn", "relu")
    if activation not in FAIRSEQ_ACTIVATIONS:
        problems.add(f"{where}: activation_fn is {activation!r}; the model has {', '.join(FAIRSEQ_ACTIVATIONS)}")
    dropouts = {
        "dropout": settings.get("dropout", 0.1),
        "attention_dropout": settings.get("attention_dropout", 0.0),
        "activation_dropout": settings.get("activation_dropout") or settings.get("relu_dropout") or 0.0,
    }
    return {
        **fields,
        **dropouts,
        "activation_function": FAIRSEQ_ACTIVATIONS.get(activation),
        "scale_embedding": not settings.get("no_scale_embedding", False),
        **FAIRSEQ_LAYOUT,
    }


def dictionary_files(path: Path, dictionary, languages) -> list[Path]:
    """The dictionary files given, else those beside the checkpoint: dict.txt, or dict.SRC.txt and dict.TGT.txt."""
    if dictionary is not None:
        files = [Path(name) for name in ([dictionary] if isinstance(dictionary, (str, Path)) else dictionary)]
        if not 1 <= len(files) <= 2:
            raise ConversionError(f"give one dictionary, or the source's and the target's: got {len(files)}")
        return files
    if (joined := beside(path.parent, "dict.txt")).is_file():
        return [joined]
    files = [beside(path.parent, f"dict.{language}.txt") for language in languages]
    if not all(file.is_file() for file in files):
        raise ConversionError(f"no dict.txt nor {files[0].name} and {files[1].name} beside {path}: give --dictionary")
    return files


def fairseq_dictionary(files: list[Path], embedding: torch.Tensor, problems: Problems) -> list[str]:
    """The fairseq Dictionary of `files` (lines "symbol count"), by id: its four special symbols, then the lines. Two
    files must hold the same symbols in the same order (a joined dictionary): else separate vocabularies, a problem;
    so is a dictionary of another size than the embedding matrix."""
    lists = [read_dictionary(file) for file in files]
    if len(lists) == 2 and lists[0] != lists[1]:
        index = next((i for i, (a, b) in enumerate(zip(*lists, strict=False)) if a != b), min(map(len, lists)))
        problems.add(
            f"{files[0]} and {files[1]} differ (from symbol {index + 1}): separate source and target dictionaries; "
            "the paper's model has one vocabulary (fairseq's --joined-dictionary)"
        )
    symbols = [*FAIRSEQ_SPECIALS, *lists[0]]
    if len(symbols) != embedding.shape[0]:
        problems.add(f"the dictionary has {len(symbols):,} symbols but the embeddings {embedding.shape[0]:,} rows")
    return symbols


def read_dictionary(path: Path) -> list[str]:
    symbols, seen = [], set(FAIRSEQ_SPECIALS)
    for number, line in enumerate(read_text(path).splitlines(), 1):
        symbol, _, count = line.rstrip().removesuffix(" #fairseq:overwrite").rpartition(" ")
        if not symbol or not count.isdigit():
            raise ConversionError(f"{path}, line {number}: {line[:80]!r} is not `symbol count`")
        if symbol in seen:
            raise ConversionError(f"{path}, line {number}: {symbol!r} is there twice (or is a special symbol)")
        seen.add(symbol)
        symbols.append(symbol)
    return symbols


def fsmt_vocabulary(symbols: list[str]) -> dict[str, int]:
    """A fairseq dictionary as FSMTTokenizer's vocabulary: subword-nmt marks a subword that the word continues after
    with "@@", FSMT's BPE marks the subword that ends a word with "</w>"; the special symbols stay as they are."""
    vocabulary = {}
    for index, symbol in enumerate(symbols):
        token = symbol if symbol in FAIRSEQ_SPECIALS else symbol[:-2] if symbol.endswith("@@") else f"{symbol}</w>"
        if token in vocabulary:
            raise ConversionError(f"the dictionary's {symbols[vocabulary[token]]!r} and {symbol!r} are the same token")
        vocabulary[token] = index
    return vocabulary


def fsmt_merges(path: Path) -> str:
    """subword-nmt's (or fastBPE's) BPE codes as FSMT's merges.txt: "a b" per line, counts and the version header
    dropped. Codes of subword-nmt 0.1, where a word's end is a symbol of its own, segment differently: refused."""
    lines = read_text(path).splitlines()
    if lines and lines[0].startswith("#version:"):
        if lines[0].split()[-1] != "0.2":
            raise ConversionError(f"{path}: {lines[0]!r}; FSMTTokenizer applies subword-nmt 0.2 codes")
        lines = lines[1:]
    merges = {}  # in rank order; a duplicate keeps its first rank, as subword-nmt does (FSMTTokenizer keeps the last)
    for number, line in enumerate(lines, 1):
        parts = line.split()
        if len(parts) not in (2, 3) or parts[1] == "</w>":
            raise ConversionError(f"{path}, line {number}: {line[:80]!r} is not a 0.2 merge `a b` (or `a b count`)")
        merges.setdefault(f"{parts[0]} {parts[1]}", number)
    if not merges:
        raise ConversionError(f"{path} holds no merges: give the BPE codes the model was trained with")
    if duplicates := len(lines) - len(merges):
        logger.warning(
            f"{path} holds {duplicates} merge(s) more than once: each keeps its first rank, as subword-nmt applies them"
        )
    return "\n".join(merges) + "\n"


def tokenizer_from_fairseq(symbols: list[str], codes: Path, languages, max_length: int, scratch: Path):
    """FSMTTokenizer files built from a fairseq dictionary and BPE codes (in `scratch`), and the tokenizer."""
    from transformers import FSMTTokenizer

    vocabulary = json.dumps(fsmt_vocabulary(symbols), ensure_ascii=False, indent=1)
    for name in FSMT_TOKENIZER_FILES[:2]:
        (scratch / name).write_text(vocabulary, encoding="utf-8")
    (scratch / "merges.txt").write_text(fsmt_merges(codes), encoding="utf-8")
    files = {
        f"{kind}_file": str(scratch / name)
        for kind, name in zip(("src_vocab", "tgt_vocab", "merges"), FSMT_TOKENIZER_FILES, strict=True)
    }
    return FSMTTokenizer(langs=list(languages), model_max_length=max_length, **files)


def fsmt_reference(fields: dict, layers: dict, embedding: torch.Tensor, languages) -> nn.Module:
    """FSMT, transformers' port of fairseq's transformer, fed a fairseq checkpoint's weights: what the converted model
    is checked against."""
    from transformers import FSMTConfig, FSMTForConditionalGeneration

    sizes = {name: fields[name] for name in SIZE_LIMITS if name != "vocab_size"}
    config = FSMTConfig(
        langs=list(languages),
        src_vocab_size=fields["vocab_size"],
        tgt_vocab_size=fields["vocab_size"],
        **sizes,
        activation_function=fields["activation_function"],
        scale_embedding=fields["scale_embedding"],
        tie_word_embeddings=True,
        dropout=0.0,
        pad_token_id=1,
        bos_token_id=0,
        eos_token_id=2,
        decoder_start_token_id=2,
    )
    reference = FSMTForConditionalGeneration(config).eval()
    state = {f"model.{name}": tensor for name, tensor in layers.items()}
    for name in ("encoder.embed_tokens.weight", "decoder.embed_tokens.weight", "decoder.output_projection.weight"):
        state[f"model.{name}"] = embedding
    result = reference.load_state_dict(state, strict=False)
    unexpected = [name.removeprefix("model.") for name in result.unexpected_keys]
    missing = [name for name in result.missing_keys if "embed_positions" not in name]
    if unexpected or missing:
        raise ConversionError(weights_problem(unexpected, [name.removeprefix("model.") for name in missing]))
    return reference
