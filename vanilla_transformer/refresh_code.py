"""Refresh the model code inside a saved model folder, then check that the weights load and decode the same.

    vanilla-transformer refresh-code outputs/vanilla-transformer

A model folder carries the code it was saved with (configuration, modeling, pipeline and fast-path files), and
transformers runs that copy under whatever release is installed. Folders saved before this project supported
transformers 5.24 decode without their cache there (garbage translations). This command replaces the folder's code
files with this installation's, which supports transformers {supported}, and then:

1. decodes a few sentences with the installed project's own classes (the reference), with and without the cache;
2. loads the folder as a Hub user would, in a fresh process (`AutoModelForSeq2SeqLM`, `trust_remote_code=True`, the
   folder's new code) and decodes the same sentences: the tokens must be the reference's.

The old files are kept in `.previous_code/<time>/` inside the folder (a hidden folder, never uploaded); if the
check fails, they are put back and the command exits with an error. Then push the folder again to update a Hub
repository (`vanilla-transformer push`).
"""

import json
import shutil
import subprocess
import sys
import time
from pathlib import Path

import torch

import modeling_vanilla_transformer
from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS, VanillaTransformerForConditionalGeneration
from vanilla_transformer.model_card import EXAMPLE_SOURCES
from vanilla_transformer.names import CODE_FILES
from vanilla_transformer.tokenization import load_tokenizer

__doc__ = __doc__.format(supported=SUPPORTED_TRANSFORMERS)
BACKUP_FOLDER = ".previous_code"
CHECK_SENTENCES = [*EXAMPLE_SOURCES.values(), "A man in a blue shirt is standing on a ladder."]


class RefreshError(Exception):
    """The folder is not a model folder of this project, or its refreshed code does not decode as it should."""


def check_folder(folder: Path) -> None:
    config_file = folder / "config.json"
    if not config_file.is_file():
        raise RefreshError(f"{folder} is not a model folder: it has no config.json")
    try:
        model_type = json.loads(config_file.read_text(encoding="utf-8")).get("model_type")
    except json.JSONDecodeError as error:
        raise RefreshError(f"{config_file} is not valid JSON: {error}") from error
    if model_type != modeling_vanilla_transformer.VanillaTransformerConfig.model_type:
        raise RefreshError(f"{folder} holds a {model_type!r} model, not a vanilla_transformer one")
    if not (folder / "tokenizer.json").is_file():
        raise RefreshError(f"{folder} has no tokenizer.json: nothing to decode the check sentences with")


GENERATE = dict(num_beams=1, do_sample=False, max_new_tokens=20)

# Decoding as a Hub user would, in a fresh process: transformers loads the folder's own code there (in this process,
# the project's registered classes would win over it).
DECODE_WITH_THE_FOLDERS_CODE = """
import json, sys, torch
from transformers import AutoModelForSeq2SeqLM, PreTrainedTokenizerFast
folder, sentences, settings = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
model = AutoModelForSeq2SeqLM.from_pretrained(folder, trust_remote_code=True).eval()
tokenizer = PreTrainedTokenizerFast.from_pretrained(folder)
with torch.no_grad():
    output = model.generate(**tokenizer(sentences, return_tensors="pt", padding=True), **settings)
print(json.dumps({"module": type(model).__module__, "tokens": output.tolist()}))
"""


@torch.no_grad()
def decode(model, tokenizer, use_cache: bool = True) -> list[list[int]]:
    inputs = tokenizer(CHECK_SENTENCES, return_tensors="pt", padding=True)
    return model.generate(**inputs, **GENERATE, use_cache=use_cache).tolist()


def folder_decodes(folder: Path) -> list[list[int]]:
    arguments = [str(folder), json.dumps(CHECK_SENTENCES), json.dumps(GENERATE)]
    result = subprocess.run(
        [sys.executable, "-c", DECODE_WITH_THE_FOLDERS_CODE, *arguments],
        capture_output=True,
        text=True,
        stdin=subprocess.DEVNULL,
        cwd=folder.parent,
        timeout=600,
    )
    if result.returncode != 0:
        raise RefreshError(f"the refreshed folder does not load: {result.stderr.strip().splitlines()[-1]}")
    decoded = json.loads(result.stdout.strip().splitlines()[-1])
    if not decoded["module"].startswith("transformers_modules"):
        raise RefreshError(f"transformers loaded {decoded['module']}, not the folder's code")
    return decoded["tokens"]


def refresh(folder: str | Path) -> Path:
    """Replace the folder's code files, check the decoding, keep the old files; return the backup folder."""
    folder = Path(folder)
    check_folder(folder)
    tokenizer = load_tokenizer(folder)
    reference_model = VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()
    reference = decode(reference_model, tokenizer)
    if decode(reference_model, tokenizer, use_cache=False) != reference:
        raise RefreshError("the installed code decodes differently with and without its cache; nothing was changed")

    backup = folder / BACKUP_FOLDER / time.strftime("%Y%m%d-%H%M%S")
    backup.mkdir(parents=True)
    source = Path(modeling_vanilla_transformer.__file__).resolve().parent
    for name in CODE_FILES:
        if (folder / name).is_file():
            shutil.copy2(folder / name, backup / name)
        shutil.copyfile(source / name, folder / f".{name}.new")
        (folder / f".{name}.new").replace(folder / name)
    try:
        refreshed = folder_decodes(folder)
    except (RefreshError, subprocess.TimeoutExpired) as error:
        restore(folder, backup)
        raise RefreshError(f"{error}; old code restored") from error
    if refreshed != reference:
        restore(folder, backup)
        raise RefreshError("the refreshed folder decodes other tokens than the installed code; old code restored")
    return backup


def restore(folder: Path, backup: Path) -> None:
    for name in CODE_FILES:
        if (backup / name).is_file():
            shutil.copy2(backup / name, folder / name)
        else:  # the folder had no such file before
            (folder / name).unlink(missing_ok=True)


if __name__ == "__main__":  # `python -m vanilla_transformer.refresh_code`: the command lives in the command layer
    import runpy

    runpy.run_module("vanilla_transformer.commands.refresh_code", run_name="__main__")
