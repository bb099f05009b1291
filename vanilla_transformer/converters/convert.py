"""Convert published Transformers of the paper's architecture into model folders of this project: exactly, or not
at all.

    convert("Helsinki-NLP/opus-mt-en-de", "opus-mt-en-de")                  # a Marian (OPUS-MT) folder or Hub id
    convert("path/to/fsmt-folder", "fsmt-model")                            # an FSMT folder or Hub id
    convert("wmt16.en-de.joined-dict.transformer/model.pt", "wmt16-en-de",  # a fairseq checkpoint file
            dictionary=["dict.en.txt", "dict.de.txt"], bpe_codes="bpecodes", source_lang="en", target_lang="de")

The command is `vanilla-transformer convert` (vanilla_transformer/commands/convert.py).

What converts exactly. OPUS-MT's `MarianMTModel`, FSMT (transformers' port of fairseq's WMT models) and fairseq's
`transformer` are the paper's model: post-LN layers, sinusoidal positions, one embedding matrix for the encoder input,
the decoder input and the pre-softmax projection, or separate source and target vocabularies (Marian's
`share_encoder_decoder_embeddings: false` with a `decoder_vocab_size` and MarianTokenizer's `separate_vocabs`, FSMT's
two dictionaries), which our config holds in Marian's fields: the encoder's matrix, and the decoder's, also its
pre-softmax projection. Each made a few choices the paper leaves open, which the written
config.json records (`configuration_vanilla_transformer.py`) and the model computes:

    choice                 Marian (OPUS-MT)        FSMT and fairseq             the paper (our default)
    position_layout        sin_cos (sines first)   sin_cos                      interleaved
    position_frequencies   paper                   fairseq, 1/10000^(i/(d/2-1)) paper
    position_offset        0                       padding id + 1               0
    activation_function    swish (usually)         relu (fairseq's activation_fn)
    lm_head_bias           final_logits_bias       none                         none
    special token ids      </s>=0, <unk>=1,        <s>=0, <pad>=1, </s>=2,      <pad>=0, <s>=1, </s>=2, <unk>=3
                           <pad>=last, decoding    <unk>=3, decoding starts
                           starts from <pad>       from </s>

Every weight of the source goes somewhere or the conversion is refused (a weight left over is a part our model does not
have), and for Marian and FSMT the converted model is checked against the source model on a padded probe batch before
anything is written (fairseq checkpoints against FSMT, transformers' port of fairseq's model, fed the same weights).
The tests (tests/test_convert_*.py) check logits within 1e-5 and the same greedy and beam-search tokens.

What is refused, with a ConversionError naming the field (or file) and its value, before anything is written: two
different fairseq dictionaries (separate vocabularies from a fairseq checkpoint), a Marian tokenizer whose
`separate_vocabs` is not its config's, embedding matrices or an output projection that differ (e.g. `tie_word_embeddings: false` with another lm_head), pre-LN
layers (`normalize_before`, fairseq's `encoder_normalize_before`/`decoder_normalize_before`), a LayerNorm on the
embeddings (`layernorm_embedding`, `normalize_embedding`) or after the stacks (`add_final_layer_norm`), learned
positions (`static_position_embeddings: false`, fairseq's `encoder_learned_pos`), an adaptive softmax or input, an
activation our model does not have, and sizes no model of this kind has (checked before anything is allocated).
Each reader collects every such problem of a source it can find (core.Problems) and refuses them in one
ConversionError, one a line; only a problem that makes the further checks meaningless (a file missing or unreadable,
no config) stops the checks at once, and is named with those found before it.

Tokenizers: the converted folder keeps the source's own tokenizer class, so it gives the same ids and text:
transformers' `MarianTokenizer` for OPUS-MT (marian.py says why no fast tokenizer can be exact), `FSMTTokenizer` for
FSMT (fsmt.py) and for fairseq, its files built from the checkpoint's dictionary and BPE codes (fairseq.py).

Both need `pip install "vanilla-transformer[convert]"` (sentencepiece, sacremoses). The project's loaders take such a
folder (`tokenization.load_tokenizer` falls back to AutoTokenizer without a tokenizer.json).

Untrusted input: size limits and no remote code (untrusted.py), no class unpickled but `argparse.Namespace`
(fairseq.py).
"""

import contextlib
import json
import os
import socket
import tempfile
from pathlib import Path

import torch
from torch import nn

from vanilla_transformer.converters.card import conversion_card
from vanilla_transformer.converters.core import ConversionError, Source, build_model, check_against_reference
from vanilla_transformer.converters.fairseq import read_fairseq
from vanilla_transformer.converters.fsmt import read_fsmt
from vanilla_transformer.converters.marian import read_marian
from vanilla_transformer.converters.output_folder import (
    CONVERSION_RECORD,
    WRITTEN_BY,
    check_conversion_folder,
    why_not_a_conversion,
)
from vanilla_transformer.converters.untrusted import (
    card_license,
    check_no_link_leaves,
    download,
    known_tokenizer_settings,
)
from vanilla_transformer.hub.model_folder import save_model_folder
from vanilla_transformer.mechanics.files import TargetChanged, on_full_disk, remove_stale, staged_folder
from vanilla_transformer.mechanics.outputs import write_record
from vanilla_transformer.model.loading import read_json_file

WEIGHT_DTYPES = ("float32", "float16", "bfloat16")  # what a converted folder's weights may be stored as


def convert(
    source: str | Path,
    output_dir: str | Path,
    *,
    dictionary: str | Path | list[str | Path] | None = None,
    bpe_codes: str | Path | None = None,
    source_lang: str | None = None,
    target_lang: str | None = None,
    license: str | None = None,
    revision: str | None = None,
    overwrite: bool = False,
    dtype: str | None = None,
) -> Path:
    """Convert `source` (a Marian or FSMT folder or Hub id, or a fairseq checkpoint file with its `dictionary` and
    `bpe_codes`) into a model folder of this project at `output_dir`; returns its path. ConversionError, before
    anything is written, for a source that cannot be converted exactly or an output folder that holds anything but a
    previous conversion (which `overwrite` replaces). `source_lang`, `target_lang` and `license` override the
    source's. The folder's weights have the source's dtype, or `dtype` (WEIGHT_DTYPES); the check against the source
    runs in float32 whatever the dtype (float16 and bfloat16 values are float32 values)."""
    if dtype is not None and dtype not in WEIGHT_DTYPES:
        raise ConversionError(f"--dtype is {dtype!r}; give one of {', '.join(WEIGHT_DTYPES)}")
    # a previous conversion, which --overwrite replaces
    replacing = check_conversion_folder(source, output_dir, overwrite)
    scratch_prefix = f"vanilla-transformer-convert-{socket.gethostname()}-"  # then this process's id
    remove_stale(Path(tempfile.gettempdir()), scratch_prefix)  # what killed conversions here left
    with tempfile.TemporaryDirectory(prefix=f"{scratch_prefix}{os.getpid()}-") as scratch:
        read = read_source(source, dictionary, bpe_codes, (source_lang, target_lang), revision, Path(scratch))
        read.license = license or read.license
        model = build_model(read)
        difference = check_against_reference(model, read)  # both in float32
        model = model.to(getattr(torch, dtype) if dtype is not None else read.dtype)
        write_folder(model, read, Path(output_dir), difference, replacing)
    return Path(output_dir)


def read_source(source, dictionary, bpe_codes, languages, revision, scratch: Path) -> Source:
    """The Source behind `source`: a fairseq checkpoint file, a local Marian or FSMT folder, or a Hub id."""
    path = Path(source)
    if path.is_file():
        return read_fairseq(path, dictionary, bpe_codes, languages, scratch)
    if dictionary is not None or bpe_codes is not None:
        raise ConversionError("--dictionary and --bpe_codes go with a fairseq checkpoint file, not with a folder")
    hub_id = None
    if not path.is_dir():
        if str(source).endswith((".pt", ".pth", ".bin")) or str(source).startswith((".", "/", "~")):
            raise ConversionError(f"{source}: no such file or folder")
        hub_id, path = str(source), download(str(source), revision)
    check_no_link_leaves(path, allowed_root=path.parents[1] if hub_id else None)  # a Hub snapshot links to its blobs
    config = read_json_file(path / "config.json", ConversionError, required=True)
    model_type = config.get("model_type")
    if model_type == "marian":
        read = read_marian(path, config)
    elif model_type == "fsmt":
        read = read_fsmt(path, config)
    else:
        raise ConversionError(
            f"{path / 'config.json'}: model_type is {model_type!r}; convert reads Marian (OPUS-MT) and FSMT folders, "
            "and fairseq checkpoint files"
        )
    read.name, read.hub_id = hub_id or path.resolve().name, hub_id  # a folder by its name: no path of this machine
    read.languages = tuple(given or found for given, found in zip(languages, read.languages, strict=True))
    read.license = read.license or card_license(path / "README.md")
    return read


def write_folder(model: nn.Module, source: Source, output_dir: Path, difference: float, replacing: bool) -> None:
    """Write the model folder into a new hidden folder beside `output_dir`, then move it into place: a failed write
    (a full disk) leaves `output_dir` as it was, and so does one whose `output_dir` changed meanwhile (another
    convert's result, a training run, a file put there): only a folder still new or empty, or still the previous
    conversion that `replacing` says the check found, is replaced."""
    output = output_dir.resolve()
    output.parent.mkdir(parents=True, exist_ok=True)
    languages = dict(zip(("source_lang", "target_lang"), source.languages, strict=True))
    full_disk = ConversionError(f"no space left on device while writing {output_dir}: it is as it was")
    changed = why_not_a_conversion if replacing else None
    with on_full_disk(lambda cause: full_disk), conversion_not_written(), staged_folder(output, changed) as staging:
        save_model_folder(model, source.tokenizer, staging, card_values=languages, decoding=source.decoding)
        written = read_json_file(staging / "tokenizer_config.json", ConversionError)
        kept = known_tokenizer_settings(source.tokenizer, written)
        (staging / "tokenizer_config.json").write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", "utf-8")
        generation = read_json_file(staging / "generation_config.json", ConversionError)
        card = conversion_card(model, source, difference, generation)
        (staging / "README.md").write_text(card, encoding="utf-8")
        write_record(staging, CONVERSION_RECORD, WRITTEN_BY)  # last: what --overwrite may replace later


@contextlib.contextmanager
def conversion_not_written():
    """A folder that changed while the conversion was written (`staged_folder`'s TargetChanged) as ConversionError."""
    try:
        yield
    except TargetChanged as error:
        raise ConversionError(f"{error.strerror}; the conversion was not written: convert again") from error
