"""Peak memory of loading a model folder whose sizes sit at the loader's bounds (vanilla_transformer/model/loading.py).

A downloaded folder may ask for anything; `check_folder_sizes` refuses, before anything is built, a position table
over MAX_TABLE_BYTES at the peak of building it, an embedding matrix over MAX_TABLE_BYTES, more than MAX_LAYERS
layers a stack and more than MAX_MODEL_BYTES of weights. This script writes folders just inside those bounds (and one
just outside each, which must be refused), loads each with `load_model_folder` in a fresh process, and reports the
process's peak resident memory (`ru_maxrss`) against a tiny folder's: what a hostile folder can make a loader spend.

Usage:
    python benchmarks/loading_memory.py
"""

import json
import subprocess
import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))  # run from a checkout without installing

from common import describe_machine, machine  # noqa: E402

from configuration_vanilla_transformer import VanillaTransformerConfig  # noqa: E402
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.model.loading import MAX_LAYERS, MAX_TABLE_BYTES, POSITION_TABLE_BYTES  # noqa: E402

TINY = dict(
    vocab_size=64,
    d_model=64,
    encoder_layers=1,
    decoder_layers=1,
    encoder_attention_heads=2,
    decoder_attention_heads=2,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
)
AT_THE_BOUND = {
    "tiny (the baseline)": {},
    "positions at the bound": {"max_position_embeddings": MAX_TABLE_BYTES // (POSITION_TABLE_BYTES * 64)},
    "positions past the bound": {"max_position_embeddings": MAX_TABLE_BYTES // (POSITION_TABLE_BYTES * 64) + 1},
    "layers at the bound": {"encoder_layers": MAX_LAYERS, "decoder_layers": MAX_LAYERS},
    "layers past the bound": {"encoder_layers": MAX_LAYERS + 1},
}
LOAD = """
import resource, sys, time
from vanilla_transformer.model.loading import ModelFolderError, load_model_folder
start = time.time()
try:
    load_model_folder(sys.argv[1])
    outcome = "loaded"
except ModelFolderError as error:
    outcome = "refused: " + str(error).split(": ", 1)[1][:80]
print(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024, round(time.time() - start, 1), outcome)
"""


def write_folder(folder: Path, changes: dict) -> Path:
    """A tiny model's weights, with `changes` written into its config.json (the weights stay the tiny model's: the
    loader either refuses the sizes or builds the model and reports the weights that do not fit)."""
    VanillaTransformerForConditionalGeneration(VanillaTransformerConfig(**TINY)).save_pretrained(folder)
    config = json.loads((folder / "config.json").read_text())
    (folder / "config.json").write_text(json.dumps({**config, **changes}))
    return folder


def main() -> None:
    print(f"# {describe_machine(machine())}")
    print("| folder | changes | peak RSS MiB | seconds | outcome |")
    print("|---|---|---:|---:|---|")
    with tempfile.TemporaryDirectory() as scratch:
        for number, (name, changes) in enumerate(AT_THE_BOUND.items()):
            folder = write_folder(Path(scratch) / str(number), changes)
            result = subprocess.run(
                [sys.executable, "-c", LOAD, str(folder)], capture_output=True, text=True, timeout=600, check=True
            )
            peak, seconds, outcome = result.stdout.strip().splitlines()[-1].split(" ", 2)
            print(f"| {name} | {changes or '-'} | {int(peak):,} | {seconds} | {outcome} |")


if __name__ == "__main__":
    main()
