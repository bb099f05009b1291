"""The paper's equations and figures drawn from the numbers `measurements.py` computes, one PNG an item.

Each comes with the paragraph of `index.md` that ties it to the paper's section and to the code that computed it.

Drawn with matplotlib's Figure (no pyplot, no display), as the attention maps are; the attention grids are theirs
(`serving/attention_maps.py`). `--model` changes the model-dependent figures only (attention, beam search); the others
show the paper's sizes, or the demonstration model's masks, whatever the model.
"""

from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import torch
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from configuration_vanilla_transformer import PRESETS
from pipeline_vanilla_transformer import PAPER_DECODING
from vanilla_transformer.data.toy_task import SYNTHETIC_EXAMPLE
from vanilla_transformer.paper import measurements
from vanilla_transformer.serving.attention_maps import ATTENTION_KINDS, compute_attentions, plot_attention_grid

# Sentences of the embedded synthetic task, of three lengths: a padded batch
MASK_BATCH = (
    ("the dog sleeps", "ter hunt slafet"),
    ("the small dog sees a red cat", SYNTHETIC_EXAMPLE[1]),
    ("a cat runs", "aine katse lofet"),
)


@dataclass
class Item:
    """One figure: its file, its heading in index.md and the paragraph under it."""

    file_name: str
    heading: str
    paragraph: str


def _figure(width: float, height: float, columns: int = 1, rows: int = 1):
    try:
        from matplotlib.figure import Figure  # without pyplot: the Agg backend draws PNGs, no display needed
    except ImportError as error:
        raise ImportError("Paper figures need matplotlib: pip install 'vanilla-transformer[plots]'.") from error
    figure = Figure(figsize=(width, height), layout="constrained")
    return figure, figure.subplots(rows, columns, squeeze=False)[0] if rows == 1 else figure.subplots(rows, columns)


def positions() -> tuple[object, Item]:
    d_model = PRESETS["base"]["d_model"]
    table = measurements.paper_position_table(2000, d_model)
    offsets = (1, 5, 20, 100)
    errors = measurements.offset_linearity(table, offsets)
    figure, (heat, curves, linear) = _figure(15, 4, columns=3)
    image = heat.imshow(table[:100].numpy(), cmap="RdBu", vmin=-1, vmax=1, aspect="auto")
    heat.set(title=f"PE(pos, i), d_model = {d_model}", xlabel="dimension i", ylabel="position pos")
    figure.colorbar(image, ax=heat, shrink=0.8)
    for dim in (4, 5, 6, 7):
        curves.plot(table[:100, dim].numpy(), label=f"dimension {dim} ({'sin' if dim % 2 == 0 else 'cos'})")
    curves.set(title="A few dimensions over the positions", xlabel="position pos", ylabel="PE(pos, i)")
    curves.legend(fontsize=8)
    linear.bar([str(k) for k in offsets], [errors[k] for k in offsets], color="tab:green")
    linear.set(yscale="log", title="PE(pos + k) = PE(pos) M_k: largest error", xlabel="offset k", ylabel="max |error|")
    figure.suptitle("Section 3.5: the sinusoidal position encodings (modeling_vanilla_transformer.py)")
    worst = max(errors.values())
    return figure, Item(
        "positions.png",
        "Section 3.5: positional encodings",
        "The table the model adds to its embeddings, PE(pos, 2i) = sin(pos / 10000^(2i/d_model)) and PE(pos, 2i+1) = "
        "cos(pos / 10000^(2i/d_model)), made by `sinusoidal_position_table` in `modeling_vanilla_transformer.py` "
        "(the model's `VanillaTransformerSinusoidalPositionalEmbedding` holds it as a buffer), at the base model's "
        f"d_model = {d_model}: each dimension a sinusoid, its wavelength growing from 2π to 10000 · 2π. The paper "
        "chose sinusoids because PE(pos + k) is a linear function of PE(pos) for any fixed k. Measured "
        "(`measurements.offset_linearity`): one matrix M_k, fitted by least squares on the even positions of 2000, "
        f"maps every odd position too, with a largest error of {worst:.1e} over k = "
        f"{', '.join(map(str, offsets))}: the float32 table's own rounding.",
    )


def scaling() -> tuple[object, Item]:
    head_sizes = (4, 8, 16, 32, 64, 128, 256, 512)
    variances = measurements.dot_product_variances(head_sizes)
    saturation = measurements.softmax_saturation(head_sizes, keys=32)
    figure, (left, right) = _figure(11, 4, columns=2)
    left.plot(head_sizes, [variances[d] for d in head_sizes], "o-", label="measured Var(q · k)")
    left.plot(head_sizes, head_sizes, "k--", linewidth=0.8, label="d_k")
    left.set(xscale="log", yscale="log", xlabel="d_k", ylabel="variance", title="q · k for unit-variance q, k")
    left.legend()
    for name, style in (("unscaled", "s-"), ("scaled", "o-")):
        label = "QK^T (no scaling)" if name == "unscaled" else "QK^T / sqrt(d_k) (the model's)"
        right.plot(head_sizes, [saturation[name][d] for d in head_sizes], style, label=label)
    right.axhline(1 / 32, color="gray", linestyle=":", label="uniform over 32 keys")
    right.set(xscale="log", ylim=(0, 1.05), xlabel="d_k", ylabel="mean largest weight", title="Softmax saturation")
    right.legend(fontsize=8)
    figure.suptitle("Section 3.2.1: why the dot products are scaled by 1 / sqrt(d_k)")
    d_paper = 64
    return figure, Item(
        "scaling.png",
        "Section 3.2.1: scaled dot-product attention",
        "For q and k with independent components of mean 0 and variance 1, q · k has variance d_k (measured over "
        f"4000 pairs, `measurements.dot_product_variances`: {variances[d_paper]:.1f} at the paper's d_k = "
        f"{d_paper}). Unscaled, large dot products push the softmax into regions of tiny gradients: through the "
        "model's own `eager_attention_forward` (`modeling_vanilla_transformer.py`), one query's largest weight over "
        f"32 random keys averages {saturation['unscaled'][d_paper]:.2f} at d_k = {d_paper} without scaling and "
        f"{saturation['scaled'][d_paper]:.2f} with the module's `scaling` = 1/sqrt(d_k), which keeps it flat as d_k "
        "grows.",
    )


def masks(model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, note: str) -> tuple[object, Item]:
    built = measurements.built_masks(model, tokenizer, [s for s, _ in MASK_BATCH], [t for _, t in MASK_BATCH])
    row = min(range(len(MASK_BATCH)), key=lambda i: int(built["source_mask"][i].sum()))  # the most padded
    figure, axes = _figure(12, 10, columns=2, rows=2)
    panels = (
        ("encoder", "source_tokens", "Encoder self-attention mask (padding)"),
        ("decoder", "target_tokens", "Decoder self-attention mask (subsequent + padding)"),
    )
    for column, (name, tokens, title) in enumerate(panels):
        labels = built[tokens][row]
        for line, (data, subtitle, cmap) in enumerate(
            ((built[name][row].float(), title, "Greys_r"), (built[f"{name}_weights"][row], "its weights", "viridis"))
        ):
            ax = axes[line, column]
            ax.imshow(data.numpy(), cmap=cmap, vmin=0, vmax=1, aspect="auto")
            ax.set_title(subtitle if line == 0 else f"{title.split(' mask')[0]}: layer 1, head 1 weights", fontsize=9)
            ax.set_xticks(range(len(labels)), labels, rotation=90, fontsize=7)
            ax.set_yticks(range(len(labels)), labels, fontsize=7)
    figure.suptitle(f"The masks as the model builds them: white may attend, black may not ({note})")
    shape_e, shape_d = tuple(built["encoder"].shape), tuple(built["decoder"].shape)
    return figure, Item(
        "masks.png",
        "Section 3.2.3: the padding mask and the subsequent mask",
        f"A padded batch of {len(MASK_BATCH)} sentences of the synthetic task, run through the model with "
        "`output_attentions=True`; the masks are caught where the first layer's attention receives them (built by "
        "transformers' `create_bidirectional_mask` and `create_causal_mask` in the encoder's and decoder's `forward`, "
        "`modeling_vanilla_transformer.py`; `measurements.built_masks`). The encoder's, of shape "
        f"{shape_e} (batch, queries, keys), hides the padding keys of the shortest sentence; the decoder's, {shape_d}, "
        "also hides every later position (section 3.2.3: position i attends to positions up to i), the inputs being "
        "the targets shifted right from `<s>`. Under the masks the attention weights of hidden keys are exactly 0.",
    )


def learning_rate() -> tuple[object, Item]:
    steps = list(range(1, 100_001, 50))
    figure, (ax,) = _figure(8, 4)
    values = {}
    for preset in ("base", "big"):
        d_model = PRESETS[preset]["d_model"]
        values[preset] = measurements.learning_rates([1, 4000, 100_000], d_model)
        ax.plot(steps, measurements.learning_rates(steps, d_model), label=f"{preset} (d_model = {d_model})")
    ax.axvline(
        measurements.PAPER_WARMUP_STEPS,
        color="gray",
        linestyle=":",
        label=f"warmup_steps = {measurements.PAPER_WARMUP_STEPS}",
    )
    ax.set(
        xlabel="training step",
        ylabel="learning rate",
        title="Equation 3: d_model^-0.5 · min(step^-0.5, step · warmup^-1.5)",
    )
    ax.legend()
    base = values["base"]
    return figure, Item(
        "learning_rate.png",
        "Section 5.3, equation 3: the learning rate",
        "lrate = d_model^-0.5 · min(step_num^-0.5, step_num · warmup_steps^-1.5): linear warmup over the first 4000 "
        "steps, then decay with the inverse square root of the step. Drawn from the training's own schedule, "
        "`inverse_sqrt_learning_rate` in `vanilla_transformer/training/schedule.py` (the `LambdaLR` of "
        f"`make_optimizer_and_schedule`). For the base model it is {base[0]:.3g} at step 1, peaks at {base[1]:.3g} "
        f"at step 4000 and falls to {base[2]:.3g} by step 100000 (the base model's training length); the big "
        "model's is 1/sqrt(2) of it throughout.",
    )


def label_smoothing() -> tuple[object, Item]:
    vocab, target, smoothing = 10, 3, measurements.PAPER_LABEL_SMOOTHING
    distribution = measurements.smoothed_target(vocab, target, smoothing)
    probabilities = [float(p) for p in torch.linspace(0.05, 0.999, 200)]
    curve = measurements.loss_against_perplexity(100, probabilities, smoothing)
    best = min(range(len(probabilities)), key=lambda i: curve["smoothed_loss"][i])
    figure, (left, right) = _figure(11, 4, columns=2)
    left.bar(
        range(vocab), distribution.numpy(), color=["tab:orange" if i == target else "tab:blue" for i in range(vocab)]
    )
    left.set(
        xlabel="token", ylabel="target probability", title=f"The smoothed target (ε_ls = {smoothing}, V = {vocab})"
    )
    left.set_xticks(range(vocab))
    right.plot(curve["perplexity"], curve["smoothed_loss"], label=f"the training's loss (ε_ls = {smoothing})")
    right.plot(curve["perplexity"], curve["cross_entropy"], label="cross-entropy = log perplexity (ε_ls = 0)")
    right.axvline(curve["perplexity"][best], color="gray", linestyle=":", label="the smoothed loss's minimum")
    right.set(xscale="log", xlabel="perplexity", ylabel="loss per token", title="Loss against perplexity (V = 100)")
    right.legend(fontsize=8)
    figure.suptitle("Section 5.4: label smoothing")
    return figure, Item(
        "label_smoothing.png",
        "Section 5.4: label smoothing",
        f"With ε_ls = {smoothing} the loss pulls the model towards {float(distribution[target]):.3f} on the correct "
        f"token and {float(distribution[0]):.3f} on each of the other {vocab - 1} (mass {float(distribution.sum()):.3f}): "
        "the distribution is read off the gradient of the training's own loss, `label_smoothed_cross_entropy` in "
        "`vanilla_transformer/training/loss.py` (d loss / d logits = softmax − target; `measurements.smoothed_target`). "
        "Right: for a model that gives the correct token probability p, that loss against the perplexity 1/p. The "
        f"smoothed loss is lowest at perplexity {curve['perplexity'][best]:.2f}, not 1: as the paper says, label "
        "smoothing hurts perplexity, as the model learns to be more unsure, but improves accuracy and BLEU.",
    )


def complexity() -> tuple[object, Item]:
    d_model, lengths = 64, (8, 16, 32, 64, 128, 256)
    timings = measurements.layer_timings(d_model, lengths)
    figure, (left, right) = _figure(12, 4.5, columns=2)
    for name, times in timings.items():
        left.plot(lengths, [times[n] for n in lengths], "o-", label=name)
    left.axvline(d_model, color="gray", linestyle=":", label=f"n = d = {d_model}")
    left.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="median ms (4 sequences, 1 thread)")
    left.set_title(f"Measured on this machine, d = {d_model}")
    left.legend(fontsize=7)
    n = torch.tensor(lengths, dtype=torch.float64)
    for label, operations in (
        ("self-attention: n² · d", n**2 * d_model),
        ("recurrent: n · d²", n * d_model**2),
        ("convolution: k · n · d² (k = 3)", 3 * n * d_model**2),
    ):
        right.plot(lengths, operations.numpy(), "o--", label=label)
    right.axvline(d_model, color="gray", linestyle=":")
    right.set(xscale="log", yscale="log", xlabel="sequence length n", ylabel="operations per layer")
    right.set_title("Table 1's complexity per layer")
    right.legend(fontsize=8)
    figure.suptitle("Table 1: self-attention, recurrent and convolutional layers")
    attention, rnn = timings["attention alone (n² d)"], timings["recurrent (nn.RNN)"]
    slower = [length for length in lengths if attention[length] > rnn[length]]
    crossing = f"from n = {slower[0]}" if slower else f"nowhere up to n = {lengths[-1]}"
    rows = "; ".join(f"{name} {times[lengths[-1]]:.2f} ms" for name, times in timings.items())
    return figure, Item(
        "complexity.png",
        "Table 1: complexity per layer",
        "Table 1 counts n² · d operations for self-attention, n · d² for a recurrent layer and k · n · d² for a "
        "convolution, so self-attention is the cheaper while n < d, which sentences mostly are. Measured "
        f"(`measurements.layer_timings`, median of 5 runs) at d = {d_model}: the model's own "
        "`VanillaTransformerAttention` (with its four n · d² projections) and its `eager_attention_forward` alone, "
        "against torch's `nn.RNN`, `nn.LSTM` and `nn.Conv1d`. Attention alone is slower than the RNN "
        f"{crossing}; at n = {lengths[-1]}: {rows}. Times on a CPU carry each call's fixed cost, and the recurrent "
        "layers' n sequential steps (Table 1's O(n) sequential operations) cost more than their count of operations "
        "says: the crossover on a given machine is where the measurement puts it.",
    )


def attention_maps(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source: str, target: str | None, layer: int, note: str
) -> list[tuple[object, Item]]:
    attentions = compute_attentions(model, tokenizer, source, target)
    layers = attentions["encoder_attentions"].shape[0]
    index = layer % layers
    drawn = []
    file_names = {
        "encoder_attentions": "attention_encoder_self.png",
        "decoder_attentions": "attention_decoder_self.png",
        "cross_attentions": "attention_cross.png",
    }
    for kind, (_, title, query_side, key_side) in ATTENTION_KINDS.items():
        weights = attentions[kind][index : index + 1]
        figure = plot_attention_grid(
            weights, attentions[query_side], attentions[key_side], f"{title}, layer {index + 1} ({note})", index + 1
        )
        drawn.append(
            (
                figure,
                Item(
                    file_names[kind],
                    f"Figures 3-5: {title.lower()}, layer {index + 1}",
                    f"Every head of layer {index + 1} of {layers}: row i holds query i's weights over the keys, as "
                    "the model returns them with `output_attentions=True` (`compute_attentions` and "
                    "`plot_attention_grid` in `vanilla_transformer/serving/attention_maps.py`, the eager attention "
                    "of `modeling_vanilla_transformer.py`). Each head attends differently: the paper's figures 3-5 "
                    "show heads that follow long-distance dependencies and anaphora.",
                ),
            )
        )
    cross = attentions["cross_attentions"][index].mean(dim=0)  # (target, source), averaged over the heads
    figure, (ax,) = _figure(1.5 + 0.3 * cross.shape[1], 1.5 + 0.3 * cross.shape[0])
    ax.imshow(cross.numpy(), cmap="Blues", vmin=0, aspect="auto")
    best = cross.argmax(dim=1)
    ax.plot(best.numpy(), range(len(best)), "o", color="tab:red", label="the source token each target reads most")
    ax.set_xticks(range(cross.shape[1]), attentions["source"], rotation=90, fontsize=8)
    ax.set_yticks(range(cross.shape[0]), attentions["target"], fontsize=8)
    ax.set(xlabel="source", ylabel="target (decoder input)")
    ax.legend(fontsize=7, loc="lower left")
    figure.suptitle(f"Cross-attention as word alignment, layer {index + 1}, mean of heads ({note})", fontsize=9)
    drawn.append(
        (
            figure,
            Item(
                "alignment.png",
                "Encoder-decoder attention read as word alignment",
                f"The encoder-decoder attention of layer {index + 1}, averaged over its heads: for each target "
                "token fed to the decoder (`<s>` first, then the translation), how much it reads each source token; "
                "the red dot marks the source token it reads most. In a trained model's upper layers this often "
                "lines up with the word alignment; it is no guarantee of one (several heads, and the decoder input "
                "is the previous token).",
            ),
        )
    )
    return drawn


def beam_search_table(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, source: str, note: str, steps: int = 5
) -> tuple[object, Item]:
    beams = measurements.beam_steps(model, tokenizer, source, steps)
    num_beams = len(beams[0])
    cells = [
        [
            " ".join(h["tokens"]).replace("$", r"\$") + f"\nlog P {h['log_probability']:.2f}, score {h['score']:.2f}"
            for h in hypotheses
        ]
        for hypotheses in beams
    ]
    figure, (ax,) = _figure(3.2 * num_beams + 1, 0.75 * steps + 1.2)
    ax.axis("off")
    table = ax.table(
        cellText=cells,
        rowLabels=[f"step {step}" for step in range(1, steps + 1)],
        colLabels=[f"beam {rank}" for rank in range(1, num_beams + 1)],
        loc="center",
        cellLoc="left",
    )
    table.auto_set_font_size(False)
    table.set_fontsize(8)
    table.scale(1, 2.6)
    alpha = PAPER_DECODING["length_penalty"]
    figure.suptitle(f"Beam search of “{source}”, beam {num_beams}, α = {alpha} ({note})", fontsize=10)
    best = beams[-1][0]
    return figure, Item(
        "beam_search.png",
        "Section 6.1: beam search",
        f"The beam of {num_beams} hypotheses after each of the first {steps} steps, best first, as transformers' "
        "beam search returns them from the model's `generate()` stopped at that step (`return_dict_in_generate`, "
        "`output_scores`, `num_return_sequences`; `measurements.beam_steps`). log P is a hypothesis's summed "
        "log-probability (`compute_transition_scores`); the score ranks them: log P / length^α with the paper's "
        f"length penalty α = {alpha} (`PAPER_DECODING` in `pipeline_vanilla_transformer.py`), which keeps longer "
        f"hypotheses in the race. At step {steps} the best reads “{' '.join(best['tokens'])}”, score "
        f"{best['score']:.2f}.",
    )


def all_figures(
    model: PreTrainedModel | None,
    tokenizer: PreTrainedTokenizerBase | None,
    source: str | None = None,
    target: str | None = None,
    layer: int = -1,
) -> list[Callable[[], list[tuple[object, Item]]]]:
    """Every item, as functions that compute and draw it: with `model` (and its `tokenizer`) the attention maps and
    beam search are that model's, on `source` (and `target`, else its own translation); without, those of a randomly
    initialised demonstration model (`measurements.demo_model_and_tokenizer`), as the figures say."""
    demo_model, demo_tokenizer = measurements.demo_model_and_tokenizer()
    demo_sizes = measurements.DEMO_SIZES
    demo_note = (
        f"untrained, randomly initialised d_model = {demo_sizes['d_model']}, N = {demo_sizes['encoder_layers']}, "
        f"h = {demo_sizes['encoder_attention_heads']} model"
    )
    if model is None:
        model, tokenizer, note = demo_model, demo_tokenizer, demo_note
        source, target = source or SYNTHETIC_EXAMPLE[0], target or (None if source else SYNTHETIC_EXAMPLE[1])
    else:
        note = f"{getattr(model.config, 'name_or_path', '') or 'the given model'}"
        source = source or "The house is small."
    return [
        lambda: [positions()],
        lambda: [scaling()],
        lambda: [masks(demo_model, demo_tokenizer, demo_note)],
        lambda: [learning_rate()],
        lambda: [label_smoothing()],
        lambda: [complexity()],
        lambda: attention_maps(model, tokenizer, source, target, layer, note),
        lambda: [beam_search_table(model, tokenizer, source, note)],
    ]


def write_figures(
    folder: Path,
    model: PreTrainedModel | None = None,
    tokenizer: PreTrainedTokenizerBase | None = None,
    source: str | None = None,
    target: str | None = None,
    layer: int = -1,
    dpi: int = 80,
) -> list[str]:
    """Draw every item into `folder` (which exists) with `index.md`; returns the names of the files written."""
    items = []
    for draw in all_figures(model, tokenizer, source, target, layer):
        for figure, item in draw():
            figure.savefig(folder / item.file_name, dpi=dpi)
            items.append(item)
    (folder / INDEX).write_text(index_text(items), encoding="utf-8")
    return [item.file_name for item in items] + [INDEX]


INDEX = "index.md"


def index_text(items: list[Item]) -> str:
    lines = [
        "# Attention Is All You Need, figure by figure",
        "",
        "Each figure below was computed by this project's own code (the module and function each paragraph names) "
        "and drawn by `vanilla-transformer paper-figures` (`vanilla_transformer/paper/`).",
        "",
    ]
    for item in items:
        lines += [f"## {item.heading}", "", f"![{item.heading}]({item.file_name})", "", item.paragraph, ""]
    return "\n".join(lines)
