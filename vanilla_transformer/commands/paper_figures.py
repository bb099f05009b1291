"""`vanilla-transformer paper-figures`: draw the paper's equations and figures, each computed by the
project's own code.

One PNG an item, with an `index.md` that ties each to the paper's section and to the code.

    vanilla-transformer paper-figures figures/
    vanilla-transformer paper-figures figures/ --model MODEL_DIR --source "The house is small."

Positions (3.5), the 1/sqrt(d_k) scaling (3.2.1), the masks, equation 3's learning rate, label smoothing (5.4),
Table 1 measured, attention maps of every head of a layer (figures 3-5) with cross-attention as word alignment, and
beam search step by step (6.1). Without --model everything runs offline in seconds, the attention maps and beam
search on a randomly initialised model of the paper's architecture (the figures say so); with --model, on that
model. An OUTPUT_DIR that holds anything is refused; --overwrite replaces a previous paper-figures output there.
"""

import sys
from collections.abc import Sequence

from vanilla_transformer.commands.flags import add_trust_remote_code, at_least, command_parser
from vanilla_transformer.commands.runner import command

MAX_DPI = 600  # a print's resolution; the largest figure is then about 100 MB to draw


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("vanilla-transformer paper-figures", __doc__)
    parser.add_argument("output_dir", help="the folder to write the PNG files and index.md into")
    parser.add_argument("--model", help="a saved model folder for the attention maps and beam search")
    parser.add_argument("--source", help="the sentence of the attention maps and beam search")
    parser.add_argument("--target", help="its translation for the attention maps (default: the model's own)")
    parser.add_argument(
        "--layer", type=int, default=-1, help="the layer whose heads are drawn, from 1 (default: last)"
    )
    parser.add_argument(
        "--dpi", type=at_least(1, MAX_DPI), default=80, help=f"resolution of the PNG files (at most {MAX_DPI})"
    )
    parser.add_argument(
        "--overwrite", action="store_true", help="replace a previous paper-figures output in OUTPUT_DIR (only that)"
    )
    add_trust_remote_code(parser)
    args = parser.parse_args(argv)
    if args.layer == 0:
        parser.error("--layer counts from 1 (or -1 for the last)")
    for flag in ("source", "target"):
        if getattr(args, flag) is not None and not getattr(args, flag).strip():
            parser.error(f"--{flag} is empty: give a sentence, or leave the flag out")
    from vanilla_transformer.paper.output import write_paper_figures

    paths = write_paper_figures(
        args.output_dir,
        args.model,
        args.overwrite,
        args.source,
        args.target,
        args.layer,
        args.dpi,
        args.trust_remote_code,
    )
    for path in paths:
        print(path)
    return 0


if __name__ == "__main__":
    sys.exit(main())
