"""Train the Transformer of "Attention Is All You Need" with Accelerate, following the paper's section 5.

    python train_accelerate.py                                   # the embedded synthetic task, offline, CPU
    vanilla-transformer train                                    # the same, installed (or python -m train_accelerate)
    vanilla-transformer train --data_dir ../shared/data/multi30k --source_lang en --target_lang de \
        --validation_split val --test_split test_2016_flickr --preset small --max_minutes 25
    vanilla-transformer prepare --dataset_name wmt14 --dataset_config de-en --source_lang en \
        --target_lang de --vocab_size 37000 --output_dir data-bin/wmt14-en-de    # once, on any machine
    accelerate launch --multi_gpu --num_processes 8 -m train_accelerate --prepared_data data-bin/wmt14-en-de \
        --preset base --max_tokens 3125

Reads top to bottom: settings (`vanilla_transformer.commands.arguments`), the output folder, data (prepared once and cached,
`vanilla_transformer.prepare`), model, optimizer, the loop, then the final model: averaged, saved, evaluated.
Checkpoint mechanics are `vanilla_transformer.checkpoints`, evaluation `vanilla_transformer.evaluation`.
"""

import datetime
import json
import sys
import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path

import torch
from accelerate.utils import InitProcessGroupKwargs, set_seed
from tqdm.auto import tqdm

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer import checkpoints, hub, prepare, streaming
from vanilla_transformer.batching import (
    DataPosition,
    TokenBatchSampler,
    TokenizedPairs,
    TranslationCollator,
    padding_statistics,
)
from vanilla_transformer.checkpoints import CheckpointError, RunState
from vanilla_transformer.commands.arguments import TrainingSettings, parse_training_arguments
from vanilla_transformer.coordination import CoordinationError, main_process_only
from vanilla_transformer.data import DataError
from vanilla_transformer.evaluation import (
    evaluate_saved_model,
    final_model,
    periodic_evaluation,
    prepared_loader,
    score_splits,
)
from vanilla_transformer.names import RESULTS, TRACKER_LOGS, TRAIN_LOG
from vanilla_transformer.output_folder import (
    FINAL_ENTRIES,
    TRAINING_ENTRIES,
    OutputDirError,
    RunFolder,
    claim_run_folder,
)
from vanilla_transformer.training import (
    StopSignals,
    TrainingLog,
    UnsupportedSetup,
    config_for_tokenizer,
    count_target_tokens,
    forward_backward,
    make_accelerator,
    make_optimizer_and_schedule,
    optimizer_step_batches,
    prefetch,
)


def train(argv=None) -> None:
    settings = parse_training_arguments(argv)
    accelerator = make_accelerator(
        mixed_precision=settings.mixed_precision,
        log_with=None if settings.report_to == "none" else settings.report_to,
        project_dir=settings.output.output_dir,
        kwargs_handlers=[InitProcessGroupKwargs(timeout=datetime.timedelta(seconds=settings.ddp_timeout))],
    )
    if settings.evaluate_only:
        scoring = (settings.data, settings.evaluation, settings.output, settings.trust_remote_code)
        evaluate_saved_model(accelerator, settings.evaluate_only, *scoring)
        return
    folder = claim_the_output_folder(accelerator, settings)  # before any data is prepared; holds the folder's lock
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


def claim_the_output_folder(accelerator, settings: TrainingSettings) -> RunFolder:
    """The output folder is this run's (or refused), on every machine that writes one: with no filesystem shared
    by every process, each machine keeps its own copy of every checkpoint. Returns the folder, locked by the process
    that claimed it (one run per folder), to record what the run writes and to close at the end.

    The lock: on one filesystem shared by every process, only the main process writes the folder, and only it takes
    the lock. Without one, each machine's first process writes that machine's own copy of the folder and claims it,
    lock included: a second run can only write into a machine's copy through that machine's first process, which
    then meets the lock there (on other machines' folders nobody else writes)."""
    save_on_each_node = not checkpoints.output_dir_is_shared(accelerator, settings.output.output_dir)
    accelerator.project_configuration.save_on_each_node = save_on_each_node
    if save_on_each_node:
        accelerator.print("[output] --output_dir is not shared between the machines: each keeps its own checkpoints")
    claimed = [RunFolder(settings.output.output_dir)]  # unlocked: a process that does not write the folder

    def claim():
        claimed[0] = claim_run_folder(settings.output)

    try:
        main_process_only(accelerator, claim, "checking --output_dir", checkpoints.writes_checkpoints(accelerator))
    except BaseException:  # refused on another machine: this one's lock goes too
        claimed[0].close()
        raise
    return claimed[0]


# --- data --------------------------------------------------------------------------------------------------------


def load_training_data(settings: TrainingSettings, accelerator):
    """(tokenizer, evaluation splits, `step_stream(position)`: the optimizer steps' batches from a data position).

    By default the corpus is prepared once (tokenized, filtered, cached on disk) and memory-mapped by every process;
    with --streaming the training pairs are read, shuffled and tokenized as they are needed.
    """
    accumulation, data = settings.gradient_accumulation_steps, settings.data
    if settings.stream:
        tokenizer = streaming.load_or_train_tokenizer(data, settings.stream.shuffle_buffer_size, accelerator)
        corpus = prepare.load_or_prepare(data, accelerator, splits=("validation", "test"), tokenizer=tokenizer)
        epoch_batches = streaming.epoch_batches_factory(
            data.corpus, data.filters, settings.stream, tokenizer, accelerator.process_index, accelerator.num_processes
        )
        collator = TranslationCollator(tokenizer.pad_token_id)
        accelerator.print("[data] streaming the training pairs")
        return (
            tokenizer,
            corpus.splits,
            partial(streaming.streaming_step_batches, epoch_batches, collator, accumulation),
        )

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
    collator = TranslationCollator(corpus.tokenizer.pad_token_id)
    stats = padding_statistics(sampler.epoch_batches(), sampler.source_lengths, sampler.target_lengths)
    accelerator.print(
        f"[data] {len(train_examples)} training pairs, {len(sampler)} batches per process per epoch, "
        f"padding waste {stats['padding_fraction']:.1%}"
    )
    evaluation_splits = {split: dataset for split, dataset in corpus.splits.items() if split != "train"}

    def step_stream(position: DataPosition):
        return optimizer_step_batches(sampler, collator, train_examples, accumulation, position, settings.max_epochs)

    return corpus.tokenizer, evaluation_splits, step_stream


# --- model, optimizer, resume -------------------------------------------------------------------------------------


@dataclass
class Run:
    """What the loop and the final model need; `state` advances in place."""

    tokenizer: object
    splits: dict  # the evaluation splits there are
    step_stream: object
    model: object
    optimizer: object
    schedule: object
    default_attention: str  # what the saved model will use (sdpa)
    identity: dict  # what a checkpoint must share with this run (checkpoints.run_identity)
    continuation: dict  # what an exact continuation needs unchanged (checkpoints.continuation_settings)
    evaluate: object  # step, progress bar -> validation loss and greedy BLEU; None without a validation split
    state: RunState | None = None


def set_up_run(settings: TrainingSettings, accelerator) -> Run:
    """Data, model, optimizer (5.3) and schedule (equation 3); resumed from a checkpoint when asked."""
    tokenizer, splits, step_stream = load_training_data(settings, accelerator)
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
    evaluate = None
    if (validation := splits.get("validation")) is not None:
        validation = validation.select(range(min(len(validation), settings.evaluation.max_sentences)))
        loader = prepared_loader(accelerator, tokenizer, validation, settings.evaluation, config, "validation")
        evaluate = partial(periodic_evaluation, accelerator, model, tokenizer, validation, loader)
    identity = checkpoints.run_identity(config, prepare.tokenizer_fingerprint(tokenizer))
    continuation = checkpoints.continuation_settings(accelerator, settings.continuation)
    run = Run(
        tokenizer, splits, step_stream, model, optimizer, schedule, default_attention, identity, continuation, evaluate
    )
    if settings.checkpoints.resume_from:
        run.state = checkpoints.resume(
            accelerator, settings.checkpoints, model, schedule, run.identity, run.continuation
        )
    run.state = run.state or RunState(checkpoints.new_run_id())
    return run


# --- the loop ----------------------------------------------------------------------------------------------------


def train_loop(accelerator, settings: TrainingSettings, run: Run, stop_signals: StopSignals) -> str:
    """Section 5: optimizer steps until a limit or a stop request; returns why it stopped. `run.state` advances in
    place and is checkpointed every --save_steps and at the end."""
    model, optimizer, schedule, state = run.model, run.optimizer, run.schedule, run.state
    progress = tqdm(
        total=settings.max_steps, initial=state.step, disable=not accelerator.is_local_main_process, desc="train"
    )
    log = TrainingLog(accelerator, Path(settings.output.output_dir) / TRAIN_LOG, progress, state.step)
    save = partial(
        checkpoints.save_checkpoint, accelerator, settings.checkpoints, state, schedule, run.identity, run.continuation
    )
    start_time, last_saved_step, stop_reason = time.time() - state.elapsed_seconds, state.step, "max_epochs"
    steps = prefetch(run.step_stream(state.position), settings.prefetch_batches, accelerator.device.type == "cuda")
    for step_batches, position_after_step in steps:
        if settings.max_steps is not None and state.step >= settings.max_steps:
            stop_reason = "max_steps"
            break
        # One collective per step: the step's global target-token count, and whether any process must stop (and
        # why: a signal anywhere stops every process the same way, at the same step).
        out_of_time = settings.max_minutes is not None and time.time() - start_time > settings.max_minutes * 60
        local = [sum(count_target_tokens(b) for b in step_batches), float(stop_signals.requested), float(out_of_time)]
        global_tokens, signal_votes, time_votes = accelerator.reduce(
            torch.tensor(local, dtype=torch.float64, device=accelerator.device)
        ).tolist()
        if signal_votes or time_votes:
            stop_reason = "signal" if signal_votes else "max_minutes"
            break
        model.train()
        step_loss = forward_backward(accelerator, model, step_batches, global_tokens, settings.label_smoothing)
        log.add(step_loss, global_tokens)
        if settings.max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), settings.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        state.step, state.position = state.step + 1, position_after_step
        state.elapsed_seconds = time.time() - start_time
        progress.update(1)
        if state.step % settings.logging_steps == 0:
            log.write(state.step, schedule.get_last_lr()[0], state.position.epoch)
        if state.step % settings.evaluation.every_steps == 0 and run.evaluate:
            run.evaluate(state.step, progress)
        if state.step % settings.checkpoints.save_steps == 0:
            save()
            last_saved_step = state.step
    steps.close()
    progress.close()
    state.elapsed_seconds = time.time() - start_time
    if state.step != last_saved_step:
        save()
    return stop_reason


# --- the final model ---------------------------------------------------------------------------------------------


def finish(
    accelerator,
    settings: TrainingSettings,
    run: Run,
    stop_reason: str,
    stop_signals: StopSignals,
    folder: RunFolder | None = None,
) -> None:
    """The final model: averaged checkpoints (6.1), saved as a Hub-ready folder, then the paper's decoding of the
    validation and test sets (beam 4, length penalty 0.6, input + 50) in float32 with the default attention, as users
    run the saved model. The folder and results.json are written before evaluating, so a crash or a Ctrl-C there
    loses nothing; a signal while saving is acted on once the folder is complete."""
    output_dir = settings.output.output_dir
    model = final_model(accelerator, run.model, run.default_attention)
    summary = {
        "steps": run.state.step,
        "processes": accelerator.num_processes,
        "stop_reason": stop_reason,
        "training_minutes": run.state.elapsed_seconds / 60,
        "mixed_precision": accelerator.mixed_precision,
        "checkpoints_averaged": checkpoints.load_averaged_weights(
            model, accelerator, settings.checkpoints, run.state.run_id
        ),
        "results": {},
        "preset": settings.preset,
        "parameters": sum(p.numel() for p in model.parameters()),
    }
    if accelerator.is_main_process:
        if folder is not None:
            folder.record(FINAL_ENTRIES)  # the model folder, results and hypotheses, listed before they are written
        save_final_model(model, run.tokenizer, settings, summary)
        if folder is not None:
            folder.record_model_shards()
    # a signal while saving, on any process, skips the evaluation everywhere (every process must agree)
    if accelerator.reduce(torch.tensor(float(stop_signals.requested), device=accelerator.device), "sum").item():
        accelerator.print(
            f"[stop] a stop signal: the model folder is saved, the final evaluation skipped; score it "
            f"with --evaluate_only --model_name_or_path {output_dir}"
        )
        return
    stop_signals.restore_defaults()
    try:
        summary["results"] = score_splits(
            accelerator, model, run.tokenizer, run.splits, settings.evaluation, output_dir
        )
    except KeyboardInterrupt:
        sys.exit(
            f"[stop] interrupted during the final evaluation; the model folder {output_dir} is saved; "
            f"score it with --evaluate_only --model_name_or_path {output_dir}"
        )
    accelerator.log({f"final/{split}_bleu": r["bleu"] for split, r in summary["results"].items()}, step=run.state.step)
    upload_failure = None
    if accelerator.is_main_process:
        save_final_model(model, run.tokenizer, settings, summary, card_only=True)
        if settings.push_to_hub:
            try:
                hub.push_folder_to_hub(output_dir, settings.hub_model_id, private=settings.hub_private)
            except hub.HubUploadError as error:
                upload_failure = (
                    f"error: {error} The model folder {output_dir} is complete; upload it later with "
                    f"vanilla-transformer push {output_dir} --hub_model_id {settings.hub_model_id}"
                )
    accelerator.wait_for_everyone()
    if upload_failure:
        sys.exit(upload_failure)


def save_final_model(model, tokenizer, settings: TrainingSettings, summary: dict, card_only: bool = False) -> None:
    """results.json and the Hub-ready model folder (weights, config, code, tokenizer, card); `card_only` rewrites
    the card and results.json once the scores are known."""
    output_dir = Path(settings.output.output_dir)
    (output_dir / RESULTS).write_text(json.dumps(summary, indent=2))
    card_values = hub.training_card_values(settings.data, summary, settings.recipe)
    if card_only:
        (output_dir / "README.md").write_text(hub.render_model_card(model, card_values), encoding="utf-8")
    else:
        decoding = settings.evaluation.final_decoding  # as the scores are measured
        print(f"[save] model folder: {hub.save_model_folder(model, tokenizer, output_dir, card_values, decoding)}")


def main(argv=None) -> int:
    """The command (`vanilla-transformer train`, `python -m train_accelerate`): a refused setting, bad data or a
    damaged checkpoint ends it with one message, not a traceback."""
    try:
        train(argv)
    except (
        DataError,
        FileNotFoundError,
        CheckpointError,
        CoordinationError,
        OutputDirError,
        UnsupportedSetup,
    ) as error:
        print(f"error: {error}", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
