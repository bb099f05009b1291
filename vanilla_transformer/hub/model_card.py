"""The model card: the README.md of a model folder, rendered from the package's template (model_card.md).

It gives the model's architecture, the run's data and recipe, and the measured scores (with the Hub's
`model-index`)."""

import json
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any

import yaml
from huggingface_hub.repocard_data import EvalResult, eval_results_to_model_index
from transformers import PreTrainedModel

from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS
from pipeline_vanilla_transformer import PAPER_DECODING
from vanilla_transformer.data.toy_task import SYNTHETIC_EXAMPLE, SYNTHETIC_LANGUAGES

if TYPE_CHECKING:
    from vanilla_transformer.data.settings import DataSettings

# the repository's model_card.md, installed as package data (in a checkout, templates/model_card.md links to it)
MODEL_CARD_TEMPLATE = resources.files("vanilla_transformer.hub") / "templates" / "model_card.md"
MODEL_ID_PLACEHOLDER = "your-username/vanilla-transformer"  # README.md code uses it until the folder is pushed
NOT_MEASURED = "not measured"
NOT_RECORDED = "not recorded"
EXAMPLE_SOURCES = {"en": "The house is small.", "de": "Das Haus ist klein.", "fr": "La maison est petite."}


def render_model_card(model: PreTrainedModel, card_values: dict[str, Any]) -> str:
    """README.md: model_card.md with its `$name` placeholders filled from the model's config and `card_values`.

    `dataset` (with `dataset_config` and the `validation_split`/`test_split` names) is a Hub dataset id: it fills
    `datasets:` and the model-index. Data from local files or the embedded task has no `dataset`, only `data`, the
    words that name it in the card's text (default: the Hub id and config). `synthetic_task`: the model learnt the
    embedded synthetic task, whose languages are invented: the card names them in words, with no language code, and
    its example comes from the task's own vocabulary."""
    if not MODEL_CARD_TEMPLATE.is_file():
        raise FileNotFoundError(f"The model card template is missing: {MODEL_CARD_TEMPLATE}")
    values = _card_values(model, card_values)
    languages = [str(values[name]) for name in ("source_lang", "target_lang") if values[name] != NOT_RECORDED]
    if values.get("synthetic_task"):  # invented languages: no language code, an example from the task's vocabulary
        languages, values["source_name"], values["target_name"] = [], *SYNTHETIC_LANGUAGES
        values.setdefault("model_name", "vanilla-transformer-synthetic-task")
        values.setdefault("example_source", SYNTHETIC_EXAMPLE[0])
    values.setdefault("source_name", values["source_lang"])
    values.setdefault("target_name", values["target_lang"])
    values.setdefault("model_name", "-".join(["vanilla-transformer", *languages]))
    values.setdefault("example_source", EXAMPLE_SOURCES.get(values["source_lang"], EXAMPLE_SOURCES["en"]))
    values["example_literal"] = json.dumps(str(values["example_source"]), ensure_ascii=False)

    # The YAML front matter gets YAML values (JSON flow lists are YAML); the body gets plain text.
    front_values = {
        "language": json.dumps(languages, ensure_ascii=False),
        "datasets": json.dumps([str(values["dataset"])] if "dataset" in values else [], ensure_ascii=False),
        "model_index": _model_index_yaml(values),
    }
    _, front_template, body_template = MODEL_CARD_TEMPLATE.read_text(encoding="utf-8").split("---\n", 2)
    front = Template(front_template).substitute(front_values)
    if not isinstance(yaml.safe_load(front), dict):
        raise ValueError(f"The model card's YAML front matter did not render to a mapping:\n{front}")
    body = Template(body_template).substitute({key: str(value) for key, value in values.items()})
    return f"---\n{front}---\n{body}"


def _card_values(model: PreTrainedModel, card_values: dict[str, Any]) -> dict[str, Any]:
    """The card's values: the architecture from the model's config, then `card_values`, then the defaults (the
    paper's decoding; "not recorded" and "not measured" for what is missing)."""
    config = model.config
    values = {
        "model_id": MODEL_ID_PLACEHOLDER,
        "preset": NOT_RECORDED,
        "d_model": config.d_model,
        "encoder_layers": config.encoder_layers,
        "decoder_layers": config.decoder_layers,
        "attention_heads": config.encoder_attention_heads,
        "ffn_dim": config.encoder_ffn_dim,
        "dropout": config.dropout,
        "position_embedding_type": config.position_embedding_type,
        "vocab_size": config.vocab_size,
        "parameters": f"{model.num_parameters():,}",
        **{key: value for key, value in card_values.items() if value is not None},
    }
    for name in ("num_beams", "length_penalty"):
        values.setdefault(name, PAPER_DECODING[name])
    values["decoding"] = (
        "greedy search (one beam)"
        if int(values["num_beams"]) == 1
        else f"beam search with beam size {values['num_beams']} and length penalty {values['length_penalty']}"
    )
    values["transformers_range"] = SUPPORTED_TRANSFORMERS
    if "dataset" in values:
        config_name = f" ({values['dataset_config']})" if values.get("dataset_config") else ""
        values.setdefault("data", f"{values['dataset']}{config_name}")
    for name in (
        "source_lang",
        "target_lang",
        "data",
        "steps",
        "training_minutes",
        "max_tokens",
        "warmup_steps",
        "learning_rate_scale",
        "label_smoothing",
        "checkpoints_averaged",
        "training_precision",
    ):
        values.setdefault(name, NOT_RECORDED)
    for name in ("validation_bleu", "validation_chrf", "test_bleu", "test_chrf", "bleu_signature"):
        values.setdefault(name, NOT_MEASURED)
    return values


def training_card_values(data: "DataSettings", summary: dict[str, Any], recipe: dict[str, Any]) -> dict[str, Any]:
    """The card's values for a training run: its data (see `render_model_card`), `recipe` (preset, max_tokens,
    warmup_steps, learning_rate_scale, label_smoothing, num_beams, length_penalty: the flags as run) and the run's
    `summary` (results.json: steps, minutes, averaging, precision, scores)."""
    corpus = data.corpus
    # `datasets:` and the model-index name a Hub dataset only: local files and the embedded task are named in the
    # text. A prepared corpus records what its splits were read from.
    sources = {}
    if data.prepared_data:
        sources = json.loads((Path(data.prepared_data) / "manifest.json").read_text())["key"]["sources"]
    elif corpus.dataset_name:
        hub = {"kind": "hub", "name": corpus.dataset_name, "config": corpus.dataset_config}
        sources = {split: {**hub, "split": corpus.split_name(split)} for split in ("train", "validation", "test")}
    local = corpus.data_dir or corpus.train_file or data.prepared_data
    if sources.get("train", {}).get("kind") == "hub":
        values = {"dataset": sources["train"]["name"], "dataset_config": sources["train"]["config"]}
        values |= {f"{split}_split": source["split"] for split, source in sources.items() if split != "train"}
    elif sources.get("train", {}).get("kind") == "synthetic" or not local:
        values = {"data": "the embedded synthetic task", "synthetic_task": True}
    else:
        values = {"data": f"local files ({Path(local).name})"}
    precision = summary["mixed_precision"]
    values |= {
        "source_lang": corpus.source_lang,
        "target_lang": corpus.target_lang,
        **recipe,
        "steps": summary["steps"],
        "training_minutes": round(summary["training_minutes"], 1),
        "checkpoints_averaged": summary["checkpoints_averaged"],
        "training_precision": "float32" if precision == "no" else f"{precision} autocast",
    }
    for split, result in summary["results"].items():
        values[f"{split}_bleu"] = round(result["bleu"], 2)
        values[f"{split}_chrf"] = round(result["chrf"], 2)
        values["bleu_signature"] = result["signature"]
    return values


def _model_index_yaml(values: dict[str, Any]) -> str:
    """The `model-index` block of the Hub's model card spec: the measured BLEU and chrF on the Hub dataset (its id,
    config and split), each with its sacreBLEU signature where recorded; "" without a Hub dataset or a score."""
    if "dataset" not in values:
        return ""  # local data: a dataset `type` would link to a Hub page that is not this data
    dataset = str(values["dataset"])
    config_name = values.get("dataset_config")
    signatures = {metric: values.get(f"{metric}_signature", NOT_MEASURED) for metric in ("bleu", "chrf")}
    args = {metric: {"signature": str(value)} for metric, value in signatures.items() if value != NOT_MEASURED}
    results = [
        EvalResult(
            task_type="translation",
            task_name=f"Translation {values['source_lang']}-{values['target_lang']}",
            dataset_type=dataset,
            dataset_name=f"{dataset} {config_name}" if config_name else dataset,
            dataset_config=config_name,
            dataset_split=str(values.get(f"{split}_split", split)),
            metric_type=metric,
            metric_name=display_name,
            metric_value=float(values[f"{split}_{metric}"]),
            metric_args=args.get(metric),
        )
        for split in ("validation", "test")
        for metric, display_name in (("bleu", "BLEU"), ("chrf", "chrF"))
        if values[f"{split}_{metric}"] != NOT_MEASURED
    ]
    if not results:
        return ""
    model_index = eval_results_to_model_index(str(values["model_name"]), results)
    return yaml.safe_dump({"model-index": model_index}, sort_keys=False, allow_unicode=True).rstrip("\n")
