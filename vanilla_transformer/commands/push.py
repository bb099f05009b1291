"""`vanilla-transformer push`: upload an existing model folder to the Hugging Face Hub, after checking that it is
complete.

    vanilla-transformer push outputs/vanilla-transformer --hub_model_id your-name/vanilla-en-de

The token comes from --token, the HF_TOKEN variable or `hf auth login`. Only the model repository's files are
uploaded (an allow-list, printed first: weights, configs, tokenizer, code, card); checkpoints, logs, results,
hypotheses and anything else in the folder stay local.
"""

import sys
from collections.abc import Sequence

from vanilla_transformer.commands.flags import command_parser
from vanilla_transformer.commands.runner import command
from vanilla_transformer.mechanics.names import COMMIT_MESSAGE


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("vanilla-transformer push", __doc__)
    parser.add_argument("folder", help="a folder written by save_model_folder (e.g. the training --output_dir)")
    parser.add_argument("--hub_model_id", required=True, help="the model repo, as user/name or organisation/name")
    parser.add_argument("--private", action="store_true", help="create the repo as private")
    parser.add_argument("--token", help="a Hub token with write access (default: the logged-in one)")
    parser.add_argument("--commit_message", default=COMMIT_MESSAGE)
    args = parser.parse_args(argv)
    from vanilla_transformer.hub.model_folder import hub_folder_problems
    from vanilla_transformer.hub.upload import push_folder_to_hub

    problems = hub_folder_problems(args.folder)
    if problems:
        print(f"error: {args.folder} is not ready for the Hub:", *problems, sep="\n- ", file=sys.stderr)
        return 1
    url = push_folder_to_hub(args.folder, args.hub_model_id, args.token, args.private, args.commit_message)
    print(f"uploaded {args.folder} to {url}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
