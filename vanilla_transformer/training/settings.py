"""One training run's settings (`TrainingSettings`) and their parts: the output folder, the checkpoints, the evaluation;
each default stated once (the training flags read them).

A field that is a flag of `vanilla-transformer train` declares it in its metadata (its help, the check of its value:
commands/flags.py's `add_settings_flags` reads them; `flag` names a flag spelled otherwise than the field). This
module imports neither torch nor transformers, so that `vanilla-transformer train --help` answers at once."""

from dataclasses import dataclass, field
from pathlib import Path

from vanilla_transformer.data.settings import DataSettings, StreamSettings
from vanilla_transformer.mechanics.names import CHECKPOINTS_DIR

STEPS = "positive_int"  # the check of a count of steps


@dataclass(frozen=True)
class OutputSettings:
    """A run's folder, and what the run may do with an earlier run's files there (`output_folder.py`)."""

    output_dir: str = field(default="outputs/vanilla-transformer", metadata={"help": None})
    overwrite: bool = field(
        default=False,
        metadata={
            "help": "delete an earlier run's checkpoints, logs and model in --output_dir first (else such a folder "
            "is refused, unless resumed)"
        },
    )
    resume_from: str | None = field(
        default=None,
        metadata={"flag": "resume_from_checkpoint", "help": "a checkpoint folder, or `latest`"},
    )


@dataclass(frozen=True)
class CheckpointSettings:
    output: OutputSettings  # the run's folder: the checkpoints go into its checkpoints/
    save_steps: int = field(default=1000, metadata={"help": "checkpoint every N steps", "check": STEPS})
    keep_last: int = field(
        default=5,
        metadata={
            "flag": "save_total_limit",
            "help": "keep the last K checkpoints (0: all)",
            "check": "non_negative_int",
        },
    )
    average_last: int = field(
        default=5,  # averaged into the final model
        metadata={"help": "average the last K checkpoints (paper: 5/20)", "check": "positive_int"},
    )

    @property
    def output_dir(self) -> str:
        return self.output.output_dir

    @property
    def resume_from(self) -> str | None:
        return self.output.resume_from

    @property
    def root(self) -> Path:
        return Path(self.output_dir) / CHECKPOINTS_DIR


@dataclass(frozen=True)
class EvaluationSettings:
    batch_size: int = field(default=64, metadata={"flag": "eval_batch_size", "help": None, "check": "positive_int"})
    max_eval_tokens: int = field(
        default=1024,
        metadata={
            "help": "evaluation truncates longer sources and targets (counted), bounding its memory",
            "check": ("at_least", 2),
        },
    )
    # the final decoding: section 6.1's (pipeline_vanilla_transformer.PAPER_DECODING, held equal by
    # tests/test_commands.py); None (--evaluate_only without the flag) leaves it to the model's generation_config.json
    num_beams: int | None = field(default=4, metadata={"help": "final decoding", "check": "positive_int"})
    length_penalty: float | None = field(default=0.6, metadata={"help": "final decoding", "check": "any_number"})
    max_sentences: int = field(
        default=500,
        metadata={
            "flag": "eval_max_sentences",
            "help": "validation sentences for BLEU in training",
            "check": "positive_int",
        },
    )
    every_steps: int = field(
        default=1000,
        metadata={"flag": "eval_steps", "help": "validation loss and greedy BLEU every N steps", "check": STEPS},
    )

    @property
    def final_decoding(self) -> dict:
        """The decoding settings given (None ones are the model's generation config's)."""
        decoding = {"num_beams": self.num_beams, "length_penalty": self.length_penalty}
        return {name: value for name, value in decoding.items() if value is not None}


@dataclass(frozen=True)
class TrainingSettings:
    """One run of train_accelerate.py: the library's settings, and the loop's own."""

    data: DataSettings
    stream: StreamSettings | None  # None: the corpus is prepared and memory-mapped (the default)
    output: OutputSettings
    checkpoints: CheckpointSettings
    evaluation: EvaluationSettings
    preset: str
    model_overrides: dict  # config fields given by flags, over the preset's
    attn_implementation: str = field(
        default="sdpa",
        metadata={
            "help": "attention kernel while training; on CPUs with bf16, eager is faster (docs/BENCHMARKS.md)",
            "choices": ("sdpa", "eager"),
        },
    )
    max_tokens: int = field(
        default=4096, metadata={"help": "source and target tokens per batch per process", "check": ("at_least", 2)}
    )
    gradient_accumulation_steps: int = field(default=1, metadata={"help": None, "check": "positive_int"})
    warmup_steps: int = field(default=4000, metadata={"help": "warm-up steps of equation (3)", "check": STEPS})
    learning_rate_scale: float = field(
        default=1.0, metadata={"help": "factor on equation (3)", "check": "positive_float"}
    )
    label_smoothing: float = field(default=0.1, metadata={"help": None, "check": "probability"})
    max_grad_norm: float = field(
        default=0.0, metadata={"help": "clip gradients; 0 = off (the paper)", "check": "non_negative_float"}
    )
    seed: int = field(
        default=42, metadata={"help": "initialisation, dropout, batch order", "check": "non_negative_int"}
    )
    max_steps: int | None = field(default=None, metadata={"help": "optimizer steps to train", "check": STEPS})
    max_epochs: int | None = field(default=None, metadata={"help": None, "check": "positive_int"})
    max_minutes: float | None = field(
        default=None, metadata={"help": "wall-clock budget of the training loop", "check": "positive_float"}
    )
    mixed_precision: str | None = field(
        default=None,
        metadata={"help": "default: accelerate's config; bf16 works on CPUs too", "choices": ("no", "fp16", "bf16")},
    )
    ddp_timeout: int = field(
        default=1800,
        metadata={
            "help": "seconds a process waits at a collective, e.g. while the main process prepares the corpus "
            "(torch's NCCL default is 600; prepare large corpora beforehand with vanilla-transformer prepare)",
            "check": "positive_int",
        },
    )
    prefetch_batches: int = field(
        default=2,
        metadata={"help": "optimizer steps collated ahead in a thread; 0 = inline", "check": "non_negative_int"},
    )
    logging_steps: int = field(default=50, metadata={"help": None, "check": STEPS})
    report_to: str = field(default="none", metadata={"help": "an accelerate tracker, e.g. tensorboard"})
    push_to_hub: bool = field(default=False, metadata={"help": None})
    hub_model_id: str | None = field(default=None, metadata={"help": None})
    hub_private: bool = field(default=False, metadata={"help": None})
    model_to_evaluate: str | None = None  # --evaluate_only: the saved model folder to score, instead of training
    trust_remote_code: bool = field(
        default=False,
        metadata={
            "help": "--evaluate_only: run the model folder's own code (Hub models); default: the installed code"
        },
    )
    hyperparameters: dict = field(default_factory=dict)  # the flags as given, for accelerate's trackers

    @property
    def batches_and_schedule(self) -> dict:
        """What decides the batches, the learning rate and the loss of each step (part of
        run_checkpoints.continuation_settings)."""
        names = ("max_tokens", "gradient_accumulation_steps", "seed", "learning_rate_scale", "warmup_steps")
        names += ("label_smoothing",)
        return {name: getattr(self, name) for name in names}

    @property
    def card_recipe(self) -> dict:
        """The recipe as the model card shows it."""
        names = ("preset", "max_tokens", "warmup_steps", "learning_rate_scale", "label_smoothing")
        return {name: getattr(self, name) for name in names} | self.evaluation.final_decoding
