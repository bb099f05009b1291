"""The ONNX export where its users run it: transformers.js in Node (tests/web/translate.mjs) and the page that
`export-onnx --web --assets` writes (vanilla_transformer/serving/web_page.py), in headless Chromium from a local static
server with every other host unresolvable, each giving the text that ONNX Runtime in Python gives on 20 sentences. All
three decode greedily, one sentence at a time, with the paper's output length (vanilla_transformer/serving/web/
decoding.mjs). The model is conftest's memorising model, with a BPE tokenizer of one token a word: its four sources
have known translations, and equal texts are equal tokens.

transformers.js comes from npm: $TRANSFORMERS_JS_FOLDER where CI installed it (tests/web/install.sh FOLDER), else
tests/web/install.sh installs it into a temporary folder. The tests skip, naming why, without node and npm, without
the packages (no registry to install them from), or without Chromium and its driver."""

import dataclasses
import functools
import json
import os
import random
import shutil
import subprocess
import threading
from http.server import SimpleHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import pytest
import yaml

from vanilla_transformer.serving import space, web_page
from vanilla_transformer.serving.web_page import ASSET_FILES, WebPageError, write_page

from .helpers import OFFLINE, free_port, headless_chromium, run_in_this_process

PROJECT = Path(__file__).resolve().parent.parent
INSTALL = PROJECT / "tests" / "web" / "install.sh"
TRANSLATE = PROJECT / "tests" / "web" / "translate.mjs"
NODE, NPM = shutil.which("node"), shutil.which("npm")
FOLDER_VARIABLE = "TRANSFORMERS_JS_FOLDER"
DIST = Path("node_modules", "@huggingface", "transformers", "dist")
# what the browser may reach: the test's server only (a request to the CDN or anywhere else fails to resolve)
CHROMIUM_FLAGS = (
    "--headless",
    "--no-sandbox",
    "--disable-gpu",
    "--disable-background-networking",
    "--disable-component-update",
    "--disable-sync",
    "--no-first-run",
    "--disable-dev-shm-usage",
    "--host-resolver-rules=MAP * ~NOTFOUND, EXCLUDE 127.0.0.1",
)


def tail(text: str, characters: int = 3000) -> str:
    return text[-characters:]


@pytest.fixture(scope="session")
def transformers_js(tmp_path_factory) -> Path:
    """The npm folder holding transformers.js and ONNX Runtime's packages: $TRANSFORMERS_JS_FOLDER, or a temporary
    folder tests/web/install.sh fills; skipped, naming why, where neither can be had, or where no model can be exported
    for it (the onnx extra)."""
    pytest.importorskip("onnxruntime", reason="the page translates an ONNX export: pip install -e '.[onnx]'")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript: pip install -e '.[onnx]'")
    if given := os.environ.get(FOLDER_VARIABLE):
        folder = Path(given)
        if not (folder / DIST / web_page.LIBRARY_FILE).is_file():
            pytest.fail(
                f"${FOLDER_VARIABLE}={given} holds no {DIST / web_page.LIBRARY_FILE}: tests/web/install.sh {given}"
            )
        return folder
    if not (NODE and NPM):
        pytest.skip("no node and npm to install transformers.js with (apt-get install nodejs npm)")
    folder = tmp_path_factory.mktemp("transformers_js")
    result = subprocess.run(["bash", str(INSTALL), str(folder)], capture_output=True, text=True, timeout=900)
    if result.returncode != 0:
        pytest.skip(f"tests/web/install.sh could not install transformers.js from npm: {tail(result.stderr, 600)}")
    return folder


@pytest.fixture(scope="module")
def memorising_bpe_folder(memorising_model, tmp_path_factory):
    """The memorising model (conftest.py) saved as a folder with a BPE tokenizer that spells token i as "w{i}", each
    word merged whole: transformers.js 3 reads BPE, not the WordLevel model of conftest's `memorising_folder`. Returns
    the folder, the four source sentences and their translations (their reverses)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    from vanilla_transformer.data.tokenization import SPECIAL_TOKENS
    from vanilla_transformer.hub.model_folder import save_model_folder

    model, sources, targets = memorising_model
    words = [f"w{index}" for index in range(len(SPECIAL_TOKENS), model.config.vocab_size)]
    vocab = {token: index for index, token in enumerate([*SPECIAL_TOKENS, *words])}
    # each word whole, by the vocabulary before any merge; anything else a character at a time, each <unk>
    backend = Tokenizer(models.BPE(vocab, [], unk_token="<unk>", ignore_merges=True))
    backend.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=backend, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    card_values = {"source_lang": "en", "target_lang": "de", "data": "four memorised pairs"}
    folder = tmp_path_factory.mktemp("memorising_bpe") / "model"
    save_model_folder(model, tokenizer, folder, card_values, decoding={"num_beams": 1})
    spell = lambda ids: " ".join(f"w{index}" for index in ids if index != model.config.eos_token_id)  # noqa: E731
    return folder, [spell(row.tolist()) for row in sources], [spell(row.tolist()) for row in targets]


@pytest.fixture(scope="module")
def sentences(memorising_bpe_folder) -> list[str]:
    """20 sentences: the memorising model's four sources (whose translations are known), and 16 other sequences of its
    words. Each word is one token, so that equal texts are equal tokens."""
    _, sources, _ = memorising_bpe_folder
    draw = random.Random(5)
    others = [" ".join(f"w{draw.randrange(4, 61)}" for _ in range(draw.randint(1, 7))) for _ in range(16)]
    return [*sources, *others]


@pytest.fixture(scope="module")
def exported(memorising_bpe_folder, transformers_js, tmp_path_factory) -> Path:
    """The memorising model exported for transformers.js with the page (`export-onnx --web --assets`), its assets
    from the npm packages."""
    from vanilla_transformer.commands.export_onnx import main

    out = tmp_path_factory.mktemp("web_export") / "web"
    done = run_in_this_process(
        main, [str(memorising_bpe_folder[0]), str(out), "--web", "--assets", str(transformers_js / DIST)]
    )
    assert done.returncode == 0, done.stderr
    return out


def paper_new_tokens(source_tokens: int, generation: dict) -> int:
    """decoding.mjs's output length: the length generation_config.json sets, else (`extra_output_tokens`, the model
    folder set none) input + 50, at most 4096."""
    if "extra_output_tokens" in generation:
        return min(source_tokens + generation["extra_output_tokens"], 4096)
    return generation.get("max_new_tokens") or generation["max_length"] - 1


@pytest.fixture(scope="module")
def python_greedy(exported, sentences) -> list[str]:
    """ONNX Runtime's greedy translations of `sentences` in Python (the export's own search), each sentence a batch
    of its own with its own output length, as the page and Node decode them."""
    from transformers import AutoTokenizer

    from vanilla_transformer.converters.onnx_decoding import Decoding, OnnxModel, greedy

    generation = json.loads((exported / "generation_config.json").read_text())
    config = json.loads((exported / "config.json").read_text())
    decoding = dataclasses.replace(Decoding.from_generation(generation, config), num_beams=1)
    model, tokenizer = OnnxModel(exported, threads=1), AutoTokenizer.from_pretrained(exported)
    texts = []
    for sentence in sentences:
        inputs = tokenizer([sentence], return_tensors="np")
        length = 1 + paper_new_tokens(inputs["input_ids"].shape[1], generation)
        tokens = greedy(model, inputs["input_ids"], inputs["attention_mask"], decoding, length)
        texts.append(tokenizer.decode(tokens[0], skip_special_tokens=True))
    return texts


@pytest.mark.slow
def test_the_python_reference_translates_the_memorised_sentences(python_greedy, memorising_bpe_folder):
    assert python_greedy[:4] == memorising_bpe_folder[2]  # the comparisons below compare real translations


@pytest.mark.slow
def test_transformers_js_in_node_gives_onnx_runtime_s_greedy_text(exported, transformers_js, sentences, python_greedy):
    if not NODE:
        pytest.skip("no node to run transformers.js in")
    result = subprocess.run(
        [NODE, str(TRANSLATE), str(transformers_js), str(exported), "fp32"],
        input=json.dumps(sentences),
        capture_output=True,
        text=True,
        timeout=600,
        env={**os.environ, **OFFLINE},
    )
    assert result.returncode == 0, tail(result.stderr)
    texts = json.loads(result.stdout)["texts"]
    assert [(index, text) for index, text in enumerate(texts) if text != python_greedy[index]] == []


class StaticFiles(SimpleHTTPRequestHandler):
    """A static server of one folder, cross-origin isolated (so that ONNX Runtime may use WebAssembly threads),
    recording each path asked for."""

    extensions_map = {
        **SimpleHTTPRequestHandler.extensions_map,
        ".mjs": "text/javascript",
        ".wasm": "application/wasm",
    }

    def __init__(self, *arguments, requested: list, **keywords):
        self.requested = requested
        super().__init__(*arguments, **keywords)

    def end_headers(self):
        self.send_header("Cross-Origin-Opener-Policy", "same-origin")
        self.send_header("Cross-Origin-Embedder-Policy", "require-corp")
        self.send_header("Cache-Control", "no-store")
        super().end_headers()

    def log_message(self, format, *arguments):
        self.requested.append(self.path)


@pytest.fixture(scope="module")
def served(exported):
    """The exported folder on a local static server: its address and the paths asked for."""
    requested = []
    handler = functools.partial(StaticFiles, directory=str(exported), requested=requested)
    server = ThreadingHTTPServer(("127.0.0.1", free_port()), handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}/", requested
    server.shutdown()
    server.server_close()
    thread.join()


@pytest.fixture(scope="module")
def browser():
    driver = headless_chromium(CHROMIUM_FLAGS, "dev", browser_log=True)
    driver.set_script_timeout(600)
    yield driver
    driver.quit()


def open_page(browser, url: str) -> None:
    """Open the page and wait until its script has loaded transformers.js (or failed, with the page's message)."""
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url)
    WebDriverWait(browser, 120).until(
        lambda driver: driver.execute_script(
            "return document.body.dataset.ready === 'true' || document.getElementById('status').textContent.startsWith('Error')"
        )
    )
    status = browser.execute_script("return document.getElementById('status').textContent")
    assert status == "Ready.", f"{status}\n{browser_log(browser)}"


def browser_log(browser) -> str:
    return "\n".join(entry["message"] for entry in browser.get_log("browser"))


def translate_in_page(browser, lines: list[str], **options) -> dict:
    result = browser.execute_async_script(
        "const done = arguments[arguments.length - 1];"
        "window.translateAll(arguments[0], arguments[1]).then(done, (error) => done({error: String(error)}));",
        lines,
        options,
    )
    assert "error" not in result, f"{result['error']}\n{browser_log(browser)}"
    return result


@pytest.mark.slow
def test_the_page_in_chromium_gives_onnx_runtime_s_greedy_text_with_no_network(
    browser, served, sentences, python_greedy
):
    url, requested = served
    open_page(browser, url + "index.html?threads=2")
    result = translate_in_page(browser, sentences, dtype="fp32", device="wasm")
    assert [(index, text) for index, text in enumerate(result["texts"]) if text != python_greedy[index]] == []
    assert (result["device"], result["threads"], result["crossOriginIsolated"]) == ("wasm", 2, True)
    assert all(seconds > 0 for seconds in result["seconds"])
    # the library and ONNX Runtime's WebAssembly came from the folder's assets/, the model from the folder
    assert {f"/assets/{name}" for name in ASSET_FILES} <= set(requested)
    assert {"/config.json", "/tokenizer.json", "/onnx/encoder_model.onnx", "/onnx/decoder_model_merged.onnx"} <= set(
        requested
    )


@pytest.mark.slow
def test_the_page_translates_what_is_typed_and_shows_the_time_a_sentence_takes(
    browser, served, sentences, python_greedy
):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import Select, WebDriverWait

    url, _ = served
    open_page(browser, url + "index.html")
    browser.find_element(By.ID, "source").send_keys("\n".join(sentences[:3]))
    Select(browser.find_element(By.ID, "device")).select_by_value("wasm")
    browser.find_element(By.ID, "translate").click()
    status = browser.find_element(By.ID, "status")
    WebDriverWait(browser, 300).until(
        lambda driver: " ms a sentence" in status.text or status.text.startswith("Error")
    )
    assert browser.find_element(By.ID, "target").get_attribute("value") == "\n".join(python_greedy[:3])
    assert status.text.startswith("3 sentences,") and "WebAssembly" in status.text, status.text
    times = [row.text for row in browser.find_elements(By.CSS_SELECTOR, "#times li")]
    assert len(times) == 3 and all(time.endswith(" ms") for time in times)
    assert "greedy search" in browser.find_element(By.ID, "decoding").text


def fake_export(folder: Path, precisions=("",)) -> Path:
    """A folder with empty graph files where an export puts them: enough for write_page, which reads none."""
    (folder / "onnx").mkdir(parents=True)
    for suffix in precisions:
        for graph in web_page.GRAPHS:
            (folder / "onnx" / f"{graph}{suffix}.onnx").write_bytes(b"")
    return folder


def page_settings(folder: Path) -> dict:
    text = (folder / "page.mjs").read_text()
    start = text.index("const SETTINGS = ") + len("const SETTINGS = ")
    return json.loads(text[start : text.index(";\n", start)])


def test_write_page_refuses_an_assets_folder_without_the_files_it_needs_naming_them(tmp_path):
    out = fake_export(tmp_path / "out")
    assets = tmp_path / "assets"
    assets.mkdir()
    (assets / "transformers.min.js").write_text("export {};")
    with pytest.raises(WebPageError) as refused:
        write_page(out, assets)
    message = str(refused.value)
    assert f"--assets {assets}: " in message and "missing transformers.min.js" not in message
    assert "missing ort-wasm-simd-threaded.jsep.mjs; missing ort-wasm-simd-threaded.jsep.wasm" in message
    assert f"@huggingface/transformers@{web_page.TRANSFORMERS_JS_VERSION}" in message
    assert sorted(path.name for path in out.iterdir()) == ["onnx"]  # nothing written
    with pytest.raises(WebPageError, match="not a folder"):
        write_page(out, tmp_path / "nowhere")


def test_write_page_refuses_a_folder_without_the_float32_model(tmp_path):
    with pytest.raises(WebPageError, match="missing onnx/encoder_model.onnx, onnx/decoder_model_merged.onnx"):
        write_page(tmp_path, None)


def test_the_page_offers_the_precisions_whose_files_exist_and_the_pinned_cdn_without_assets(tmp_path):
    plain = fake_export(tmp_path / "plain")
    write_page(plain, None)
    assert page_settings(plain) == {
        "library": web_page.CDN_LIBRARY,
        "wasmPaths": None,
        "version": web_page.TRANSFORMERS_JS_VERSION,
        "precisions": ["fp32"],
    }
    assert "@3." in web_page.CDN_LIBRARY and not (plain / "assets").exists()
    quantized = fake_export(tmp_path / "quantized", ("", "_quantized"))
    assets = tmp_path / "assets"
    assets.mkdir()
    for name in ASSET_FILES:
        (assets / name).write_text(name)
    write_page(quantized, assets)
    settings = page_settings(quantized)
    assert (settings["library"], settings["wasmPaths"], settings["precisions"]) == (
        "./assets/transformers.min.js",
        "./assets/",
        ["fp32", "q8"],
    )
    assert all((quantized / "assets" / name).read_text() == name for name in ASSET_FILES)
    assert {"index.html", "page.mjs", "decoding.mjs"} <= {path.name for path in quantized.iterdir()}


def test_export_onnx_refuses_an_assets_folder_without_the_files_before_exporting(memorising_folder, tmp_path):
    from vanilla_transformer.commands.export_onnx import main

    (tmp_path / "assets").mkdir()
    done = run_in_this_process(
        main, [str(memorising_folder), str(tmp_path / "out"), "--web", "--assets", str(tmp_path / "assets")]
    )
    assert done.returncode != 0 and "transformers.min.js" in done.stderr
    assert not (tmp_path / "out").exists()


# --- the folder as a static Space ------------------------------------------------------------------------------------


def card_header(folder: Path) -> dict:
    return yaml.safe_load((folder / "README.md").read_text().split("---\n")[1])


def test_the_pages_card_is_a_static_spaces_with_the_headers_that_give_webassembly_threads(tmp_path):
    folder = fake_export(tmp_path / "web", ("", "_quantized"))
    names = write_page(folder, None, "vanilla-en-de")
    header = card_header(folder)
    assert (header["sdk"], header["app_file"], header["title"]) == (
        "static",
        "index.html",
        "vanilla-en-de in the browser",
    )
    assert header["custom_headers"] == {
        "cross-origin-embedder-policy": "require-corp",
        "cross-origin-opener-policy": "same-origin",
        "cross-origin-resource-policy": "cross-origin",
    }
    assert len(header["short_description"]) <= 60
    body = (folder / "README.md").read_text().split("---\n", 2)[2]
    assert "vanilla-en-de" in body and "float32, int8 (q8" in body and "browser" in body and "float16" not in body
    assert "README.md" in names and space.space_upload_problems(folder, names) == []  # no app.py: a static Space


def test_a_static_spaces_card_must_name_a_page_that_is_sent_and_any_other_sdk_is_refused(tmp_path):
    folder = fake_export(tmp_path / "web")
    names = write_page(folder, None)
    assert card_header(folder)["title"] == "Translate in the browser"
    without_page = [name for name in names if name != "index.html"]
    assert space.space_upload_problems(folder, without_page) == [
        "README.md's app_file index.html is not among the files sent"
    ]
    (folder / "README.md").write_text((folder / "README.md").read_text().replace("sdk: static", "sdk: docker"))
    assert space.space_upload_problems(folder, names) == [
        "README.md is not a Space's card (no `sdk: gradio` or `sdk: static` in its header)"
    ]
    assert space.space_upload_problems(folder, [name for name in names if name != "README.md"]) == [
        "no README.md, the Space's card, among the files"
    ]


class RecordingHub:
    """Stands in for huggingface_hub.HfApi in the Space's upload: records the calls, touches no network."""

    calls: list = []

    def __init__(self, token=None):
        self.calls.append(("init", token))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id, kwargs["space_sdk"], kwargs["private"]))
        return f"https://huggingface.co/spaces/{repo_id}"

    def create_commit(self, repo_id, operations, **kwargs):
        self.calls.append(("create_commit", {op.path_in_repo: op.path_or_fileobj for op in operations}))


def recorded_export(folder: Path) -> Path:
    """A folder as `export-onnx --web` leaves it, without a model: empty graphs, the page and its card, the record."""
    from vanilla_transformer.converters.export_onnx import ONNX_EXPORT_RECORD, WRITTEN_BY
    from vanilla_transformer.mechanics.outputs import write_record

    fake_export(folder)
    (folder / "config.json").write_text("{}")
    write_page(folder, None, "vanilla-en-de")
    write_record(folder, ONNX_EXPORT_RECORD, WRITTEN_BY)
    return folder


def sent_names(calls: list) -> list[str]:
    (_, sent), *_ = [call for call in calls if call[0] == "create_commit"]
    return sorted(sent)


def test_the_page_upload_sends_exactly_the_exports_recorded_files_and_never_a_link(tmp_path, monkeypatch):
    from vanilla_transformer.converters.export_onnx import ONNX_EXPORT_RECORD

    monkeypatch.setattr(RecordingHub, "calls", [])
    monkeypatch.setattr(space, "HfApi", RecordingHub)
    folder = recorded_export(tmp_path / "web")
    recorded = sorted(json.loads((folder / ONNX_EXPORT_RECORD).read_text())["files"])
    (folder / ".env").write_text("HF_TOKEN=hf_secret\n")  # not the export's: stays local
    url = web_page.upload_page(folder, "someone/page", token="hf_token", private=True)
    assert url == "https://huggingface.co/spaces/someone/page"
    assert ("create_repo", "someone/page", "static", True) in RecordingHub.calls
    assert sent_names(RecordingHub.calls) == recorded and "README.md" in recorded and "index.html" in recorded
    assert ONNX_EXPORT_RECORD not in recorded and ".env" not in recorded

    RecordingHub.calls.clear()
    page = (folder / "index.html").read_bytes()
    (tmp_path / "outside.html").write_bytes(page)  # the same bytes, so only the link is wrong
    (folder / "index.html").unlink()
    (folder / "index.html").symlink_to(tmp_path / "outside.html")
    with pytest.raises(space.SpaceError, match="index.html is a symbolic link"):
        web_page.upload_page(folder, "someone/page")
    (folder / "index.html").unlink()
    (folder / "index.html").write_bytes(page.replace(b"<!doctype", b"<!DOCTYPE"))  # edited, the same size
    with pytest.raises(space.SpaceError, match="index.html does not match the sha256 recorded"):
        web_page.upload_page(folder, "someone/page")
    assert RecordingHub.calls == []


@pytest.mark.slow
def test_export_onnx_space_id_offline_says_so_in_one_line_and_keeps_the_export(
    memorising_bpe_folder, tmp_path, monkeypatch
):
    pytest.importorskip("onnxruntime", reason="the export needs the onnx extra: pip install -e '.[onnx]'")
    pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript: pip install -e '.[onnx]'")
    from huggingface_hub import constants

    from vanilla_transformer.commands.export_onnx import main
    from vanilla_transformer.converters.export_onnx import ONNX_EXPORT_RECORD, WRITTEN_BY
    from vanilla_transformer.mechanics.outputs import why_not_recorded

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    out = tmp_path / "web"
    done = run_in_this_process(main, [str(memorising_bpe_folder[0]), str(out), "--web", "--space_id", "someone/page"])
    errors = [line for line in done.stderr.splitlines() if line.startswith("error:")]
    assert done.returncode == 1 and len(errors) == 1, done.stderr[-3000:]
    assert "could not upload" in errors[0] and "offline mode is on (HF_HUB_OFFLINE" in errors[0]
    assert why_not_recorded(out, ONNX_EXPORT_RECORD, WRITTEN_BY) is None  # the export in place, as written
    assert card_header(out)["sdk"] == "static" and (out / "onnx" / "decoder_model_merged.onnx").is_file()

    monkeypatch.setattr(RecordingHub, "calls", [])
    monkeypatch.setattr(space, "HfApi", RecordingHub)
    web_page.upload_page(out, "someone/page")
    assert sent_names(RecordingHub.calls) == sorted(json.loads((out / ONNX_EXPORT_RECORD).read_text())["files"])
