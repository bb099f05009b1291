"""Draw a saved model's attention weights for one sentence, as the paper's appendix shows them.

    vanilla-transformer attention-maps MODEL_DIR --source "The house is small." --output_dir maps/
    vanilla-transformer attention-maps MODEL_DIR --source "..." --target "Das Haus ist klein." --output_dir maps/

Writes three PNG files, one per kind of attention: encoder self-attention, decoder (masked) self-attention and
encoder-decoder attention. Each is a grid of heat maps with one row per layer and one column per head. In a heat
map, row i holds the weights of query position i over the key positions (each row sums to 1), on a fixed 0-1 colour
scale so that heads can be compared. The decoder reads `<s>`, the target tokens and `</s>`; without --target, the
target is the model's own translation (beam search, the paper's maximum length input + 50). A picture over
MAX_PICTURE_PIXELS (2**28 pixels, 1 GiB to draw: a 6-layer, 8-head grid of about 140 tokens at 100 dpi) is refused
with a message naming the limit, before any attention is computed where the lengths are known.
"""

from collections.abc import Sequence
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from pipeline_vanilla_transformer import PAPER_DECODING, length_arguments
from vanilla_transformer.mechanics.errors import VanillaTransformerError

# model output name -> (file name, title, query side, key side)
ATTENTION_KINDS = {
    "encoder_attentions": ("encoder_self_attention.png", "Encoder self-attention", "source", "source"),
    "decoder_attentions": ("decoder_self_attention.png", "Decoder self-attention", "target", "target"),
    "cross_attentions": ("encoder_decoder_attention.png", "Encoder-decoder attention", "target", "source"),
}
INCHES_PER_TOKEN = 0.16
# The largest picture drawn: Agg draws into width x height x 4 bytes, so 2**28 pixels is 1 GiB (a 6-layer, 8-head
# grid of about 140 tokens at 100 dpi). A 2000-token source would need about 200 GB: refused before anything runs.
MAX_PICTURE_PIXELS = 2**28


class PictureTooLarge(VanillaTransformerError, ValueError):
    """A picture over MAX_PICTURE_PIXELS, refused before its attention weights are computed or drawn."""


def figure_inches(num_layers: int, num_heads: int, num_queries: int, num_keys: int) -> tuple[float, float]:
    """The width and height of `plot_attention_grid`'s figure, in inches: one cell per layer and head."""
    cell_width = 0.9 + INCHES_PER_TOKEN * num_keys
    cell_height = 0.7 + INCHES_PER_TOKEN * num_queries
    return num_heads * cell_width + 1.5, num_layers * cell_height + 0.8


def check_picture_size(title: str, num_layers: int, num_heads: int, num_queries: int, num_keys: int, dpi: int) -> None:
    """PictureTooLarge, naming the limit, if the grid of `title` would be over MAX_PICTURE_PIXELS at `dpi`."""
    width, height = (round(inches * dpi) for inches in figure_inches(num_layers, num_heads, num_queries, num_keys))
    if width * height > MAX_PICTURE_PIXELS:
        raise PictureTooLarge(
            f"The {title.lower()} picture would be {width:,} x {height:,} pixels ({num_layers} layers x {num_heads} "
            f"heads of {num_queries} x {num_keys} tokens at {dpi} dpi, {width * height * 4 / 2**30:,.1f} GiB to "
            f"draw); the limit is {MAX_PICTURE_PIXELS:,} pixels ({MAX_PICTURE_PIXELS * 4 / 2**30:g} GiB). Draw a "
            "shorter sentence, or at a lower dpi."
        )


def check_picture_sizes(config, dpi: int, source_tokens: int, target_tokens: int | None) -> None:
    """Check the pictures of the three kinds (`target_tokens` None: the encoder's only) for a model `config`."""
    sides = {"source": source_tokens, "target": target_tokens}
    for kind, (_, title, query_side, key_side) in ATTENTION_KINDS.items():
        if sides[query_side] is None or sides[key_side] is None:
            continue
        encoder = kind == "encoder_attentions"
        layers = config.encoder_layers if encoder else config.decoder_layers
        heads = config.encoder_attention_heads if encoder else config.decoder_attention_heads
        check_picture_size(title, layers, heads, sides[query_side], sides[key_side], dpi)


def token_labels(tokenizer: PreTrainedTokenizerBase, ids: Sequence[int]) -> list[str]:
    """Each token's own text for the axes, byte-level pieces decoded: a word-initial space shows as '▁' (SentencePiece's
    mark), so 'Ġs', 'at' read '▁s', 'at' and the word 'sat' stays visible."""
    labels = []
    for token_id in ids:
        text = tokenizer.decode([token_id])
        labels.append("▁" + text.strip() if text[:1].isspace() else text.strip() or "␣")
    return labels


def compute_attentions(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    target: str | None = None,
    num_beams: int = PAPER_DECODING["num_beams"],
    max_new_tokens: int | None = None,
) -> dict:
    """The attention weights for `source` (and `target`, or the model's translation of `source`).

    Returns the source and target token labels and, per kind in ATTENTION_KINDS, a float tensor of shape
    (layers, heads, queries, keys).
    """
    if not source.strip():
        raise ValueError("The source sentence is empty: there is nothing to draw.")
    if model.config._attn_implementation != "eager":
        model.set_attn_implementation("eager")  # sdpa and flash attention return no weights
    model.eval()
    source_ids = tokenizer(source, return_tensors="pt")["input_ids"].to(model.device)
    start = torch.tensor([[model.config.decoder_start_token_id]], device=model.device)
    with torch.inference_mode():
        if target is None:
            mask = torch.ones_like(source_ids)
            lengths = length_arguments(mask, model.config, model.generation_config, max_new_tokens)
            generated = model.generate(source_ids, num_beams=num_beams, **lengths)[0]
            target_ids = generated[1:][generated[1:] != model.config.pad_token_id]  # drop the start token and padding
        else:
            target_ids = tokenizer(target, return_tensors="pt")["input_ids"][0].to(model.device)
        decoder_input_ids = torch.cat([start, target_ids.unsqueeze(0)], dim=1)
        outputs = model(input_ids=source_ids, decoder_input_ids=decoder_input_ids, output_attentions=True)
    result = {
        "source": token_labels(tokenizer, source_ids[0].tolist()),
        "target": token_labels(tokenizer, decoder_input_ids[0].tolist()),
    }
    for kind in ATTENTION_KINDS:
        layers = getattr(outputs, kind)
        if layers is None:
            raise RuntimeError(f"The model returned no {kind}: load it with attn_implementation='eager'.")
        result[kind] = torch.stack([layer[0] for layer in layers]).float().cpu()  # (layers, heads, queries, keys)
    return result


def plot_attention_grid(
    weights: torch.Tensor, query_tokens: list[str], key_tokens: list[str], title: str, first_layer: int = 1
):
    """A matplotlib Figure with one heat map per layer (rows) and head (columns) of `weights` (L, H, Q, K), the rows
    numbered from `first_layer` (the model's numbering of the layers drawn)."""
    try:
        from matplotlib.figure import Figure  # without pyplot: PNGs are drawn by the Agg backend, no display needed
    except ImportError as error:
        raise ImportError("Attention maps need matplotlib: pip install 'vanilla-transformer[plots]'.") from error
    num_layers, num_heads, num_queries, num_keys = weights.shape
    figure = Figure(figsize=figure_inches(num_layers, num_heads, num_queries, num_keys), layout="constrained")
    axes = figure.subplots(num_layers, num_heads, squeeze=False, sharex=True, sharey=True)
    for layer in range(num_layers):
        for head in range(num_heads):
            ax = axes[layer, head]
            image = ax.imshow(weights[layer, head].numpy(), cmap="viridis", vmin=0.0, vmax=1.0, aspect="auto")
            ax.set_title(f"layer {first_layer + layer}, head {head + 1}", fontsize=8)
            ax.tick_params(labelsize=7)
            ax.tick_params(axis="x", labelrotation=90)
    ax = axes[0, 0]  # the axes are shared: the labels show on the outer heat maps
    ax.set_xticks(range(num_keys), key_tokens)
    ax.set_yticks(range(num_queries), query_tokens)
    figure.colorbar(image, ax=axes, shrink=0.6, label="attention weight")
    figure.suptitle(title)
    return figure


def draw_attention_maps(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    output_dir: str | Path,
    target: str | None = None,
    num_beams: int = PAPER_DECODING["num_beams"],
    max_new_tokens: int | None = None,
    dpi: int = 100,
) -> dict[str, Path]:
    """Write the three attention-map PNGs into `output_dir`; returns {kind: path} for the kinds in ATTENTION_KINDS.

    PictureTooLarge refuses a picture over MAX_PICTURE_PIXELS: those of the source (and of a given `target`) before
    any attention is computed, those of the model's own translation before anything is drawn."""
    count = lambda text: len(tokenizer(text)["input_ids"])  # noqa: E731
    target_tokens = None if target is None else count(target) + 1  # the decoder reads <s> first
    check_picture_sizes(model.config, dpi, count(source), target_tokens)
    attentions = compute_attentions(model, tokenizer, source, target, num_beams, max_new_tokens)
    check_picture_sizes(model.config, dpi, len(attentions["source"]), len(attentions["target"]))
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    paths = {}
    for kind, (file_name, title, query_side, key_side) in ATTENTION_KINDS.items():
        figure = plot_attention_grid(attentions[kind], attentions[query_side], attentions[key_side], title)
        paths[kind] = output_dir / file_name
        figure.savefig(paths[kind], dpi=dpi)
    return paths
