"""Training throughput and model FLOPs utilisation (MFU) of the base model in bf16 on a GPU, by attention kernel.

Work per step, as `train_accelerate.py --mixed_precision bf16` does it: forward, then the training script's
label-smoothed loss (vanilla_transformer/training/loss.py: block by block, no logits), both under bf16 autocast with
float32 weights, backward and an Adam step (5.3), on a
synthetic batch shaped like the paper's token batches (5.1: ~25000 target tokens; by default 800 sentence pairs of
24-36 target and 28-32 source tokens, padded per batch, seeded). Throughput counts non-padding target tokens.

Variants (`--variants`), each timed over the same batch (`--steps` steps per call) after one untimed call,
interleaved in alternating order, median of `--repetitions`:
- sdpa: torch's scaled_dot_product_attention, every backend allowed (flash where it applies);
- sdpa_no_flash: the same without the flash backend (`torch.nn.attention.sdpa_kernel`);
- eager: the attention written out (matmul, softmax, matmul);
- flash_attention_2: the flash-attn package (skipped if it is not installed);
- sdpa_host_sync: sdpa with one host sync per step (a `.item()`, as the training loop read its step's token count
  before each step until 2026-11-27): the CPU cannot queue a step while the GPU runs the last one;
- sdpa_fused_adam: sdpa with `torch.optim.Adam(fused=True)` (one kernel for the update of every parameter);
- sdpa_no_cudnn: sdpa without cuDNN's kernel, as the model backend decodes (`decoding.DECODING_ATTENTION`): whether
  cuDNN's kernel, which costs a plan per new shape, is worth it in training's steady state;
- sdpa_compiled: sdpa with the model's forward under `torch.compile` (inductor fuses the casts, LayerNorm, dropout
  and residuals); its compilation is in the untimed first call;
- sdpa_compiled_graphs: the same in `mode="reduce-overhead"`: the compiled forward and backward replayed as CUDA
  graphs, so the host launches a graph, not its kernels. The batch here has one shape; the training script's token
  batches have many, so this is the bound that batches bucketed to a few shapes could reach;
- bf16_weights: no autocast; FSDP2's `MixedPrecisionPolicy(param_dtype=bfloat16, reduce_dtype=float32)` over one
  process: float32 master weights that Adam updates, cast to bf16 once a step (not at every use, as autocast does),
  gradients reduced in float32. LayerNorm and the residuals then run in bf16 too;
- bf16_weights_compiled: both.

Every variant starts from the same seeded weights and trains on the same batch, so its losses are the plain step's
within bf16's rounding: the table gives the largest relative difference from sdpa's losses, step by step.

`--profile`: then 5 more sdpa steps under `torch.profiler`: the 15 kernels with the most GPU time, and the share of
the steps' wall time the GPU spent in kernels (what is left is the GPU waiting for the host).

MFU = model FLOPs per second / the GPU's peak bf16 dense FLOPs (`--peak_tflops`; 989 for H100 and H200 SXM).
Model FLOPs (`model_flops`) count the matrix multiplies and the two attention products of every layer for the
non-padding tokens (3 x forward for forward + backward), not the padding the kernels also compute.

Usage:
    python benchmarks/gpu_training.py                                   # on a GPU: base, every variant
    python benchmarks/gpu_training.py --device cpu --preset tiny --sentences 16 --steps 1
"""

import argparse
import sys
import time
from contextlib import nullcontext
from datetime import datetime, timezone
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))

from common import padded_batch  # noqa: E402
from timing import median_seconds  # noqa: E402

from configuration_vanilla_transformer import VanillaTransformerConfig  # noqa: E402
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.model.decoding import DECODING_ATTENTION  # noqa: E402
from vanilla_transformer.training.loss import forward_inputs, label_smoothed_cross_entropy, output_head  # noqa: E402

VARIANTS = (
    "sdpa",
    "sdpa_no_flash",
    "eager",
    "flash_attention_2",
    "sdpa_host_sync",
    "sdpa_fused_adam",
    "sdpa_no_cudnn",
    "sdpa_compiled",
    "sdpa_compiled_graphs",
    "bf16_weights",
    "bf16_weights_compiled",
)
PEAK_BF16_TFLOPS = {"H100": 989.4, "H200": 989.4, "A100": 312.0}  # dense, SXM; PCIe parts are lower


def model_flops(config: VanillaTransformerConfig, source_lengths: torch.Tensor, target_lengths: torch.Tensor) -> int:
    """FLOPs of one training step (forward and backward = 3 x forward) for sentence pairs of these lengths, without
    padding: 2 FLOPs per multiply-add of every linear layer and of the attention products (3.2.1: Q K^T and the
    weighted sum of V; causal self-attention counted as the full square, as is usual)."""
    d, vocab = config.d_model, config.vocab_size
    # queries and keys: heads x d_k features (d_model but in Table 3's row B); values: d_model
    qk_encoder = config.encoder_attention_heads * (config.qk_head_dim or d // config.encoder_attention_heads)
    qk_decoder = config.decoder_attention_heads * (config.qk_head_dim or d // config.decoder_attention_heads)
    sources, targets = source_lengths.long(), target_lengths.long()
    s, t = int(sources.sum()), int(targets.sum())
    s_squared, t_squared, t_times_s = int((sources**2).sum()), int((targets**2).sum()), int((targets * sources).sum())
    encoder = config.encoder_layers * (
        s * 2 * (d * (2 * qk_encoder + d) + d * d + 2 * d * config.encoder_ffn_dim)  # QKV, output projection, FFN
        + 2 * s_squared * (qk_encoder + d)  # Q K^T and weights V
    )
    decoder = config.decoder_layers * (
        t * 2 * (d * (2 * qk_decoder + d) + d * d)  # self-attention QKV and output projection
        + 2 * t_squared * (qk_decoder + d)
        + t * 2 * (d * qk_decoder + d * d)  # encoder-decoder attention: queries and output projection
        + s * 2 * d * (qk_decoder + d)  # its keys and values, from the encoder output
        + 2 * t_times_s * (qk_decoder + d)
        + t * 2 * 2 * d * config.decoder_ffn_dim
    )
    output_projection = t * 2 * d * vocab
    return 3 * (encoder + decoder + output_projection)


def attention_context(variant: str):
    from torch.nn.attention import SDPBackend, sdpa_kernel

    if variant == "sdpa_no_flash":
        return sdpa_kernel([SDPBackend.EFFICIENT_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.MATH])
    if variant == "sdpa_no_cudnn":
        return sdpa_kernel(DECODING_ATTENTION)
    return nullcontext()


def available(variant: str) -> bool:
    if variant != "flash_attention_2":
        return True
    try:
        import flash_attn  # noqa: F401
    except ImportError:
        return False
    return True


def profile(steps, device: torch.device, count: int) -> None:
    """`steps()` (`count` training steps) under torch.profiler: the top 15 kernels by GPU time, and the GPU's busy
    share of the wall time."""
    from torch.profiler import ProfilerActivity
    from torch.profiler import profile as profiler

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device.type == "cuda" else [])
    with profiler(activities=activities) as trace:
        started = time.perf_counter()
        steps()
        wall = time.perf_counter() - started
    events = trace.key_averages()
    sort_by = "self_device_time_total" if device.type == "cuda" else "self_cpu_time_total"
    print(f"\n## profile of {count} sdpa steps ({wall * 1000 / count:.1f} ms a step)\n")
    print(events.table(sort_by=sort_by, row_limit=15, max_name_column_width=60))
    if device.type == "cuda":  # the union of the kernels' intervals on the GPU's timeline, in microseconds
        kernels = sorted(
            (event.time_range.start, event.time_range.end)
            for event in trace.events()
            if event.device_type == torch.autograd.DeviceType.CUDA
        )
        busy, end = 0.0, float("-inf")
        for start, stop in kernels:
            busy += max(0.0, stop - max(start, end))
            end = max(end, stop)
        print(f"GPU busy in kernels: {busy / 1e6 / wall:.1%} of the wall time ({len(kernels)} kernels)")


def model_and_optimizer(config: VanillaTransformerConfig, variant: str, device: torch.device):
    """The seeded model of `variant` (its attention, compiled or not, its weights' precision) on `device`, in train
    mode, and its Adam."""
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(config).to(device).train()
    model.set_attn_implementation(variant if variant in ATTENTIONS else "sdpa")
    if variant.startswith("bf16_weights"):
        shard_in_bf16(model, device)
    if "compiled" in variant:
        mode = {"mode": "reduce-overhead"} if variant.endswith("graphs") else {}
        model.forward = torch.compile(model.forward, **mode)
    fused = {"fused": True} if variant == "sdpa_fused_adam" else {}
    return model, torch.optim.Adam(model.parameters(), lr=1e-4, betas=(0.9, 0.98), eps=1e-9, **fused)


ATTENTIONS = ("sdpa", "eager", "flash_attention_2")


def shard_in_bf16(model: torch.nn.Module, device: torch.device) -> None:
    """FSDP2 over this one process, each encoder and decoder layer a unit: bf16 compute weights gathered from float32
    master weights, gradients reduced in float32. The process group is made here once, in memory."""
    import torch.distributed as dist
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    if not dist.is_initialized():
        backend = "nccl" if device.type == "cuda" else "gloo"
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1)
    policy = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for layer in [*model.model.encoder.layers, *model.model.decoder.layers]:
        fully_shard(layer, mp_policy=policy)
    fully_shard(model, mp_policy=policy)


def training_step(model, optimizer, variant: str, batch: dict, target_tokens: int, device: torch.device):
    """One step of the training script (its forward, its blockwise loss, backward, Adam), as `variant` runs it; the
    step's summed loss, on the device (not read back, but by sdpa_host_sync)."""
    precision = nullcontext() if variant.startswith("bf16_weights") else torch.autocast(device.type, torch.bfloat16)
    with attention_context(variant), precision:
        hidden = model(**forward_inputs(model, batch), output_hidden_states=True).decoder_hidden_states[-1]
        loss = label_smoothed_cross_entropy(hidden, output_head(model), batch["labels"], 0.1)
    (loss / target_tokens).backward()
    optimizer.step()
    optimizer.zero_grad(set_to_none=True)
    if variant == "sdpa_host_sync":
        loss.item()
    return loss.detach()


def variant_losses(config: VanillaTransformerConfig, variant: str, device: torch.device, batch: dict, steps: int):
    """The losses of `steps` training steps of `variant` from the seeded start, as floats: what the variants must
    share (tests/test_benchmarks.py holds them to the plain step's)."""
    model, optimizer = model_and_optimizer(config, variant, device)
    target_tokens = int((batch["labels"] != -100).sum())
    return [float(training_step(model, optimizer, variant, batch, target_tokens, device)) for _ in range(steps)]


def largest_difference(losses: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """The largest relative difference between two variants' losses, step by step."""
    return max(abs(float(a) - float(b)) / abs(float(b)) for a, b in zip(losses, reference, strict=True))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--preset", default="base")
    parser.add_argument("--vocab_size", type=int, default=37000)
    parser.add_argument("--sentences", type=int, default=800, help="sentence pairs per batch")
    parser.add_argument("--steps", type=int, default=5, help="timed steps per repetition")
    parser.add_argument("--repetitions", type=int, default=3)
    parser.add_argument("--variants", nargs="+", default=list(VARIANTS), choices=VARIANTS)
    parser.add_argument("--peak_tflops", type=float, default=None, help="the GPU's peak bf16 dense TFLOP/s")
    parser.add_argument("--profile", action="store_true", help="then profile 5 sdpa steps")
    args = parser.parse_args()

    device = torch.device(args.device)
    name = torch.cuda.get_device_name(device) if device.type == "cuda" else "CPU"
    peak = args.peak_tflops or next((tflops for key, tflops in PEAK_BF16_TFLOPS.items() if key in name), None)
    config = VanillaTransformerConfig.from_preset(args.preset, vocab_size=args.vocab_size)
    input_ids, attention_mask, labels = padded_batch(args.vocab_size, args.sentences, (28, 32), (24, 36), seed=1)
    batch = {"input_ids": input_ids, "attention_mask": attention_mask, "labels": labels}
    batch = {key: value.to(device) for key, value in batch.items()}
    target_tokens = int((labels != -100).sum())
    flops = model_flops(config, attention_mask.sum(1), (labels != -100).sum(1))

    variants = [variant for variant in args.variants if available(variant)]
    trained = {variant: model_and_optimizer(config, variant, device) for variant in variants}

    losses = {variant: [] for variant in variants}

    def train_steps(variant: str) -> None:
        model, optimizer = trained[variant]
        for _ in range(args.steps):
            losses[variant].append(training_step(model, optimizer, variant, batch, target_tokens, device))
        if device.type == "cuda":
            torch.cuda.synchronize(device)  # the GPU's work, not just its queueing

    runs = {variant: lambda variant=variant: train_steps(variant) for variant in variants}
    step_seconds = {
        variant: seconds / args.steps for variant, seconds in median_seconds(runs, args.repetitions).items()
    }

    date = datetime.now(timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    print(f"# {date}; {name}; torch {torch.__version__}; {args.preset}, vocabulary {args.vocab_size}")
    print(f"# batch: {args.sentences} pairs, {target_tokens} target tokens; {flops / 1e12:.2f} TFLOP per step\n")
    print("| variant | step ms | target tokens/s | TFLOP/s | MFU | first loss | losses against sdpa's |")
    print("|---|---:|---:|---:|---:|---:|---:|")
    for variant in variants:
        step = step_seconds[variant]
        achieved = flops / step / 1e12
        mfu = f"{achieved / peak:.1%}" if peak else "-"
        first = float(losses[variant][0]) / target_tokens
        against = f"{largest_difference(losses[variant], losses['sdpa']):.2%}" if "sdpa" in losses else "-"
        row = f"| {variant} | {step * 1000:.1f} | {target_tokens / step:,.0f} | {achieved:.1f} | {mfu} | {first:.4f} |"
        print(f"{row} {against} |")
    if args.profile and "sdpa" in trained:
        profile(lambda: train_steps("sdpa"), device, args.steps)
    if device.type == "cuda":
        print(f"\npeak memory allocated: {torch.cuda.max_memory_allocated(device) / 2**30:.1f} GiB")


if __name__ == "__main__":
    main()
