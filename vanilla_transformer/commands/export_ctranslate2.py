"""`vanilla-transformer export-ctranslate2`: export a saved model to CTranslate2, a C++ engine for fast
CPU and GPU decoding.

It needs the export extra (`pip install "vanilla-transformer[export]"`).

    vanilla-transformer export-ctranslate2 MODEL_DIR OUTPUT_DIR [--quantization int8] [--overwrite]

The output folder may not be the model folder, nor inside it, nor hold it. If it exists, --overwrite replaces it only
when it is a previous CTranslate2 export. The export is moved into place only once complete: a failed one (a full
disk) leaves the output folder as it was. How the model maps onto CTranslate2:
vanilla_transformer/converters/export_ctranslate2.py.
"""

import sys
from collections.abc import Sequence

from vanilla_transformer.commands.flags import add_deprecated_alias, command_parser
from vanilla_transformer.commands.runner import command, need
from vanilla_transformer.converters.ctranslate2_types import WEIGHT_TYPES


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("vanilla-transformer export-ctranslate2", __doc__)
    parser.add_argument("model_dir", help="folder written by save_pretrained (a tokenizer in it is used if present)")
    parser.add_argument("output_dir", help="folder to write the CTranslate2 model to")
    parser.add_argument("--quantization", choices=WEIGHT_TYPES, help="weight type written (default: float32)")
    parser.add_argument("--overwrite", action="store_true", help="replace output_dir if it is a previous export")
    add_deprecated_alias(parser, "--force", "--overwrite")
    args = parser.parse_args(argv)
    need("ctranslate2", "export", "export-ctranslate2")
    from vanilla_transformer.converters.export_ctranslate2 import convert_to_ctranslate2

    print(convert_to_ctranslate2(args.model_dir, args.output_dir, args.quantization, args.overwrite))


if __name__ == "__main__":
    sys.exit(main())
