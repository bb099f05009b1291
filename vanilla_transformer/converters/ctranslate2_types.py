"""CTranslate2's names for weight types (`export-ctranslate2 --quantization`) and compute types (`translate --backend
ctranslate2 --compute_type`), without importing CTranslate2 or torch, so that the commands' --help answers at once."""

QUANTIZATIONS = ("int8", "int8_float32", "int8_float16", "int8_bfloat16", "int16", "float16", "bfloat16", "float32")
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
