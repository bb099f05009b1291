"""File and folder names that several modules share: a leaf, imported by every layer, importing nothing.

A name that only one module uses stays in that module.
"""

# the Hub-facing files: copied into every saved model folder, and what a Hub user runs with trust_remote_code=True
CODE_FILES = (
    "configuration_vanilla_transformer.py",
    "modeling_vanilla_transformer.py",
    "pipeline_vanilla_transformer.py",
)
# transformers' hook for a repository's own decoding (the paper's output length): generate_vanilla_transformer.py,
# copied into every saved model folder under this name
CUSTOM_GENERATE = "custom_generate/generate.py"
# code files that earlier releases copied into model folders and this one does not (refresh-code sets them aside)
RETIRED_CODE_FILES = ("fast_paths_vanilla_transformer.py",)
WEIGHTS_NAME = "model.safetensors"
# a tokenizer's vocabulary and rules, as the tokenizer class that a folder names writes them: `tokenizers`' file (the
# project's own tokenizer), MarianTokenizer's (converted OPUS-MT models), FSMTTokenizer's (converted fairseq and FSMT)
TOKENIZER_FILES_BY_CLASS = {
    "PreTrainedTokenizerFast": ("tokenizer.json",),
    "MarianTokenizer": ("source.spm", "target.spm", "vocab.json"),
    "FSMTTokenizer": ("vocab-src.json", "vocab-tgt.json", "merges.txt"),
}
# what a complete model folder holds besides its weights and its tokenizer's files
REQUIRED_FILES = (
    "config.json",
    "generation_config.json",
    "tokenizer_config.json",
    "README.md",
    *CODE_FILES,
    CUSTOM_GENERATE,
)
# what an upload sends: exactly these names where present, plus the weights' shards (UPLOADED_PATTERNS)
UPLOADED_FILES = (
    *REQUIRED_FILES,
    *dict.fromkeys(name for names in TOKENIZER_FILES_BY_CLASS.values() for name in names),
    "target_vocab.json",  # MarianTokenizer's, with separate vocabularies
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
COMMIT_MESSAGE = "Upload vanilla-transformer model"  # `push`'s default commit message on the Hub
