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
import signal
import sys
import time
from functools import partial
from pathlib import Path

import torch
from accelerate.utils import InitProcessGroupKwargs, set_seed
from tqdm.auto import tqdm
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from configuration_vanilla_transformer import PRESETS, VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer import checkpoints, data, prepare, streaming
from vanilla_transformer.batching import TokenBatchSampler, TokenizedPairs, TranslationCollator, padding_statistics
from vanilla_transformer.metrics import load_bleu_metric
from vanilla_transformer.training import (
    DataPosition,
    count_target_tokens,
    evaluation_loader,
    final_model,
    forward_backward,
    make_accelerator,
    make_optimizer_and_schedule,
    optimizer_step_batches,
    prefetch,
    translate_for_evaluation,
    validation_loss,
)

TRAINER_STATE = "trainer_state.json"
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
    prepare.add_data_arguments(parser)
    streaming.add_streaming_arguments(parser)
    parser.add_argument(
        "--prepared_data", help="a folder made by `python -m vanilla_transformer.prepare` (replaces the data flags)"
    )
    parser.add_argument(
        "--ddp_timeout",
        type=int,
        default=1800,
        help="seconds a process waits at a collective, e.g. while the main process prepares the corpus (torch's "
        "NCCL default is 600; prepare large corpora beforehand with python -m vanilla_transformer.prepare)",
    )
    parser.add_argument(
        "--prefetch_batches", type=int, default=2, help="optimizer steps collated ahead in a thread; 0 = inline"
    )

    group = parser.add_argument_group("model")
    group.add_argument(
        "--preset",
        choices=sorted(PRESETS),
        help="Table 3 base/big, or small/tiny (default: small; tiny for the embedded task)",
    )
    group.add_argument("--d_model", type=int)
    group.add_argument("--layers", type=int, help="encoder and decoder layers (N)")
    group.add_argument("--heads", type=int)
    group.add_argument("--ffn_dim", type=int)
    group.add_argument("--dropout", type=float, help="P_drop; default: the preset's")
    group.add_argument("--position_embedding_type", choices=["sinusoidal", "learned"], default="sinusoidal")

    group = parser.add_argument_group("optimisation (paper section 5)")
    group.add_argument("--max_tokens", type=int, default=4096, help="source and target tokens per batch per process")
    group.add_argument("--gradient_accumulation_steps", type=int, default=1)
    group.add_argument("--warmup_steps", type=int, help="default: 4000 (the paper); 200 for the embedded task")
    group.add_argument("--learning_rate_scale", type=float, default=1.0, help="factor on equation (3)")
    group.add_argument("--label_smoothing", type=float, default=0.1)
    group.add_argument("--max_grad_norm", type=float, default=0.0, help="clip gradients; 0 = off (the paper)")
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
        "--max_steps", type=int, help="default: 100000 (400 for the embedded task) unless another limit is given"
    )
    group.add_argument("--max_epochs", type=int, default=None)
    group.add_argument("--max_minutes", type=float, default=None, help="wall-clock budget of the training loop")
    group.add_argument("--seed", type=int, default=42, help="initialisation, dropout, batch order")

    group = parser.add_argument_group("evaluation")
    group.add_argument(
        "--eval_steps", type=int, help="validation loss and greedy BLEU every N steps (default 1000; 200)"
    )
    group.add_argument("--eval_max_sentences", type=int, default=500, help="validation sentences for BLEU in training")
    group.add_argument("--eval_batch_size", type=int, default=64)
    group.add_argument("--num_beams", type=int, default=4, help="final decoding (paper: 4)")
    group.add_argument("--length_penalty", type=float, default=0.6, help="final decoding (paper: 0.6)")
    group.add_argument("--evaluate_only", action="store_true", help="translate and score with a saved model")
    group.add_argument("--model_name_or_path", help="saved model folder for --evaluate_only")

    group = parser.add_argument_group("checkpoints, logging, sharing")
    group.add_argument("--output_dir", default="outputs/vanilla-transformer")
    group.add_argument(
        "--save_steps", type=int, help="checkpoint every N steps (default 1000; 80 for the embedded task)"
    )
    group.add_argument("--save_total_limit", type=int, default=5, help="keep the last K checkpoints")
    group.add_argument("--average_last", type=int, default=5, help="average the last K checkpoints (paper: 5/20)")
    group.add_argument("--resume_from_checkpoint", help="a checkpoint folder, or `latest`")
    group.add_argument("--logging_steps", type=int, default=50)
    group.add_argument("--report_to", default="none", help="an accelerate tracker, e.g. tensorboard")
    group.add_argument("--push_to_hub", action="store_true")
    group.add_argument("--hub_model_id")
    group.add_argument("--hub_private", action="store_true")
    args = parser.parse_args(argv)
    check_arguments(parser, args)
    return args


def check_arguments(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Fill the defaults that depend on the data, and refuse combinations that cannot work (parser.error)."""
    other_limit = args.max_epochs is not None or args.max_minutes is not None
    for name, value in (EMBEDDED_TASK_DEFAULTS if is_synthetic(args) else REAL_DATA_DEFAULTS).items():
        if getattr(args, name) is None and not (name == "max_steps" and other_limit):
            setattr(args, name, value)
    if args.max_source_tokens and args.max_source_tokens > args.max_tokens:
        parser.error(f"--max_source_tokens {args.max_source_tokens} exceeds --max_tokens {args.max_tokens}: a kept "
                     "pair would not fit in a batch; lower the first or raise the second")  # fmt: skip
    if args.prepared_data and not prepare.is_synthetic(args):
        parser.error("--prepared_data replaces --data_dir/--train_file/--dataset_name: give one or the other")
    if args.streaming and (args.prepared_data or args.max_epochs is not None):
        parser.error("--streaming reads raw data and ends at --max_steps/--max_minutes: it takes neither "
                     "--prepared_data nor --max_epochs")  # fmt: skip
    if args.evaluate_only and not args.model_name_or_path:
        parser.error("--evaluate_only needs --model_name_or_path")
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id")
    if args.average_last > args.save_total_limit > 0:
        parser.error("--average_last cannot exceed --save_total_limit: the checkpoints to average must be kept")


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
    if args.prepared_data:  # the model card names the prepared corpus's languages
        args.source_lang, args.target_lang = (
            corpus.manifest["key"]["source_lang"],
            corpus.manifest["key"]["target_lang"],
        )
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


def build_config(args, tokenizer) -> VanillaTransformerConfig:
    overrides = {
        "d_model": args.d_model,
        "encoder_layers": args.layers,
        "decoder_layers": args.layers,
        "encoder_attention_heads": args.heads,
        "decoder_attention_heads": args.heads,
        "encoder_ffn_dim": args.ffn_dim,
        "decoder_ffn_dim": args.ffn_dim,
        "dropout": args.dropout,
    }
    return VanillaTransformerConfig.from_preset(
        args.preset,
        **{name: value for name, value in overrides.items() if value is not None},
        vocab_size=len(tokenizer),
        position_embedding_type=args.position_embedding_type,
        label_smoothing=args.label_smoothing,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )


# --- checkpoints -----------------------------------------------------------------------------------------------


def save_checkpoint(accelerator, args, step: int, position: DataPosition, elapsed_seconds: float) -> None:
    """accelerator.save_state into a staging folder, renamed into place once complete; keeps the last K."""
    root = Path(args.output_dir) / "checkpoints"
    staging = checkpoints.staging_dir(root, step)
    accelerator.save_state(str(staging))
    if accelerator.is_main_process:
        state = {"step": step, "epoch": position.epoch, "batches_done_in_epoch": position.batches_done_in_epoch,
                 "elapsed_seconds": elapsed_seconds}  # fmt: skip
        (staging / TRAINER_STATE).write_text(json.dumps(state, indent=2))
    accelerator.wait_for_everyone()
    if accelerator.is_main_process:
        checkpoints.finalize_checkpoint(staging, checkpoints.checkpoint_dir(root, step))
        checkpoints.prune_checkpoints(root, args.save_total_limit)
    accelerator.wait_for_everyone()


def resume(accelerator, args) -> tuple[int, DataPosition, float]:
    """Restore model, optimizer, schedule and RNG states; return (step, data position, elapsed seconds)."""
    root = Path(args.output_dir) / "checkpoints"
    path = checkpoints.latest_checkpoint(root) if args.resume_from_checkpoint == "latest" else None
    path = path or Path(args.resume_from_checkpoint)
    if args.resume_from_checkpoint == "latest" and not checkpoints.is_complete_checkpoint(path):
        accelerator.print(f"[resume] no checkpoint in {root}; starting from scratch")
        return 0, DataPosition(), 0.0
    if not checkpoints.is_complete_checkpoint(path):
        raise FileNotFoundError(f"{path} is not a complete checkpoint (a step_* folder with model.safetensors).")
    accelerator.load_state(str(path))
    state = json.loads((path / TRAINER_STATE).read_text())
    accelerator.print(f"[resume] from {path} at step {state['step']}")
    return state["step"], DataPosition(state["epoch"], state["batches_done_in_epoch"]), state["elapsed_seconds"]


def load_averaged_weights(model, args, accelerator) -> int:
    """Section 6.1: average the last K checkpoints into the final model; returns how many were averaged."""
    paths = checkpoints.list_checkpoints(Path(args.output_dir) / "checkpoints")[-args.average_last :]
    if len(paths) < 2:
        return len(paths)
    averaged = checkpoints.average_checkpoints(paths)
    missing, unexpected = model.load_state_dict(averaged, strict=False)
    tied = set(model.get_expanded_tied_weights_keys(all_submodels=True)) | {
        name for name, _ in model.named_buffers() if name.endswith("embed_positions.table")
    }
    if unexpected or not set(missing) <= tied:
        raise RuntimeError(f"Averaged checkpoint does not match the model: missing {missing}, unexpected {unexpected}")
    accelerator.print(f"[average] averaged {len(paths)} checkpoints: {[p.name for p in paths]}")
    return len(paths)


# --- evaluation ------------------------------------------------------------------------------------------------


def prepared_loader(accelerator, tokenizer, dataset, batch_size: int):
    """An evaluation loader over a prepared split, sharded over processes by Accelerate."""
    collator = TranslationCollator(tokenizer.pad_token_id)
    return accelerator.prepare(evaluation_loader(TokenizedPairs(dataset), collator, batch_size))


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
    model = AutoModelForSeq2SeqLM.from_pretrained(args.model_name_or_path, trust_remote_code=True)
    tokenizer = AutoTokenizer.from_pretrained(args.model_name_or_path, trust_remote_code=True)
    model = accelerator.prepare(model)
    Path(args.output_dir).mkdir(parents=True, exist_ok=True)
    corpus = prepare.load_or_prepare(args, accelerator, splits=("validation", "test"), tokenizer=tokenizer)
    if prepare.tokenizer_fingerprint(corpus.tokenizer) != prepare.tokenizer_fingerprint(tokenizer):
        raise data.DataError(f"{corpus.folder} was tokenized with another tokenizer than {args.model_name_or_path}'s")
    accelerator.print("\n".join(corpus.summary()))  # which files were scored
    score_splits(accelerator, model, tokenizer, corpus.splits, args)


def score_splits(accelerator, model, tokenizer, splits: dict, args) -> dict:
    """The paper's decoding (6.1: beam 4, length penalty 0.6, input + 50) of the validation and test splits there are;
    writes `<split>.hyp.txt` into the output folder; returns BLEU, chrF and the signature per split."""
    metric = load_bleu_metric()
    generation_kwargs = {"num_beams": args.num_beams, "length_penalty": args.length_penalty, "do_sample": False}
    results = {}
    for split in ("validation", "test"):
        if split in splits:
            loader = prepared_loader(accelerator, tokenizer, splits[split], args.eval_batch_size)
            hypotheses_file = Path(args.output_dir) / f"{split}.hyp.txt"
            result = evaluate_split(
                accelerator, model, tokenizer, splits[split], loader, metric, generation_kwargs, hypotheses_file
            )
            results[split] = {k: result[k] for k in ("bleu", "chrf", "signature")}
            accelerator.print(f"[{split}] BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}  {result['signature']}")
    return results


# --- main ------------------------------------------------------------------------------------------------------


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
    set_seed(args.seed)
    output_dir = Path(args.output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)

    tokenizer, splits, step_stream = load_training_data(args, accelerator)
    validation = splits.get("validation")
    validation = validation.select(range(min(len(validation), args.eval_max_sentences))) if validation else None

    # model, optimizer (5.3), schedule (equation 3)
    config = build_config(args, tokenizer)
    model = VanillaTransformerForConditionalGeneration(config)
    default_attention = model.config._attn_implementation  # what the saved model will use (sdpa)
    model.set_attn_implementation(args.attn_implementation)
    accelerator.print(f"[model] {args.preset}: {sum(p.numel() for p in model.parameters()) / 1e6:.1f}M parameters")
    optimizer, schedule = make_optimizer_and_schedule(
        model, config.d_model, args.warmup_steps, args.learning_rate_scale
    )
    # The schedule is not prepared: accelerate would step it once per process, and equation (3) counts steps.
    model, optimizer = accelerator.prepare(model, optimizer)
    accelerator.register_for_checkpointing(schedule)
    validation_loader = (
        prepared_loader(accelerator, tokenizer, validation, args.eval_batch_size) if validation else None
    )
    metric = load_bleu_metric()

    step, position, elapsed_before = 0, DataPosition(), 0.0
    if args.resume_from_checkpoint:
        step, position, elapsed_before = resume(accelerator, args)
    if accelerator.is_main_process and args.report_to != "none":
        hyperparameters = {k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))}
        accelerator.init_trackers("vanilla_transformer", config=hyperparameters)

    # SIGTERM/SIGINT: finish the current step, save a checkpoint, exit. All processes stop at the same step.
    stop_signal = {"number": 0}

    def request_stop(number, frame):
        stop_signal["number"] = number

    signal.signal(signal.SIGTERM, request_stop)
    signal.signal(signal.SIGINT, request_stop)

    # the loop
    log_file = output_dir / "train_log.jsonl"
    progress = tqdm(total=args.max_steps, initial=step, disable=not accelerator.is_local_main_process, desc="train")
    start_time = time.time() - elapsed_before
    # the logged loss and tokens/s are means over the steps since the last log line
    window_loss, window_tokens, window_start, last_saved_step = 0.0, 0.0, time.time(), step
    device = accelerator.device
    stop_reason = "max_epochs"
    steps = prefetch(step_stream(position), depth=args.prefetch_batches, pin_memory=device.type == "cuda")
    for step_batches, position_after_step in steps:
        if args.max_steps is not None and step >= args.max_steps:
            stop_reason = "max_steps"
            break
        # One collective per step: the step's global target-token count, and whether any process must stop.
        out_of_time = args.max_minutes is not None and time.time() - start_time > args.max_minutes * 60
        local = [sum(count_target_tokens(b) for b in step_batches), float(stop_signal["number"] or out_of_time)]
        global_tokens, stop_votes = accelerator.reduce(
            torch.tensor(local, dtype=torch.float64, device=device)
        ).tolist()
        if stop_votes:
            stop_reason = "signal" if stop_signal["number"] else "max_minutes"
            break

        model.train()
        step_loss = forward_backward(accelerator, model, step_batches, global_tokens)
        if args.max_grad_norm > 0:
            accelerator.clip_grad_norm_(model.parameters(), args.max_grad_norm)
        optimizer.step()
        schedule.step()
        optimizer.zero_grad(set_to_none=True)
        step, position = step + 1, position_after_step
        progress.update(1)
        window_loss, window_tokens = window_loss + step_loss, window_tokens + global_tokens

        if step % args.logging_steps == 0:
            loss_per_token = (accelerator.reduce(window_loss, "sum") / window_tokens).item()
            tokens_per_second = window_tokens / (time.time() - window_start)
            record = {"step": step, "loss": loss_per_token, "lr": schedule.get_last_lr()[0],
                      "target_tokens_per_second": tokens_per_second, "epoch": position.epoch}  # fmt: skip
            progress.set_postfix(
                loss=f"{loss_per_token:.3f}", lr=f"{record['lr']:.2e}", tok_s=f"{tokens_per_second:.0f}"
            )
            accelerator.log({"train/" + k: v for k, v in record.items() if k != "step"}, step=step)
            if accelerator.is_main_process:
                with log_file.open("a") as log:
                    log.write(json.dumps(record) + "\n")
            window_loss, window_tokens, window_start = 0.0, 0.0, time.time()
        if step % args.eval_steps == 0 and validation:
            losses = validation_loss(accelerator, model, validation_loader)
            bleu = evaluate_split(
                accelerator, model, tokenizer, validation, validation_loader, metric, {"num_beams": 1}
            )
            if accelerator.is_main_process:
                progress.write(f"[eval] step {step}: nll {losses['nll']:.3f}  greedy BLEU {bleu['bleu']:.2f}")
            accelerator.log({"eval/nll": losses["nll"], "eval/bleu_greedy": bleu["bleu"]}, step=step)
        if step % args.save_steps == 0:
            save_checkpoint(accelerator, args, step, position, time.time() - start_time)
            last_saved_step = step
    steps.close()
    progress.close()
    training_seconds = time.time() - start_time

    if step != last_saved_step:
        save_checkpoint(accelerator, args, step, position, training_seconds)
    if stop_reason == "signal":
        accelerator.print(f"[stop] signal {stop_signal['number']} at step {step}: checkpoint saved; "
                          "continue with --resume_from_checkpoint latest")  # fmt: skip
        accelerator.end_training()
        return

    # final model: averaged checkpoints (6.1), the paper's decoding (beam 4, length penalty 0.6, input + 50),
    # in float32 with the default attention, as users will run the saved model (no mixed-precision wrapper)
    model = final_model(accelerator, model, default_attention)
    averaged = load_averaged_weights(model, args, accelerator)  # in place
    results = score_splits(accelerator, model, tokenizer, splits, args)
    accelerator.log({f"final/{split}_bleu": r["bleu"] for split, r in results.items()}, step=step)

    if accelerator.is_main_process:
        summary = {"steps": step, "processes": accelerator.num_processes, "stop_reason": stop_reason, "training_minutes": training_seconds / 60,
                   "mixed_precision": accelerator.mixed_precision,
                   "checkpoints_averaged": averaged, "results": results, "preset": args.preset,
                   "parameters": sum(p.numel() for p in model.parameters())}  # fmt: skip
        (output_dir / "results.json").write_text(json.dumps(summary, indent=2))
        save_final_model(model, tokenizer, args, summary)
    accelerator.wait_for_everyone()
    accelerator.end_training()


def save_final_model(model, tokenizer, args, summary: dict) -> None:
    """The output folder becomes a Hub-ready model repo (weights, config, code, tokenizer, card)."""
    from vanilla_transformer.hub import push_folder_to_hub, save_model_folder

    card_values = {
        "source_lang": args.source_lang,
        "target_lang": args.target_lang,
        "dataset": args.dataset_name or args.data_dir or args.train_file or args.prepared_data or "synthetic",
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
    }
    for split, result in summary["results"].items():
        card_values[f"{split}_bleu"] = round(result["bleu"], 2)
        card_values[f"{split}_chrf"] = round(result["chrf"], 2)
        card_values["bleu_signature"] = result["signature"]
    folder = save_model_folder(model, tokenizer, args.output_dir, card_values=card_values)
    print(f"[save] model folder: {folder}")
    if args.push_to_hub:
        push_folder_to_hub(folder, args.hub_model_id, private=args.hub_private)


if __name__ == "__main__":
    try:
        main()
    except (data.DataError, FileNotFoundError) as error:
        sys.exit(f"error: {error}")
