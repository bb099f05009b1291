"""`vanilla-transformer train [FLAGS]`: train (and score) a model with train_accelerate.py, the repository's main job.

`vanilla-transformer train --help` lists the flags; `accelerate launch -m train_accelerate [FLAGS]` runs it on several
processes. The flags are parsed before the training script and torch are imported, so that --help answers at once."""

from collections.abc import Sequence

from vanilla_transformer.commands.arguments import parse_training_arguments
from vanilla_transformer.commands.runner import command


@command
def main(argv: Sequence[str] | None = None) -> None:
    settings = parse_training_arguments(argv)
    from train_accelerate import train

    train(settings)
