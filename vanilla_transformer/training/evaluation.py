"""Evaluation under Accelerate: validation loss, translation of a split sharded over processes, BLEU and chrF.

The scores are sacreBLEU's, through `evaluate`. It runs during training (greedy, on the first validation sentences),
after it (the paper's decoding, section 6.1: beam 4, length penalty 0.6, input + 50) and for a saved model
(`--evaluate_only`)."""

import contextlib
import json
import math
from collections.abc import Sequence
from pathlib import Path

import numpy as np
import torch
from torch.nn import functional as F
from tqdm.auto import tqdm

from pipeline_vanilla_transformer import LENGTH_SETTINGS
from vanilla_transformer.data.batching import TokenizedPairs, TranslationCollator
from vanilla_transformer.data.prepare import DataSettings, load_or_prepare, tokenizer_fingerprint
from vanilla_transformer.data.readers import DataError
from vanilla_transformer.mechanics.barrier import run_while_others_wait
from vanilla_transformer.mechanics.names import EVALUATION_RESULTS
from vanilla_transformer.model.decoding import ModelBackend
from vanilla_transformer.model.loading import load_model_folder
from vanilla_transformer.model.onednn import use_onednn_linears
from vanilla_transformer.training.metrics import load_bleu_and_chrf
from vanilla_transformer.training.output_folder import claim_evaluation_dir
from vanilla_transformer.training.settings import EvaluationSettings, OutputSettings


def sharded_generation_kwargs(accelerator) -> dict:
    """generate() on an FSDP-sharded model gathers the parameters in every forward, a collective: the processes
    decode in step until all are done (`synced_gpus`), however long their own sentences are."""
    from accelerate.utils import DistributedType

    return {"synced_gpus": accelerator.distributed_type == DistributedType.FSDP}


def bare_model(accelerator, model, attn_implementation: str):
    """The bare model (no DDP, no mixed-precision wrapper) with `attn_implementation`, for the final averaging,
    evaluation and saving: scores are then measured in float32, as users run the saved model. Under FSDP the shards
    are no model to run or save: a plain model of the same config is built on every process, and the caller loads
    its weights from the checkpoints (which hold the full state)."""
    from accelerate.utils import DistributedType

    model = accelerator.unwrap_model(model, keep_fp32_wrapper=False)
    if accelerator.distributed_type == DistributedType.FSDP:
        model = type(model)(model.config).to(accelerator.device)
    model.set_attn_implementation(attn_implementation)
    return model


@torch.no_grad()
def validation_loss(accelerator, model, loader) -> dict[str, float]:
    """Per-token negative log-likelihood (no smoothing) and perplexity over the whole validation set.

    Per-sentence sums go through `gather_for_metrics`, so the examples that pad the last batch count once.
    """
    model.eval()
    total_loss, total_tokens = 0.0, 0
    for batch in loader:
        logits = model(
            input_ids=batch["input_ids"], attention_mask=batch["attention_mask"], labels=batch["labels"]
        ).logits
        token_losses = F.cross_entropy(
            logits.float().transpose(1, 2), batch["labels"], ignore_index=-100, reduction="none"
        )
        sentence_losses, sentence_tokens = accelerator.gather_for_metrics(
            (token_losses.sum(dim=1), (batch["labels"] != -100).sum(dim=1))
        )
        total_loss += sentence_losses.double().sum().item()
        total_tokens += int(sentence_tokens.sum())
    nll = total_loss / max(total_tokens, 1)
    return {"nll": nll, "perplexity": math.exp(min(nll, 50.0))}


@torch.no_grad()
def translate_for_evaluation(
    accelerator, model, loader, tokenizer, generation_kwargs: dict, description: str | None = None
) -> list[str]:
    """Translate every example of a prepared evaluation loader; returns hypotheses in the dataset's order. With a
    `description`, a progress bar of the batches on the main process's stderr (the final evaluation's).

    Each batch decodes through `ModelBackend` (model/decoding.py), the decoding of the translate command and the demo:
    the unwrapped model's generate() (DDP has none), its length where its generation config gives one, else section
    6.1's input + 50. The batches are the loader's: the same number on every process, as FSDP's synchronised
    generation needs. `gather_for_metrics` drops the duplicates that pad the last batch (accelerate issues #1326,
    #1674).
    """
    from torch.distributed.fsdp import FullyShardedDataParallel

    unwrapped = accelerator.unwrap_model(model)
    settings = dict(generation_kwargs)
    backend = ModelBackend(unwrapped, tokenizer, max_new_tokens=settings.pop("max_new_tokens", None), **settings)
    hypotheses: dict[int, str] = {}
    gathered = contextlib.nullcontext()
    if isinstance(model, FullyShardedDataParallel):  # FSDP1 wraps the root: its shards gathered while decoding
        gathered = FullyShardedDataParallel.summon_full_params(model, writeback=False)
    batches = tqdm(loader, desc=description, disable=description is None or not accelerator.is_local_main_process)
    with gathered:
        for batch in batches:
            lengths = batch["attention_mask"].sum(dim=1).tolist()
            sources = [ids[:length].tolist() for ids, length in zip(batch["input_ids"], lengths, strict=True)]
            texts, _ = backend.translate(sources)
            pairs = list(zip(batch["example_index"].tolist(), texts, strict=True))
            for index, text in accelerator.gather_for_metrics(pairs, use_gather_object=True):
                hypotheses[index] = text.strip()
    return [hypotheses[i] for i in range(len(hypotheses))]


def evaluation_loader(examples: Sequence[dict], collator: TranslationCollator, batch_size: int, max_tokens: int):
    """A plain DataLoader (to be prepared by Accelerate) whose batches carry each example's index, and how many
    examples were truncated: sources and targets longer than `max_tokens` keep their first `max_tokens - 1` tokens
    and their last (`</s>`), so one over-long line cannot blow up evaluation's memory (the text references stay
    whole, so such a sentence scores as translated from its truncated source)."""

    def collate_with_index(items):
        batch = collator([item for _, item in items])
        batch["example_index"] = torch.tensor([index for index, _ in items])
        return batch

    def truncated(ids):
        return ids if len(ids) <= max_tokens else np.concatenate([ids[: max_tokens - 1], ids[-1:]])

    # Sorting by length keeps padding low; indices restore the original order afterwards.
    order = sorted(range(len(examples)), key=lambda i: len(examples[i]["input_ids"]))
    indexed, too_long = [], 0
    for i in order:
        example = examples[i]
        too_long += max(len(example["input_ids"]), len(example["labels"])) > max_tokens
        indexed.append((i, {name: truncated(example[name]) for name in ("input_ids", "labels")}))
    loader = torch.utils.data.DataLoader(indexed, batch_size=batch_size, shuffle=False, collate_fn=collate_with_index)
    return loader, too_long


def truncation_length(settings: EvaluationSettings, config) -> int:
    """`max_eval_tokens`, lowered so that input + 50 output tokens fit a learned position table."""
    if config.position_embedding_type == "learned":
        return min(settings.max_eval_tokens, config.max_position_embeddings - 50)
    return settings.max_eval_tokens


def sharded_loader(accelerator, tokenizer, dataset, settings: EvaluationSettings, config, split: str):
    """An evaluation loader over a prepared split, sharded over processes by Accelerate; over-long lines are
    truncated and counted."""
    collator = TranslationCollator(tokenizer.pad_token_id)
    max_tokens = truncation_length(settings, config)
    loader, truncated = evaluation_loader(TokenizedPairs(dataset), collator, settings.batch_size, max_tokens)
    if truncated:
        accelerator.print(
            f"[{split}] {truncated} of {len(dataset)} pairs have a side longer than {max_tokens} "
            "tokens; truncated (see --max_eval_tokens)"
        )
    return accelerator.prepare(loader)


def evaluate_split(
    accelerator, model, tokenizer, dataset, loader, metric, generation_kwargs, write_to=None, description=None
) -> dict:
    """Translate a prepared split (sharded over processes), score BLEU and chrF against its `target` text on
    detokenized text, write hypotheses; `description` names its progress bar."""
    hypotheses = translate_for_evaluation(accelerator, model, loader, tokenizer, generation_kwargs, description)
    scores = metric.compute(predictions=hypotheses, references=[[target] for target in dataset["target"]])
    if accelerator.is_main_process and write_to:
        Path(write_to).write_text("\n".join(hypotheses) + "\n", encoding="utf-8")
    return {
        "bleu": scores["bleu"],
        "chrf": scores["chrf"],
        "signature": scores["bleu_signature"],
        "hypotheses": hypotheses,
    }


def score_splits(accelerator, model, tokenizer, splits: dict, settings: EvaluationSettings, output_dir) -> dict:
    """The decoding of `settings.final_decoding` (training's: the paper's, 6.1: beam 4, length penalty 0.6), on top of
    the model's generation config (its length where it gives one, else input + 50), of the validation and test splits
    there are;
    writes `<split>.hyp.txt` into `output_dir`; returns BLEU, chrF, the signature and the per-token perplexity (no
    label smoothing; Table 3's dev PPL) per split."""
    metric = load_bleu_and_chrf()
    generation_kwargs = {**settings.final_decoding, "do_sample": False}
    results = {}
    use_onednn_linears(accelerator.unwrap_model(model))  # float32 inference on CPU through oneDNN (onednn.py)
    for split in ("validation", "test"):
        if split in splits:
            loader = sharded_loader(accelerator, tokenizer, splits[split], settings, model.config, split)
            hypotheses_file = Path(output_dir) / f"{split}.hyp.txt"
            result = evaluate_split(
                accelerator,
                model,
                tokenizer,
                splits[split],
                loader,
                metric,
                generation_kwargs,
                hypotheses_file,
                description=f"translating {split}",
            )
            results[split] = {k: result[k] for k in ("bleu", "chrf", "signature")}
            results[split]["perplexity"] = validation_loss(accelerator, model, loader)["perplexity"]
            accelerator.print(
                f"[{split}] BLEU {result['bleu']:.2f}  chrF {result['chrf']:.2f}  perplexity "
                f"{results[split]['perplexity']:.2f}  {result['signature']}"
            )
    return results


def periodic_evaluation(accelerator, model, tokenizer, validation, loader, step: int, progress) -> None:
    """Validation loss and greedy BLEU on the first `max_sentences` validation pairs (`validation`, `loader`)."""
    losses = validation_loss(accelerator, model, loader)
    generation_kwargs = {"num_beams": 1, **sharded_generation_kwargs(accelerator)}
    bleu = evaluate_split(accelerator, model, tokenizer, validation, loader, load_bleu_and_chrf(), generation_kwargs)
    if accelerator.is_main_process:
        progress.write(f"[eval] step {step}: nll {losses['nll']:.3f}  greedy BLEU {bleu['bleu']:.2f}")
    accelerator.log({"eval/nll": losses["nll"], "eval/bleu_greedy": bleu["bleu"]}, step=step)


def evaluate_saved_model(
    accelerator,
    model_name_or_path: str,
    data: DataSettings,
    settings: EvaluationSettings,
    output: OutputSettings,
    trust_remote_code: bool = False,
) -> dict:
    """Translate and score the validation and test splits of `data` with a saved model (its own tokenizer), into
    `output.output_dir` (hypotheses and eval_results.json, never over earlier ones unless `output.overwrite`). By
    default the installed model code runs, whatever code the folder holds (`trust_remote_code` runs the folder's)."""
    locks = []  # the folder's, on the main process (the one that writes there) while the evaluation runs

    def claim():
        locks.append(claim_evaluation_dir(output.output_dir, output.overwrite))

    run_while_others_wait(accelerator, claim, "checking --output_dir", accelerator.is_main_process)
    try:
        return _score_saved_model(accelerator, model_name_or_path, data, settings, output, trust_remote_code)
    finally:
        for lock in locks:
            lock.release()


def _score_saved_model(accelerator, model_name_or_path, data, settings, output, trust_remote_code) -> dict:
    from transformers import AutoTokenizer

    model = load_model_folder(model_name_or_path, trust_remote_code=trust_remote_code)  # ModelFolderError
    tokenizer = AutoTokenizer.from_pretrained(model_name_or_path, trust_remote_code=trust_remote_code)
    model = accelerator.prepare(model)
    Path(output.output_dir).mkdir(parents=True, exist_ok=True)
    corpus = load_or_prepare(data, accelerator, splits=("validation", "test"), tokenizer=tokenizer)
    if tokenizer_fingerprint(corpus.tokenizer) != tokenizer_fingerprint(tokenizer):
        raise DataError(f"{corpus.folder} was tokenized with another tokenizer than {model_name_or_path}'s")
    accelerator.print("\n".join(corpus.summary()))  # which files were scored
    model = accelerator.unwrap_model(model)
    accelerator.print(decoding_used(settings.final_decoding, model.generation_config))
    results = score_splits(accelerator, model, tokenizer, corpus.splits, settings, output.output_dir)
    if accelerator.is_main_process:
        scored = {"model": model_name_or_path, "data": corpus.summary(), "results": results}
        (Path(output.output_dir) / EVALUATION_RESULTS).write_text(json.dumps(scored, indent=2))
    return results


def decoding_used(given: dict, generation_config) -> str:
    """One line naming the decoding a saved model is scored with, each setting with where it comes from: the flag
    given (`given`, the settings' final decoding) or the model's generation_config.json; its length, or section 6.1's
    input + 50 where it gives none."""
    defaults = {"num_beams": 1, "length_penalty": 1.0}  # generate()'s where generation_config.json sets none
    parts = [
        f"{name} {given[name]} (--{name})"
        if name in given
        else f"{name} {_or(getattr(generation_config, name, None), default)} (generation_config.json)"
        for name, default in defaults.items()
    ]
    lengths = [(name, getattr(generation_config, name, None)) for name in LENGTH_SETTINGS]
    parts += [f"{name} {value} (generation_config.json)" for name, value in lengths if value is not None][:1] or [
        "at most input length + 50 tokens (section 6.1)"
    ]
    return "decoding: " + ", ".join(parts)


def _or(value, default):
    return default if value is None else value
