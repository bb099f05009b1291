"""BLEU (and speed) of a saved model quantized to int8 three ways, against float32, and which layers lose the BLEU.

Variants, each a fresh copy of the float32 model:
- float32: the model as saved;
- dynamic: `torch.ao.quantization.quantize_dynamic(model, {nn.Linear}, dtype=torch.qint8)` (every linear layer:
  int8 weights with one scale per matrix, activations quantized per batch); and the same with one weight scale per
  output row (`per_channel_dynamic_qconfig`), as CTranslate2's int8 quantizes (its weights, the tied embedding and
  output projection included, carry one scale per row; layer norms, biases and positions stay float32);
- dynamic, each group alone: only the pre-softmax projection (`lm_head`, tied to the embedding), only the attention
  projections, only the feed-forward layers; and all but `lm_head`: which layers the loss comes from;
- torchao: `quantize_(model, Int8DynamicActivationInt8WeightConfig())` (`pip install torchao`), if installed;
- quanto: `quantize(model, weights=qint8, activations=None)` then `freeze` (`pip install optimum-quanto`), if
  installed.

Decoding is the saved generation_config's (the paper's beam 4, length penalty 0.6), input length + 50, batches of 32
sorted by length, through `vanilla_transformer.serving.translate.translate_sentences`; sacreBLEU on the detokenized output.

Usage:
    python benchmarks/int8_quality.py outputs/vanilla-transformer --embedded_test        # the README's main job
    python benchmarks/int8_quality.py outputs/multi30k-en-de \\
        --source ../shared/data/multi30k/test_2016_flickr.en.gz --reference ../shared/data/multi30k/test_2016_flickr.de.gz
"""

import argparse
import copy
import sys
import time
from pathlib import Path

import sacrebleu
import torch
from torch import nn
from torch.ao import quantization

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import describe_machine, machine  # noqa: E402

from vanilla_transformer.data import (
    prepare,  # noqa: E402
    readers,
)
from vanilla_transformer.model.onednn import plain_linears  # noqa: E402
from vanilla_transformer.serving.translate import load_model_and_tokenizer, translate_sentences  # noqa: E402

ATTENTION = ("q_proj", "k_proj", "v_proj", "kv_proj", "qkv_proj", "out_proj")
FEED_FORWARD = ("fc1", "fc2")


def dynamic(model: nn.Module, names: tuple[str, ...] | None = None, per_channel: bool = False) -> nn.Module:
    """quantize_dynamic of every linear layer, or of those whose last name is in `names`; one weight scale per
    matrix (torch's default), or per output row (`per_channel`, as CTranslate2's int8 does)."""
    qconfig = quantization.per_channel_dynamic_qconfig if per_channel else quantization.default_dynamic_qconfig
    chosen = {name for name, module in model.named_modules() if isinstance(module, nn.Linear)}
    chosen = {name for name in chosen if names is None or name.split(".")[-1] in names}
    return quantization.quantize_dynamic(model, {name: qconfig for name in chosen}, dtype=torch.qint8)


def torchao_int8(model: nn.Module) -> nn.Module:
    from torchao.quantization import Int8DynamicActivationInt8WeightConfig, quantize_

    quantize_(model, Int8DynamicActivationInt8WeightConfig())
    return model


def quanto_int8(model: nn.Module) -> nn.Module:
    from optimum.quanto import freeze, qint8, quantize

    quantize(model, weights=qint8, activations=None)
    freeze(model)
    return model


VARIANTS = {
    "float32": lambda model: model,
    "dynamic int8, every linear layer": dynamic,
    "dynamic int8 per output row, every linear layer": lambda model: dynamic(model, per_channel=True),
    "dynamic int8, lm_head only": lambda model: dynamic(model, ("lm_head",)),
    "dynamic int8, attention only": lambda model: dynamic(model, ATTENTION),
    "dynamic int8, feed-forward only": lambda model: dynamic(model, FEED_FORWARD),
    "dynamic int8, all but lm_head": lambda model: dynamic(model, (*ATTENTION, *FEED_FORWARD)),
    "torchao int8 (dynamic activations)": torchao_int8,
    "quanto int8 weights": quanto_int8,
}


def is_float_linear(module: nn.Module) -> bool:
    """A linear layer left in float: its type and its weight's type are torch's own (torchao swaps the weight for a
    tensor subclass, quanto and quantize_dynamic the module)."""
    return type(module) is nn.Linear and type(module.weight) in (nn.Parameter, torch.Tensor)


def test_pairs(args) -> tuple[list[str], list[str]]:
    if args.embedded_test:
        pairs = prepare._synthetic_splits(args.synthetic_pairs, args.synthetic_seed)["test"]
    else:
        pairs = list(readers.iter_parallel_text(args.source, args.reference))
    pairs = pairs[: args.limit] if args.limit else pairs
    return [source for source, _ in pairs], [target for _, target in pairs]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("model_dir")
    parser.add_argument("--embedded_test", action="store_true", help="the embedded task's test split (README model)")
    parser.add_argument("--synthetic_pairs", type=int, default=30000, help="as the model was trained (default)")
    parser.add_argument("--synthetic_seed", type=int, default=42)
    parser.add_argument("--source", help="source lines (optionally .gz)")
    parser.add_argument("--reference", help="reference lines (optionally .gz)")
    parser.add_argument("--limit", type=int, help="only the first LIMIT pairs")
    parser.add_argument("--variants", help='names separated by ";" (default: all that are installed)')
    args = parser.parse_args()
    sources, references = test_pairs(args)
    model, tokenizer = load_model_and_tokenizer(args.model_dir, "cpu")
    plain_linears(model)  # the model as a Hub user has it: quantizers match nn.Linear by type
    print(f"# {describe_machine(machine())}; {len(sources)} sentences; {args.model_dir}")
    print("| variant | BLEU | chrF | seconds | linear layers quantized |")
    print("|---|---|---|---|---|")
    names = args.variants.split(";") if args.variants else list(VARIANTS)
    for name in names:
        try:
            variant = VARIANTS[name](copy.deepcopy(model)).eval()
        except ImportError as error:
            print(f"| {name} | not installed ({error.name}) | | | |", flush=True)
            continue
        plain = sum(is_float_linear(module) for module in variant.modules())
        total = sum(is_float_linear(module) for module in model.modules())
        started = time.perf_counter()
        with torch.no_grad():
            hypotheses = translate_sentences(variant, tokenizer, sources, batch_size=32)
        seconds = time.perf_counter() - started
        bleu = sacrebleu.corpus_bleu(hypotheses, [references])
        chrf = sacrebleu.corpus_chrf(hypotheses, [references])
        quantized = f"{total - plain} of {total}" if name != "float32" else "-"
        print(f"| {name} | {bleu.score:.2f} | {chrf.score:.2f} | {seconds:.1f} | {quantized} |", flush=True)


if __name__ == "__main__":
    main()
