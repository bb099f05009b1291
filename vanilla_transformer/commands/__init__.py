"""The commands: each one's flags and `main`, the top layer (nothing in the library imports it), as fairseq_cli/ sits
apart from fairseq/. `vanilla-transformer SUBCOMMAND` (main.py) runs them, as does `python -m vanilla_transformer
SUBCOMMAND`; each module is named after its subcommand. The training command is the repository's own
`train_accelerate.py`, installed as the module `train_accelerate`."""
