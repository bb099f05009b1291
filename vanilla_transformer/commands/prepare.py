"""`vanilla-transformer prepare`: prepare a translation corpus once, for any number of training runs.

    vanilla-transformer prepare --data_dir wmt14 --source_lang en --target_lang de \
        --validation_split newstest2013 --test_split newstest2014 --vocab_size 37000 \
        --preprocessing_num_workers 16 --output_dir data-bin/wmt14-en-de
    vanilla-transformer train --prepared_data data-bin/wmt14-en-de ...      # any number of experiments

What a prepared folder holds: vanilla_transformer/data/prepare.py. --output_dir must be new or empty, and none of the
data's files or folders, nor inside or holding one (the one rule: vanilla_transformer/mechanics/outputs.py): a prepared
corpus is never written over anything.
"""

import argparse
import sys
from pathlib import Path

from vanilla_transformer.commands.arguments import add_data_arguments, data_settings
from vanilla_transformer.commands.flags import command_parser
from vanilla_transformer.commands.runner import command
from vanilla_transformer.mechanics.outputs import check_output_folder

INPUTS = ("data_dir", "train_file", "validation_file", "test_file", "tokenizer_name_or_path")  # flags naming paths


def prepare_parser() -> argparse.ArgumentParser:
    parser = command_parser("vanilla-transformer prepare", __doc__)
    add_data_arguments(parser)
    parser.add_argument("--output_dir", required=True, help="the prepared folder to write (new or empty)")
    return parser


@command
def main(argv=None) -> int:
    parser = prepare_parser()
    args = parser.parse_args(argv)
    settings = data_settings(parser, args)
    folder = Path(args.output_dir)
    if blocking := next((parent for parent in folder.absolute().parents if parent.is_file()), None):
        parser.error(f"--output_dir {folder}: {blocking} is a file, not a folder")
    check_output_folder(
        folder,
        overwrite=True,  # never: a folder that holds anything is refused (`why_not_previous` always says why)
        why_not_previous=never_over_anything,
        previous="new or empty",
        inputs=[(f"--{name}", getattr(args, name)) for name in INPUTS if getattr(args, name)],
        flag=None,
    )
    from vanilla_transformer.data.prepare import corpus_key, prepare_corpus, split_sources

    tokenizer = settings.tokenizer.load_given()
    sources = split_sources(settings.corpus)
    if "train" not in sources:
        parser.error("no training data: give --data_dir, --train_file or --dataset_name")
    prepare_corpus(settings, sources, folder, corpus_key(settings, sources, tokenizer), tokenizer)
    return 0


def never_over_anything(folder: Path) -> str:
    """Why a folder that holds anything is not one to prepare into: what it holds (a prepared corpus too)."""
    held = ", ".join(sorted(path.name for path in folder.iterdir())[:5])
    return f"it holds {held}; a prepared corpus is never written over anything: choose a new folder"


if __name__ == "__main__":
    sys.exit(main())
