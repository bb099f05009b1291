"""`vanilla-transformer export-onnx`: export a model folder to ONNX in the layout transformers.js loads (`pip install
"vanilla-transformer[onnx]"`), checked against the model through ONNX Runtime before anything is written.

    vanilla-transformer export-onnx MODEL_DIR OUTPUT_DIR [--quantize q8] [--quantize fp16] [--overwrite] [--web]
        [--assets DIR]

--web also writes a static page (index.html and its script) that translates in the browser with transformers.js;
--assets DIR takes transformers.js and ONNX Runtime's WASM files from DIR instead of the CDN. The layout and the check:
vanilla_transformer/converters/export_onnx.py.
"""

import sys
from collections.abc import Sequence
from pathlib import Path

from vanilla_transformer.commands.flags import command_parser
from vanilla_transformer.commands.runner import command, need

QUANTIZATIONS = ("q8", "fp16")


@command
def main(argv: Sequence[str] | None = None) -> int:
    parser = command_parser("vanilla-transformer export-onnx", __doc__)
    parser.add_argument("model_dir", help="a model folder (trained here, or converted)")
    parser.add_argument("output_dir", help="folder to write the export to")
    parser.add_argument(
        "--quantize",
        action="append",
        choices=QUANTIZATIONS,
        default=[],
        help="also write this variant (q8: dynamic int8, *_quantized.onnx; fp16: *_fp16.onnx); may be given twice",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace output_dir if it is a previous export")
    parser.add_argument("--web", action="store_true", help="also write a static page that translates in a browser")
    parser.add_argument("--assets", type=Path, help="with --web: a folder of transformers.js and ONNX Runtime files")
    args = parser.parse_args(argv)
    if args.assets is not None and not args.web:
        parser.error("--assets is for the page: give --web with it")
    from vanilla_transformer.converters.export_onnx import check_folders, export_onnx
    from vanilla_transformer.serving.web_page import check_assets, write_page

    # what the user gave is checked first, in seconds and without the onnx extra: the assets, then the folders
    if args.assets is not None:
        check_assets(args.assets)
    check_folders(args.model_dir, args.output_dir, args.overwrite)
    need("onnxruntime", "onnx", "export-onnx")

    def extra(staging: Path) -> list[str]:
        return write_page(staging, args.assets)

    summary = export_onnx(
        args.model_dir, args.output_dir, tuple(args.quantize), args.overwrite, extra if args.web else None
    )
    for name, value in summary.items():
        print(f"{name}: {value:.3g}", file=sys.stderr)
    print(args.output_dir)


if __name__ == "__main__":
    sys.exit(main())
