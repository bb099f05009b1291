"""The Hub-ready model folder: write it, check it, upload it.

`save_model_folder` writes everything a Hub user needs to run the model with `trust_remote_code=True`:

    config.json               the configuration, with `auto_map` (the model classes) and `custom_pipelines`
    model.safetensors         the weights (one entry for the shared embedding matrix); a model too large for one
                              file is saved as model-0000k-of-0000n.safetensors shards with model.safetensors.index.json
    configuration_vanilla_transformer.py, modeling_vanilla_transformer.py, pipeline_vanilla_transformer.py,
    fast_paths_vanilla_transformer.py    (CODE_FILES)
    tokenizer.json, tokenizer_config.json (and special_tokens_map.json, from a tokenizer that writes one)
    generation_config.json    the decoding the scores were measured with; by default the paper's: beam 4, length
                              penalty 0.6 (section 6.1)
    README.md                 the model card, rendered from model_card.md

The paper's maximum output length, input length + 50, depends on each input, so it is not in generation_config.json:
the model's generate(), the translation pipeline and `vanilla_transformer.translate` apply it when no length is given.

`push_folder_to_hub` uploads exactly these files (`UPLOADED_FILES` and the shards: `files_to_upload`, an allow-list),
whatever else the folder holds (a training run's checkpoints, logs and hypotheses, a `.env`), and only as regular
files inside the folder: a symbolic link under one of these names is refused, never followed (it could send a file
from anywhere, a token say). Each file is checked to be what its name says first (`check_model_folder`): JSON,
safetensors (its header), Python, the card's YAML front matter.
"""

import json
from importlib import resources
from pathlib import Path
from string import Template
from typing import TYPE_CHECKING, Any

import yaml
from huggingface_hub import CommitOperationAdd, HfApi
from huggingface_hub.repocard_data import EvalResult, eval_results_to_model_index
from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS
from pipeline_vanilla_transformer import VanillaTransformerTranslationPipeline

from .folder_files import content_problem, file_problem, link_on_the_way, replace_file
from .names import REQUIRED_FILES, UPLOADED_FILES, UPLOADED_PATTERNS

if TYPE_CHECKING:
    from .prepare import DataSettings

# the repository's model_card.md, installed as package data (in a checkout, templates/model_card.md links to it)
MODEL_CARD_TEMPLATE = resources.files("vanilla_transformer") / "templates" / "model_card.md"
MODEL_ID_PLACEHOLDER = "your-username/vanilla-transformer"  # README.md code uses it until the folder is pushed
NOT_MEASURED = "not measured"
NOT_RECORDED = "not recorded"
PAPER_DECODING = dict(num_beams=4, length_penalty=0.6, early_stopping=True)  # section 6.1
BEAM_ONLY = ("length_penalty", "early_stopping")
# what `from_pretrained` records of the machine that loaded a tokenizer, and `save_pretrained` writes back
MACHINE_SETTINGS = ("is_local", "local_files_only", "cache_dir", "token", "_commit_hash")
EXAMPLE_SOURCES = {"en": "The house is small.", "de": "Das Haus ist klein.", "fr": "La maison est petite."}

REQUIRED_AUTO_MAP = ("AutoConfig", "AutoModelForSeq2SeqLM")


def save_model_folder(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | Path,
    card_values: dict[str, Any] | None = None,
    decoding: dict[str, Any] | None = None,
) -> Path:
    """Write the complete Hub-ready folder (see the module docstring) into `output_dir`; return its path.

    `card_values` fill the model card: source_lang, target_lang, dataset, dataset_config, preset, steps, training_minutes,
    max_tokens, warmup_steps, learning_rate_scale, label_smoothing, checkpoints_averaged, training_precision,
    {validation,test}_{bleu,chrf}, bleu_signature, model_name, model_id, example_source. Missing metrics read
    "not measured", other missing values "not recorded"; the architecture comes from the model's config. The model's
    config gains `custom_pipelines`. `decoding` (num_beams, length_penalty) replaces the paper's in
    generation_config.json and the card: the model folder decodes as its scores were measured.
    """
    decoding = {**PAPER_DECODING, **(decoding or {})}
    output_dir = Path(output_dir)
    output_dir.mkdir(parents=True, exist_ok=True)
    # Pipeline.save_pretrained writes `custom_pipelines` into config.json and copies the pipeline's file, then saves
    # the model (safetensors, config with auto_map, the two model files) and the tokenizer.
    translator = VanillaTransformerTranslationPipeline(model=model, tokenizer=tokenizer, device=model.device)
    translator.save_pretrained(output_dir)
    languages = {name: (card_values or {}).get(name) for name in ("source_lang", "target_lang")}
    settle_tokenizer_config(output_dir / "tokenizer_config.json", languages)
    paper_generation_config(model.config, **decoding).save_pretrained(output_dir)
    card = render_model_card(model, {**(card_values or {}), **decoding})
    (output_dir / "README.md").write_text(card, encoding="utf-8")
    return output_dir


def settle_tokenizer_config(tokenizer_config: Path, languages: dict[str, str | None]) -> None:
    """Remove from a saved tokenizer_config.json what describes the machine that loaded the tokenizer, and record the
    model's `source_lang` and `target_lang` where known (as Marian's tokenizers do): the pipeline checks a caller's
    `src_lang`/`tgt_lang` against them."""
    settings = json.loads(tokenizer_config.read_text(encoding="utf-8"))
    kept = {name: value for name, value in settings.items() if name not in MACHINE_SETTINGS}
    kept |= {name: language for name, language in languages.items() if language}
    if kept != settings:
        tokenizer_config.write_text(json.dumps(kept, indent=2, ensure_ascii=False) + "\n", encoding="utf-8")


def paper_generation_config(config, **decoding) -> GenerationConfig:
    """Beam search with beam 4 and length penalty 0.6 (section 6.1), or `decoding`'s values, with the model's special
    token ids. With one beam (greedy), the beam-only settings are left out: transformers refuses to save them."""
    decoding = {**PAPER_DECODING, **decoding}
    if decoding["num_beams"] == 1:
        decoding = {name: value for name, value in decoding.items() if name not in BEAM_ONLY}
    return GenerationConfig(
        **decoding,
        decoder_start_token_id=config.decoder_start_token_id,
        bos_token_id=config.bos_token_id,
        eos_token_id=config.eos_token_id,
        pad_token_id=config.pad_token_id,
    )


def render_model_card(model: PreTrainedModel, card_values: dict[str, Any]) -> str:
    """README.md: model_card.md with its `$name` placeholders filled from the model's config and `card_values`.

    `dataset` (with `dataset_config` and the `validation_split`/`test_split` names) is a Hub dataset id: it fills
    `datasets:` and the model-index. Data from local files or the embedded task has no `dataset`, only `data`, the
    words that name it in the card's text (default: the Hub id and config)."""
    if not MODEL_CARD_TEMPLATE.is_file():
        raise FileNotFoundError(f"The model card template is missing: {MODEL_CARD_TEMPLATE}")
    values = _card_values(model, card_values)
    languages = [str(values[name]) for name in ("source_lang", "target_lang") if values[name] != NOT_RECORDED]
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
    if sources.get("train", {}).get("kind") == "hub":
        values = {"dataset": sources["train"]["name"], "dataset_config": sources["train"]["config"]}
        values |= {f"{split}_split": source["split"] for split, source in sources.items() if split != "train"}
    else:
        local = corpus.data_dir or corpus.train_file or data.prepared_data
        values = {"data": f"local files ({Path(local).name})" if local else "the embedded synthetic task"}
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


def check_model_folder(folder: str | Path) -> list[str]:
    """The problems that keep `folder` from working on the Hub (missing files or config entries, a symbolic link
    where an uploaded file goes, a file that is not what its name says); [] if none."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    problems = [problem for name in REQUIRED_FILES if (problem := file_problem(folder, name))]
    problems += [problem for name in _uploaded_links(folder) if (problem := file_problem(folder, name))]
    names = files_to_upload(folder)
    if not any(name.endswith(".safetensors") for name in names):
        problems.append("missing the weights: no .safetensors file")
    # config.json has its own check below; README.md is checked for its front matter
    problems += [problem for name in names if name != "config.json" and (problem := content_problem(folder / name))]
    if "config.json" in names:
        problems += _config_problems(folder)
    readme = folder / "README.md"
    if "README.md" in names and not content_problem(readme) and not readme.read_text("utf-8").startswith("---\n"):
        problems.append("README.md has no YAML metadata (front matter between --- lines)")
    return problems


def _uploaded_links(folder: Path) -> list[str]:
    """The names of the upload's allow-list that are symbolic links in `folder` (never uploaded), but for the
    required ones (named with the missing files)."""
    candidates = [name for name in UPLOADED_FILES if name not in REQUIRED_FILES]
    candidates += sorted(path.name for pattern in UPLOADED_PATTERNS for path in folder.glob(pattern))
    return [name for name in candidates if link_on_the_way(folder, name) is not None]


def _config_problems(folder: Path) -> list[str]:
    try:
        config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    except json.JSONDecodeError as error:
        return [f"config.json is not valid JSON: {error}"]
    problems = []
    auto_map = config.get("auto_map", {})
    for auto_class in REQUIRED_AUTO_MAP:
        if auto_class not in auto_map:
            problems.append(f"config.json: auto_map has no {auto_class}")
    impl = config.get("custom_pipelines", {}).get("translation", {}).get("impl")
    if impl is None:
        problems.append("config.json: custom_pipelines has no translation pipeline")
    for reference in [*auto_map.values(), *([impl] if impl else [])]:
        module_file = f"{reference.split('.')[0]}.py"
        if not (folder / module_file).is_file():
            problems.append(f"config.json refers to {reference}, but {module_file} is missing")
    return problems


class HubUploadError(RuntimeError):
    """An upload that did not happen (offline, unreachable, refused); nothing local was changed."""


class FolderNotReadyError(HubUploadError, ValueError):
    """A folder refused before any upload (`check_model_folder`'s problems); nothing was uploaded or changed."""


def files_to_upload(folder: str | Path) -> list[str]:
    """The model repository's files in `folder`, by an allow-list (never "everything but"): the weights, the configs,
    the tokenizer, the Hub-facing code and the card. Logs, results, hypotheses, checkpoints, notes, secrets (`.env`)
    and subfolders (the demo's Space, `vanilla_transformer.space`) stay local, whatever else the folder holds. Only
    regular files inside the folder: a symbolic link is never followed (`check_model_folder` names it)."""
    folder = Path(folder)
    names = list(UPLOADED_FILES)
    names += sorted(path.name for pattern in UPLOADED_PATTERNS for path in folder.glob(pattern))
    return [name for name in names if file_problem(folder, name) is None]


def push_folder_to_hub(
    folder: str | Path,
    repo_id: str,
    token: str | None = None,
    private: bool = False,
    commit_message: str = "Upload vanilla-transformer model",
) -> str:
    """Upload the model repository's files of `folder` (`files_to_upload`) to the Hub model repo `repo_id` (created
    if needed) in one commit; return its URL. The folder is checked first; the card is uploaded with the model id
    placeholder in its code replaced by `repo_id`, and the local card gets the same text only once the upload
    succeeded (by replacing the file: never written through a link). A folder with problems: FolderNotReadyError
    naming them, before any Hub call. Offline, unreachable or refused: a HubUploadError that says so, with nothing
    changed locally."""
    folder = Path(folder)
    problems = check_model_folder(folder)
    if problems:
        raise FolderNotReadyError(f"{folder} is not ready for the Hub:\n- " + "\n- ".join(problems))
    names = files_to_upload(folder)
    print(f"[hub] uploading to {repo_id}: {', '.join(names)}")
    readme = (folder / "README.md").read_text(encoding="utf-8").replace(MODEL_ID_PLACEHOLDER, repo_id)
    operations = [
        CommitOperationAdd(name, readme.encode("utf-8") if name == "README.md" else folder / name) for name in names
    ]
    try:
        api = HfApi(token=token)
        repo_url = api.create_repo(repo_id, private=private, exist_ok=True)
        api.create_commit(repo_id, operations, commit_message=commit_message)
    except Exception as error:  # noqa: BLE001 - every failure of the Hub calls gets the same clear message
        raise HubUploadError(hub_failure(error, f"upload {folder} to {repo_id}")) from error
    replace_file(folder / "README.md", readme)
    return str(repo_url)


def hub_failure(error: Exception, action: str) -> str:
    """A one-paragraph explanation of a failed Hub call (offline mode, no connection, refused), for the user."""
    kinds = {cls.__name__ for cls in type(error).__mro__}
    if "OfflineModeIsEnabled" in kinds:
        reason = "offline mode is on (HF_HUB_OFFLINE is set); unset it to reach the Hub"
    elif kinds & {"ConnectionError", "TransportError", "NetworkError", "TimeoutException"}:  # requests, httpx
        reason = f"the Hub cannot be reached ({type(error).__name__}: {error})"
    else:
        reason = (
            f"the Hub refused it ({type(error).__name__}: {error}); check the token (--token, HF_TOKEN or "
            "`hf auth login`) and the repo id"
        )
    return f"could not {action}: {reason}. Nothing was uploaded, and nothing local was changed or deleted."
