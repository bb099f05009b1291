"""The flags of `train_accelerate.py` (and the data flags of `vanilla-transformer prepare`), and the typed
settings they become: the only module that reads an argparse Namespace. `parse_training_arguments` parses, fills
the defaults that depend on the data, refuses combinations that cannot work (naming the flags) and returns one
frozen `TrainingSettings`; the parsed flags are never changed afterwards."""

import argparse
from pathlib import Path

from vanilla_transformer.commands.flags import (
    add_deprecated_alias,
    add_settings_flags,
    command_parser,
    field_default,
    flag_values,
    positive_int,
    probability,
    settings_field,
)
from vanilla_transformer.data.readers import DataError
from vanilla_transformer.data.settings import Corpus, DataSettings, LengthFilter, StreamSettings, TokenizerSettings
from vanilla_transformer.training.settings import (
    CheckpointSettings,
    EvaluationSettings,
    OutputSettings,
    TrainingSettings,
)

# Flags left unset take these values, which depend on the data: the embedded task trains in a few minutes on a laptop
# CPU; real data follows the paper (warm-up 4000: the settings' defaults) with the CPU-sized model unless --preset says
# otherwise. Every other flag is its settings field's, as the field declares it (flags.add_settings_flags).
EMBEDDED_TASK_DEFAULTS = {"preset": "tiny", "max_steps": 400, "warmup_steps": 200, "save_steps": 80, "eval_steps": 200}
REAL_DATA_DEFAULTS = {
    "preset": "small",
    "max_steps": 100_000,
    "warmup_steps": field_default(TrainingSettings, "warmup_steps"),
    "save_steps": field_default(CheckpointSettings, "save_steps"),
    "eval_steps": field_default(EvaluationSettings, "every_steps"),
}


def parse_training_arguments(argv=None) -> TrainingSettings:
    parser = training_parser()
    return training_settings(parser, parser.parse_args(argv))


def training_parser() -> argparse.ArgumentParser:
    parser = command_parser("vanilla-transformer train", TRAINING_DESCRIPTION)
    for add_group in (
        add_data_arguments,
        add_streaming_arguments,
        add_process_arguments,
        add_model_arguments,
        add_optimisation_arguments,
        add_evaluation_arguments,
        add_output_arguments,
    ):
        add_group(parser)
    return parser


TRAINING_DESCRIPTION = """Train the Transformer of "Attention Is All You Need" with Accelerate (paper section 5).

    vanilla-transformer train                                    # the embedded synthetic task, offline, CPU
    vanilla-transformer train --data_dir ../shared/data/multi30k --source_lang en --target_lang de \\
        --validation_split val --test_split test_2016_flickr --preset small --max_minutes 25
    accelerate launch --multi_gpu --num_processes 8 -m train_accelerate --prepared_data data-bin/wmt14-en-de \\
        --preset base --max_tokens 3125

(`python train_accelerate.py` in a checkout, and `python -m train_accelerate`, are the same command.)
"""


# --- the flags, in the order --help lists them ------------------------------------------------------------------


def data_dependent(settings_class, name: str, key: str, more: str = "") -> dict:
    """The overrides of a flag whose default depends on the data: left out (None), `training_settings` fills it."""
    help_text = settings_field(settings_class, name).metadata["help"]
    real, embedded = REAL_DATA_DEFAULTS[key], EMBEDDED_TASK_DEFAULTS[key]
    return {"default": None, "help": f"{help_text} (default: {real}; {embedded} for the embedded task{more})"}


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data flags, shared by `vanilla-transformer train` and `vanilla-transformer prepare`."""
    group = parser.add_argument_group("data (default: the embedded synthetic task)")
    names = ["dataset_name", "dataset_config", "data_dir", "train_file", "validation_file", "test_file"]
    names += ["train_split", "validation_split", "test_split", "source_lang", "target_lang", "synthetic_pairs"]
    languages = {  # left out: en-de, or a prepared corpus's pair (`data_settings`)
        f"{side}_lang": {
            "default": None,
            "help": f"the {side} language (default: {field_default(Corpus, f'{side}_lang')}; with --prepared_data: "
            "the corpus's)",
        }
        for side in ("source", "target")
    }
    add_settings_flags(group, Corpus, names, **languages)
    add_settings_flags(group, LengthFilter)
    add_deprecated_alias(group, "--max_source_tokens", "--max_sentence_tokens")
    add_settings_flags(group, TokenizerSettings)
    add_settings_flags(group, DataSettings, ["num_workers", "cache_dir"])


def add_streaming_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("streaming (corpora larger than the disk or memory)")
    group.add_argument("--streaming", action="store_true", help="read the training pairs as they are needed")
    add_settings_flags(group, StreamSettings)


def add_process_arguments(parser: argparse.ArgumentParser) -> None:
    """A prepared corpus, and how processes wait and load batches."""
    group = parser.add_argument_group("prepared data and processes")
    add_settings_flags(group, DataSettings, ["prepared_data"])
    add_settings_flags(group, TrainingSettings, ["ddp_timeout", "prefetch_batches"])


def preset_name(text: str) -> str:
    """An argparse type: a name of configuration_vanilla_transformer.PRESETS (read when a value is given, so that
    --help needs no transformers)."""
    from configuration_vanilla_transformer import PRESETS

    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(sorted(PRESETS))}, got {text!r}")
    return text


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model: a preset of the paper's Table 3 (or a CPU-sized one) and overrides (`model_overrides`)."""
    group = parser.add_argument_group("model")
    group.add_argument(
        "--preset",
        type=preset_name,
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
    group.add_argument(
        "--position_embedding_type",
        choices=["sinusoidal", "learned"],
        help="default: sinusoidal (the paper); learned is Table 3's row E",
    )


def add_optimisation_arguments(parser: argparse.ArgumentParser) -> None:
    """Section 5: batches, the schedule of equation (3), regularisation, limits."""
    group = parser.add_argument_group("optimisation (paper section 5)")
    names = ["max_tokens", "gradient_accumulation_steps", "warmup_steps", "learning_rate_scale", "label_smoothing"]
    names += ["max_grad_norm", "mixed_precision", "attn_implementation", "max_steps", "max_epochs", "max_minutes"]
    add_settings_flags(
        group,
        TrainingSettings,
        [*names, "seed"],
        warmup_steps=data_dependent(TrainingSettings, "warmup_steps", "warmup_steps"),
        max_steps=data_dependent(
            TrainingSettings, "max_steps", "max_steps", more="; none when --max_epochs or --max_minutes is given"
        ),
    )


def add_evaluation_arguments(parser: argparse.ArgumentParser) -> None:
    """BLEU during and after training, and --evaluate_only."""
    group = parser.add_argument_group("evaluation")
    names = ["every_steps", "max_sentences", "batch_size", "max_eval_tokens", "num_beams", "length_penalty"]
    final_decoding = {  # left out: the paper's for a training run, the model's for --evaluate_only (`final_decoding`)
        name: {
            "default": None,
            "help": f"final decoding (default: paper's {field_default(EvaluationSettings, name)}; --evaluate_only: "
            "the model's generation_config.json)",
        }
        for name in ("num_beams", "length_penalty")
    }
    every_steps = data_dependent(EvaluationSettings, "every_steps", "eval_steps")
    add_settings_flags(group, EvaluationSettings, names, every_steps=every_steps, **final_decoding)
    add_deprecated_alias(group, "--max_eval_source_tokens", "--max_eval_tokens")
    group.add_argument("--evaluate_only", action="store_true", help="translate and score with a saved model")
    group.add_argument("--model_name_or_path", help="saved model folder for --evaluate_only")
    add_settings_flags(group, TrainingSettings, ["trust_remote_code"])


def add_output_arguments(parser: argparse.ArgumentParser) -> None:
    """The output folder, checkpoints, logs and the Hub."""
    group = parser.add_argument_group("checkpoints, logging, sharing")
    add_settings_flags(group, OutputSettings, ["output_dir", "overwrite"])
    add_deprecated_alias(group, "--overwrite_output_dir", "--overwrite")
    save_steps = data_dependent(CheckpointSettings, "save_steps", "save_steps")
    add_settings_flags(group, CheckpointSettings, save_steps=save_steps)
    add_settings_flags(group, OutputSettings, ["resume_from"])
    names = ["logging_steps", "report_to", "push_to_hub", "hub_model_id", "hub_private"]
    add_settings_flags(group, TrainingSettings, names)


# --- flags -> settings ------------------------------------------------------------------------------------------


def data_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> DataSettings:
    """The data flags as settings; refuses flags that cannot describe a translation task (parser.error names them).
    The languages default to en-de, except for a prepared corpus, which holds its own: language flags may repeat
    them, never contradict them."""
    prepared_data = vars(args).get("prepared_data")
    source_lang = args.source_lang or field_default(Corpus, "source_lang")
    target_lang = args.target_lang or field_default(Corpus, "target_lang")
    if prepared_data:
        from vanilla_transformer.data.prepare import read_manifest

        try:
            key = read_manifest(Path(prepared_data))["key"]
        except DataError as error:
            parser.error(f"--prepared_data: {error}")
        for flag in ("source_lang", "target_lang"):
            if getattr(args, flag) not in (None, key[flag]):
                parser.error(
                    f"--{flag} {getattr(args, flag)}, but --prepared_data {prepared_data} holds "
                    f"{key['source_lang']}-{key['target_lang']} pairs: drop the language flags, or prepare that pair"
                )
        source_lang, target_lang = key["source_lang"], key["target_lang"]
    if source_lang == target_lang:
        parser.error(
            f"--source_lang and --target_lang are both {source_lang!r}: the model would learn to copy its "
            "input; name two different languages (the file suffixes or the keys of the two sides)"
        )
    languages = {"source_lang": source_lang, "target_lang": target_lang}
    corpus = Corpus(**flag_values(Corpus, args) | languages, synthetic_seed=args.data_seed)
    if prepared_data and not corpus.is_embedded_task:
        parser.error("--prepared_data replaces --data_dir/--train_file/--dataset_name: give one or the other")
    return DataSettings(
        corpus=corpus,
        tokenizer=TokenizerSettings(**flag_values(TokenizerSettings, args)),
        filters=LengthFilter(**flag_values(LengthFilter, args)),
        **flag_values(DataSettings, args),  # prepare's flags hold no --prepared_data
    )


def model_overrides(args: argparse.Namespace) -> dict:
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
        "position_embedding_type": args.position_embedding_type,
    }
    return {name: value for name, value in overrides.items() if value is not None}


def training_settings(parser: argparse.ArgumentParser, args: argparse.Namespace) -> TrainingSettings:
    """The settings of a training run, with the defaults that depend on the data; parser.error for flags that
    cannot work together."""
    data = data_settings(parser, args)
    check_combinations(parser, args)
    other_limit = args.max_epochs is not None or args.max_minutes is not None
    embedded_task = data.corpus.is_embedded_task and not data.prepared_data
    defaults = EMBEDDED_TASK_DEFAULTS if embedded_task else REAL_DATA_DEFAULTS
    filled = {name: value if getattr(args, name) is None else getattr(args, name) for name, value in defaults.items()}
    if args.max_steps is None and other_limit:
        filled["max_steps"] = None
    if data.filters.max_sentence_tokens and data.filters.max_sentence_tokens > args.max_tokens:
        parser.error(
            f"--max_sentence_tokens {data.filters.max_sentence_tokens} exceeds --max_tokens {args.max_tokens}: a kept "
            "pair would not fit in a batch; lower the first or raise the second"
        )
    overrides = model_overrides(args)
    from configuration_vanilla_transformer import VanillaTransformerConfig

    try:  # the model the flags describe, checked before any data is read
        VanillaTransformerConfig.from_preset(filled["preset"], **overrides)
    except ValueError as error:
        parser.error(f"--preset {filled['preset']} with the model flags given: {error}")
    stream = StreamSettings(**flag_values(StreamSettings, args)) if args.streaming else None
    evaluation = flag_values(EvaluationSettings, args) | final_decoding(args) | {"every_steps": filled["eval_steps"]}
    output = OutputSettings(**flag_values(OutputSettings, args))
    checkpoints = flag_values(CheckpointSettings, args) | {"save_steps": filled["save_steps"]}
    filled_here = {name: filled[name] for name in ("warmup_steps", "max_steps")}
    return TrainingSettings(
        data=data,
        stream=stream,
        output=output,
        checkpoints=CheckpointSettings(output, **checkpoints),
        evaluation=EvaluationSettings(**evaluation),
        preset=filled["preset"],
        model_overrides=overrides,
        model_to_evaluate=args.model_name_or_path if args.evaluate_only else None,
        hyperparameters={k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))},
        **flag_values(TrainingSettings, args) | filled_here,
    )


def final_decoding(args: argparse.Namespace) -> dict:
    """--num_beams and --length_penalty as given; left out, the paper's for a training run (the settings' defaults),
    None for --evaluate_only: a saved model is scored as its generation_config.json decodes."""
    given = {name: getattr(args, name) for name in ("num_beams", "length_penalty")}
    if args.evaluate_only:
        return given
    return {name: field_default(EvaluationSettings, name) if value is None else value for name, value in given.items()}


def check_combinations(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    """Refuse flags that cannot work together, naming them (parser.error)."""
    if args.resume_from_checkpoint == "latest" and args.overwrite:
        parser.error("--resume_from_checkpoint continues the run in --output_dir; --overwrite deletes it")
    if args.streaming and (args.prepared_data or args.max_epochs is not None):
        parser.error(
            "--streaming reads raw data and ends at --max_steps/--max_minutes: it takes neither "
            "--prepared_data nor --max_epochs"
        )
    if args.evaluate_only and not args.model_name_or_path:
        parser.error("--evaluate_only needs --model_name_or_path")
    if args.push_to_hub and not args.hub_model_id:
        parser.error("--push_to_hub needs --hub_model_id")
    from huggingface_hub import constants as hub_constants

    if args.push_to_hub and hub_constants.HF_HUB_OFFLINE:
        parser.error(
            "--push_to_hub with HF_HUB_OFFLINE set: the upload at the end could not happen; train without it and "
            "run `vanilla-transformer push OUTPUT_DIR --hub_model_id ID` once online"
        )
    if args.average_last > args.save_total_limit > 0:
        parser.error("--average_last cannot exceed --save_total_limit: the checkpoints to average must be kept")
