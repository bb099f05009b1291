"""The main job: train the Transformer of "Attention Is All You Need" with Accelerate, following the paper's section 5.

Run as `python train_accelerate.py`, `vanilla-transformer train` or `accelerate launch ... -m train_accelerate`;
`--help` lists the flags. Reads top to bottom: settings (`vanilla_transformer.commands.arguments`), the output
folder, data (prepared once and cached), model, optimizer, the loop, then the final model: averaged, saved,
evaluated. Checkpoint mechanics are `vanilla_transformer.training.checkpoint_folders` and `.checkpointing`, evaluation
`vanilla_transformer.training.evaluation`.
"""

import contextlib
import datetime
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import datasets
import torch
from accelerate.utils import InitProcessGroupKwargs, set_seed
from tqdm.auto import tqdm
from transformers import PreTrainedTokenizerBase

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.commands.arguments import parse_training_arguments
from vanilla_transformer.commands.runner import command
from vanilla_transformer.data import prepare, streaming
from vanilla_transformer.data.batching import (
    TokenBatchSampler,
    TokenizedPairs,
    TranslationCollator,
    padding_statistics,
)
from vanilla_transformer.data.streaming import StreamedSteps
from vanilla_transformer.hub import model_card, model_folder, upload
from vanilla_transformer.mechanics.files import on_full_disk
from vanilla_transformer.mechanics.names import TRACKER_LOGS, TRAIN_LOG
from vanilla_transformer.training import checkpointing, evaluation
from vanilla_transformer.training.checkpointing import TrainerState
from vanilla_transformer.training.log import TrainingLog
from vanilla_transformer.training.loss import forward_inputs, label_smoothed_cross_entropy, output_head
from vanilla_transformer.training.output_folder import (
    FINAL_ENTRIES,
    TRAINING_ENTRIES,
    ClaimedOutputDir,
    claim_for_training,
    write_final_records,
)
from vanilla_transformer.training.run_setup import config_for_tokenizer, make_accelerator
from vanilla_transformer.training.schedule import make_optimizer_and_schedule
from vanilla_transformer.training.settings import TrainingSettings
from vanilla_transformer.training.signals import StopSignals
from vanilla_transformer.training.steps import PreparedSteps, count_target_tokens, prefetch

Steps = PreparedSteps | StreamedSteps  # the optimizer steps' batches, from any data position


def train(settings: TrainingSettings) -> None:
    accelerator = make_accelerator(
        mixed_precision=settings.mixed_precision,
        log_with=None if settings.report_to == "none" else settings.report_to,
        project_dir=settings.output.output_dir,
        kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=settings.ddp_timeout))],
    )
    if settings.model_to_evaluate:
        scoring = (settings.data, settings.evaluation, settings.output, settings.trust_remote_code)
        evaluation.evaluate_saved_model(accelerator, settings.model_to_evaluate, *scoring)
        return
    folder = claim_for_training(accelerator, settings.output)  # before any data is prepared; holds its lock
    try:
        set_seed(settings.seed)
        run = set_up_run(settings, accelerator)
        trackers = (TRACKER_LOGS,) if settings.report_to != "none" else ()
        folder.record((*TRAINING_ENTRIES, *trackers), run.state.run_id)  # listed before they are written
        Path(settings.output.output_dir).mkdir(parents=True, exist_ok=True)
        if accelerator.is_main_process and settings.report_to != "none":
            accelerator.init_trackers(TRACKER_LOGS, config=settings.hyperparameters)

        stop_signals = StopSignals()
        stop_reason = train_loop(accelerator, settings, run, stop_signals)
        if stop_reason == "signal":
            accelerator.print(
                f"[stop] a stop signal at step {run.state.step}: checkpoint saved; continue with "
                "--resume_from_checkpoint latest"
            )
        else:
            finish(accelerator, settings, run, stop_reason, stop_signals, folder)
        del run
        accelerator.free_memory()  # the DDP model and its reducer go while their process group still exists
        accelerator.end_training()
    finally:
        folder.close()  # the lock goes; the record keeps what the run wrote


# --- data --------------------------------------------------------------------------------------------------------


def load_training_data(settings: TrainingSettings, accelerator) -> tuple[PreTrainedTokenizerBase, dict, Steps, dict]:
    """(tokenizer, evaluation splits, the optimizer steps' batches from any data position, the training data's
    fingerprint: what a resumed run must train on).

    By default the corpus is prepared once (tokenized, filtered, cached on disk) and memory-mapped by every process;
    with --streaming the training pairs are read, shuffled and tokenized as they are needed.
    """
    accumulation, data = settings.gradient_accumulation_steps, settings.data
    if settings.stream:
        tokenizer = streaming.load_or_train_tokenizer(data, settings.stream.shuffle_buffer_size, accelerator)
        corpus = prepare.load_or_prepare(data, accelerator, splits=("validation", "test"), tokenizer=tokenizer)
        rank, processes = accelerator.process_index, accelerator.num_processes
        epoch_batches = streaming.epoch_batches_factory(
            data, settings.stream, tokenizer, settings.max_tokens, settings.seed, rank, processes
        )
        accelerator.print("[data] streaming the training pairs")
        steps = StreamedSteps(epoch_batches, TranslationCollator(tokenizer.pad_token_id), accumulation)
        return tokenizer, corpus.splits, steps, streaming.streamed_data_fingerprint(data)

    corpus = prepare.load_or_prepare(data, accelerator)
    accelerator.print("\n".join(corpus.summary()))
    train_examples = TokenizedPairs(corpus.splits["train"])
    sampler = TokenBatchSampler(
        train_examples.source_lengths,
        train_examples.target_lengths,
        max_tokens=settings.max_tokens,
        seed=settings.seed,
        num_replicas=accelerator.num_processes,
        rank=accelerator.process_index,
    )
    stats = padding_statistics(sampler.epoch_batches(), sampler.source_lengths, sampler.target_lengths)
    accelerator.print(
        f"[data] {len(train_examples)} training pairs, {len(sampler)} batches per process per epoch, "
        f"padding waste {stats['padding_fraction']:.1%}"
    )
    evaluation_splits = {split: dataset for split, dataset in corpus.splits.items() if split != "train"}
    steps = PreparedSteps(sampler, TranslationCollator(corpus.tokenizer.pad_token_id), train_examples, accumulation)
    fingerprint = prepare.training_data_fingerprint(corpus, train_examples)
    return corpus.tokenizer, evaluation_splits, steps, fingerprint


# --- model, optimizer, resume -------------------------------------------------------------------------------------


@dataclass
class Run:
    """What the loop and the final model need; `state` advances in place."""

    tokenizer: PreTrainedTokenizerBase
    splits: dict[str, datasets.Dataset]  # the evaluation splits there are
    steps: Steps
    model: torch.nn.Module  # prepared by accelerate (DDP, mixed precision)
    optimizer: torch.optim.Optimizer
    schedule: torch.optim.lr_scheduler.LambdaLR
    default_attention: str  # what the saved model will use (sdpa)
    identity: dict  # what a checkpoint must share with this run (checkpointing.run_identity)
    continuation: dict  # what an exact continuation needs unchanged (checkpointing.continuation_settings)
    validation: datasets.Dataset | None  # the first validation pairs, for loss and greedy BLEU during training
    validation_loader: torch.utils.data.DataLoader | None
    state: TrainerState


def set_up_run(settings: TrainingSettings, accelerator) -> Run:
    """Data, model, optimizer (5.3) and schedule (equation 3); resumed from a checkpoint when asked."""
    tokenizer, splits, steps, training_data = load_training_data(settings, accelerator)
    config = config_for_tokenizer(settings.preset, tokenizer, **settings.model_overrides)
    model = VanillaTransformerForConditionalGeneration(config)
    default_attention = model.config._attn_implementation
    model.set_attn_implementation(settings.attn_implementation)
    accelerator.print(f"[model] {settings.preset}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    optimizer, schedule = make_optimizer_and_schedule(
        model, config.d_model, settings.warmup_steps, settings.learning_rate_scale
    )
    # The schedule is not prepared: accelerate would step it once per process, and equation (3) counts steps.
    # Nor registered for checkpointing: accelerate pickles registered objects; ours go into trainer_state.json.
    model, optimizer = accelerator.prepare(model, optimizer)
    for split in ("validation", "test"):
        if split not in splits:
            accelerator.print(
                f"[data] no {split} split: training goes on without scoring one (give --{split}_file, "
                f"or --{split}_split with --data_dir/--dataset_name)"
            )
    validation, validation_loader = splits.get("validation"), None
    if validation is not None:
        validation = validation.select(range(min(len(validation), settings.evaluation.max_sentences)))
        validation_loader = evaluation.sharded_loader(
            accelerator, tokenizer, validation, settings.evaluation, config, "validation"
        )
    identity = checkpointing.run_identity(config, prepare.tokenizer_fingerprint(tokenizer), training_data)
    continuation = checkpointing.continuation_settings(accelerator, settings.batches_and_schedule)
    state = None
    if settings.checkpoints.resume_from:
        state = checkpointing.resume(accelerator, settings.checkpoints, model, schedule, identity, continuation)
    return Run(
        tokenizer=tokenizer,
        splits=splits,
        steps=steps,
        model=model,
        optimizer=optimizer,
        schedule=schedule,
        default_attention=default_attention,
        identity=identity,
        continuation=continuation,
        validation=validation,
        validation_loader=validation_loader,
        state=state or TrainerState(checkpointing.new_run_id()),
    )


# --- the loop ----------------------------------------------------------------------------------------------------


def train_step(accelerator, model, optimizer, schedule, step_batches: list[dict], settings: TrainingSettings):
    """One optimizer step (5.3), its loss (5.4) the mean over the step's target tokens on all processes. Returns the
    summed loss and the target tokens on the device, never read here: the host queues the next step while this runs."""
    local_tokens = sum(count_target_tokens(batch) for batch in step_batches)  # the host's batches: no device wait
    step_tokens = accelerator.reduce(torch.full((), local_tokens, dtype=torch.float64, device=accelerator.device))
    model.train()
    step_loss = torch.zeros((), device=accelerator.device)
    for index, batch in enumerate(step_batches):  # micro-batches: gradients are synchronised on the last only
        batch = {name: tensor.to(accelerator.device, non_blocking=True) for name, tensor in batch.items()}
        with accelerator.no_sync(model) if index < len(step_batches) - 1 else contextlib.nullcontext():
            outputs = model(**forward_inputs(model, batch), output_hidden_states=True)  # sections 3.1-3.5
            # 5.4, summed over the targets, block by block; autocast too (Accelerate's covers the forward only)
            hidden, labels = outputs.decoder_hidden_states[-1], batch["labels"]
            with accelerator.autocast():
                loss = label_smoothed_cross_entropy(hidden, output_head(model), labels, settings.label_smoothing)
            # DDP averages the processes' gradients: this gives the mean over the step's target tokens
            accelerator.backward(loss / (step_tokens / accelerator.num_processes).to(loss.dtype))
        step_loss += loss.detach()  # no host sync: read only every --logging_steps
    if settings.max_grad_norm > 0:
        accelerator.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
    optimizer.step()
    schedule.step()
    optimizer.zero_grad(set_to_none=True)
    return step_loss, step_tokens


def train_loop(accelerator, settings: TrainingSettings, run: Run, stop_signals: StopSignals) -> str:
    """Section 5: optimizer steps until `stop_reason` gives one; returns it. `run.state` advances in place and is
    checkpointed every --save_steps and at the end."""
    model, optimizer, schedule, state = run.model, run.optimizer, run.schedule, run.state
    progress = tqdm(
        total=settings.max_steps, initial=state.step, disable=not accelerator.is_local_main_process, desc="train"
    )
    log = TrainingLog(
        accelerator, Path(settings.output.output_dir) / TRAIN_LOG, progress, state.step, settings.checkpoints
    )
    start_time, last_saved_step = time.time() - state.elapsed_seconds, state.step
    steps = prefetch(
        run.steps.from_position(state.position), settings.prefetch_batches, accelerator.device.type == "cuda"
    )
    while not (reason := stop_reason(accelerator, settings, state, stop_signals, start_time)):
        step_batches, position_after_step = next(steps)
        step_loss, step_tokens = train_step(accelerator, model, optimizer, schedule, step_batches, settings)
        state.step, state.position = state.step + 1, position_after_step
        state.elapsed_seconds = time.time() - start_time
        progress.update(1)
        log.add(step_loss, step_tokens)
        if state.step % settings.logging_steps == 0:
            log.write(state.step, schedule.get_last_lr()[0], state.position.epoch)
        if state.step % settings.evaluation.every_steps == 0 and run.validation is not None:
            evaluation.periodic_evaluation(
                accelerator, model, run.tokenizer, run.validation, run.validation_loader, state.step, progress
            )
        if state.step % settings.checkpoints.save_steps == 0:
            checkpointing.save_checkpoint(
                accelerator, settings.checkpoints, state, schedule, run.identity, run.continuation
            )
            last_saved_step = state.step
    steps.close()
    progress.close()
    state.elapsed_seconds = time.time() - start_time
    stop = reason == "signal"  # a stop checkpoint, to resume from: never pruned or averaged (checkpoint_folders.py)
    if state.step != last_saved_step or (state.at_stop_checkpoint and not stop):  # a regular one replaces a stop's
        checkpointing.save_checkpoint(
            accelerator, settings.checkpoints, state, schedule, run.identity, run.continuation, stop=stop
        )
    return reason


def stop_reason(accelerator, settings: TrainingSettings, state: TrainerState, stop_signals: StopSignals, start_time):
    """Why the run stops before its next step, the same on every process, or None to go on: its limits (steps,
    epochs), then one collective for what one process alone may see (a stop signal, the clock): a signal anywhere
    stops every process at the same step."""
    if settings.max_steps is not None and state.step >= settings.max_steps:
        return "max_steps"
    if settings.max_epochs is not None and state.position.epoch >= settings.max_epochs:
        return "max_epochs"
    out_of_time = settings.max_minutes is not None and time.time() - start_time > settings.max_minutes * 60
    if accelerator.num_processes == 1:  # no collective, so no host sync: the CPU stays a step ahead of the GPU
        return "signal" if stop_signals.requested else "max_minutes" if out_of_time else None
    votes = torch.tensor([float(stop_signals.requested), float(out_of_time)], device=accelerator.device)
    signal_votes, time_votes = accelerator.reduce(votes).tolist()
    return "signal" if signal_votes else "max_minutes" if time_votes else None


# --- the final model ---------------------------------------------------------------------------------------------


def finish(
    accelerator,
    settings: TrainingSettings,
    run: Run,
    stop_reason: str,
    stop_signals: StopSignals,
    folder: ClaimedOutputDir | None = None,
) -> None:
    """The final model: averaged checkpoints (6.1), saved as a Hub-ready folder, then scored as users run it (the
    paper's decoding, float32, the default attention). The folder is written before evaluating, so a crash or a
    Ctrl-C there loses nothing, and its card and results.json once after, with the scores; a signal while saving is
    acted on once the folder is complete."""
    output_dir = settings.output.output_dir
    model = evaluation.bare_model(accelerator, run.model, run.default_attention)
    averaged = checkpointing.load_averaged_weights(model, accelerator, settings.checkpoints, run.state.run_id)
    summary = {
        "steps": run.state.step,
        "processes": accelerator.num_processes,
        "stop_reason": stop_reason,
        "training_minutes": run.state.elapsed_seconds / 60,
        "mixed_precision": accelerator.mixed_precision,
        "checkpoints_averaged": averaged,
        "results": {},
        "preset": settings.preset,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if accelerator.is_main_process:
        save_final_model(model, run.tokenizer, settings, summary, folder)
    # a signal while saving, on any process, skips the evaluation everywhere (every process must agree)
    skipped = bool(
        accelerator.reduce(torch.tensor(float(stop_signals.requested), device=accelerator.device), "sum").item()
    )
    try:
        if not skipped:
            stop_signals.restore_defaults()
            summary["results"] = evaluation.score_splits(
                accelerator, model, run.tokenizer, run.splits, settings.evaluation, output_dir
            )
    except KeyboardInterrupt:
        sys.exit(
            f"[stop] interrupted during the final evaluation; the model folder {output_dir} is saved; "
            f"score it with --evaluate_only --model_name_or_path {output_dir}"
        )
    finally:  # with the scores, or without them when the evaluation was skipped, interrupted or failed
        if accelerator.is_main_process:
            write_card_and_results(model, settings, summary)
    if skipped:
        accelerator.print(
            f"[stop] a stop signal: the model folder is saved, the final evaluation skipped; score it "
            f"with --evaluate_only --model_name_or_path {output_dir}"
        )
        return
    accelerator.log({f"final/{split}_bleu": r["bleu"] for split, r in summary["results"].items()}, step=run.state.step)
    upload_failure = push(settings) if accelerator.is_main_process and settings.push_to_hub else None
    accelerator.wait_for_everyone()
    if upload_failure:
        sys.exit(upload_failure)


def push(settings: TrainingSettings) -> str | None:
    """Upload the finished model folder (--push_to_hub); the message of a failed upload, else None."""
    output_dir, repo_id = settings.output.output_dir, settings.hub_model_id
    try:
        upload.push_folder_to_hub(output_dir, repo_id, private=settings.hub_private)
    except upload.HubUploadError as error:
        return (
            f"error: {error} The model folder {output_dir} is complete; upload it later with "
            f"vanilla-transformer push {output_dir} --hub_model_id {repo_id}"
        )
    return None


def save_final_model(
    model, tokenizer, settings: TrainingSettings, summary: dict, folder: ClaimedOutputDir | None
) -> None:
    """The Hub-ready model folder (weights, config, code, tokenizer, generation config); its card comes with the
    scores (`write_card_and_results`)."""
    if folder is not None:
        folder.record(FINAL_ENTRIES)  # the model folder, results and hypotheses, listed before they are written
    corpus = settings.data.corpus  # the card's other values come with the scores; the tokenizer's config needs these
    languages = {"source_lang": corpus.source_lang, "target_lang": corpus.target_lang}
    decoding = settings.evaluation.final_decoding  # as the scores are measured
    with on_full_disk(checkpointing.disk_full(settings.checkpoints, "the final model folder")):
        model_folder.save_model_folder(model, tokenizer, settings.output.output_dir, languages, decoding, card=False)
    if folder is not None:
        folder.record_model_shards()
    print(f"[save] model folder: {settings.output.output_dir}")


def write_card_and_results(model, settings: TrainingSettings, summary: dict) -> None:
    """The model card and results.json of the finished run, each written once (output_folder.write_final_records)."""
    card = model_card.render_model_card(
        model, model_card.training_card_values(settings.data, summary, settings.card_recipe)
    )
    with on_full_disk(checkpointing.disk_full(settings.checkpoints, "the model card and results.json")):
        write_final_records(settings.output.output_dir, card, summary)


@command
def main(argv=None) -> None:
    """`python -m train_accelerate` (and `vanilla-transformer train`, commands/train.py): a refused setting, bad data,
    a damaged checkpoint or an occupied folder ends it with one message, not a traceback (`commands.runner`)."""
    train(parse_training_arguments(argv))


if __name__ == "__main__":
    sys.exit(main())
