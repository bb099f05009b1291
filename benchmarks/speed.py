"""Speed of our model against transformers' `MarianMTModel` of identical size, and against CTranslate2.

Both PyTorch models get the same shape (d_model, layers, heads, FFN size, vocabulary, ReLU, post-LN, tied and
sqrt(d_model)-scaled embeddings, same dropout) and the same weights: ours are copied into Marian, including our
position table, and the script checks that both give the same logits before timing anything. The CTranslate2
columns run our model converted with `vanilla_transformer.export_ctranslate2` (float32, and int8 weights), in a
worker process of their own (see `Ctranslate2Process`).

Work, per preset (small: the recipe's CPU model, 8000 tokens; base: the paper's, 37000 tokens):
- train: forward, backward and Adam step on one identical padded batch (train mode, dropout 0.1), 64 sentence
  pairs shaped like the recipe's length-sorted token batches; throughput counts non-padding target tokens.
- greedy / beam4: generation from identical sources (16-32 tokens) of exactly 32 new tokens per sentence: no end
  token (`eos_token_id=None`; CTranslate2 `end_token=[]`), so every engine does the same work; throughput counts
  batch x 32 (beam search: returned tokens, not beams x tokens).

Every row runs its engines interleaved, in alternating order (A B, B A, A B, ...), after one untimed warm-up
each, and reports the median (of 5 repetitions, 15 for the batch-1 rows, which vary the most).
glibc's malloc thresholds are fixed first (see `fix_malloc_thresholds`; `--system-malloc` keeps them adaptive).

Peak memory runs each engine in a fresh subprocess: after one untimed warm-up of the work, freed memory is
returned to the OS (malloc_trim), the kernel's resident-set high-water mark is reset (/proc/self/clear_refs),
the work runs once and the row reports VmHWM - VmRSS(before): the extra resident memory the work needed on top
of the loaded model (and, for training, Adam's state). "(loaded)" is the process's resident set before that:
Python, torch and transformers (imported by every worker, CTranslate2's too) plus the model. Linux only.

Usage:
    python benchmarks/speed.py                      # small and base, every row (about 9 minutes on 2 cores)
    python benchmarks/speed.py --quick              # 2 repetitions per row
    python benchmarks/speed.py --presets small --no-memory --no-ctranslate2
    python benchmarks/speed.py --before --bf16      # also: our model with its fast paths off; in bf16
    python benchmarks/speed.py --compile            # also: training under torch.compile
"""

import argparse
import ctypes
import gc
import json
import os
import platform
import subprocess
import sys
import tempfile
from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path

import torch
import transformers
from transformers import MarianConfig, MarianMTModel

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from timing import median_seconds  # noqa: E402

from configuration_vanilla_transformer import VanillaTransformerConfig  # noqa: E402
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402

ENGINES = ("ours", "marian", "ct2_float32", "ct2_int8")
TORCH_ENGINES = ("ours", "marian")
# Optional extra engines: table column and the work they run.
EXTRA_ENGINES = {
    "ours_compiled": ("ours+compile tok/s", ("train",)),
    "ours_before": ("ours before tok/s", ("train", "greedy", "beam4")),
    "ours_bf16": ("ours bf16 tok/s", ("greedy", "beam4")),
}


@dataclass(frozen=True)
class Workload:
    vocab_size: int
    repetitions: int
    train_steps: int = 1  # optimizer steps per timed repetition
    # A training batch as the recipe's token batching makes them (sorted by length): 64 sentence pairs, sources of
    # nearly equal length, targets that vary; ~1900 target tokens. Lengths are drawn from these ranges (inclusive).
    train_batch: int = 64
    train_source_lengths: tuple[int, int] = (28, 32)
    train_target_lengths: tuple[int, int] = (24, 36)
    source_lengths: tuple[int, int] = (16, 32)  # generation sources
    new_tokens: int = 32  # output length of every generated sequence


WORKLOADS = {
    "small": Workload(vocab_size=8000, repetitions=5, train_steps=2),  # the recipe's CPU preset and vocabulary
    "base": Workload(vocab_size=37000, repetitions=5),  # the paper's base model and vocabulary size
}
GENERATION_ROWS = [("greedy", 1, 1), ("greedy", 32, 1), ("beam4", 1, 4), ("beam4", 32, 4)]


@dataclass(frozen=True)
class Row:
    work: str  # train, greedy or beam4
    batch: int
    num_beams: int = 1


def rows_for(workload: Workload) -> list[Row]:
    return [Row("train", workload.train_batch)] + [Row(work, batch, beams) for work, batch, beams in GENERATION_ROWS]


# --- models --------------------------------------------------------------------------------------------------


def build_ours(preset: str, vocab_size: int, fast_paths: bool = True):
    """Our model; `fast_paths=False` switches off oneDNN linear layers and beam search's encoder-decoder keys and
    values kept once per sentence (and the benchmark trains it with the loss on the logits)."""
    torch.manual_seed(0)
    config = VanillaTransformerConfig.from_preset(
        preset, vocab_size=vocab_size, onednn_linear=fast_paths, grouped_beam_cross_attention=fast_paths
    )
    return VanillaTransformerForConditionalGeneration(config)


def marian_config(config: VanillaTransformerConfig) -> MarianConfig:
    return MarianConfig(
        vocab_size=config.vocab_size,
        d_model=config.d_model,
        encoder_layers=config.encoder_layers,
        decoder_layers=config.decoder_layers,
        encoder_attention_heads=config.encoder_attention_heads,
        decoder_attention_heads=config.decoder_attention_heads,
        encoder_ffn_dim=config.encoder_ffn_dim,
        decoder_ffn_dim=config.decoder_ffn_dim,
        activation_function=config.activation_function,
        dropout=config.dropout,
        attention_dropout=config.attention_dropout,
        activation_dropout=config.activation_dropout,
        max_position_embeddings=config.max_position_embeddings,
        scale_embedding=config.scale_embedding,
        share_encoder_decoder_embeddings=True,
        tie_word_embeddings=True,
        pad_token_id=config.pad_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        decoder_start_token_id=config.decoder_start_token_id,
        forced_eos_token_id=None,
    )


@torch.no_grad()
def copy_weights_into_marian(ours: VanillaTransformerForConditionalGeneration, marian: MarianMTModel) -> None:
    """Ours -> Marian: split the fused projections, copy our (interleaved) position table over Marian's."""
    marian.model.shared.weight.copy_(ours.model.shared.weight)
    for stack in ("encoder", "decoder"):
        our_stack, marian_stack = getattr(ours.model, stack), getattr(marian.model, stack)
        marian_stack.embed_positions.weight.copy_(
            our_stack.embed_positions(0, marian_stack.embed_positions.num_embeddings)
        )
        for our_layer, marian_layer in zip(our_stack.layers, marian_stack.layers, strict=True):
            attention_pairs = [(our_layer.self_attn, marian_layer.self_attn)]
            if stack == "decoder":
                attention_pairs.append((our_layer.encoder_attn, marian_layer.encoder_attn))
            for our_attention, marian_attention in attention_pairs:
                projections = [marian_attention.q_proj, marian_attention.k_proj, marian_attention.v_proj]
                if our_attention.is_cross_attention:
                    fused = [(our_attention.q_proj, projections[:1]), (our_attention.kv_proj, projections[1:])]
                else:
                    fused = [(our_attention.qkv_proj, projections)]
                for our_linear, parts in fused:
                    for part, weight, bias in zip(
                        parts, our_linear.weight.chunk(len(parts)), our_linear.bias.chunk(len(parts)), strict=True
                    ):
                        part.weight.copy_(weight)
                        part.bias.copy_(bias)
                marian_attention.out_proj.load_state_dict(our_attention.out_proj.state_dict())
            marian_layer.fc1.load_state_dict(our_layer.feed_forward.fc1.state_dict())
            marian_layer.fc2.load_state_dict(our_layer.feed_forward.fc2.state_dict())
            for name in ("self_attn_layer_norm", "encoder_attn_layer_norm", "final_layer_norm"):
                if hasattr(marian_layer, name):
                    getattr(marian_layer, name).load_state_dict(getattr(our_layer, name).state_dict())


def build_marian(ours: VanillaTransformerForConditionalGeneration) -> MarianMTModel:
    marian = MarianMTModel(marian_config(ours.config))
    copy_weights_into_marian(ours, marian)
    return marian


@torch.no_grad()
def check_same_function(ours, marian, vocab_size: int) -> None:
    """Both models must compute the same logits: proof that Marian is the same architecture and size."""
    ours.eval(), marian.eval()
    input_ids, attention_mask, labels = padded_batch(vocab_size, 4, (5, 12), (5, 12), seed=99)
    our_logits = ours(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    marian_logits = marian(input_ids=input_ids, attention_mask=attention_mask, labels=labels).logits
    difference = (our_logits - marian_logits).abs().max().item()
    if difference > 1e-3:
        raise RuntimeError(f"Ours and Marian disagree (max |logit difference| {difference:.2e}): not the same model.")
    our_params = sum(p.numel() for p in ours.parameters())
    marian_params = sum(p.numel() for p in marian.parameters() if p.requires_grad)
    if our_params != marian_params:
        raise RuntimeError(f"Trainable parameters differ: ours {our_params}, Marian {marian_params}.")


# --- work ----------------------------------------------------------------------------------------------------


def random_lengths(batch: int, lengths: tuple[int, int], generator: torch.Generator) -> torch.Tensor:
    return torch.randint(lengths[0], lengths[1] + 1, (batch,), generator=generator)


def padded_batch(
    vocab_size: int, batch: int, source_lengths: tuple[int, int], target_lengths: tuple[int, int], seed: int
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Random right-padded (input_ids, attention_mask, labels), each sequence ending with </s> (id 2);
    padded to the longest sequence of the batch, labels padded with -100."""
    generator = torch.Generator().manual_seed(seed)
    source_lengths = random_lengths(batch, source_lengths, generator)
    target_lengths = random_lengths(batch, target_lengths, generator)
    source_positions = torch.arange(int(source_lengths.max()))
    target_positions = torch.arange(int(target_lengths.max()))
    input_ids = torch.randint(4, vocab_size, (batch, len(source_positions)), generator=generator)
    labels = torch.randint(4, vocab_size, (batch, len(target_positions)), generator=generator)
    input_ids[source_positions == source_lengths[:, None] - 1] = 2
    labels[target_positions == target_lengths[:, None] - 1] = 2
    attention_mask = (source_positions < source_lengths[:, None]).long()
    input_ids = input_ids.masked_fill(attention_mask == 0, 0)
    labels = labels.masked_fill(target_positions >= target_lengths[:, None], -100)
    return input_ids, attention_mask, labels


def training_step(model, batch, loss_without_logits: bool = False) -> Callable[[], None]:
    """One optimizer step; `loss_without_logits`: our training script's loss path (`return_logits=False`)."""
    input_ids, attention_mask, labels = batch
    loss_kwargs = {"return_logits": False} if loss_without_logits else {}
    parameters = [p for p in model.parameters() if p.requires_grad]
    optimizer = torch.optim.Adam(parameters, lr=1e-4, betas=(0.9, 0.98), eps=1e-9)

    def step() -> None:
        model.train()
        loss = model(input_ids=input_ids, attention_mask=attention_mask, labels=labels, **loss_kwargs).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)

    return step


def generation(model, batch, num_beams: int, new_tokens: int) -> Callable[[], None]:
    input_ids, attention_mask, _ = batch

    def generate() -> None:
        model.eval()
        output = model.generate(
            input_ids,
            attention_mask=attention_mask,
            num_beams=num_beams,
            do_sample=False,
            max_new_tokens=new_tokens,
            eos_token_id=None,  # no end token: exactly `new_tokens` tokens, no per-step logits processor
        )
        assert output.shape == (input_ids.shape[0], 1 + new_tokens), output.shape

    return generate


def ctranslate2_generation(translator, batch, num_beams: int, new_tokens: int) -> Callable[[], None]:
    input_ids, attention_mask, _ = batch
    rows = zip(input_ids, attention_mask.bool(), strict=True)
    tokens = [[f"id_{index}" for index in row[mask].tolist()] for row, mask in rows]  # unpadded sources

    def generate() -> None:
        results = translator.translate_batch(tokens, beam_size=num_beams, max_decoding_length=new_tokens, end_token=[])
        assert all(len(result.hypotheses[0]) == new_tokens for result in results)

    return generate


def work_batch(workload: Workload, row: Row):
    if row.work == "train":
        lengths = (workload.train_source_lengths, workload.train_target_lengths)
        return padded_batch(workload.vocab_size, row.batch, *lengths, seed=1)
    return padded_batch(workload.vocab_size, row.batch, workload.source_lengths, (1, 1), seed=2)


def tokens_per_run(workload: Workload, row: Row, batch) -> int:
    if row.work == "train":
        return int((batch[2] != -100).sum()) * workload.train_steps
    return row.batch * workload.new_tokens


class Engines:
    """The engines of one preset; `run(engine, row, batch)` gives the callable that does the row's work once.

    Extra engines: ours_compiled (--compile) is our model under `torch.compile`, for the training row;
    ours_before (--before) is our model with its fast paths switched off (config and loss path), for every row;
    ours_bf16 (--bf16) is our model with bf16 weights and eager attention, for the generation rows.
    """

    def __init__(self, preset: str, workload: Workload, names: list[str], threads: int, check: bool = True):
        self.workload = workload
        self.threads = threads
        self.models = {}
        self.translators = {}  # CTranslate2 engines loaded in this process (memory and CTranslate2 workers)
        self.external = {}  # CTranslate2 engines in a process of their own (timing): name -> Ctranslate2Process
        if "ours" in names or check:
            ours = build_ours(preset, workload.vocab_size)
            if "ours" in names:
                self.models["ours"] = ours
            if "marian" in names:
                self.models["marian"] = build_marian(ours)
                if check:
                    check_same_function(ours, self.models["marian"], workload.vocab_size)
        elif "marian" in names:  # alone, for its memory: its own random weights, nothing else in the process
            torch.manual_seed(0)
            config = VanillaTransformerConfig.from_preset(preset, vocab_size=workload.vocab_size)
            self.models["marian"] = MarianMTModel(marian_config(config))
        if "ours_compiled" in names:
            compiled = build_ours(preset, workload.vocab_size)
            compiled.forward = torch.compile(compiled.forward)
            self.models["ours_compiled"] = compiled
        if "ours_before" in names:
            self.models["ours_before"] = build_ours(preset, workload.vocab_size, fast_paths=False)
        if "ours_bf16" in names:  # bf16 weights; eager attention, as torch's CPU sdpa kernels are slow in bf16
            self.models["ours_bf16"] = build_ours(preset, workload.vocab_size).to(torch.bfloat16)
            self.models["ours_bf16"].set_attn_implementation("eager")

    def add_ctranslate2(self, names: list[str], ct2_dir: Path) -> None:
        """Load `ct2_float32` / `ct2_int8` from the models `export_ctranslate2` wrote into `ct2_dir`."""
        import ctranslate2

        for name in names:
            compute_type = name.removeprefix("ct2_")
            self.translators[name] = ctranslate2.Translator(
                str(ct2_dir / compute_type), compute_type=compute_type, intra_threads=self.threads
            )

    def names(self, row: Row) -> list[str]:
        models = [name for name in self.models if name not in EXTRA_ENGINES or row.work in EXTRA_ENGINES[name][1]]
        return models + (list(self.translators) + list(self.external) if row.work != "train" else [])

    def run(self, name: str, row: Row, batch) -> Callable[[], None]:
        if name in self.external:
            return self.external[name].run(name, row)
        if name in self.translators:
            return ctranslate2_generation(self.translators[name], batch, row.num_beams, self.workload.new_tokens)
        model = self.models[name]
        if row.work == "train":
            step = training_step(model, batch, loss_without_logits=name == "ours")

            def work() -> None:
                for _ in range(self.workload.train_steps):
                    step()
        else:
            work = generation(model, batch, row.num_beams, self.workload.new_tokens)
        return work


def export_ctranslate2(model: VanillaTransformerForConditionalGeneration, folder: Path) -> None:
    from vanilla_transformer.export_ctranslate2 import convert_to_ctranslate2

    model.save_pretrained(folder / "hf")
    convert_to_ctranslate2(folder / "hf", folder / "float32")
    convert_to_ctranslate2(folder / "hf", folder / "int8", quantization="int8")


def time_row(engines: Engines, row: Row, repetitions: int) -> dict[str, float]:
    """Tokens per second of each engine on this row."""
    batch = work_batch(engines.workload, row)
    runs = {name: engines.run(name, row, batch) for name in engines.names(row)}
    tokens = tokens_per_run(engines.workload, row, batch)
    return {name: tokens / seconds for name, seconds in median_seconds(runs, repetitions).items()}


# --- memory --------------------------------------------------------------------------------------------------


def _status_mib(field: str) -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1]) / 1024
    raise RuntimeError(f"/proc/self/status has no {field}")


def peak_extra_memory_mib(run: Callable[[], None]) -> float:
    run()  # warm-up: one-time allocations (Adam state, caches) belong to the baseline
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    Path("/proc/self/clear_refs").write_text("5")  # resets VmHWM to the current VmRSS
    before = _status_mib("VmRSS")
    run()
    return _status_mib("VmHWM") - before


class Ctranslate2Process:
    """The CTranslate2 engines of one preset, timed in a process of their own: in the PyTorch engines' process,
    CTranslate2 (which brings its own OpenMP runtime and oneDNN) changed their speed: our model's small greedy
    batch-1 row measured 1.27x Marian without it loaded, 0.92-0.95x with it (docs/BENCHMARKS.md). `run(name, row)` gives
    a callable that has the worker do the row's work once and returns when it is done, so the main process can
    interleave and time it like the other engines (the pipe round trip is microseconds)."""

    def __init__(self, preset: str, names: list[str], ct2_dir: Path, threads: int):
        command = [sys.executable, __file__, "--ct2-worker", preset, *names, "--ct2-dir", str(ct2_dir)]
        command += ["--threads", str(threads)]
        self.process = subprocess.Popen(command, stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
        self._expect("ready")

    def _expect(self, word: str) -> None:
        line = self.process.stdout.readline().strip()
        if line != word:
            raise RuntimeError(
                f"CTranslate2 worker: expected {word!r}, got {line!r} (exit code {self.process.poll()})"
            )

    def run(self, name: str, row: Row) -> Callable[[], None]:
        def generate() -> None:
            self.process.stdin.write(json.dumps([name, row.work, row.batch, row.num_beams]) + "\n")
            self.process.stdin.flush()
            self._expect("done")

        return generate

    def close(self) -> None:
        self.process.stdin.close()
        self.process.wait()


def ctranslate2_worker(preset: str, names: list[str], ct2_dir: str, threads: int) -> None:
    """Runs in its own process: loads the CTranslate2 engines, then does one row's work per line of stdin."""
    workload = WORKLOADS[preset]
    engines = Engines(preset, workload, [], threads, check=False)
    engines.add_ctranslate2(names, Path(ct2_dir))
    batches = {}
    print("ready", flush=True)
    for line in sys.stdin:
        name, work, batch, num_beams = json.loads(line)
        row = Row(work, batch, num_beams)
        if row not in batches:
            batches[row] = work_batch(workload, row)  # the same seeded batch as the main process's
        engines.run(name, row, batches[row])()
        print("done", flush=True)


def memory_worker(preset: str, name: str, ct2_dir: str | None, threads: int) -> None:
    """Runs in a fresh process: one engine, every row; prints {"loaded": MiB, "<work>/<batch>": MiB, ...}."""
    workload = WORKLOADS[preset]
    engines = Engines(preset, workload, [name] if name in TORCH_ENGINES else [], threads, check=False)
    if name not in TORCH_ENGINES:
        engines.add_ctranslate2([name], Path(ct2_dir))
    gc.collect()
    ctypes.CDLL("libc.so.6").malloc_trim(0)
    result = {"loaded": _status_mib("VmRSS")}
    for row in rows_for(workload):
        if name in engines.names(row):
            result[f"{row.work}/{row.batch}"] = peak_extra_memory_mib(
                engines.run(name, row, work_batch(workload, row))
            )
    print(json.dumps(result))


def measure_memory(preset: str, engines: list[str], ct2_dir: Path | None, threads: int) -> dict[str, dict]:
    results = {}
    for engine in engines:
        command = [sys.executable, __file__, "--memory-worker", preset, engine, "--threads", str(threads)]
        if ct2_dir is not None:
            command += ["--ct2-dir", str(ct2_dir)]
        completed = subprocess.run(command, capture_output=True, text=True, check=False)
        if completed.returncode != 0:
            raise RuntimeError(f"memory worker {preset}/{engine} failed:\n{completed.stderr[-3000:]}")
        results[engine] = json.loads(completed.stdout.strip().splitlines()[-1])
    return results


# --- report --------------------------------------------------------------------------------------------------


def machine() -> str:
    cpu = platform.processor() or platform.machine()
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        names = [line.split(":", 1)[1].strip() for line in cpuinfo.read_text().splitlines() if "model name" in line]
        cpu = names[0] if names else cpu
    versions = f"torch {torch.__version__}, transformers {transformers.__version__}"
    try:
        import ctranslate2

        versions += f", ctranslate2 {ctranslate2.__version__}"
    except ImportError:
        pass
    return f"{cpu}, {os.cpu_count()} CPUs, {torch.get_num_threads()} threads; {versions}; Python {platform.python_version()}"


def load() -> str:
    return "/".join(f"{value:.2f}" for value in os.getloadavg())


def ratio(numerator: float | None, denominator: float | None) -> str:
    return f"{numerator / denominator:.2f}x" if numerator and denominator else "-"


def number(value: float | None, digits: int = 0) -> str:
    return f"{value:,.{digits}f}" if value is not None else "-"


def speed_table(results: dict) -> str:
    """Tokens per second (higher is better) and the ratios; a column per extra engine that ran."""
    extras = [name for name in EXTRA_ENGINES if any(name in speeds for speeds in results.values())]
    header = "| preset | work | batch | ours tok/s | Marian tok/s | ours/Marian | CT2 f32 tok/s | CT2 int8 tok/s | ours/CT2 f32 |"
    header += "".join(f" {EXTRA_ENGINES[name][0]} |" for name in extras)
    with_before, with_bf16 = "ours_before" in extras, "ours_bf16" in extras
    header += " ours/before |" * with_before + " ours bf16/CT2 f32 |" * with_bf16
    lines = [header, "|---|---|---:" + "|---:" * (6 + len(extras) + with_before + with_bf16) + "|"]
    for (preset, row), speeds in results.items():
        ours, marian = speeds.get("ours"), speeds.get("marian")
        ct2_f32, ct2_int8 = speeds.get("ct2_float32"), speeds.get("ct2_int8")
        line = (
            f"| {preset} | {row.work} | {row.batch} | {number(ours)} | {number(marian)} | {ratio(ours, marian)} "
            f"| {number(ct2_f32)} | {number(ct2_int8)} | {ratio(ours, ct2_f32)} |"
        )
        line += "".join(f" {number(speeds.get(name))} |" for name in extras)
        line += f" {ratio(ours, speeds.get('ours_before'))} |" * with_before
        lines.append(line + f" {ratio(speeds.get('ours_bf16'), ct2_f32)} |" * with_bf16)
    return "\n".join(lines)


def memory_table(memory: dict) -> str:
    lines = [
        "| preset | work | batch | ours MiB | Marian MiB | ours/Marian | CT2 f32 MiB | CT2 int8 MiB |",
        "|---|---|---:|---:|---:|---:|---:|---:|",
    ]
    for preset, by_engine in memory.items():
        loaded = [by_engine.get(engine, {}).get("loaded") for engine in ENGINES]
        lines.append(
            f"| {preset} | (loaded) | | {' | '.join(number(value) for value in loaded[:2])} | "
            f"{ratio(*loaded[:2])} | {' | '.join(number(value) for value in loaded[2:])} |"
        )
        for row in rows_for(WORKLOADS[preset]):
            key = f"{row.work}/{row.batch}"
            ours, marian, ct2_f32, ct2_int8 = (by_engine.get(engine, {}).get(key) for engine in ENGINES)
            lines.append(
                f"| {preset} | {row.work} | {row.batch} | {number(ours)} | {number(marian)} | {ratio(ours, marian)} "
                f"| {number(ct2_f32)} | {number(ct2_int8)} |"
            )
    return "\n".join(lines)


def fix_malloc_thresholds() -> None:
    """Keep freed memory in glibc's heap instead of unmapping it and page-faulting it back in on the next large
    allocation. glibc adapts these thresholds to the allocations it has seen, so without this the engines that run
    in one process change each other's speed; with it every engine runs with the same allocator. (The same as
    setting MALLOC_MMAP_THRESHOLD_ and MALLOC_TRIM_THRESHOLD_ in the environment.)"""
    libc = ctypes.CDLL("libc.so.6")
    m_trim_threshold, m_mmap_threshold = -1, -3  # from malloc.h
    libc.mallopt(m_mmap_threshold, 32 * 2**20)  # glibc's maximum; larger allocations are still mapped
    libc.mallopt(m_trim_threshold, 2**30)


def time_presets(args, torch_names: list[str], ct2_names: list[str]) -> tuple[dict, dict]:
    """Tokens per second of every engine on every row of each preset, then (unless --no-memory) peak memory."""
    speeds, memory = {}, {}
    with tempfile.TemporaryDirectory() as scratch:
        for preset in args.presets:
            workload = WORKLOADS[preset]
            repetitions = args.repetitions or (2 if args.quick else workload.repetitions)
            engines = Engines(preset, workload, torch_names, args.threads)
            ct2_dir = Path(scratch) / preset
            if ct2_names:
                export_ctranslate2(engines.models["ours"], ct2_dir)
                ct2_process = Ctranslate2Process(preset, ct2_names, ct2_dir, args.threads)
                engines.external = dict.fromkeys(ct2_names, ct2_process)
            for row in rows_for(workload):
                # batch-1 rows take a fraction of a second per run and vary the most: three times the repetitions
                speeds[(preset, row)] = time_row(engines, row, repetitions * (3 if row.batch == 1 else 1))
                line = ", ".join(f"{name} {value:,.0f}" for name, value in speeds[(preset, row)].items())
                print(f"{preset} {row.work} batch {row.batch}: {line} tok/s (load {load()})", flush=True)
            if ct2_names:
                ct2_process.close()
            del engines
            gc.collect()
            if not args.no_memory:
                memory[preset] = measure_memory(preset, list(TORCH_ENGINES) + ct2_names, ct2_dir, args.threads)
    return speeds, memory


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--presets", nargs="+", default=list(WORKLOADS), choices=list(WORKLOADS))
    parser.add_argument("--repetitions", type=int, default=None, help="timed repetitions per row (median)")
    parser.add_argument("--quick", action="store_true", help="2 repetitions per row")
    parser.add_argument("--threads", type=int, default=torch.get_num_threads(), help="torch and CTranslate2 threads")
    parser.add_argument("--no-memory", action="store_true", help="skip the peak memory subprocesses")
    parser.add_argument("--no-ctranslate2", action="store_true", help="skip the CTranslate2 rows")
    parser.add_argument("--compile", action="store_true", help="also time training of torch.compile(our model)")
    parser.add_argument("--before", action="store_true", help="also time our model with its fast paths off")
    parser.add_argument("--bf16", action="store_true", help="also time generation with bf16 weights (ours_bf16)")
    parser.add_argument("--system-malloc", action="store_true", help="keep glibc's adaptive malloc thresholds")
    parser.add_argument("--memory-worker", nargs=2, metavar=("PRESET", "ENGINE"), help=argparse.SUPPRESS)
    parser.add_argument("--ct2-dir", help=argparse.SUPPRESS)
    parser.add_argument("--ct2-worker", nargs="+", metavar="PRESET ENGINE", help=argparse.SUPPRESS)
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    if args.memory_worker:
        memory_worker(*args.memory_worker, args.ct2_dir, args.threads)
        return
    if args.ct2_worker:
        ctranslate2_worker(args.ct2_worker[0], args.ct2_worker[1:], args.ct2_dir, args.threads)
        return
    if not args.system_malloc:
        fix_malloc_thresholds()

    ct2_names = [] if args.no_ctranslate2 else [name for name in ENGINES if name.startswith("ct2_")]
    if ct2_names:
        try:
            import ctranslate2  # noqa: F401
        except ImportError:
            print("ctranslate2 is not installed: no CTranslate2 rows", file=sys.stderr)
            ct2_names = []
    torch_names = (
        list(TORCH_ENGINES)
        + ["ours_compiled"] * args.compile
        + ["ours_before"] * args.before
        + ["ours_bf16"] * args.bf16
    )

    started = datetime.now(timezone.utc)
    print(f"# {started:%Y-%m-%d %H:%M} UTC; {machine()}; load average at start {load()}", flush=True)
    speeds, memory = time_presets(args, torch_names, ct2_names)
    elapsed = (datetime.now(timezone.utc) - started).total_seconds()
    print(f"\nCommand: python {' '.join(sys.argv)}; {elapsed:.0f} s; load average at end {load()}\n")
    print(speed_table(speeds))
    if memory:
        print("\nPeak memory (MiB, lower is better): resident set of the process after loading the engine, and the")
        print("extra resident memory one run of the work needed on top of it.\n")
        print(memory_table(memory))


if __name__ == "__main__":
    main()
