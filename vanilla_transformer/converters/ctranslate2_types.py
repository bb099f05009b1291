"""CTranslate2's names for weight types and compute types, without importing CTranslate2 or torch.

The weight types are `export-ctranslate2 --quantization`'s choices, the compute types `translate --backend ctranslate2
--compute_type`'s. Importing neither CTranslate2 nor torch keeps the commands' --help answering at once."""

WEIGHT_TYPES = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
COMPUTE_TYPES = (
    "default",
    "auto",
    "float32",
    "int8",
    "int8_float32",
    "int8_float16",
    "int8_bfloat16",
    "float16",
    "bfloat16",
    "int16",
)
