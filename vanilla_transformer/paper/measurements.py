"""The numbers behind each figure of the paper, computed by the code that runs.

That code is the model file's position table, attention and masks, the training's schedule and loss, and
transformers' beam search through the model's `generate()`. Nothing here restates an equation; each function runs
the project's own code and measures it.
"""

import statistics
import time
from collections.abc import Sequence

import torch
from torch import nn
from transformers import PreTrainedModel, PreTrainedTokenizerBase

from configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from modeling_vanilla_transformer import (
    VanillaTransformerAttention,
    VanillaTransformerForConditionalGeneration,
    eager_attention_forward,
    sinusoidal_position_table,
)
from pipeline_vanilla_transformer import PAPER_DECODING
from vanilla_transformer.data.tokenization import train_shared_tokenizer
from vanilla_transformer.data.toy_task import synthetic_translation_pairs
from vanilla_transformer.serving.attention_maps import token_labels
from vanilla_transformer.training.loss import label_smoothed_cross_entropy
from vanilla_transformer.training.schedule import inverse_sqrt_learning_rate
from vanilla_transformer.training.settings import TrainingSettings

PAPER_WARMUP_STEPS = TrainingSettings.warmup_steps  # section 5.3: the training's own default
PAPER_LABEL_SMOOTHING = TrainingSettings.label_smoothing  # section 5.4
# The demonstration model without --model: the paper's architecture (post-LN encoder-decoder, sinusoids, one shared
# embedding), small enough to build and run in a second; randomly initialised, never trained.
DEMO_SIZES = dict(
    d_model=64,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=256,
    decoder_ffn_dim=256,
)
DEMO_VOCAB_SIZE = 400


def demo_model_and_tokenizer(seed: int = 0) -> tuple[PreTrainedModel, PreTrainedTokenizerBase]:
    """A randomly initialised model of the paper's architecture at DEMO_SIZES, and a byte-level BPE tokenizer trained
    on the embedded synthetic task's sentences (offline, in milliseconds)."""
    pairs = synthetic_translation_pairs(300, seed=seed)
    tokenizer = train_shared_tokenizer([text for pair in pairs for text in pair], vocab_size=DEMO_VOCAB_SIZE)
    torch.manual_seed(seed)
    config = VanillaTransformerConfig(vocab_size=len(tokenizer), attn_implementation="eager", **DEMO_SIZES)
    return VanillaTransformerForConditionalGeneration(config).eval(), tokenizer


# --- 3.5: positions ----------------------------------------------------------------------------------------------


def paper_position_table(num_positions: int, d_model: int = PRESETS["base"]["d_model"]) -> torch.Tensor:
    """The model file's table, PE(pos, 2i) = sin(...), PE(pos, 2i+1) = cos(...): (num_positions, d_model)."""
    return sinusoidal_position_table(num_positions, d_model)


def model_position_rows(model: PreTrainedModel, num_positions: int) -> torch.Tensor:
    """The first `num_positions` rows of the encoder's own position buffer (what the model adds to its embeddings)."""
    return model.get_encoder().embed_positions(0, num_positions).detach().float().cpu()


def offset_linearity(table: torch.Tensor, offsets: Sequence[int]) -> dict[int, float]:
    """Section 3.5's claim, measured: for each offset k, one matrix M_k fitted by least squares on the even positions
    (PE(pos + k) ~ PE(pos) M_k), and its largest error on the odd positions, which the fit never saw. An error at the
    table's float32 rounding says that one matrix per k maps every PE(pos) to PE(pos + k)."""
    table = table.double()
    errors = {}
    for k in offsets:
        earlier, later = table[:-k], table[k:]
        matrix = torch.linalg.lstsq(earlier[0::2], later[0::2]).solution
        errors[k] = float((earlier[1::2] @ matrix - later[1::2]).abs().max())
    return errors


# --- 3.2.1: the scaling ------------------------------------------------------------------------------------------


def dot_product_variances(head_sizes: Sequence[int], samples: int = 4000, seed: int = 0) -> dict[int, float]:
    """The measured variance of q . k for q and k with independent unit-variance components, per d_k."""
    generator = torch.Generator().manual_seed(seed)
    variances = {}
    for d_k in head_sizes:
        query, key = torch.randn(2, samples, d_k, generator=generator, dtype=torch.float64)
        variances[d_k] = float((query * key).sum(-1).var())
    return variances


def _attention_module(d_k: int) -> VanillaTransformerAttention:
    """The model's attention module of one head of size d_k: its `scaling` is the model's 1/sqrt(d_k)."""
    config = VanillaTransformerConfig(vocab_size=8, d_model=d_k, encoder_attention_heads=1, decoder_attention_heads=1)
    return VanillaTransformerAttention(config, num_heads=1).eval()


def softmax_saturation(
    head_sizes: Sequence[int], queries: int = 256, keys: int = 32, seed: int = 0
) -> dict[str, dict[int, float]]:
    """The mean largest attention weight of a query over `keys` random keys (1/keys: spread evenly; 1: all on one,
    the softmax saturated, its gradient vanishing), run through the model's `eager_attention_forward` with the
    module's own scaling and without any (scaling 1)."""
    generator = torch.Generator().manual_seed(seed)
    result = {"scaled": {}, "unscaled": {}}
    for d_k in head_sizes:
        module = _attention_module(d_k)
        query = torch.randn(1, 1, queries, d_k, generator=generator)
        key = torch.randn(1, 1, keys, d_k, generator=generator)
        value = torch.randn(1, 1, keys, d_k, generator=generator)
        for name, scaling in (("scaled", module.scaling), ("unscaled", 1.0)):
            _, weights = eager_attention_forward(module, query, key, value, None, scaling=scaling)
            result[name][d_k] = float(weights.max(dim=-1).values.mean())
    return result


# --- 3.2.3: the masks --------------------------------------------------------------------------------------------


def built_masks(
    model: PreTrainedModel, tokenizer: PreTrainedTokenizerBase, sources: Sequence[str], targets: Sequence[str]
) -> dict:
    """The masks the model builds for a padded batch, caught where the first layer's attention receives them, and
    the attention weights that result. Returns the tokens per sentence, "encoder" (B, S, S) and "decoder" (B, T, T)
    boolean masks (True: may attend), the attention weights of the first layer's first head under each (same shapes),
    and the attention masks given (1: token, 0: padding)."""
    caught = {}

    def catch(name):
        def hook(module, positional, kwargs):
            mask = kwargs.get("attention_mask", positional[1] if len(positional) > 1 else None)
            caught.setdefault(name, mask)

        return hook

    handles = [
        model.get_encoder().layers[0].self_attn.register_forward_pre_hook(catch("encoder"), with_kwargs=True),
        model.get_decoder().layers[0].self_attn.register_forward_pre_hook(catch("decoder"), with_kwargs=True),
    ]
    if model.config._attn_implementation != "eager":
        model.set_attn_implementation("eager")  # the weights come from the eager attention only
    source = tokenizer(list(sources), padding=True, return_tensors="pt").to(model.device)
    target = tokenizer(list(targets), padding=True, return_tensors="pt").to(model.device)
    start = torch.full((len(targets), 1), model.config.decoder_start_token_id, device=model.device)
    decoder_input_ids = torch.cat([start, target["input_ids"][:, :-1]], dim=1)  # the labels shifted right
    decoder_mask = torch.cat([torch.ones_like(start), target["attention_mask"][:, :-1]], dim=1)
    try:
        with torch.inference_mode():
            outputs = model(
                **source,
                decoder_input_ids=decoder_input_ids,
                decoder_attention_mask=decoder_mask,
                output_attentions=True,
            )
    finally:
        for handle in handles:
            handle.remove()
    result = {
        "source_tokens": [token_labels(tokenizer, row.tolist()) for row in source["input_ids"]],
        "target_tokens": [token_labels(tokenizer, row.tolist()) for row in decoder_input_ids],
        "source_mask": source["attention_mask"].cpu(),
        "target_mask": decoder_mask.cpu(),
        "encoder_weights": outputs.encoder_attentions[0][:, 0].float().cpu(),
        "decoder_weights": outputs.decoder_attentions[0][:, 0].float().cpu(),
    }
    for name in ("encoder", "decoder"):
        additive = caught[name]  # (B, 1, Q, K): 0 where allowed, the dtype's minimum where masked
        result[name] = (additive[:, 0] == 0).cpu() if additive.dtype != torch.bool else additive[:, 0].cpu()
    return result


# --- equation 3 --------------------------------------------------------------------------------------------------


def learning_rates(steps: Sequence[int], d_model: int, warmup_steps: int = PAPER_WARMUP_STEPS) -> list[float]:
    """The training's own schedule (`inverse_sqrt_learning_rate`) at each step."""
    return [inverse_sqrt_learning_rate(step, d_model, warmup_steps) for step in steps]


# --- 5.4: label smoothing ----------------------------------------------------------------------------------------


def _loss_and_logit_gradient(logits: torch.Tensor, target: int, smoothing: float) -> tuple[float, torch.Tensor]:
    """The training's loss for one token of `logits` (V,) and its gradient with respect to the logits: the head is
    the identity, so the decoder output the loss takes is the logits themselves."""
    vocab_size = logits.shape[0]
    head = nn.Linear(vocab_size, vocab_size, bias=False)
    with torch.no_grad():
        head.weight.copy_(torch.eye(vocab_size))
    hidden = logits.detach().clone().reshape(1, 1, vocab_size).requires_grad_()
    loss = label_smoothed_cross_entropy(hidden, head, torch.tensor([[target]]), smoothing)
    loss.backward()
    return float(loss.detach()), hidden.grad.reshape(vocab_size)


def smoothed_target(vocab_size: int, target: int, smoothing: float = PAPER_LABEL_SMOOTHING) -> torch.Tensor:
    """The distribution the training's loss pulls the model towards, read off its gradient: d loss / d logits =
    softmax(logits) - q, so q = softmax(logits) - gradient (V,)."""
    logits = torch.zeros(vocab_size)
    _, gradient = _loss_and_logit_gradient(logits, target, smoothing)
    return torch.softmax(logits, dim=-1) - gradient


def loss_against_perplexity(
    vocab_size: int, probabilities: Sequence[float], smoothing: float = PAPER_LABEL_SMOOTHING
) -> dict[str, list[float]]:
    """For a model that gives the correct token probability p (the rest spread evenly), the training's loss with
    `smoothing` and without (the plain cross-entropy, log perplexity), and the perplexity exp(cross-entropy)."""
    result = {"probability": [], "perplexity": [], "smoothed_loss": [], "cross_entropy": []}
    for p in probabilities:
        logits = torch.full((vocab_size,), (1 - p) / (vocab_size - 1)).log()
        logits[0] = torch.tensor(p).log()
        smoothed, _ = _loss_and_logit_gradient(logits, 0, smoothing)
        plain, _ = _loss_and_logit_gradient(logits, 0, 0.0)
        result["probability"].append(p)
        result["smoothed_loss"].append(smoothed)
        result["cross_entropy"].append(plain)
        result["perplexity"].append(float(torch.tensor(plain).exp()))
    return result


# --- Table 1: the complexity per layer, measured -----------------------------------------------------------------


def _median_milliseconds(run, repeats: int) -> float:
    run()  # warm up
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return 1000 * statistics.median(times)


def layer_timings(
    d_model: int = 64, lengths: Sequence[int] = (8, 16, 32, 64, 128, 256), batch: int = 4, repeats: int = 5
) -> dict[str, dict[int, float]]:
    """The median time (ms) of one layer's forward over `batch` sequences of each length n at width `d_model`, on
    this machine's CPU with one thread: the model's attention module (4 projections and softmax(QK^T/sqrt(d_k))V),
    its attention alone (`eager_attention_forward`, the n^2 d term of Table 1), torch's nn.RNN and nn.LSTM, and
    nn.Conv1d with kernel 3."""
    config = VanillaTransformerConfig(
        vocab_size=8, d_model=d_model, encoder_attention_heads=1, decoder_attention_heads=1
    )
    attention = VanillaTransformerAttention(config, num_heads=1).eval()
    attention.config._attn_implementation = "eager"
    layers = {
        "self-attention (the model's module)": lambda x: attention(x),
        "attention alone (n² d)": lambda x: eager_attention_forward(
            attention, x[:, None], x[:, None], x[:, None], None, scaling=attention.scaling
        ),
        "recurrent (nn.RNN)": nn.RNN(d_model, d_model, batch_first=True).eval(),
        "recurrent (nn.LSTM)": nn.LSTM(d_model, d_model, batch_first=True).eval(),
        "convolution (nn.Conv1d, k=3)": (lambda conv: lambda x: conv(x.transpose(1, 2)))(
            nn.Conv1d(d_model, d_model, 3, padding=1).eval()
        ),
    }
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    generator = torch.Generator().manual_seed(0)
    try:
        timings = {name: {} for name in layers}
        with torch.inference_mode():
            for n in lengths:
                x = torch.randn(batch, n, d_model, generator=generator)
                for name, layer in layers.items():
                    timings[name][n] = _median_milliseconds(lambda layer=layer, x=x: layer(x), repeats)
    finally:
        torch.set_num_threads(threads)
    return timings


# --- 6.1: beam search --------------------------------------------------------------------------------------------


def beam_steps(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    source: str,
    steps: int = 5,
    num_beams: int = PAPER_DECODING["num_beams"],
    length_penalty: float = PAPER_DECODING["length_penalty"],
) -> list[list[dict]]:
    """The beam of `source` after each of the first `steps` steps, as transformers' beam search (the model's
    `generate()` with `return_dict_in_generate` and `output_scores`) returns it when stopped there: per step the
    `num_beams` hypotheses, best first, each with its tokens, its log-probability (the sum of its transition scores)
    and its score with the length penalty (`sequences_scores`: log P / length^alpha)."""
    model.eval()
    inputs = tokenizer(source, return_tensors="pt").to(model.device)
    beams = []
    with torch.inference_mode():
        for step in range(1, steps + 1):
            output = model.generate(
                **inputs,
                num_beams=num_beams,
                num_return_sequences=num_beams,
                max_new_tokens=step,
                length_penalty=length_penalty,
                early_stopping=PAPER_DECODING["early_stopping"],
                do_sample=False,
                output_scores=True,
                return_dict_in_generate=True,
            )
            transitions = model.compute_transition_scores(
                output.sequences, output.scores, output.beam_indices, normalize_logits=False
            )
            hypotheses = []
            for sequence, transition, score in zip(
                output.sequences, transitions, output.sequences_scores, strict=True
            ):
                ids = [int(i) for i in sequence[1:] if int(i) != model.config.pad_token_id]
                hypotheses.append(
                    {
                        "tokens": token_labels(tokenizer, ids),
                        "log_probability": float(transition[: len(ids)].sum()),
                        "score": float(score),
                    }
                )
            beams.append(hypotheses)
    return beams
