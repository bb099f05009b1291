"""`vanilla-transformer space`: write a Hugging Face Space (Gradio) that runs the demo for a model on the Hub;
optionally upload it.

    vanilla-transformer space your-name/vanilla-en-de --output_dir outputs/vanilla-transformer/space
    vanilla-transformer space your-name/vanilla-en-de --output_dir outputs/vanilla-transformer/space \
        --space_id your-name/vanilla-en-de-demo [--private] [--token TOKEN]

What the Space's folder holds: vanilla_transformer/serving/space.py. Upload the model first (`vanilla-transformer push`):
the Space loads it from the Hub when it starts. An --output_dir that holds anything is refused, naming what it holds;
--overwrite replaces the files a previous `vanilla-transformer space` wrote there (unchanged since), nothing else.
"""

import sys
from collections.abc import Sequence

from vanilla_transformer.commands.flags import command_parser
from vanilla_transformer.commands.runner import command


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("vanilla-transformer space", __doc__)
    parser.add_argument("model_id", help="the Hub model the Space translates with, as user/name")
    parser.add_argument("--output_dir", required=True, help="where to write the Space's files (e.g. MODEL_DIR/space)")
    parser.add_argument("--space_id", help="upload the files to this Space, as user/name (created if needed)")
    parser.add_argument("--private", action="store_true", help="create the Space as private")
    parser.add_argument("--token", help="a Hub token with write access (default: the logged-in one)")
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the files a previous `vanilla-transformer space` wrote into --output_dir (only those)",
    )
    args = parser.parse_args(argv)
    from vanilla_transformer.serving.space import upload_space, write_space

    paths = write_space(args.model_id, args.output_dir, args.space_id, overwrite=args.overwrite)
    print(f"wrote the Space's {len(paths)} files into {args.output_dir}")
    if args.space_id:
        print(f"uploaded the Space to {upload_space(args.output_dir, args.space_id, args.token, args.private)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
