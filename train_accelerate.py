"""Train the Transformer of "Attention Is All You Need" with Accelerate, following the paper's section 5.

    python train_accelerate.py                                   # the embedded synthetic task, offline, CPU
    python train_accelerate.py --data_dir ../shared/data/multi30k --source_lang en --target_lang de \
        --validation_split val --test_split test_2016_flickr --preset small --max_minutes 25
    python -m vanilla_transformer.prepare --dataset_name wmt14 --dataset_config de-en --source_lang en \
        --target_lang de --vocab_size 37000 --output_dir data-bin/wmt14-en-de    # once, on any machine
    accelerate launch --multi_gpu --num_processes 8 train_accelerate.py --prepared_data data-bin/wmt14-en-de \
        --preset base --max_tokens 3125

Reads top to bottom: arguments, data and tokenizer (prepared once and cached, `vanilla_transformer.prepare`), model,
optimizer, loop, evaluation, saving.
"""

import argparse
import datetime
import json
import math
import sys
import time
import uuid
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path

import torch
from accelerate.utils import InitProcessGroupKwargs, broadcast_object_list, gather_object, set_seed
from accelerate.utils import load as load_with_weights_only
from huggingface_hub import constants as hub_constants
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer import checkpoints, data, prepare, streaming
from vanilla_transformer.batching import TokenBatchSampler, TokenizedPairs, TranslationCollator, padding_statistics
from vanilla_transformer.cli import (
    at_least,
    non_negative_float,
    non_negative_int,
    number_in,
    positive_float,
    positive_int,
    probability,
)
from vanilla_transformer.hub import HubUploadError, push_folder_to_hub, render_model_card, save_model_folder
from vanilla_transformer.metrics import load_bleu_metric
from vanilla_transformer.output_folder import OutputDirError, claim_evaluation_dir, claim_output_dir
from vanilla_transformer.training import (
    DataPosition,
    StopSignals,
    UnsupportedSetup,
    count_target_tokens,
    evaluation_loader,
    final_model,
    forward_backward,
    make_accelerator,
    make_optimizer_and_schedule,
    optimizer_step_batches,
    prefetch,
    sharded_generation_kwargs,
    translate_for_evaluation,
    validation_loss,
)

# config fields that are training settings, not what the model is: a resumed run may change them
NOT_MODEL_IDENTITY = {
    "transformers_version",
    "label_smoothing",
    "use_cache",
    "onednn_linear",
    "grouped_beam_cross_attention",
}
# Flags left unset take these values: the embedded task trains in a few minutes on a laptop CPU, real data follows
# the paper (warm-up 4000) with the CPU-sized model unless --preset says otherwise.
EMBEDDED_TASK_DEFAULTS = {"preset": "tiny", "max_steps": 400, "warmup_steps": 200, "save_steps": 80, "eval_steps": 200}
REAL_DATA_DEFAULTS = {
    "preset": "small",
    "max_steps": 100_000,
    "warmup_steps": 4000,
    "save_steps": 1000,
    "eval_steps": 1000,
}


def parse_args(argv=None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    # the groups in the order --help lists them
    prepare.add_data_arguments(parser)
    streaming.add_streaming_arguments(parser)
    add_process_arguments(parser)
    add_model_arguments(parser)
    add_optimisation_arguments(parser)
    add_evaluation_arguments(parser)
    add_output_arguments(parser)
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    return args


def add_process_arguments(parser: argparse.ArgumentParser) -> None:
    """A prepared corpus, and how processes wait and load batches."""
    group = parser.add_argument_group("prepared data and processes")
    group.add_argument(
        "--prepared_data", help="a folder made by `python -m vanilla_transformer.prepare` (replaces the data flags)"
    )
    group.add_argument(
        "--ddp_timeout",
        type=positive_int,
        default=1800,
        help="seconds a process waits at a collective, e.g. while the main process prepares the corpus (torch's "
        "NCCL default is 600; prepare large corpora beforehand with python -m vanilla_transformer.prepare)",
    )
    group.add_argument(
        "--prefetch_batches",
        type=non_negative_int,
        default=2,
        help="optimizer steps collated ahead in a thread; 0 = inline",
    )


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model: a preset of the paper's Table 3 (or a CPU-sized one) and overrides."""
    group = parser.add_argument_group("model")
    group.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="Table 3 base/big, or small/tiny (default: small; tiny for the embedded task)",
    )
    group.add_argument("--d_model", type=positive_int)
    group.add_argument("--layers", type=positive_int, help="encoder and decoder layers (N)")
    group.add_argument("--heads", type=positive_int)
    group.add_argument(
        "--qk_head_dim", type=positive_int, help="d_k, per head (default: d_model / heads; Table 3 row B)"
    )
    group.add_argument("--ffn_dim", type=positive_int)
    group.add_argument("--dropout", type=probability, help="P_drop; default: the preset's")
    group.add_argument("--attention_dropout", type=probability, help="on attention weights (paper: 0)")
    group.add_argument("--activation_dropout", type=probability, help="inside the FFN, after ReLU (paper: 0)")
    group.add_argument("--position_embedding_type", choices=["sinusoidal", "learned"], default="sinusoidal")


def add_optimisation_arguments(parser: argparse.ArgumentParser) -> None:
    """Section 5: batches, the schedule of equation (3), regularisation, limits."""
    group = parser.add_argument_group("optimisation (paper section 5)")
    group.add_argument(
        "--max_tokens", type=at_least(2), default=4096, help="source and target tokens per batch per process"
    )
    group.add_argument("--gradient_accumulation_steps", type=positive_int, default=1)
    group.add_argument(
        "--warmup_steps", type=positive_int, help="default: 4000 (the paper); 200 for the embedded task"
    )
    group.add_argument("--learning_rate_scale", type=positive_float, default=1.0, help="factor on equation (3)")
    group.add_argument("--label_smoothing", type=probability, default=0.1)
    group.add_argument(
        "--max_grad_norm", type=non_negative_float, default=0.0, help="clip gradients; 0 = off (the paper)"
    )
    group.add_argument(
        "--mixed_precision",
        choices=["no", "fp16", "bf16"],
        help="default: accelerate's config; bf16 works on CPUs too",
    )
    group.add_argument(
        "--attn_implementation",
        choices=["sdpa", "eager"],
        default="sdpa",
        help="attention kernel while training; on CPUs with bf16, eager is faster (docs/BENCHMARKS.md)",
    )
    group.add_argument(
        "--max_steps",
        type=positive_int,
        help="default: 100000 (400 for the embedded task) unless another limit is given",
    )
    group.add_argument("--max_epochs", type=positive_int, default=None)
    group.add_argument(
        "--max_minutes", type=positive_float, default=None, help="wall-clock budget of the training loop"
    )
    group.add_argument("--seed", type=non_negative_int, default=42, help="initialisation, dropout, batch order")


def add_evaluation_arguments(parser: argparse.ArgumentParser) -> None:
    """BLEU during and after training, and --evaluate_only."""
    group = parser.add_argument_group("evaluation")
    group.add_argument(
        "--eval_steps", type=positive_int, help="validation loss and greedy BLEU every N steps (default 1000; 200)"
    )
    group.add_argument(
        "--eval_max_sentences", type=positive_int, default=500, help="validation sentences for BLEU in training"
    )
    group.add_argument("--eval_batch_size", type=positive_int, default=64)
    group.add_argument(
        "--max_eval_source_tokens",
        type=at_least(2),
        default=1024,
        help="evaluation truncates longer sources and targets (counted), bounding its memory",
    )
    group.add_argument("--num_beams", type=positive_int, default=4, help="final decoding (paper: 4)")
    group.add_argument("--length_penalty", type=number_in(-math.inf), default=0.6, help="final decoding (paper: 0.6)")
    group.add_argument("--evaluate_only", action="store_true", help="translate and score with a saved model")
    group.add_argument("--model_name_or_path", help="saved model folder for --evaluate_only")
    group.add_argument(
        "--trust_remote_code",
        action="store_true",
        help="--evaluate_only: run the model folder's own code (Hub models); default: the installed code",
    )


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """The output folder, checkpoints, logs and the Hub."""
    group = parser.add_argument_group("checkpoints, logging, sharing")
    group.add_argument("--output_dir", default="outputs/vanilla-transformer")
    group.add_argument(
        "--overwrite_output_dir",
        action="store_true",
        help="delete an earlier run's checkpoints, logs and model in --output_dir first (else such a folder is "
        "refused, unless resumed)",
    )
    group.add_argument(
        "--save_steps", type=positive_int, help="checkpoint every N steps (default 1000; 80 for the embedded task)"
    )
    group.add_argument(
        "--save_total_limit", type=non_negative_int, default=5, help="keep the last K checkpoints (0: all)"
    )
    group.add_argument(
        "--average_last", type=positive_int, default=5, help="average the last K checkpoints (paper: 5/20)"
    )
    group.add_argument("--resume_from_checkpoint", help="a checkpoint folder, or `latest`")
    group.add_argument("--logging_steps", type=positive_int, default=50)
    group.add_argument("--report_to", default="none", help="an accelerate tracker, e.g. tensorboard")
    group.add_argument("--push_to_hub", action="store_true")
    group.add_argument("--hub_model_id")
    group.add_argument("--hub_private", action="store_true")


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill the defaults that depend on the data, and refuse combinations that cannot work (parser.error)."""
    prepare.check_data_arguments(parser, args)
    if args.resume_from_checkpoint == "latest" and args.overwrite_output_dir:
        parser.error("--resume_from_checkpoint continues the run in --output_dir; --overwrite_output_dir deletes it")
    other_limit = args.max_epochs is not None or args.max_minutes is not None
    for name, value in (EMBEDDED_TASK_DEFAULTS if is_synthetic(args) else REAL_DATA_DEFAULTS).items():
        if getattr(args, name) is None and not (name == "max_steps" and other_limit):
            setattr(args, name, value)
    if args.max_source_tokens and args.max_source_tokens > args.max_tokens:
        parser.error(
            f"--max_source_tokens {args.max_source_tokens} exceeds --max_tokens {args.max_tokens}: a kept "
            "pair would not fit in a batch; lower the first or raise the second"
        )
    if args.prepared_data and not prepare.is_synthetic(args):
        parser.error("--prepared_data replaces --data_dir/--train_file/--dataset_name: give one or the other")
    if args.prepared_data:
        use_prepared_languages(parser, args)
    if args.streaming and (args.prepared_data or args.max_epochs is not None):
        parser.error(
            "--streaming reads raw data and ends at --max_steps/--max_minutes: it takes neither "
            "--prepared_data nor --max_epochs"
        )
    if args.evaluate_only and not args.model_name_or_path:
        parser.error("--evaluate_only needs --model_name_or_path")
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id")
    if args.push_to_hub and hub_constants.HF_HUB_OFFLINE:
        parser.error(
            "--push_to_hub with HF_HUB_OFFLINE set: the upload at the end could not happen; train without it and "
            "run `python -m vanilla_transformer.push_to_hub OUTPUT_DIR --hub_model_id ID` once online"
        )
    if args.average_last > args.save_total_limit > 0:
        parser.error("--average_last cannot exceed --save_total_limit: the checkpoints to average must be kept")
    try:  # the model the flags describe, checked before any data is read
        VanillaTransformerConfig.from_preset(args.preset, **model_flags(args))
    except ValueError as error:
        parser.error(f"--preset {args.preset} with the model flags given: {error}")


def use_prepared_languages(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """A prepared corpus holds its languages: language flags may repeat them, never contradict them."""
    try:
        key = prepare.read_manifest(Path(args.prepared_data))["key"]
    except data.DataError as error:
        parser.error(f"--prepared_data: {error}")
    for flag in ("source_lang", "target_lang"):
        if getattr(args, flag) not in (None, key[flag]):
            parser.error(
                f"--{flag} {getattr(args, flag)}, but --prepared_data {args.prepared_data} holds "
                f"{key['source_lang']}-{key['target_lang']} pairs: drop the language flags, or prepare that pair"
            )
    args.source_lang, args.target_lang = key["source_lang"], key["target_lang"]


def is_synthetic(args) -> bool:
    return prepare.is_synthetic(args) and not args.prepared_data


def load_training_data(args, accelerator):
    """(tokenizer, evaluation splits, `step_stream(position)`: the optimizer steps' batches from a data position).

    By default the corpus is prepared once (tokenized, filtered, cached on disk) and memory-mapped by every process;
    with --streaming the training pairs are read, shuffled and tokenized as they are needed.
    """
    accumulation = args.gradient_accumulation_steps
    if args.streaming:
        tokenizer = streaming.load_or_train_tokenizer(args, accelerator)
        corpus = prepare.load_or_prepare(args, accelerator, splits=("validation", "test"), tokenizer=tokenizer)
        epoch_batches = streaming.epoch_batches_factory(
            args, tokenizer, accelerator.process_index, accelerator.num_processes
        )
        collator = TranslationCollator(tokenizer.pad_token_id)
        accelerator.print("[data] streaming the training pairs")
        return (
            tokenizer,
            corpus.splits,
            partial(streaming.streaming_step_batches, epoch_batches, collator, accumulation),
        )

    corpus = prepare.load_or_prepare(args, accelerator)
    accelerator.print("\n".join(corpus.summary()))
    train_examples = TokenizedPairs(corpus.splits["train"])
    sampler = TokenBatchSampler(
        train_examples.source_lengths,
        train_examples.target_lengths,
        max_tokens=args.max_tokens,
        seed=args.seed,
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
    )
    collator = TranslationCollator(corpus.tokenizer.pad_token_id)
    stats = padding_statistics(sampler.epoch_batches(), sampler.source_lengths, sampler.target_lengths)
    accelerator.print(
        f"[data] {len(train_examples)} training pairs, {len(sampler)} batches per process per epoch, "
        f"padding waste {stats['padding_fraction']:.1%}"
    )
    evaluation_splits = {split: dataset for split, dataset in corpus.splits.items() if split != "train"}

    def step_stream(position: DataPosition):
        return optimizer_step_batches(sampler, collator, train_examples, accumulation, position, args.max_epochs)

    return corpus.tokenizer, evaluation_splits, step_stream


# --- model -----------------------------------------------------------------------------------------------------


def model_flags(args) -> dict:
    """The model flags given (over the preset's values), as config fields."""
    overrides = {
        "d_model": args.d_model,
        "encoder_layers": args.layers,
        "decoder_layers": args.layers,
        "encoder_attention_heads": args.heads,
        "decoder_attention_heads": args.heads,
        "qk_head_dim": args.qk_head_dim,
        "encoder_ffn_dim": args.ffn_dim,
        "decoder_ffn_dim": args.ffn_dim,
        "dropout": args.dropout,
        "attention_dropout": args.attention_dropout,
        "activation_dropout": args.activation_dropout,
    }
    return {name: value for name, value in overrides.items() if value is not None}


def build_config(args, tokenizer) -> VanillaTransformerConfig:
    return VanillaTransformerConfig.from_preset(
        args.preset,
        **model_flags(args),
        vocab_size=len(tokenizer),
        position_embedding_type=args.position_embedding_type,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )


# --- checkpoints -----------------------------------------------------------------------------------------------
# Where each process writes: with one filesystem that every process sees, the main process writes checkpoints, logs
# and the model folder. Machines without a shared filesystem each get their own copy of every checkpoint (each
# machine's first process writes it: accelerate's save_on_each_node), so that every machine can resume and average;
# logs and the final model folder are written on the main process's machine only.


def output_dir_is_shared(accelerator, args) -> bool:
    """Whether every process sees the main process's --output_dir: the main process leaves a marker beside it and
    every process looks for it."""
    if accelerator.num_processes == 1:
        return True
    token = [uuid.uuid4().hex]
    broadcast_object_list(token)
    folder = Path(args.output_dir).absolute()
    marker = folder.parent / f".{folder.name}.shared-{token[0]}"

    def leave_marker():
        marker.parent.mkdir(parents=True, exist_ok=True)
        marker.touch()

    prepare.main_process_only(accelerator, leave_marker, "checking --output_dir", accelerator.is_main_process)
    seen = gather_object([marker.exists()])
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        marker.unlink()
    return all(seen)


def writes_checkpoints(accelerator, args) -> bool:
    """Whether this process writes the checkpoints (and claims --output_dir) on its machine."""
    return accelerator.is_local_main_process if args.save_on_each_node else accelerator.is_main_process


@dataclass
class RunState:
    """Where the run stands; saved in each checkpoint's trainer_state.json beside accelerate's state."""

    run_id: str | None  # the run that owns the checkpoints it prunes and averages (None: saved before ids existed)
    step: int = 0
    position: DataPosition = field(default_factory=DataPosition)
    elapsed_seconds: float = 0.0


def new_run_id(accelerator) -> str:
    run_id = [uuid.uuid4().hex]
    broadcast_object_list(run_id)  # the main process's id, on every process
    return run_id[0]


def run_identity(config, tokenizer) -> dict:
    """What a checkpoint must share with the run that resumes it: the model (its config without training settings)
    and the tokenizer."""
    model_config = {k: v for k, v in config.to_diff_dict().items() if k not in NOT_MODEL_IDENTITY}
    return {"model_config": model_config, "tokenizer": prepare.tokenizer_fingerprint(tokenizer)}


def save_checkpoint(accelerator, args, state: RunState, schedule, identity: dict) -> None:
    """accelerator.save_state into a staging folder, renamed into place once complete (with checksums); keeps the
    run's last K. The schedule and the data position go into JSON (nothing of ours is pickled)."""
    root = Path(args.output_dir) / "checkpoints"
    staging = checkpoints.staging_dir(root, state.step)
    accelerator.save_state(str(staging))
    if writes_checkpoints(accelerator, args):
        trainer_state = {
            "run_id": state.run_id,
            "step": state.step,
            "epoch": state.position.epoch,
            "batches_done_in_epoch": state.position.batches_done_in_epoch,
            "elapsed_seconds": state.elapsed_seconds,
            "schedule": schedule.state_dict(),
            "continuation": continuation_settings(accelerator, args),
            **identity,
        }
        (staging / checkpoints.TRAINER_STATE).write_text(json.dumps(trainer_state, indent=2))
    accelerator.wait_for_everyone()
    if writes_checkpoints(accelerator, args):
        checkpoints.finalize_checkpoint(staging, checkpoints.checkpoint_dir(root, state.step))
        checkpoints.prune_checkpoints(root, args.save_total_limit, run_id=state.run_id)
    accelerator.wait_for_everyone()


def find_resume_checkpoint(args, accelerator) -> Path | None:
    """The checkpoint every process resumes from, agreed before any loads it: the given one, which must be intact
    on every machine; or with `latest`, the newest step that every machine holds intact (a newer one missing or
    damaged somewhere is named and skipped). None when no machine has a checkpoint at all."""
    if args.resume_from_checkpoint != "latest":
        path = Path(args.resume_from_checkpoint)
        problems = [problem for problem in gather_object([checkpoints.checkpoint_problem(path)]) if problem]
        if problems:
            raise checkpoints.CheckpointError(f"cannot resume from {path}: {'; '.join(sorted(set(problems)))}")
        return path
    root = Path(args.output_dir) / "checkpoints"
    held = gather_object([[checkpoints.checkpoint_step(path) for path in checkpoints.list_checkpoints(root)]])
    if not any(held):
        return None
    common = set(held[0]).intersection(*held[1:])
    for step in sorted(common, reverse=True):
        path = checkpoints.checkpoint_dir(root, step)
        problems = [problem for problem in gather_object([checkpoints.checkpoint_problem(path)]) if problem]
        if not problems:
            if {newer for steps in held for newer in steps if newer > step} - common:
                accelerator.print(f"[resume] newer checkpoints are not on every machine; resuming from {path.name}")
            return path
        accelerator.print(f"[resume] skipping {path.name}: {'; '.join(sorted(set(problems)))}")
    holdings = "; ".join(f"process {rank}: steps {steps or 'none'}" for rank, steps in enumerate(held))
    raise checkpoints.CheckpointError(
        f"no intact checkpoint in {root} that every process holds ({holdings}); on machines without a shared "
        "filesystem, copy the checkpoint folder to each machine's --output_dir"
    )


def continuation_settings(accelerator, args) -> dict:
    """What an exact continuation needs unchanged: the batches (tokens per batch, accumulation, processes, seed; the
    data position counts batches) and the schedule (its scale)."""
    return {
        "max_tokens": args.max_tokens,
        "gradient_accumulation_steps": args.gradient_accumulation_steps,
        "num_processes": accelerator.num_processes,
        "seed": args.seed,
        "learning_rate_scale": args.learning_rate_scale,
    }


def warn_if_not_exact(accelerator, saved: dict, args) -> None:
    """Resuming with other batches or another schedule is allowed (a longer run at a new learning rate, more GPUs),
    but said: the data position then points at other batches, so the run is no longer the one it continues."""
    there, here = saved.get("continuation", {}), continuation_settings(accelerator, args)
    if changed := [f"{k} {there[k]} -> {here[k]}" for k in here if k in there and there[k] != here[k]]:
        accelerator.print(
            f"[resume] warning: {', '.join(changed)} since the checkpoint: training continues, but not exactly as "
            "the interrupted run would have (other batches or another learning-rate schedule)"
        )


def check_checkpoint_matches(path: Path, identity: dict, model) -> None:
    """Refuse a checkpoint of another model or tokenizer, naming what differs, before anything is loaded (checkpoints
    saved before the model's config was recorded are compared by their weights' shapes)."""
    saved = checkpoints.trainer_state(path)
    if "model_config" in saved:
        there, here = saved["model_config"], identity["model_config"]
        differing = [k for k in sorted(there.keys() | here.keys()) if there.get(k) != here.get(k)]
        differences = [f"{k}: {there.get(k)!r} there, {here.get(k)!r} here" for k in differing]
    else:
        there, here = checkpoints.weight_shapes(path), {k: tuple(v.shape) for k, v in model.state_dict().items()}
        differing = [k for k in there if there[k] != here.get(k)][:3]
        differences = [f"{k}: shape {there[k]} there, {here.get(k)} here" for k in differing]
    if differences:
        raise checkpoints.CheckpointError(
            f"{path} is a checkpoint of another model ({'; '.join(differences)}): resume with the model flags it was "
            "trained with, or start a new run in another --output_dir"
        )
    if saved.get("tokenizer", identity["tokenizer"]) != identity["tokenizer"]:
        raise checkpoints.CheckpointError(
            f"{path} was trained with another tokenizer (other data, --vocab_size or --tokenizer_name_or_path): "
            "resume with the data flags it was trained with"
        )


def resume(accelerator, args, model, schedule, identity: dict) -> RunState | None:
    """Restore model, optimizer, RNG states (accelerate), schedule and data position (ours, JSON)."""
    path = find_resume_checkpoint(args, accelerator)
    if path is None:
        accelerator.print(f"[resume] no checkpoint in {Path(args.output_dir) / 'checkpoints'}; starting from scratch")
        return None
    check_checkpoint_matches(path, identity, accelerator.unwrap_model(model))
    accelerator.load_state(str(path))
    saved = checkpoints.trainer_state(path)
    warn_if_not_exact(accelerator, saved, args)
    if "schedule" in saved:
        schedule.load_state_dict(saved["schedule"])
    else:  # saved before the schedule went into trainer_state.json: accelerate's pickle, read with weights_only
        schedule.load_state_dict(load_with_weights_only(path / "custom_checkpoint_0.pkl"))
    accelerator.print(f"[resume] from {path} at step {saved['step']}")
    position = DataPosition(saved["epoch"], saved["batches_done_in_epoch"])
    return RunState(saved.get("run_id"), saved["step"], position, saved["elapsed_seconds"])


def load_averaged_weights(model, args, accelerator, run_id) -> int:
    """Section 6.1: average this run's last K checkpoints into the final model; returns how many were averaged."""
    paths = checkpoints.list_checkpoints(Path(args.output_dir) / "checkpoints", run_id)[-args.average_last :]
    for path in paths:
        if problem := checkpoints.checkpoint_problem(path, only=checkpoints.WEIGHTS_NAMES):
            raise checkpoints.CheckpointError(f"cannot average {path}: {problem}")
    averaged = checkpoints.average_checkpoints(paths)
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    tied = set(model.get_expanded_tied_weights_keys(all_submodels=True)) | {
        name for name, _ in model.named_buffers() if name.endswith("embed_positions.table")
    }
    if unexpected or not set(missing) <= tied:
        raise RuntimeError(f"Averaged checkpoint does not match the model: missing {missing}, unexpected {unexpected}")
    accelerator.print(f"[average] the final model averages {len(paths)} checkpoint(s): {[p.name for p in paths]}")
    return len(paths)


# --- evaluation ------------------------------------------------------------------------------------------------


def max_eval_tokens(args, config) -> int:
    """--max_eval_source_tokens, lowered so that input + 50 output tokens fit a learned position table."""
    if config.position_embedding_type == "learned":
        return min(args.max_eval_source_tokens, config.max_position_embeddings - 50)
    return args.max_eval_source_tokens


def prepared_loader(accelerator, tokenizer, dataset, args, config, split: str):
    """An evaluation loader over a prepared split, sharded over processes by Accelerate; over-long lines are
    truncated and counted."""
    collator = TranslationCollator(tokenizer.pad_token_id)
    max_tokens = max_eval_tokens(args, config)
    loader, truncated = evaluation_loader(TokenizedPairs(dataset), collator, args.eval_batch_size, max_tokens)
    if truncated:
        accelerator.print(
            f"[{split}] {truncated} of {len(dataset)} pairs have a side longer than {max_tokens} "
            "tokens; truncated (see --max_eval_source_tokens)"
        )
    return accelerator.prepare(loader)


def evaluate_split(accelerator, model, tokenizer, dataset, loader, metric, generation_kwargs, write_to=None) -> dict:
    """Translate a prepared split (sharded over processes), score BLEU and chrF against its `target` text on
    detokenized text, write hypotheses."""
    hypotheses = translate_for_evaluation(accelerator, model, loader, tokenizer, generation_kwargs)
    scores = metric.compute(predictions=hypotheses, references=[[target] for target in dataset["target"]])
    if accelerator.is_main_process and write_to:
        Path(write_to).write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    return {
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "signature": scores["bleu_signature"],
        "hypotheses": hypotheses,
    }


def evaluate_only(args, accelerator) -> None:
    prepare.main_process_only(
        accelerator, partial(claim_evaluation_dir, args.output_dir, args.overwrite_output_dir), "checking --output_dir"
    )
    trust = args.trust_remote_code  # by default the installed code runs, whatever code the folder holds
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model_name_or_path, trust_remote_code=trust)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path, trust_remote_code=trust)
    model = accelerator.prepare(model)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    corpus = prepare.load_or_prepare(args, accelerator, splits=("validation", "test"), tokenizer=tokenizer)
    if prepare.tokenizer_fingerprint(corpus.tokenizer) != prepare.tokenizer_fingerprint(tokenizer):
        raise data.DataError(f"{corpus.folder} was tokenized with another tokenizer than {args.model_name_or_path}'s")
    accelerator.print("\n".join(corpus.summary()))  # which files were scored
    results = score_splits(accelerator, accelerator.unwrap_model(model), tokenizer, corpus.splits, args)
    if accelerator.is_main_process:
        scored = {"model": args.model_name_or_path, "data": corpus.summary(), "results": results}
        (Path(args.output_dir) / "eval_results.json").write_text(json.dumps(scored, indent=2))


def score_splits(accelerator, model, tokenizer, splits: dict, args) -> dict:
    """The paper's decoding (6.1: beam 4, length penalty 0.6, input + 50) of the validation and test splits there are;
    writes `<split>.hyp.txt` into the output folder; returns BLEU, chrF, the signature and the per-token perplexity
    (no label smoothing; Table 3's dev PPL) per split."""
    metric = load_bleu_metric()
    generation_kwargs = {"num_beams": args.num_beams, "length_penalty": args.length_penalty, "do_sample": False}
    results = {}
    for split in ("validation", "test"):
        if split in splits:
            loader = prepared_loader(accelerator, tokenizer, splits[split], args, model.config, split)
            hypotheses_file = Path(args.output_dir) / f"{split}.hyp.txt"
            result = evaluate_split(
                accelerator, model, tokenizer, splits[split], loader, metric, generation_kwargs, hypotheses_file
            )
            results[split] = {k: result[k] for k in ("bleu", "chrf", "signature")}
            results[split]["perplexity"] = validation_loss(accelerator, model, loader)["perplexity"]
            accelerator.print(
                f"[{split}] BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}  perplexity "
                f"{results[split]['perplexity']:.2f}  {result['signature']}"
            )
    return results


# --- the loop --------------------------------------------------------------------------------------------------


class TrainingLog:
    """Every --logging_steps: the mean loss per target token and tokens/s since the last line, into
    train_log.jsonl (main process), accelerate's trackers and the progress bar."""

    def __init__(self, accelerator, args, progress, start_step: int):
        self.accelerator, self.progress = accelerator, progress
        self.file = Path(args.output_dir) / "train_log.jsonl"
        self.loss, self.tokens, self.start = 0.0, 0.0, time.time()
        if accelerator.is_main_process and self.file.is_file():
            self.drop_lines_after(start_step)

    def drop_lines_after(self, step: int) -> None:
        """Resumed from `step`: the lines of later steps belong to steps trained again now, so each step keeps one."""
        lines = self.file.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _logged_step(line) <= step]
        if len(kept) < len(lines):
            staging = self.file.with_name(self.file.name + ".tmp")
            staging.write_text("".join(kept))
            staging.replace(self.file)

    def add(self, step_loss: float, step_tokens: float) -> None:
        self.loss, self.tokens = self.loss + step_loss, self.tokens + step_tokens

    def write(self, step: int, lr: float, epoch: int) -> None:
        loss_per_token = (self.accelerator.reduce(self.loss, "sum") / self.tokens).item()
        tokens_per_second = self.tokens / (time.time() - self.start)
        record = {
            "step": step,
            "loss": loss_per_token,
            "lr": lr,
            "target_tokens_per_second": tokens_per_second,
            "epoch": epoch,
        }
        self.progress.set_postfix(loss=f"{loss_per_token:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:.0f}")
        self.accelerator.log({"train/" + k: v for k, v in record.items() if k != "step"}, step=step)
        if self.accelerator.is_main_process:
            with self.file.open("a") as log:
                log.write(json.dumps(record) + "\n")
        self.loss, self.tokens, self.start = 0.0, 0.0, time.time()


def _logged_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return -1  # a damaged line stays as it is


def periodic_evaluation(accelerator, model, tokenizer, validation, loader, step: int, progress) -> None:
    """Validation loss and greedy BLEU on the first --eval_max_sentences validation pairs."""
    losses = validation_loss(accelerator, model, loader)
    generation_kwargs = {"num_beams": 1, **sharded_generation_kwargs(accelerator)}
    bleu = evaluate_split(accelerator, model, tokenizer, validation, loader, load_bleu_metric(), generation_kwargs)
    if accelerator.is_main_process:
        progress.write(f"[eval] step {step}: nll {losses['nll']:.3f}  greedy BLEU {bleu['bleu']:.2f}")
    accelerator.log({"eval/nll": losses["nll"], "eval/bleu_greedy": bleu["bleu"]}, step=step)


def train_loop(accelerator, args, run, state: RunState, stop_signals: StopSignals) -> str:
    """Section 5: optimizer steps until a limit or a stop request; returns why it stopped. `state` advances in place
    and is checkpointed every --save_steps and at the end."""
    model, optimizer, schedule = run["model"], run["optimizer"], run["schedule"]
    progress = tqdm(
        total=args.max_steps, initial=state.step, disable=not accelerator.is_local_main_process, desc="train"
    )
    log = TrainingLog(accelerator, args, progress, state.step)
    start_time, last_saved_step, stop_reason = time.time() - state.elapsed_seconds, state.step, "max_epochs"
    steps = prefetch(run["step_stream"](state.position), args.prefetch_batches, accelerator.device.type == "cuda")
    for step_batches, position_after_step in steps:
        if args.max_steps is not None and state.step >= args.max_steps:
            stop_reason = "max_steps"
            break
        # One collective per step: the step's global target-token count, and whether any process must stop (and
        # why: a signal anywhere stops every process the same way, at the same step).
        out_of_time = args.max_minutes is not None and time.time() - start_time > args.max_minutes * 60
        local = [sum(count_target_tokens(b) for b in step_batches), float(stop_signals.requested), float(out_of_time)]
        global_tokens, signal_votes, time_votes = accelerator.reduce(
            torch.tensor(local, dtype=torch.float64, device=accelerator.device)
        ).tolist()
        if signal_votes or time_votes:
            stop_reason = "signal" if signal_votes else "max_minutes"
            break
        model.train()
        step_loss = forward_backward(accelerator, model, step_batches, global_tokens, args.label_smoothing)
        log.add(step_loss, global_tokens)
        if args.max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        state.step, state.position = state.step + 1, position_after_step
        state.elapsed_seconds = time.time() - start_time
        progress.update(1)
        if state.step % args.logging_steps == 0:
            log.write(state.step, schedule.get_last_lr()[0], state.position.epoch)
        if state.step % args.eval_steps == 0 and run["validation"]:
            periodic_evaluation(
                accelerator, model, run["tokenizer"], run["validation"], run["validation_loader"], state.step, progress
            )
        if state.step % args.save_steps == 0:
            save_checkpoint(accelerator, args, state, schedule, run["identity"])
            last_saved_step = state.step
    steps.close()
    progress.close()
    state.elapsed_seconds = time.time() - start_time
    if state.step != last_saved_step:
        save_checkpoint(accelerator, args, state, schedule, run["identity"])
    return stop_reason


# --- main ------------------------------------------------------------------------------------------------------


def set_up_run(args, accelerator) -> tuple[dict, RunState]:
    """Data, model, optimizer (5.3) and schedule (equation 3); resumed from a checkpoint when asked."""
    tokenizer, splits, step_stream = load_training_data(args, accelerator)
    config = build_config(args, tokenizer)
    model = VanillaTransformerForConditionalGeneration(config)
    default_attention = model.config._attn_implementation  # what the saved model will use (sdpa)
    model.set_attn_implementation(args.attn_implementation)
    accelerator.print(f"[model] {args.preset}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    optimizer, schedule = make_optimizer_and_schedule(
        model, config.d_model, args.warmup_steps, args.learning_rate_scale
    )
    # The schedule is not prepared: accelerate would step it once per process, and equation (3) counts steps.
    # Nor registered for checkpointing: accelerate pickles registered objects; ours go into trainer_state.json.
    model, optimizer = accelerator.prepare(model, optimizer)
    validation = splits.get("validation")
    validation = validation.select(range(min(len(validation), args.eval_max_sentences))) if validation else None
    for split in ("validation", "test"):
        if split not in splits:
            accelerator.print(
                f"[data] no {split} split: training goes on without scoring one (give --{split}_file, "
                f"or --{split}_split with --data_dir/--dataset_name)"
            )
    run = {
        "tokenizer": tokenizer,
        "splits": splits,
        "step_stream": step_stream,
        "model": model,
        "optimizer": optimizer,
        "schedule": schedule,
        "default_attention": default_attention,
        "identity": run_identity(config, tokenizer),
        "validation": validation,
        "validation_loader": validation
        and prepared_loader(accelerator, tokenizer, validation, args, config, "validation"),
    }
    state = args.resume_from_checkpoint and resume(accelerator, args, model, schedule, run["identity"])
    return run, state or RunState(new_run_id(accelerator))


def main(argv=None) -> None:
    args = parse_args(argv)
    accelerator = make_accelerator(
        mixed_precision=args.mixed_precision,
        log_with=None if args.report_to == "none" else args.report_to,
        project_dir=args.output_dir,
        kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=args.ddp_timeout))],
    )
    if args.evaluate_only:
        return evaluate_only(args, accelerator)
    # before any data is prepared: the output folder is this run's (or refused), on every machine that writes one
    args.save_on_each_node = not output_dir_is_shared(accelerator, args)
    accelerator.project_configuration.save_on_each_node = args.save_on_each_node
    if args.save_on_each_node:
        accelerator.print("[output] --output_dir is not shared between the machines: each keeps its own checkpoints")
    claim = partial(claim_output_dir, args)
    prepare.main_process_only(accelerator, claim, "checking --output_dir", writes_checkpoints(accelerator, args))
    set_seed(args.seed)
    run, state = set_up_run(args, accelerator)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    if accelerator.is_main_process and args.report_to != "none":
        hyperparameters = {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers("vanilla_transformer", config=hyperparameters)

    stop_signals = StopSignals()
    stop_reason = train_loop(accelerator, args, run, state, stop_signals)
    if stop_reason == "signal":
        accelerator.print(
            f"[stop] a stop signal at step {state.step}: checkpoint saved; continue with "
            "--resume_from_checkpoint latest"
        )
    else:
        finish(accelerator, args, run, state, stop_reason, stop_signals)
    run.clear()
    accelerator.free_memory()  # the DDP model and its reducer go while their process group still exists
    accelerator.end_training()


def finish(accelerator, args, run, state: RunState, stop_reason: str, stop_signals: StopSignals) -> None:
    """The final model: averaged checkpoints (6.1), saved as a Hub-ready folder, then the paper's decoding of the
    validation and test sets (beam 4, length penalty 0.6, input + 50) in float32 with the default attention, as users
    run the saved model. The folder and results.json are written before evaluating, so a crash or a Ctrl-C there
    loses nothing; a signal while saving is acted on once the folder is complete."""
    model = final_model(accelerator, run["model"], run["default_attention"])
    summary = {
        "steps": state.step,
        "processes": accelerator.num_processes,
        "stop_reason": stop_reason,
        "training_minutes": state.elapsed_seconds / 60,
        "mixed_precision": accelerator.mixed_precision,
        "checkpoints_averaged": load_averaged_weights(model, args, accelerator, state.run_id),
        "results": {},
        "preset": args.preset,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if accelerator.is_main_process:
        save_final_model(model, run["tokenizer"], args, summary)
    # a signal while saving, on any process, skips the evaluation everywhere (every process must agree)
    if accelerator.reduce(torch.tensor(float(stop_signals.requested), device=accelerator.device), "sum").item():
        accelerator.print(
            f"[stop] a stop signal: the model folder is saved, the final evaluation skipped; score it "
            f"with --evaluate_only --model_name_or_path {args.output_dir}"
        )
        return
    stop_signals.restore_defaults()
    try:
        summary["results"] = score_splits(accelerator, model, run["tokenizer"], run["splits"], args)
    except KeyboardInterrupt:
        sys.exit(
            f"[stop] interrupted during the final evaluation; the model folder {args.output_dir} is saved; "
            f"score it with --evaluate_only --model_name_or_path {args.output_dir}"
        )
    accelerator.log({f"final/{split}_bleu": r["bleu"] for split, r in summary["results"].items()}, step=state.step)
    upload_failure = None
    if accelerator.is_main_process:
        save_final_model(model, run["tokenizer"], args, summary, card_only=True)
        if args.push_to_hub:
            try:
                push_folder_to_hub(args.output_dir, args.hub_model_id, private=args.hub_private)
            except HubUploadError as error:
                upload_failure = (
                    f"error: {error} The model folder {args.output_dir} is complete; upload it later with "
                    f"python -m vanilla_transformer.push_to_hub {args.output_dir} --hub_model_id {args.hub_model_id}"
                )
    accelerator.wait_for_everyone()
    if upload_failure:
        sys.exit(upload_failure)


def save_final_model(model, tokenizer, args, summary: dict, card_only: bool = False) -> None:
    """results.json and the Hub-ready model folder (weights, config, code, tokenizer, card); `card_only` rewrites
    the card and results.json once the scores are known."""
    (Path(args.output_dir) / "results.json").write_text(json.dumps(summary, indent=2))
    decoding = {"num_beams": args.num_beams, "length_penalty": args.length_penalty}  # as the scores were measured
    # The card's `datasets:` and model-index name a Hub dataset only: local files and the embedded task are named
    # in its text. A prepared corpus records what its splits were read from.
    sources = {}
    if args.prepared_data:
        sources = json.loads((Path(args.prepared_data) / prepare.MANIFEST).read_text())["key"]["sources"]
    elif args.dataset_name:
        names = {"train": args.train_split, "validation": args.validation_split, "test": args.test_split}
        sources = {
            split: {"kind": "hub", "name": args.dataset_name, "config": args.dataset_config, "split": name}
            for split, name in names.items()
        }
    if sources.get("train", {}).get("kind") == "hub":
        data_values = {"dataset": sources["train"]["name"], "dataset_config": sources["train"]["config"]}
        data_values |= {f"{split}_split": source["split"] for split, source in sources.items() if split != "train"}
    else:
        local = args.data_dir or args.train_file or args.prepared_data
        data_values = {"data": f"local files ({Path(local).name})" if local else "the embedded synthetic task"}
    card_values = {
        "source_lang": args.source_lang,
        "target_lang": args.target_lang,
        **data_values,
        "preset": args.preset,
        "steps": summary["steps"],
        "training_minutes": round(summary["training_minutes"], 1),
        "checkpoints_averaged": summary["checkpoints_averaged"],
        "max_tokens": args.max_tokens,
        "warmup_steps": args.warmup_steps,
        "learning_rate_scale": args.learning_rate_scale,
        "label_smoothing": args.label_smoothing,
        "training_precision": {"no": "float32"}.get(
            summary["mixed_precision"], f"{summary['mixed_precision']} autocast"
        ),
        **decoding,
    }
    for split, result in summary["results"].items():
        card_values[f"{split}_bleu"] = round(result["bleu"], 2)
        card_values[f"{split}_chrf"] = round(result["chrf"], 2)
        card_values["bleu_signature"] = result["signature"]
    if card_only:
        (Path(args.output_dir) / "README.md").write_text(render_model_card(model, card_values), encoding="utf-8")
    else:
        print(f"[save] model folder: {save_model_folder(model, tokenizer, args.output_dir, card_values, decoding)}")


if __name__ == "__main__":
    try:
        main()
    except (data.DataError, FileNotFoundError, checkpoints.CheckpointError, OutputDirError, UnsupportedSetup) as error:
        sys.exit(f"error: {error}")
