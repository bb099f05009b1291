"""`vanilla-transformer refresh-code`: give model folders of an earlier version the installed model
code and weights format.

Then it checks, with the installed code (never the folder's), that they load and decode.

    vanilla-transformer refresh-code outputs/vanilla-transformer [MORE_FOLDERS ...]

The old files are kept in `.previous_code/<time>/` inside each folder; if the check fails, they are put back and
the command exits with an error. What is checked, and why: vanilla_transformer/hub/refresh_code.py.
"""

import sys
from collections.abc import Sequence

from vanilla_transformer.commands.flags import command_parser
from vanilla_transformer.commands.runner import command


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("vanilla-transformer refresh-code", __doc__)
    parser.add_argument("folders", nargs="+", help="model folders written by this project (save_model_folder)")
    args = parser.parse_args(argv)
    from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS
    from vanilla_transformer.hub.refresh_code import RefreshError, refresh

    failed = 0
    for folder in args.folders:
        try:
            backup, changes = refresh(folder)
        except RefreshError as error:
            print(f"error: {folder}: {error}", file=sys.stderr)
            failed += 1
            continue
        upgraded = f"; upgraded: {', '.join(changes)}" if changes else ""
        print(
            f"{folder}: code refreshed (transformers {SUPPORTED_TRANSFORMERS}){upgraded}; it loads and decodes with "
            f"the installed code; old files in {backup}"
        )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
