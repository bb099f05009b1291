"""The flags of `train_accelerate.py` (and the data flags of `vanilla-transformer prepare`), and the typed
settings they become: the only module that reads an argparse Namespace. `parse_training_arguments` parses, fills
the defaults that depend on the data, refuses combinations that cannot work (naming the flags) and returns one
frozen `TrainingSettings`; the parsed flags are never changed afterwards."""

import argparse
import math
from pathlib import Path

from vanilla_transformer.commands.flags import (
    add_deprecated_alias,
    at_least,
    command_parser,
    field_default,
    non_negative_float,
    non_negative_int,
    number_in,
    positive_float,
    positive_int,
    probability,
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
# otherwise. Every other flag's default is its settings field's (`field_default`).
EMBEDDED_TASK_DEFAULTS = {"preset": "tiny", "max_steps": 400, "warmup_steps": 200, "save_steps": 80, "eval_steps": 200}
REAL_DATA_DEFAULTS = {
    "preset": "small",
    "max_steps": 100_000,
    "warmup_steps": field_default(TrainingSettings, "warmup_steps"),
    "save_steps": field_default(CheckpointSettings, "save_steps"),
    "eval_steps": field_default(EvaluationSettings, "every_steps"),
}


def parse_training_arguments(argv=None) -> TrainingSettings:
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
    args = parser.parse_args(argv)
    return training_settings(parser, args)


TRAINING_DESCRIPTION = """Train the Transformer of "Attention Is All You Need" with Accelerate (paper section 5).

    vanilla-transformer train                                    # the embedded synthetic task, offline, CPU
    vanilla-transformer train --data_dir ../shared/data/multi30k --source_lang en --target_lang de \\
        --validation_split val --test_split test_2016_flickr --preset small --max_minutes 25
    accelerate launch --multi_gpu --num_processes 8 -m train_accelerate --prepared_data data-bin/wmt14-en-de \\
        --preset base --max_tokens 3125

(`python train_accelerate.py` in a checkout, and `python -m train_accelerate`, are the same command.)
"""


# --- the flags, in the order --help lists them ------------------------------------------------------------------


def add_data_arguments(parser: argparse.ArgumentParser) -> None:
    """The data flags, shared by `vanilla-transformer train` and `vanilla-transformer prepare`."""
    group = parser.add_argument_group("data (default: the embedded synthetic task)")
    group.add_argument("--dataset_name", help="a Hub dataset with a `translation` column, e.g. wmt14 (online)")
    group.add_argument("--dataset_config", help="e.g. de-en")
    group.add_argument("--data_dir", help="folder of line-aligned files {split}.{lang}[.gz], e.g. Multi30k")
    group.add_argument("--train_file", help="a .tsv or .jsonl file of pairs (with --validation_file/--test_file)")
    group.add_argument("--validation_file")
    group.add_argument("--test_file")
    for split in ("train", "validation", "test"):
        group.add_argument(f"--{split}_split", default=field_default(Corpus, f"{split}_split"))
    for side in ("source", "target"):
        language = field_default(Corpus, f"{side}_lang")
        group.add_argument(f"--{side}_lang", help=f"default: {language} (with --prepared_data: the corpus's)")
    group.add_argument(
        "--synthetic_pairs",
        type=at_least(10),
        default=field_default(Corpus, "synthetic_pairs"),
        help="size of the embedded task",
    )
    group.add_argument(
        "--max_sentence_tokens",
        type=at_least(2),
        default=field_default(LengthFilter, "max_sentence_tokens"),
        help="drop training pairs with a sentence (source or target) longer than this",
    )
    add_deprecated_alias(group, "--max_source_tokens", "--max_sentence_tokens")
    group.add_argument(
        "--max_length_ratio",
        type=number_in(1),
        help="drop training pairs whose longer side has more than this many times the tokens of the shorter one "
        "(corpus cleaning; e.g. 3 for WMT; default: off)",
    )
    group.add_argument("--tokenizer_name_or_path", help="an existing tokenizer; default: train one")
    group.add_argument(
        "--vocab_size",
        type=at_least(260),
        default=field_default(TokenizerSettings, "vocab_size"),
        help="shared BPE vocabulary (paper: 37000)",
    )
    group.add_argument(
        "--tokenizer_train_pairs",
        type=positive_int,
        default=field_default(TokenizerSettings, "sample_pairs"),
        help="train the BPE on a seeded random sample of this many training pairs (all of them if fewer)",
    )
    group.add_argument(
        "--data_seed",
        type=non_negative_int,
        default=field_default(TokenizerSettings, "seed"),  # and Corpus.synthetic_seed (a test holds them equal)
        help="the tokenizer's sample and the embedded task (not training's seed)",
    )
    group.add_argument("--preprocessing_num_workers", type=positive_int, help="processes that tokenize (default: 1)")
    group.add_argument(
        "--data_cache_dir",
        help="where prepared corpora are cached (default: $HF_HOME/vanilla_transformer/prepared)",
    )


def add_streaming_arguments(parser: argparse.ArgumentParser) -> None:
    group = parser.add_argument_group("streaming (corpora larger than the disk or memory)")
    group.add_argument("--streaming", action="store_true", help="read the training pairs as they are needed")
    group.add_argument(
        "--shuffle_buffer_size",
        type=positive_int,
        default=field_default(StreamSettings, "shuffle_buffer_size"),
        help="pairs in the shuffle buffer",
    )
    group.add_argument(
        "--stream_pool_batches",
        type=positive_int,
        default=field_default(StreamSettings, "pool_batches"),
        help="batches sorted and cut together",
    )


def add_process_arguments(parser: argparse.ArgumentParser) -> None:
    """A prepared corpus, and how processes wait and load batches."""
    group = parser.add_argument_group("prepared data and processes")
    group.add_argument(
        "--prepared_data", help="a folder made by `vanilla-transformer prepare` (replaces the data flags)"
    )
    group.add_argument(
        "--ddp_timeout",
        type=positive_int,
        default=field_default(TrainingSettings, "ddp_timeout"),
        help="seconds a process waits at a collective, e.g. while the main process prepares the corpus (torch's "
        "NCCL default is 600; prepare large corpora beforehand with vanilla-transformer prepare)",
    )
    group.add_argument(
        "--prefetch_batches",
        type=non_negative_int,
        default=field_default(TrainingSettings, "prefetch_batches"),
        help="optimizer steps collated ahead in a thread; 0 = inline",
    )


def preset_name(text: str) -> str:
    """An argparse type: a name of configuration_vanilla_transformer.PRESETS (read when a value is given, so that
    --help needs no transformers)."""
    from configuration_vanilla_transformer import PRESETS

    if text not in PRESETS:
        raise argparse.ArgumentTypeError(f"must be one of {', '.join(sorted(PRESETS))}, got {text!r}")
    return text


def add_model_arguments(parser: argparse.ArgumentParser) -> None:
    """The model: a preset of the paper's Table 3 (or a CPU-sized one) and overrides."""
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
    group.add_argument(
        "--max_tokens",
        type=at_least(2),
        default=field_default(TrainingSettings, "max_tokens"),
        help="source and target tokens per batch per process",
    )
    group.add_argument(
        "--gradient_accumulation_steps",
        type=positive_int,
        default=field_default(TrainingSettings, "gradient_accumulation_steps"),
    )
    group.add_argument(
        "--warmup_steps",
        type=positive_int,
        help=f"default: {REAL_DATA_DEFAULTS['warmup_steps']} (the paper); "
        f"{EMBEDDED_TASK_DEFAULTS['warmup_steps']} for the embedded task",
    )
    group.add_argument(
        "--learning_rate_scale",
        type=positive_float,
        default=field_default(TrainingSettings, "learning_rate_scale"),
        help="factor on equation (3)",
    )
    group.add_argument(
        "--label_smoothing", type=probability, default=field_default(TrainingSettings, "label_smoothing")
    )
    group.add_argument(
        "--max_grad_norm",
        type=non_negative_float,
        default=field_default(TrainingSettings, "max_grad_norm"),
        help="clip gradients; 0 = off (the paper)",
    )
    group.add_argument(
        "--mixed_precision",
        choices=["no", "fp16", "bf16"],
        help="default: accelerate's config; bf16 works on CPUs too",
    )
    group.add_argument(
        "--attn_implementation",
        choices=["sdpa", "eager"],
        default=field_default(TrainingSettings, "attn_implementation"),
        help="attention kernel while training; on CPUs with bf16, eager is faster (docs/BENCHMARKS.md)",
    )
    group.add_argument(
        "--max_steps",
        type=positive_int,
        help=f"default: {REAL_DATA_DEFAULTS['max_steps']} ({EMBEDDED_TASK_DEFAULTS['max_steps']} for the embedded "
        "task) unless another limit is given",
    )
    group.add_argument("--max_epochs", type=positive_int)
    group.add_argument("--max_minutes", type=positive_float, help="wall-clock budget of the training loop")
    group.add_argument(
        "--seed",
        type=non_negative_int,
        default=field_default(TrainingSettings, "seed"),
        help="initialisation, dropout, batch order",
    )


def add_evaluation_arguments(parser: argparse.ArgumentParser) -> None:
    """BLEU during and after training, and --evaluate_only."""
    group = parser.add_argument_group("evaluation")
    group.add_argument(
        "--eval_steps",
        type=positive_int,
        help=f"validation loss and greedy BLEU every N steps (default {REAL_DATA_DEFAULTS['eval_steps']}; "
        f"{EMBEDDED_TASK_DEFAULTS['eval_steps']} for the embedded task)",
    )
    group.add_argument(
        "--eval_max_sentences",
        type=positive_int,
        default=field_default(EvaluationSettings, "max_sentences"),
        help="validation sentences for BLEU in training",
    )
    group.add_argument("--eval_batch_size", type=positive_int, default=field_default(EvaluationSettings, "batch_size"))
    group.add_argument(
        "--max_eval_tokens",
        type=at_least(2),
        default=field_default(EvaluationSettings, "max_eval_tokens"),
        help="evaluation truncates longer sources and targets (counted), bounding its memory",
    )
    add_deprecated_alias(group, "--max_eval_source_tokens", "--max_eval_tokens")
    for name, kind in (("num_beams", positive_int), ("length_penalty", number_in(-math.inf))):
        default = field_default(EvaluationSettings, name)
        group.add_argument(
            f"--{name}",
            type=kind,
            help=f"final decoding (default: paper's {default}; --evaluate_only: the model's generation_config.json)",
        )
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
        "--overwrite",
        action="store_true",
        help="delete an earlier run's checkpoints, logs and model in --output_dir first (else such a folder is "
        "refused, unless resumed)",
    )
    add_deprecated_alias(group, "--overwrite_output_dir", "--overwrite")
    group.add_argument(
        "--save_steps",
        type=positive_int,
        help=f"checkpoint every N steps (default {REAL_DATA_DEFAULTS['save_steps']}; "
        f"{EMBEDDED_TASK_DEFAULTS['save_steps']} for the embedded task)",
    )
    group.add_argument(
        "--save_total_limit",
        type=non_negative_int,
        default=field_default(CheckpointSettings, "keep_last"),
        help="keep the last K checkpoints (0: all)",
    )
    group.add_argument(
        "--average_last",
        type=positive_int,
        default=field_default(CheckpointSettings, "average_last"),
        help="average the last K checkpoints (paper: 5/20)",
    )
    group.add_argument("--resume_from_checkpoint", help="a checkpoint folder, or `latest`")
    group.add_argument("--logging_steps", type=positive_int, default=field_default(TrainingSettings, "logging_steps"))
    group.add_argument(
        "--report_to",
        default=field_default(TrainingSettings, "report_to"),
        help="an accelerate tracker, e.g. tensorboard",
    )
    group.add_argument("--push_to_hub", action="store_true")
    group.add_argument("--hub_model_id")
    group.add_argument("--hub_private", action="store_true")


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
    corpus_fields = ("dataset_name", "dataset_config", "data_dir", "train_file", "validation_file", "test_file")
    corpus = Corpus(
        source_lang=source_lang,
        target_lang=target_lang,
        **{name: getattr(args, name) for name in corpus_fields},
        train_split=args.train_split,
        validation_split=args.validation_split,
        test_split=args.test_split,
        synthetic_pairs=args.synthetic_pairs,
        synthetic_seed=args.data_seed,
    )
    if prepared_data and not corpus.is_embedded_task:
        parser.error("--prepared_data replaces --data_dir/--train_file/--dataset_name: give one or the other")
    tokenizer = TokenizerSettings(
        args.tokenizer_name_or_path, args.vocab_size, args.tokenizer_train_pairs, seed=args.data_seed
    )
    return DataSettings(
        corpus=corpus,
        tokenizer=tokenizer,
        filters=LengthFilter(args.max_sentence_tokens, args.max_length_ratio),
        prepared_data=prepared_data,
        cache_dir=args.data_cache_dir,
        num_workers=args.preprocessing_num_workers,
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
    stream = None
    if args.streaming:
        stream = StreamSettings(args.shuffle_buffer_size, args.stream_pool_batches)
    evaluation = EvaluationSettings(
        batch_size=args.eval_batch_size,
        max_eval_tokens=args.max_eval_tokens,
        **final_decoding(args),
        max_sentences=args.eval_max_sentences,
        every_steps=filled["eval_steps"],
    )
    output = OutputSettings(args.output_dir, args.overwrite, args.resume_from_checkpoint)
    checkpoints = CheckpointSettings(output, filled["save_steps"], args.save_total_limit, args.average_last)
    copied = ("max_tokens", "gradient_accumulation_steps", "learning_rate_scale", "label_smoothing", "max_grad_norm")
    copied += ("seed", "max_epochs", "max_minutes", "mixed_precision", "ddp_timeout", "prefetch_batches")
    copied += ("logging_steps", "report_to", "push_to_hub", "hub_model_id", "hub_private", "trust_remote_code")
    return TrainingSettings(
        data=data,
        stream=stream,
        output=output,
        checkpoints=checkpoints,
        evaluation=evaluation,
        preset=filled["preset"],
        model_overrides=overrides,
        attn_implementation=args.attn_implementation,
        warmup_steps=filled["warmup_steps"],
        max_steps=filled["max_steps"],
        model_to_evaluate=args.model_name_or_path if args.evaluate_only else None,
        hyperparameters={k: v for k, v in vars(args).items() if isinstance(v, (int, float, str, bool))},
        **{name: getattr(args, name) for name in copied},
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
