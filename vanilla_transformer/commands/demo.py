"""`vanilla-transformer demo`: a web page that translates with a saved model and shows its attention (Gradio:
`pip install "vanilla-transformer[demo]"`).

    vanilla-transformer demo outputs/vanilla-transformer       # a model folder
    vanilla-transformer demo your-name/vanilla-en-de           # or a model on the Hub
    GRADIO_SERVER_PORT=8080 GRADIO_SERVER_NAME=0.0.0.0 vanilla-transformer demo MODEL   # Gradio's own settings apply

Without MODEL, the model comes from the MODEL_ID variable. What the page does: vanilla_transformer/serving/demo.py.
"""

import os
import sys
from collections.abc import Sequence

from vanilla_transformer.commands.flags import command_parser
from vanilla_transformer.commands.runner import command, need


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("vanilla-transformer demo", __doc__)
    parser.add_argument("model", nargs="?", default=os.environ.get("MODEL_ID"), help="a model folder or Hub id")
    args = parser.parse_args(argv)
    if not args.model:
        parser.error("give a model folder or Hub id: vanilla-transformer demo MODEL (or set MODEL_ID)")
    need("gradio", "demo", "the demo")
    from vanilla_transformer.serving.demo import serve

    serve(args.model)
    return 0


if __name__ == "__main__":
    sys.exit(main())
