"""The Hub-ready model folder: write it and check it (`vanilla_transformer.hub.upload` uploads it).

`save_model_folder` writes everything a Hub user needs to run the model with `trust_remote_code=True`:

    config.json               the configuration, with `auto_map` (the model classes) and `custom_pipelines`
    model.safetensors         the weights (one entry for the shared embedding matrix); a model too large for one
                              file is saved as model-0000k-of-0000n.safetensors shards with model.safetensors.index.json
    configuration_vanilla_transformer.py, modeling_vanilla_transformer.py, pipeline_vanilla_transformer.py,
    custom_generate/generate.py          (generate_vanilla_transformer.py: the paper's output length, input + 50, for
                                         a plain generate(); transformers' hook for a repository's own decoding)
    tokenizer.json, tokenizer_config.json (and special_tokens_map.json, from a tokenizer that writes one)
    generation_config.json    the decoding the scores were measured with; by default the paper's: beam 4, length
                              penalty 0.6 (section 6.1)
    README.md                 the model card (`vanilla_transformer.hub.model_card`)

The paper's maximum output length, input length + 50, depends on each input, so generation_config.json cannot hold
it: the folder's custom_generate/generate.py (for a Hub user's generate()), the translation pipeline and
`vanilla_transformer.serving.translate` apply it when no length is given.

`files_to_upload` is the model repository's part of a folder (an allow-list: a training run's checkpoints, logs and
hypotheses, a `.env` stay local), as regular files inside the folder: a symbolic link under one of these names is
never followed (it could send a file from anywhere, a token say). `hub_folder_problems` names what keeps a folder from
working on the Hub, each file checked to be what its name says: JSON, safetensors (its header), Python, the card's YAML
front matter.
"""

import json
from pathlib import Path
from typing import Any

from transformers import GenerationConfig, PreTrainedModel, PreTrainedTokenizerBase

import generate_vanilla_transformer
import pipeline_vanilla_transformer
from pipeline_vanilla_transformer import PAPER_DECODING, VanillaTransformerTranslationPipeline
from vanilla_transformer.hub.model_card import render_model_card
from vanilla_transformer.mechanics.files import (
    content_problem,
    describe_link,
    file_problem,
    give_umask_modes,
    link_on_the_way,
)
from vanilla_transformer.mechanics.names import (
    CUSTOM_GENERATE,
    REQUIRED_FILES,
    TOKENIZER_FILES_BY_CLASS,
    UPLOADED_FILES,
    UPLOADED_PATTERNS,
)
from vanilla_transformer.model.registration import register_model

BEAM_ONLY = ("length_penalty", "early_stopping")
# what `from_pretrained` records of the machine that loaded a tokenizer, and `save_pretrained` writes back
MACHINE_SETTINGS = ("is_local", "local_files_only", "cache_dir", "token", "_commit_hash")
REQUIRED_AUTO_MAP = ("AutoConfig", "AutoModel", "AutoModelForSeq2SeqLM")
BASE_MODEL = "modeling_vanilla_transformer.VanillaTransformerModel"  # auto_map's AutoModel
PIPELINE_FILE = "pipeline_vanilla_transformer.py"


def save_model_folder(
    model: PreTrainedModel,
    tokenizer: PreTrainedTokenizerBase,
    output_dir: str | Path,
    card_values: dict[str, Any] | None = None,
    decoding: dict[str, Any] | None = None,
    card: bool = True,
) -> Path:
    """Write the complete Hub-ready folder (see the module docstring) into `output_dir`; return its path. With
    `card=False`, all of it but the model card (README.md), which a training run writes once its scores are known.

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
    # Pipeline.save_pretrained writes `custom_pipelines` into config.json (write_hub_code writes the pipeline's file),
    # then saves the model (safetensors, config with auto_map, the two model files) and the tokenizer. auto_map names
    # the model classes that save_pretrained knows (AutoConfig, AutoModelForSeq2SeqLM) and the encoder-decoder without
    # its head.
    model.config.auto_map = {**(getattr(model.config, "auto_map", None) or {}), "AutoModel": BASE_MODEL}
    register_model()  # the pipeline's registration is what save_pretrained writes as `custom_pipelines`
    translator = VanillaTransformerTranslationPipeline(model=model, tokenizer=tokenizer, device=model.device)
    translator.save_pretrained(output_dir)
    give_umask_modes(output_dir.glob("*.safetensors"))  # written 0600 by safetensors; 0644 as every other file
    languages = {name: (card_values or {}).get(name) for name in ("source_lang", "target_lang")}
    settle_tokenizer_config(output_dir / "tokenizer_config.json", languages)
    paper_generation_config(model.config, **decoding).save_pretrained(output_dir)
    write_hub_code(output_dir)
    if card:
        text = render_model_card(model, {**(card_values or {}), **decoding})
        (output_dir / "README.md").write_text(text, encoding="utf-8")
    return output_dir


def write_hub_code(folder: Path) -> None:
    """The folder's code that transformers does not copy with the model's: this installation's
    pipeline_vanilla_transformer.py (the pipeline config.json's `custom_pipelines` names) and, as
    custom_generate/generate.py, its generate_vanilla_transformer.py; never written through a symbolic link."""
    files = {
        PIPELINE_FILE: Path(pipeline_vanilla_transformer.__file__),
        CUSTOM_GENERATE: Path(generate_vanilla_transformer.__file__),
    }
    for name, source in files.items():
        if (link := link_on_the_way(folder, name)) is not None:
            raise FileExistsError(f"{describe_link(link)}: refusing to write {name} through it")
        (folder / name).parent.mkdir(exist_ok=True)
        (folder / name).write_bytes(source.read_bytes())


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


def hub_folder_problems(folder: str | Path) -> list[str]:
    """The problems that keep `folder` from working on the Hub (missing files or config entries, a symbolic link
    where an uploaded file goes, a file that is not what its name says); [] if none."""
    folder = Path(folder)
    if not folder.is_dir():
        return [f"{folder} is not a folder"]
    required = (*REQUIRED_FILES, *tokenizer_files(folder))
    problems = [problem for name in required if (problem := file_problem(folder, name))]
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


def tokenizer_files(folder: Path) -> tuple[str, ...]:
    """The files the tokenizer class that the folder's tokenizer_config.json names reads (TOKENIZER_FILES_BY_CLASS);
    the project's own, tokenizer.json, for any other class."""
    try:
        tokenizer_class = json.loads((folder / "tokenizer_config.json").read_text(encoding="utf-8"))["tokenizer_class"]
    except (OSError, ValueError, KeyError, TypeError):
        tokenizer_class = None
    return TOKENIZER_FILES_BY_CLASS.get(tokenizer_class, TOKENIZER_FILES_BY_CLASS["PreTrainedTokenizerFast"])


def _uploaded_links(folder: Path) -> list[str]:
    """The names of the upload's allow-list that are symbolic links in `folder` (never uploaded), but for the
    required ones (named with the missing files)."""
    candidates = [name for name in UPLOADED_FILES if name not in (*REQUIRED_FILES, *tokenizer_files(folder))]
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


def files_to_upload(folder: str | Path) -> list[str]:
    """The model repository's files in `folder`, by an allow-list (never "everything but"): the weights, the configs,
    the tokenizer, the Hub-facing code and the card. Logs, results, hypotheses, checkpoints, notes, secrets (`.env`)
    and subfolders (the demo's Space, `vanilla_transformer.serving.space`) stay local, whatever else the folder holds. Only
    regular files inside the folder: a symbolic link is never followed (`hub_folder_problems` names it)."""
    folder = Path(folder)
    names = list(UPLOADED_FILES)
    names += sorted(path.name for pattern in UPLOADED_PATTERNS for path in folder.glob(pattern))
    return [name for name in names if file_problem(folder, name) is None]
