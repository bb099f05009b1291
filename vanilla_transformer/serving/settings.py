"""A translation run's settings and choices, each default stated once (the `translate` command's flags read them).

A field that is a flag of `translate` (and of `serve`) declares it in its metadata: its help, the check of its value
(commands/flags.py's `add_settings_flags` reads them), and `recorded: False` where it does not change the output (a
run's manifest records the others). This module imports nothing (neither torch nor transformers, nor the flags'
checks), so that `vanilla-transformer translate --help` answers at once and a Space's copy of it stands alone."""

from dataclasses import dataclass, field

BATCH_SIZE = 32  # sentences a batch, the default of `translate_sentences` (the library call)
DEFAULT_BATCH_TOKENS = 4000  # source tokens x beams a batch, unless a sentence count alone is given
DTYPE_NAMES = ("float32", "bfloat16", "float16")  # the model's weights and computation (`translate.DTYPES`)
BACKENDS = ("model", "ctranslate2", "onnx")


def folder_max_new_tokens(generation: dict) -> int | None:
    """The output length a folder's generation_config.json sets, as both backends decode it: its max_new_tokens, or
    its max_length less the decoder's start token; None where it sets neither (section 6.1's input + 50)."""
    if generation.get("max_new_tokens") is not None:
        return generation["max_new_tokens"]
    return generation["max_length"] - 1 if generation.get("max_length") is not None else None


@dataclass(frozen=True)
class CorpusSettings:
    """How a corpus is cut and batched. A batch holds at most `max_batch_tokens` source tokens x beams (padding
    counted) and at most `batch_size` sentences: left out, the budget is DEFAULT_BATCH_TOKENS, unless `batch_size`
    alone is given (then sentences alone count)."""

    buffer_size: int = field(  # units a chunk: sorted together, recorded together (a kill loses one a process)
        default=200, metadata={"help": "units a chunk, sorted by length", "check": "positive_int"}
    )
    max_batch_tokens: int | None = field(
        default=None,
        metadata={
            "help": f"source tokens x beams a batch, padding counted (default: {DEFAULT_BATCH_TOKENS}, unless "
            "--batch_size)",
            "check": "positive_int",
        },
    )
    batch_size: int | None = field(
        default=None, metadata={"help": "sentences a batch, at most", "check": "positive_int"}
    )
    split_sentences: bool = field(default=False, metadata={"help": "translate each text sentence by sentence"})
    language: str = field(default="en", metadata={"help": "the source language, for --split_sentences"})
    max_piece_tokens: int | None = field(
        default=None,
        metadata={
            "help": "longer sentences are cut into pieces (default: the model's positions)",
            "check": "positive_int",
        },
    )
    log_every: float = field(
        default=60.0, metadata={"help": "seconds, off a tty", "check": "positive_float", "recorded": False}
    )

    def __post_init__(self):
        if self.max_batch_tokens is None and self.batch_size is None:  # the one place the default budget is decided
            object.__setattr__(self, "max_batch_tokens", DEFAULT_BATCH_TOKENS)


@dataclass(frozen=True)
class BackendSettings:
    """What translates (the model, its CTranslate2 export or its ONNX export), where, and in what precision."""

    backend: str = field(default="model", metadata={"help": "what translates", "choices": BACKENDS})
    onnx_dir: str | None = field(
        default=None,
        metadata={
            "help": "with --backend onnx: MODEL_DIR's export (`vanilla-transformer export-onnx`)",
            "recorded": False,
        },
    )
    onnx_variant: str | None = field(  # the choices: the command's (converters/export_onnx.py's VARIANT_SUFFIXES)
        default=None,
        metadata={
            "help": "with --backend onnx: the export's quantized files (written by its --quantize) instead of float32"
        },
    )
    ctranslate2_dir: str | None = field(  # recorded by its weights' digest
        default=None,
        metadata={"help": "a CTranslate2 export (default: made beside MODEL_DIR on first use)", "recorded": False},
    )
    compute_type: str | None = field(  # the choices: the command's (converters' COMPUTE_TYPES)
        default=None, metadata={"help": "CTranslate2's (default: its default)"}
    )
    device: str | None = field(  # recorded as the device the process runs on
        default=None,
        metadata={"help": "cpu, cuda, cuda:1, ... (default: the process's, from accelerate)", "recorded": False},
    )
    dtype: str = field(
        default="float32", metadata={"help": "the model's weights and computation", "choices": DTYPE_NAMES}
    )
    attn_implementation: str | None = field(
        default=None, metadata={"help": "attention (default: the model's)", "choices": ("sdpa", "eager")}
    )
    trust_remote_code: bool = field(
        default=False,
        metadata={
            "help": "run the folder's own model code (Hub models); by default the installed vanilla-transformer code "
            "runs"
        },
    )


@dataclass(frozen=True)
class DecodingSettings:
    """The beam and the output length (None: the folder's generation_config.json, else section 6.1's)."""

    num_beams: int | None = field(
        default=None, metadata={"help": "beam size (default: generation_config.json; paper: 4)", "check": "beam_size"}
    )
    max_new_tokens: int | None = field(
        default=None, metadata={"help": "output length (default: input length + 50)", "check": "output_tokens"}
    )


# a manifest's settings written before the flags were renamed: their names now
RENAMED_IN_RECORDS = {"--max_tokens": "--max_batch_tokens", "--max_source_tokens": "--max_piece_tokens"}


def upgraded_record(settings: dict) -> dict:
    """A run's recorded settings (a manifest's `settings`) under today's names: a run begun before a rename
    resumes."""
    return {RENAMED_IN_RECORDS.get(name, name): value for name, value in settings.items()}
