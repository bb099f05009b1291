"""One training run's settings (`TrainingSettings`) and their parts: the output folder, the checkpoints, the evaluation;
each default stated once (the training flags read them). This module imports neither torch nor transformers, so that
`vanilla-transformer train --help` answers at once."""

from dataclasses import dataclass, field
from pathlib import Path

from vanilla_transformer.data.settings import DataSettings, StreamSettings
from vanilla_transformer.mechanics.names import CHECKPOINTS_DIR


@dataclass(frozen=True)
class OutputSettings:
    """A run's folder, and what the run may do with an earlier run's files there (`output_folder.py`)."""

    output_dir: str
    overwrite: bool = False  # delete the earlier run's files first (--overwrite)
    resume_from: str | None = None  # a checkpoint folder, or "latest" (--resume_from_checkpoint)


@dataclass(frozen=True)
class CheckpointSettings:
    output: OutputSettings  # the run's folder: the checkpoints go into its checkpoints/
    save_steps: int = 1000
    keep_last: int = 5  # 0: all (--save_total_limit)
    average_last: int = 5  # averaged into the final model (paper: 5 for base, 20 for big)

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
    batch_size: int = 64
    max_eval_tokens: int = 1024  # longer sources and targets are truncated (counted), bounding evaluation's memory
    # the final decoding: section 6.1's (pipeline_vanilla_transformer.PAPER_DECODING, held equal by
    # tests/test_commands.py); None (--evaluate_only without the flag) leaves it to the model's generation_config.json
    num_beams: int | None = 4
    length_penalty: float | None = 0.6
    max_sentences: int = 500  # validation sentences for greedy BLEU during training
    every_steps: int = 1000  # validation loss and greedy BLEU during training

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
    attn_implementation: str = "sdpa"  # while training
    max_tokens: int = 4096
    gradient_accumulation_steps: int = 1
    warmup_steps: int = 4000
    learning_rate_scale: float = 1.0
    label_smoothing: float = 0.1
    max_grad_norm: float = 0.0
    seed: int = 42
    max_steps: int | None = None
    max_epochs: int | None = None
    max_minutes: float | None = None
    mixed_precision: str | None = None
    ddp_timeout: int = 1800
    prefetch_batches: int = 2
    logging_steps: int = 50
    report_to: str = "none"
    push_to_hub: bool = False
    hub_model_id: str | None = None
    hub_private: bool = False
    model_to_evaluate: str | None = None  # --evaluate_only: the saved model folder to score, instead of training
    trust_remote_code: bool = False
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
