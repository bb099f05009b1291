"""`vanilla-transformer export-onnx`: export a model folder to ONNX in the layout transformers.js loads.

The export is checked against the model through ONNX Runtime before anything is written (`pip install
"vanilla-transformer[onnx]"`).

    vanilla-transformer export-onnx MODEL_DIR OUTPUT_DIR [--quantize q8] [--quantize fp16] [--overwrite] [--web]
        [--assets DIR] [--space_id user/name [--private] [--token TOKEN]]

--web also writes a static page (index.html and its script) that translates in the browser with transformers.js, and
README.md, the card that makes the folder a static Hugging Face Space; --assets DIR takes transformers.js and ONNX
Runtime's WASM files from DIR instead of the CDN. --space_id then uploads the folder to that Space (created if
needed): exactly the files the export wrote. Offline or refused, it says so and the folder stays as written. The
layout and the check: vanilla_transformer/converters/export_onnx.py; the page and its Space: serving/web_page.py.
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
    parser.add_argument("--space_id", help="with --web: upload the folder to this static Space, as user/name")
    parser.add_argument("--private", action="store_true", help="with --space_id: create the Space as private")
    parser.add_argument("--token", help="with --space_id: a Hub token with write access (default: the logged-in one)")
    args = parser.parse_args(argv)
    for flag, given in (("--assets", args.assets is not None), ("--space_id", args.space_id is not None)):
        if given and not args.web:
            parser.error(f"{flag} is for the page: give --web with it")
    if (args.private or args.token is not None) and args.space_id is None:
        parser.error("--private and --token are for the upload: give --space_id with them")
    from vanilla_transformer.converters.export_onnx import check_onnx_folders, export_onnx
    from vanilla_transformer.serving.web_page import check_assets, upload_page, write_page

    # what the user gave is checked first, in seconds and without the onnx extra: the assets, then the folders
    if args.assets is not None:
        check_assets(args.assets)
    check_onnx_folders(args.model_dir, args.output_dir, args.overwrite)
    need("onnxruntime", "onnx", "export-onnx")

    def extra(staging: Path) -> list[str]:
        return write_page(staging, args.assets, Path(args.model_dir).resolve().name)

    summary = export_onnx(
        args.model_dir, args.output_dir, tuple(args.quantize), args.overwrite, extra if args.web else None
    )
    for name, value in summary.items():
        print(f"{name}: {value:.3g}", file=sys.stderr)
    print(args.output_dir)
    if args.space_id:
        print(f"uploaded the page to {upload_page(args.output_dir, args.space_id, args.token, args.private)}")


if __name__ == "__main__":
    sys.exit(main())
