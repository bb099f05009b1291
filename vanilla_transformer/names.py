"""File and folder names that several modules share: a leaf, imported by every layer, importing nothing.

A name that only one module uses stays in that module.
"""

# the Hub-facing files: copied into every saved model folder, and what a Hub user runs with trust_remote_code=True
CODE_FILES = (
    "configuration_vanilla_transformer.py",
    "modeling_vanilla_transformer.py",
    "pipeline_vanilla_transformer.py",
    "fast_paths_vanilla_transformer.py",
)
WEIGHTS_NAME = "model.safetensors"
# what a complete model folder holds besides its weights
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer.json",
    "tokenizer_config.json",
    "README.md",
    *CODE_FILES,
)
# what an upload sends: exactly these names where present, plus the weights' shards (UPLOADED_PATTERNS)
UPLOADED_FILES = (
    *REQUIRED_FILES,
    WEIGHTS_NAME,
    "model.safetensors.index.json",
    "special_tokens_map.json",
)
UPLOADED_PATTERNS = ("model-*-of-*.safetensors",)

# a training run's output folder
CHECKPOINTS_DIR = "checkpoints"
TRAIN_LOG = "train_log.jsonl"
RESULTS = "results.json"
TRACKER_LOGS = "vanilla_transformer"  # accelerate's tracker logs (--report_to) are named after the project
HYPOTHESES_FILES = ("validation.hyp.txt", "test.hyp.txt")
EVALUATION_RESULTS = "eval_results.json"
EVALUATION_FILES = (*HYPOTHESES_FILES, EVALUATION_RESULTS)
