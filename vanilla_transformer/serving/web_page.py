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

The folder is also a static Hugging Face Space: `README.md` is its card (`SPACE_CARD`: `sdk: static`, the page as
`app_file`, and the cross-origin isolation headers that give ONNX Runtime's WebAssembly its threads), and
`upload_page` sends the files the export recorded (`export-onnx --web --space_id`) through the Space's upload
(serving/space.py). huggingface_hub's commit stores the large graphs with LFS itself: no .gitattributes is needed.
"""

import json
from importlib import resources
from pathlib import Path

from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.mechanics.files import file_problem, replace_file
from vanilla_transformer.mechanics.integrity import files_problem

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
CARD_FILE = "README.md"  # the folder as a static Space: its card
SETTINGS_MARK = '"__PAGE_SETTINGS__"'  # where page.mjs's settings go, as a JSON object
# transformers.js's names of the precisions and the suffix of their files (onnx/encoder_model{suffix}.onnx)
PRECISIONS = {"fp32": "", "fp16": "_fp16", "q8": "_quantized"}
GRAPHS = ("encoder_model", "decoder_model_merged")
# the headers that make the page cross-origin isolated (SharedArrayBuffer, so WebAssembly threads), which a static
# Space sends for every file when its card names them
ISOLATION_HEADERS = {
    "cross-origin-embedder-policy": "require-corp",
    "cross-origin-opener-policy": "same-origin",
    "cross-origin-resource-policy": "cross-origin",
}
SPACE_CARD = """---
title: {title}
emoji: 🔤
colorFrom: indigo
colorTo: green
sdk: static
app_file: index.html
short_description: Translate in your browser with transformers.js
custom_headers:
{headers}
---

# {heading}

A translator that runs in the visitor's browser: {model}, the Transformer of "Attention Is All You Need" exported
to ONNX by vanilla-transformer's `export-onnx --web` (its float32 graphs checked there to give the PyTorch model's
logits and tokens), run by [transformers.js](https://huggingface.co/docs/transformers.js) {version} {library}. What
is typed is translated in the tab, on WebAssembly or on WebGPU where the browser has it, and never leaves it.
Precisions offered: {precisions}. The headers above make the page cross-origin isolated, so that ONNX Runtime's
WebAssembly may run on several threads; the page says how many it used.
"""


class WebPageError(VanillaTransformerError):
    """The page cannot be written (an assets folder without the files it needs, a folder without a model), or its
    folder cannot go up as a Space (no record of the export, or changed since)."""


def write_page(out_dir: Path, assets: Path | None, model: str | None = None) -> list[str]:
    """Write the page and its Space's card (`SPACE_CARD`, naming `model`, the model folder's name) into `out_dir`, an
    exported folder (onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx, and the config and tokenizer files):
    transformers.js from its CDN, or with `assets`, from a copy of `assets`'s files in `out_dir/assets/`. Refuses
    (WebPageError, naming the files) a folder without the float32 graphs, or an `assets` folder without `ASSET_FILES`,
    before writing anything. Returns the names written, relative to `out_dir`."""
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
    replace_file(out_dir / CARD_FILE, space_card(model, precisions, assets is not None))
    return [*written, CARD_FILE]


def space_card(model: str | None, precisions: list[str], local: bool) -> str:
    """The folder's README.md as a static Space's card (`SPACE_CARD`) for `model`, offering `precisions`, with
    transformers.js from the folder's assets/ (`local`) or its CDN."""
    names = {"fp32": "float32", "fp16": "float16", "q8": "int8 (q8, ONNX Runtime's dynamic quantization)"}
    return SPACE_CARD.format(
        title=json.dumps(f"{model} in the browser" if model else "Translate in the browser", ensure_ascii=False),
        headers="\n".join(f"  {name}: {value}" for name, value in ISOLATION_HEADERS.items()),
        heading=f"{model} in the browser" if model else "Translate in the browser",
        model=f"the model {model}" if model else "the model",
        version=TRANSFORMERS_JS_VERSION,
        library="from this Space's own files" if local else "from its CDN (jsDelivr)",
        precisions=", ".join(names[precision] for precision in precisions),
    )


def upload_page(folder: str | Path, space_id: str, token: str | None = None, private: bool = False) -> str:
    """Upload the exported folder as the static Space `space_id` (created if needed); return its URL. What goes up is
    exactly what the export recorded (its record itself stays local), through the Space's upload and its checks
    (`upload_space`: regular files inside the folder, never a link; the card a static Space's), each file unchanged
    since the export. A folder without the export's record or its card: WebPageError; one that fails the checks or
    changed since: SpaceError; both before any Hub call. Offline, unreachable or refused: SpaceError saying which;
    nothing local is changed."""
    from vanilla_transformer.converters.export_onnx import ONNX_EXPORT_RECORD, WRITTEN_BY
    from vanilla_transformer.serving.space import SpaceError, check_space_upload, upload_space  # imports torch

    folder = Path(folder)
    try:
        files = json.loads((folder / ONNX_EXPORT_RECORD).read_text(encoding="utf-8"))["files"]
        if not isinstance(files, dict):
            raise TypeError(f"its file list is a {type(files).__name__}")
        names = sorted(files)
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise WebPageError(f"{folder} holds no readable record of a `{WRITTEN_BY}` output: {error}") from None
    if CARD_FILE not in names:
        raise WebPageError(f"{folder} has no Space's card: export it with --web")
    check_space_upload(folder, names)
    if problem := files_problem(folder, files):
        raise SpaceError(f"{folder} is not what `{WRITTEN_BY}` wrote, so it is not uploaded: {problem}")
    return upload_space(folder, space_id, token, private, names=names)


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
