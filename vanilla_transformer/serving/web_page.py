"""Write the static page that translates with an ONNX export in the user's own browser: `export-onnx --web`.

The page (`index.html`, its script `page.mjs` and `decoding.mjs`, templates in `web/` beside this module) sits in the
exported folder itself and loads the model from its own URL with transformers.js's translation pipeline, so any static
server of that folder serves a translator (`python -m http.server`) and nothing leaves the machine. It translates each
line the user types, one at a time (transformers.js 3 keeps generating in a batch after a row's end token, and decodes
what follows it), greedily (transformers.js 3's generate takes one token a step whatever `num_beams` says), with the
paper's output length (input + 50 tokens, `decoding.mjs`), on WebAssembly, or WebGPU where the browser has it, and
shows the time each sentence takes. The precisions offered are those whose files the folder holds: float32 and,
where the `_quantized` (q8) or `_fp16` files exist, those.

The page imports transformers.js from its CDN at a pinned version (`TRANSFORMERS_JS_VERSION`); ONNX Runtime's
WebAssembly files then come from the same CDN. With `assets`, a folder holding the files of the npm package's `dist/`
(`ASSET_FILES`: the library's browser bundle and ONNX Runtime's WebAssembly build it loads), they are copied into
`assets/` beside the page, which takes both from there: the page then works with no network at all.

The page exposes `window.translateAll(lines, {dtype, device})` for scripts and tests: the texts and the seconds each
took, without typing.
"""

import json
from importlib import resources
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import file_problem, replace_file

# the release of transformers.js the page imports from the CDN, and the one tests/web/install.sh installs
TRANSFORMERS_JS_VERSION = "3.8.1"
CDN_LIBRARY = (
    f"https://cdn.jsdelivr.net/npm/@huggingface/transformers@{TRANSFORMERS_JS_VERSION}/dist/transformers.min.js"
)
LIBRARY_FILE = "transformers.min.js"  # the browser bundle (ES module) of the npm package's dist/
# ONNX Runtime's WebAssembly build that the bundle loads (threads, SIMD, and the WebGPU kernels: "jsep")
RUNTIME_FILES = ("ort-wasm-simd-threaded.jsep.mjs", "ort-wasm-simd-threaded.jsep.wasm")
ASSET_FILES = (LIBRARY_FILE, *RUNTIME_FILES)
ASSETS_FOLDER = "assets"
PAGE_FILES = ("index.html", "page.mjs", "decoding.mjs")  # written into the exported folder
SETTINGS_MARK = '"__PAGE_SETTINGS__"'  # where page.mjs's settings go, as a JSON object
# transformers.js's names of the precisions and the suffix of their files (onnx/encoder_model{suffix}.onnx)
PRECISIONS = {"fp32": "", "fp16": "_fp16", "q8": "_quantized"}
GRAPHS = ("encoder_model", "decoder_model_merged")


class WebPageError(VanillaTransformerError):
    """The page cannot be written: an assets folder without the files it needs, or a folder without a model."""


def write_page(out_dir: Path, assets: Path | None) -> list[str]:
    """Write the page into `out_dir`, an exported folder (onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx, and
    the config and tokenizer files): transformers.js from its CDN, or with `assets`, from a copy of `assets`'s files
    in `out_dir/assets/`. Refuses (WebPageError, naming the files) a folder without the float32 graphs, or an `assets`
    folder without `ASSET_FILES`, before writing anything. Returns the names written, relative to `out_dir`."""
    out_dir = Path(out_dir)
    precisions = available_precisions(out_dir)
    if assets is not None:
        check_assets(Path(assets))
    settings = {
        "library": f"./{ASSETS_FOLDER}/{LIBRARY_FILE}" if assets is not None else CDN_LIBRARY,
        "wasmPaths": f"./{ASSETS_FOLDER}/" if assets is not None else None,  # None: the library's own, on its CDN
        "version": TRANSFORMERS_JS_VERSION,
        "precisions": precisions,
    }
    written = []
    if assets is not None:
        (out_dir / ASSETS_FOLDER).mkdir(exist_ok=True)
        for name in ASSET_FILES:
            replace_file(out_dir / ASSETS_FOLDER / name, (Path(assets) / name).read_bytes())
            written.append(f"{ASSETS_FOLDER}/{name}")
    templates = resources.files("vanilla_transformer.serving") / "web"
    for name in PAGE_FILES:
        text = (templates / name).read_text(encoding="utf-8")
        if name == "page.mjs":
            text = text.replace(SETTINGS_MARK, json.dumps(settings), 1)
        replace_file(out_dir / name, text)
        written.append(name)
    return written


def available_precisions(out_dir: Path) -> list[str]:
    """The precisions (transformers.js's dtype names) whose two graphs are in `out_dir/onnx/`, float32 first; refuses
    a folder without the float32 graphs, naming them."""
    present = [
        precision
        for precision, suffix in PRECISIONS.items()
        if all((out_dir / "onnx" / f"{graph}{suffix}.onnx").is_file() for graph in GRAPHS)
    ]
    if "fp32" not in present:
        missing = [f"onnx/{graph}.onnx" for graph in GRAPHS if not (out_dir / "onnx" / f"{graph}.onnx").is_file()]
        raise WebPageError(f"The page needs an exported model in {out_dir}: missing {', '.join(missing)}.")
    return present


def check_assets(assets: Path) -> None:
    """Refuse (WebPageError) an `--assets` folder that is not a folder or lacks one of `ASSET_FILES` as a regular
    file, naming each missing file and where they come from."""
    if not assets.is_dir():
        raise WebPageError(f"--assets {assets}: not a folder.")
    problems = [problem for name in ASSET_FILES if (problem := file_problem(assets, name)) is not None]
    if problems:
        raise WebPageError(
            f"--assets {assets}: {'; '.join(problems)}. The folder must hold the files of the dist/ folder of the npm "
            f"package @huggingface/transformers@{TRANSFORMERS_JS_VERSION} ({', '.join(ASSET_FILES)}): "
            f"`npm install --prefix DIR @huggingface/transformers@{TRANSFORMERS_JS_VERSION}`, then "
            "--assets DIR/node_modules/@huggingface/transformers/dist."
        )
