"""`vanilla-transformer`: one command, its subcommands the project's commands (as `accelerate launch|config|env`).

    vanilla-transformer train [FLAGS]            train (and score) a model: train_accelerate.py
    vanilla-transformer prepare ...              prepare a corpus once, for many runs
    vanilla-transformer translate MODEL_DIR      translate a corpus (a file, stdin, documents, a dataset)
    vanilla-transformer serve MODEL_DIR ...      translate over HTTP, concurrent requests batched together
    vanilla-transformer attention-maps ...       draw a model's attention weights
    vanilla-transformer paper-figures OUTPUT     the paper's equations and figures, drawn by the code that runs
    vanilla-transformer sweep ...                the paper's Table 3
    vanilla-transformer export-ctranslate2 ...   export to CTranslate2
    vanilla-transformer export-onnx ...          export to ONNX for transformers.js and ONNX Runtime
    vanilla-transformer convert SOURCE OUTPUT    an OPUS-MT, FSMT or fairseq model as a model folder
    vanilla-transformer push MODEL_DIR ...       upload a model folder to the Hub
    vanilla-transformer refresh-code MODEL_DIR   give an older model folder the installed code
    vanilla-transformer space HUB_ID ...         write (and upload) a Hugging Face Space of the demo
    vanilla-transformer demo MODEL               the demo web page

`vanilla-transformer SUBCOMMAND --help` lists its flags; `--version` prints the package's and the transformers and
torch versions. Several processes or machines: `accelerate launch [ACCELERATE FLAGS] -m train_accelerate [FLAGS]`,
`accelerate launch [ACCELERATE FLAGS] -m vanilla_transformer translate [FLAGS]`.
"""

import sys
from collections.abc import Callable, Sequence

from vanilla_transformer.commands.flags import version_text

SUBCOMMANDS = (
    "train",
    "prepare",
    "translate",
    "serve",
    "attention-maps",
    "paper-figures",
    "sweep",
    "export-ctranslate2",
    "export-onnx",
    "convert",
    "push",
    "refresh-code",
    "space",
    "demo",
)


def subcommand_main(name: str) -> Callable[[Sequence[str]], int]:
    """The `main(argv)` of a subcommand, imported only when it runs, so that `--help` answers at once."""
    match name:
        case "train":
            from vanilla_transformer.commands.train import main
        case "prepare":
            from vanilla_transformer.commands.prepare import main
        case "translate":
            from vanilla_transformer.commands.translate import main
        case "serve":
            from vanilla_transformer.commands.serve import main
        case "attention-maps":
            from vanilla_transformer.commands.attention_maps import main
        case "paper-figures":
            from vanilla_transformer.commands.paper_figures import main
        case "sweep":
            from vanilla_transformer.commands.sweep import main
        case "export-ctranslate2":
            from vanilla_transformer.commands.export_ctranslate2 import main
        case "export-onnx":
            from vanilla_transformer.commands.export_onnx import main
        case "convert":
            from vanilla_transformer.commands.convert import main
        case "push":
            from vanilla_transformer.commands.push import main
        case "refresh-code":
            from vanilla_transformer.commands.refresh_code import main
        case "space":
            from vanilla_transformer.commands.space import main
        case "demo":
            from vanilla_transformer.commands.demo import main
        case _:
            raise ValueError(f"unknown subcommand {name!r}")
    return main


def main(argv: Sequence[str] | None = None) -> int:
    argv = sys.argv[1:] if argv is None else list(argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(__doc__)
        return 0 if argv else 2
    if argv[0] == "--version":
        print(version_text())
        return 0
    if argv[0] not in SUBCOMMANDS:
        print(f"error: unknown subcommand {argv[0]!r}; choose among {', '.join(SUBCOMMANDS)}", file=sys.stderr)
        return 2
    return subcommand_main(argv[0])(argv[1:]) or 0


if __name__ == "__main__":
    sys.exit(main())
