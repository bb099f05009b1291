"""One training run's settings (`TrainingSettings`) and their parts: the output folder, the checkpoints, the evaluation;
each default stated once (the training flags read them).

A field that is a flag of `vanilla-transformer train` declares it in its metadata (its help, the check of its value:
commands/flags.py's `add_settings_flags` reads them; `flag` names a flag spelled otherwise than the field). This
module imports neither torch nor transformers, so that `vanilla-transformer train --help` answers at once."""

from dataclasses import dataclass, field
from pathlib import Path

from vanilla_transformer.data.settings import DataSettings, StreamSettings, setting
from vanilla_transformer.mechanics.names import CHECKPOINTS_DIR

STEPS = "positive_int"  # the check of a count of steps


@dataclass(frozen=True)
class OutputSettings:
    """A run's folder, and what the run may do with an earlier run's files there (`output_folder.py`)."""

    output_dir: str = setting("outputs/vanilla-transformer", None)
    overwrite: bool = setting(
        False,
        "delete an earlier run's checkpoints, logs and model in --output_dir first (else such a folder "
        "is refused, unless resumed)",
    )
    resume_from: str | None = setting(None, "a checkpoint folder, or `latest`", flag="resume_from_checkpoint")


@dataclass(frozen=True)
class CheckpointSettings:
    output: OutputSettings  # the run's folder: the checkpoints go into its checkpoints/
    save_steps: int = setting(1000, "checkpoint every N steps", check=STEPS)
    keep_last: int = setting(
        5, "keep the last K checkpoints (0: all)", check="non_negative_int", flag="save_total_limit"
    )
    average_last: int = setting(  # averaged into the final model
        5, "average the last K checkpoints (paper: 5/20)", check="positive_int"
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
    batch_size: int = setting(64, None, check="positive_int", flag="eval_batch_size")
    max_eval_tokens: int = setting(
        1024, "evaluation truncates longer sources and targets (counted), bounding its memory", check=("at_least", 2)
    )
    # the final decoding: section 6.1's (pipeline_vanilla_transformer.PAPER_DECODING, held equal by
    # tests/test_commands.py); None (--evaluate_only without the flag) leaves it to the model's generation_config.json
    num_beams: int | None = setting(4, "final decoding", check="positive_int")
    length_penalty: float | None = setting(0.6, "final decoding", check="any_number")
    max_sentences: int = setting(
        500, "validation sentences for BLEU in training", check="positive_int", flag="eval_max_sentences"
    )
    every_steps: int = setting(1000, "validation loss and greedy BLEU every N steps", check=STEPS, flag="eval_steps")

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
    attn_implementation: str = setting(
        "sdpa",
        "attention kernel while training; on CPUs with bf16, eager is faster (docs/BENCHMARKS.md)",
        choices=("sdpa", "eager"),
    )
    max_tokens: int = setting(4096, "source and target tokens per batch per process", check=("at_least", 2))
    gradient_accumulation_steps: int = setting(1, None, check="positive_int")
    warmup_steps: int = setting(4000, "warm-up steps of equation (3)", check=STEPS)
    learning_rate_scale: float = setting(1.0, "factor on equation (3)", check="positive_float")
    label_smoothing: float = setting(0.1, None, check="probability")
    max_grad_norm: float = setting(0.0, "clip gradients; 0 = off (the paper)", check="non_negative_float")
    seed: int = setting(42, "initialisation, dropout, batch order", check="non_negative_int")
    max_steps: int | None = setting(None, "optimizer steps to train", check=STEPS)
    max_epochs: int | None = setting(None, None, check="positive_int")
    max_minutes: float | None = setting(None, "wall-clock budget of the training loop", check="positive_float")
    mixed_precision: str | None = setting(
        None, "default: accelerate's config; bf16 works on CPUs too", choices=("no", "fp16", "bf16")
    )
    ddp_timeout: int = setting(
        1800,
        "seconds a process waits at a collective, e.g. while the main process prepares the corpus "
        "(torch's NCCL default is 600; prepare large corpora beforehand with vanilla-transformer prepare)",
        check="positive_int",
    )
    prefetch_batches: int = setting(
        2, "optimizer steps collated ahead in a thread; 0 = inline", check="non_negative_int"
    )
    logging_steps: int = setting(50, None, check=STEPS)
    report_to: str = setting("none", "an accelerate tracker, e.g. tensorboard")
    push_to_hub: bool = setting(False, None)
    hub_model_id: str | None = setting(None, None)
    hub_private: bool = setting(False, None)
    model_to_evaluate: str | None = None  # --evaluate_only: the saved model folder to score, instead of training
    trust_remote_code: bool = setting(
        False, "--evaluate_only: run the model folder's own code (Hub models); default: the installed code"
    )
    hyperparameters: dict = field(default_factory=dict)  # the flags as given, for accelerate's trackers

    @property
    def batches_and_schedule(self) -> dict:
        """What decides the batches, the learning rate and the loss of each step (part of
        checkpointing.continuation_settings)."""
        names = ("max_tokens", "gradient_accumulation_steps", "seed", "learning_rate_scale", "warmup_steps")
        names += ("label_smoothing",)
        return {name: getattr(self, name) for name in names}

    @property
    def card_recipe(self) -> dict:
        """The recipe as the model card shows it."""
        names = ("preset", "max_tokens", "warmup_steps", "learning_rate_scale", "label_smoothing")
        return {name: getattr(self, name) for name in names} | self.evaluation.final_decoding
