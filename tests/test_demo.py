"""The demo (vanilla_transformer/serving/demo.py) as a person and a script use it: a real browser on the page, gradio_client
on /translate; and the Space that `vanilla-transformer space` writes. The model is the session's memorising model, whose four
sentences have known translations (their reverses), so what the page shows can be checked word for word."""

import dataclasses
import inspect
import json
import os
import shutil
import subprocess
import sys
import threading
import time
import urllib.request
from pathlib import Path

import pytest
import torch
import yaml

from modeling_vanilla_transformer import SUPPORTED_TRANSFORMERS
from vanilla_transformer.commands import space as space_command
from vanilla_transformer.serving import demo as app
from vanilla_transformer.serving import space
from vanilla_transformer.serving.sources import read_lines

from .helpers import OFFLINE, free_port, headless_chromium

PROJECT = Path(__file__).resolve().parent.parent
SERVER_ENV = {**OFFLINE, "GRADIO_ANALYTICS_ENABLED": "False"}


@pytest.fixture(scope="module")
def gr():
    return pytest.importorskip("gradio", reason="the demo needs gradio: pip install -e '.[demo]'")


@pytest.fixture(scope="module")
def translator(memorising_folder):
    return app.load_translator(str(memorising_folder[0]))


def test_lines_translate_as_one_batch_in_their_order(translator, memorising_folder, monkeypatch):
    _, sources, targets = memorising_folder
    batch_sizes = []
    translate_sentences = app.translate_sentences
    monkeypatch.setattr(
        app, "translate_sentences", lambda *a, **k: batch_sizes.append(k["batch_size"]) or translate_sentences(*a, **k)
    )
    text = "\n".join([sources[2], "", sources[0], sources[3]])
    assert app.translate_text(translator, text, 1, 1.0) == ("\n".join([targets[2], "", targets[0], targets[3]]), "")
    assert batch_sizes == [4]


def test_long_input_and_bad_settings_are_refused_with_a_message(gr, translator, memorising_folder):
    sources = memorising_folder[1]
    too_long = " ".join([sources[0]] * 5)  # 35 tokens; the model has 32 positions
    translation, image, message = app.respond(
        translator, f"{sources[1]}\n{too_long}", 4, 0.6, True, "Encoder self-attention", 1, 1
    )
    assert (translation, image) == ("", None)
    assert "Line 2 is too long: 35 tokens" in message and "at most 32" in message
    with pytest.raises(app.DemoInputError, match="The beam size must be a whole number from 1 to 8, got 0"):
        app.translate_text(translator, sources[0], 0, 0.6)
    with pytest.raises(app.DemoInputError, match="at most 32 at a time"):
        app.translate_text(translator, "\n".join(sources * 9), 1, 0.6)


def limited(translator, **limits) -> "app.Translator":
    """The session's translator under other limits."""
    return dataclasses.replace(translator, limits=app.DemoLimits(**limits))


@pytest.mark.parametrize(
    ("arguments", "message"),
    [
        (("w40 \ud800 w7",), "not valid Unicode: character 5 is a lone surrogate (U+D800)"),
        ((123,), "The text must be a string, got int"),
        (("w40", "abc"), "The beam size must be a whole number from 1 to 8, got 'abc'"),
        (("w40", 1e308), "The beam size must be a whole number from 1 to 8, got 1e+308"),
        (("w40", 100000), "The beam size must be a whole number from 1 to 8, got 100000"),
        (("w40", 2.5), "The beam size must be a whole number from 1 to 8, got 2.5"),
        (("w40", 4, float("nan")), "The length penalty must be a number from 0 to 2, got nan"),
        (("w40", 4, "0.6"), "The length penalty must be a number from 0 to 2, got '0.6'"),
    ],
)
def test_the_api_refuses_each_bad_argument_with_a_message_naming_it(gr, translator, monkeypatch, arguments, message):
    translated = []
    monkeypatch.setattr(app, "translate_sentences", lambda *a, **k: translated.append(a) or [])
    with pytest.raises(gr.Error) as refused:
        app.api_endpoint(translator)(*arguments)
    assert message in refused.value.message and translated == []


@pytest.mark.parametrize(
    ("limits", "text", "message"),
    [
        ({"lines": 3}, "w40\nw41\nw42\nw43", "The input has 4 lines; the demo translates at most 3 at a time."),
        (
            {"line_tokens": 5},
            "w40 w41\nw40 w41 w42 w43 w44 w45",
            "Line 2 is too long: 6 tokens, and the demo translates at most 5",
        ),
        (
            {"request_tokens": 10},
            "w40 w41 w42 w43\nw40 w41 w42 w43\nw40 w41 w42",
            "The input has 11 tokens; the demo translates at most 10 per request",
        ),
        ({"lines": 1, "line_tokens": 2}, "w40 " * 60, "The text has 240 characters; the demo reads at most 100."),
    ],
)
def test_a_request_over_the_limits_is_refused_before_anything_is_translated(
    translator, monkeypatch, limits, text, message
):
    translated = []
    monkeypatch.setattr(app, "translate_sentences", lambda *a, **k: translated.append(a) or [])
    with pytest.raises(app.DemoInputError) as refused:
        app.translate_text(limited(translator, **limits), text, 1, 0.6)
    assert message in str(refused.value) and translated == []


def test_the_demo_splits_a_text_into_the_lines_the_translator_reads_from_a_file(translator, monkeypatch, tmp_path):
    text = "w40 w41\u2028w42\x0cw43\x85w44\rw45\r\nw46\n"  # one "\n" inside: two lines, in a file as on the page
    seen = []
    monkeypatch.setattr(app, "translate_sentences", lambda model, tokenizer, lines, **k: seen.extend(lines) or lines)
    app.translate_text(translator, text, 1, 0.6)
    (tmp_path / "source.txt").write_bytes(text.encode())
    assert seen == read_lines(str(tmp_path / "source.txt")) == ["w40 w41\u2028w42\x0cw43\x85w44\rw45", "w46"]


def test_a_request_that_runs_out_of_its_time_budget_is_stopped_with_a_message(gr, translator, memorising_folder):
    _, sources, targets = memorising_folder
    out_of_time = limited(translator, seconds=1e-9)  # over as soon as generation first looks at the time
    translation, _, message = app.respond(out_of_time, sources[0], 1, 0.6, False, "Encoder self-attention", 1, 1)
    assert translation == targets[0].split()[0]  # stopped after its first token
    assert "ran out of the demo's time budget (1e-09 s per request)" in message
    with pytest.raises(gr.Error, match="time budget"):  # a script gets an error, not a cut translation
        app.api_endpoint(out_of_time)(sources[0])


def test_an_attention_picture_over_its_token_limit_is_refused_and_the_translation_stays(
    gr, translator, memorising_folder, monkeypatch
):
    _, sources, targets = memorising_folder
    computed = []
    monkeypatch.setattr(app, "compute_attentions", lambda *a, **k: computed.append(a))
    small_pictures = limited(translator, attention_tokens=6)  # the source has 7 tokens
    translation, image, message = app.respond(small_pictures, sources[0], 1, 0.6, True, "Encoder self-attention", 1, 1)
    assert translation == targets[0] and image is None and computed == []
    assert "The attention picture would be 8 x 7 tokens; the demo draws at most 6 tokens a side" in message


def test_an_empty_box_changes_nothing_on_the_page(gr, translator):
    assert app.respond(translator, " \n ", 4, 0.6, True, "Encoder self-attention", 1, 1) == (gr.skip(),) * 3


def test_the_attention_image_draws_the_chosen_layer_and_head_over_the_tokens(
    translator, memorising_folder, monkeypatch
):
    _, sources, targets = memorising_folder
    drawn = []
    plot = app.plot_attention_grid
    monkeypatch.setattr(app, "plot_attention_grid", lambda *args: drawn.append(args) or plot(*args))
    image = app.attention_image(translator, sources[0], targets[0], "Encoder-decoder attention", 2, 3)
    weights, queries, keys, title = drawn[0]
    everything = app.compute_attentions(translator.model, translator.tokenizer, sources[0], targets[0])
    assert torch.equal(weights[0, 0], everything["cross_attentions"][1, 2])  # layer 2, head 3
    assert keys == sources[0].split() and queries == ["<s>", *targets[0].split()]  # this tokenizer adds no </s>
    assert title == "Encoder-decoder attention" and image.width > 200 and image.height > 200
    with pytest.raises(app.DemoInputError, match="2 layers of 4 heads"):
        app.attention_image(translator, sources[0], targets[0], "Decoder self-attention", 3, 1)


def test_the_page_offers_the_cards_languages_and_the_folders_decoding(
    gr, memorising_model, memorising_folder, tmp_path
):
    from transformers import PreTrainedTokenizerFast

    from vanilla_transformer.hub.model_folder import save_model_folder

    tokenizer = PreTrainedTokenizerFast.from_pretrained(memorising_folder[0])
    card_values = {"source_lang": "fr", "target_lang": "en"}
    folder = save_model_folder(
        memorising_model[0], tokenizer, tmp_path / "model", card_values, {"num_beams": 3, "length_penalty": 0.8}
    )
    demo = app.build_demo(str(folder))
    sliders = {block.label: block.value for block in values_of(demo, gr.Slider)}
    assert sliders["Beam size"] == 3 and sliders["Length penalty"] == 0.8
    labels = {block.label for block in values_of(demo, gr.Textbox)}
    assert labels == {"Source (French)", "Translation (English)"}


def test_the_models_decoding_defaults_are_clamped_to_the_limits_and_the_page_says_so(
    gr, memorising_model, memorising_folder, tmp_path, capsys
):
    from transformers import PreTrainedTokenizerFast

    from vanilla_transformer.hub.model_folder import save_model_folder

    tokenizer = PreTrainedTokenizerFast.from_pretrained(memorising_folder[0])
    folder = save_model_folder(memorising_model[0], tokenizer, tmp_path / "model", None, {"num_beams": 32})
    demo = app.build_demo(str(folder))
    (beams,) = [block for block in values_of(demo, gr.Slider) if block.label == "Beam size"]
    assert (beams.value, beams.maximum) == (8, 8)
    assert "asks for 32 beams; this demo allows at most 8" in capsys.readouterr().err
    assert any("asks for 32 beams" in block.value for block in values_of(demo, gr.Markdown))
    endpoint = app.api_endpoint(app.load_translator(str(folder)))
    assert inspect.signature(endpoint).parameters["num_beams"].default == 8


def test_the_page_and_its_config_name_the_model_and_never_its_path(gr, memorising_folder):
    folder = memorising_folder[0]
    demo = app.build_demo(str(folder))
    config = json.dumps(demo.get_config_file())
    assert demo.title == "vanilla-transformer: vanilla-transformer-en-de"  # the card's model name
    assert str(folder) not in config and str(folder.parent) not in config


def values_of(demo, kind) -> list:
    return [block for block in demo.blocks.values() if isinstance(block, kind)]


def test_a_folder_that_is_not_a_model_says_why_on_the_page(gr, tmp_path):
    demo = app.build_demo(str(tmp_path))
    messages = [block.value for block in values_of(demo, gr.Markdown)]
    assert len(messages) == 1 and "could not be loaded" in messages[0] and "no config.json" in messages[0]


def test_a_model_that_cannot_be_loaded_is_named_on_the_page_without_its_path(gr, tmp_path):
    folder = tmp_path / "some-model"
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"vocab_size": 10**9}))
    (message,) = [block.value for block in values_of(app.build_demo(str(folder)), gr.Markdown)]
    assert "some-model/config.json: vocab_size 1,000,000,000" in message and str(tmp_path) not in message


def test_a_spaces_owner_changes_a_limit_with_its_variable_and_a_bad_value_is_named(gr, memorising_folder, monkeypatch):
    monkeypatch.setenv("VANILLA_DEMO_MAX_BEAMS", "3")
    monkeypatch.setenv("VANILLA_DEMO_TIME_BUDGET", "2.5")
    assert app.DemoLimits.from_environment() == app.DemoLimits(beams=3, seconds=2.5)
    monkeypatch.setenv("VANILLA_DEMO_MAX_LINES", "1e9")
    (message,) = [block.value for block in values_of(app.build_demo(str(memorising_folder[0])), gr.Markdown)]
    assert "VANILLA_DEMO_MAX_LINES='1e9': the demo's limit must be a whole number >= 1" in message


def test_a_space_serves_the_model_of_its_settings_else_of_its_card(monkeypatch, tmp_path):
    space.write_space("someone/from-card", tmp_path)
    monkeypatch.setenv("MODEL_ID", "someone/from-settings")
    assert app.space_model(tmp_path / "README.md") == "someone/from-settings"
    monkeypatch.delenv("MODEL_ID")
    assert app.space_model(tmp_path / "README.md") == "someone/from-card"
    assert app.space_model(tmp_path / "no-card.md") is None


# --- the demo in its own process, as `vanilla-transformer demo MODEL` starts it -----------------------------------


def start_app(argv: list[str], cwd: Path, log: Path, extra_env: dict | None = None) -> tuple[subprocess.Popen, str]:
    """`python -m vanilla_transformer demo ...` on a free loopback port, offline; returns the process and its URL once
    the page answers."""
    port = free_port()
    env = {**os.environ, **SERVER_ENV, "GRADIO_SERVER_NAME": "127.0.0.1", "GRADIO_SERVER_PORT": str(port)}
    process = subprocess.Popen(
        [sys.executable, "-m", "vanilla_transformer", "demo", *argv],
        cwd=cwd,
        env={**env, **(extra_env or {})},
        stdout=log.open("w"),
        stderr=subprocess.STDOUT,
    )
    url = f"http://127.0.0.1:{port}/"
    deadline = time.monotonic() + 180
    while time.monotonic() < deadline:
        if process.poll() is not None:
            raise AssertionError(f"the demo exited with {process.returncode}:\n{log.read_text()[-3000:]}")
        try:
            with urllib.request.urlopen(url, timeout=5) as response:
                if response.status == 200:
                    return process, url
        except OSError:
            time.sleep(0.5)
    process.kill()
    raise AssertionError(f"the demo did not answer at {url} within 180 s:\n{log.read_text()[-3000:]}")


@pytest.fixture(scope="module")
def server(gr, memorising_folder, tmp_path_factory):
    log = tmp_path_factory.mktemp("app") / "app.log"
    process, url = start_app([str(memorising_folder[0])], PROJECT, log)
    yield url
    process.terminate()
    process.wait(timeout=30)


@pytest.mark.slow
def test_the_translate_endpoint_answers_gradio_client_with_optional_settings(server, memorising_folder):
    from gradio_client import Client

    _, sources, targets = memorising_folder
    client = Client(server, verbose=False)
    assert client.predict(sources[1], api_name="/translate") == targets[1]
    assert (
        client.predict(f"{sources[0]}\n{sources[3]}", 1, 1.0, api_name="/translate") == f"{targets[0]}\n{targets[3]}"
    )
    with pytest.raises(Exception, match="too long"):
        client.predict(" ".join(sources * 2), api_name="/translate")


@pytest.mark.slow
def test_a_short_request_is_answered_while_a_long_one_is_translating(gr, memorising_folder, monkeypatch):
    from gradio_client import Client

    _, sources, targets = memorising_folder
    release, started = threading.Event(), threading.Event()
    translate_sentences = app.translate_sentences

    def slow_for_the_first_source(model, tokenizer, lines, **kwargs):
        if lines == [sources[0]]:  # the long request: holds its worker until the short one is answered
            started.set()
            assert release.wait(timeout=120), "the short request was never answered"
        return translate_sentences(model, tokenizer, lines, **kwargs)

    monkeypatch.setattr(app, "translate_sentences", slow_for_the_first_source)
    demo = app.build_demo(str(memorising_folder[0]))  # queued as `serve` launches it
    demo.launch(prevent_thread_lock=True, server_name="127.0.0.1", server_port=free_port(), quiet=True)
    try:
        client = Client(demo.local_url, verbose=False)
        long_job = client.submit(sources[0], api_name="/translate")
        assert started.wait(timeout=60)
        short = threading.Thread(target=lambda: answers.append(client.predict(sources[1], api_name="/translate")))
        answers = []
        short.start()
        short.join(timeout=60)
        release.set()
        assert answers == [targets[1]]
        assert long_job.result(timeout=60) == targets[0]
    finally:
        release.set()
        demo.close()


# --- a real browser on the page ------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def browser():
    driver = headless_chromium(
        ("--headless=new", "--no-sandbox", "--disable-dev-shm-usage", "--window-size=1280,1400"), "demo"
    )
    yield driver
    driver.quit()


def open_page(browser, url):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    browser.get(url)
    return WebDriverWait(browser, 60).until(lambda driver: driver.find_element(By.CSS_SELECTOR, "#source textarea"))


def translation_on_page(browser, timeout: float = 60) -> str:
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    box = browser.find_element(By.CSS_SELECTOR, "#translation textarea")
    WebDriverWait(browser, timeout).until(lambda driver: box.get_attribute("value"))
    return box.get_attribute("value")


@pytest.mark.slow
def test_typing_a_sentence_and_clicking_translate_shows_its_translation(server, browser, memorising_folder):
    from selenium.webdriver.common.by import By

    _, sources, targets = memorising_folder
    open_page(browser, server).send_keys(sources[2])
    browser.find_element(By.ID, "translate").click()
    assert translation_on_page(browser) == targets[2]
    assert "Source (English)" in browser.page_source and "Translation (German)" in browser.page_source


@pytest.mark.slow
def test_asking_for_attention_draws_its_image_on_the_page(server, browser, memorising_folder):
    from selenium.webdriver.common.by import By
    from selenium.webdriver.support.ui import WebDriverWait

    _, sources, targets = memorising_folder
    open_page(browser, server).send_keys(sources[0])
    browser.find_element(By.XPATH, "//button[.//*[contains(text(), 'Attention maps')]]").click()
    WebDriverWait(browser, 30).until(
        lambda driver: driver.find_element(By.CSS_SELECTOR, "#show_attention input")
    ).click()
    browser.find_element(By.ID, "translate").click()
    assert translation_on_page(browser) == targets[0]
    image = WebDriverWait(browser, 60).until(lambda driver: driver.find_element(By.CSS_SELECTOR, "#attention img"))
    WebDriverWait(browser, 30).until(
        lambda driver: driver.execute_script("return arguments[0].naturalWidth", image) > 200
    )


# --- the Space ------------------------------------------------------------------------------------------------------


def test_the_space_holds_the_app_its_code_requirements_and_a_spaces_card(tmp_path):
    paths = space.write_space("someone/vanilla-en-de", tmp_path / "space", "someone/vanilla-en-de-demo")
    assert sorted(str(path.relative_to(tmp_path / "space")) for path in paths) == sorted(space.SPACE_FILES)
    assert (tmp_path / "space" / "app.py").read_text() == space.SPACE_APP
    header = yaml.safe_load((tmp_path / "space" / "README.md").read_text().split("---\n")[1])
    assert (
        header["sdk"] == "gradio" and header["app_file"] == "app.py" and header["models"] == ["someone/vanilla-en-de"]
    )
    assert len(header["short_description"]) <= 60 and header["sdk_version"].count(".") == 2
    requirements = (tmp_path / "space" / "requirements.txt").read_text().split()
    assert f"transformers{SUPPORTED_TRANSFORMERS}" in requirements and "torch" in requirements


# In a Space, the project is what the Space holds: its modules come from the Space's folder or not at all (an installed
# copy, editable ones included, would hide a module the Space lacks).
ONLY_THE_SPACES_COPIES = """
import importlib.machinery, os, sys
PROJECT = {"vanilla_transformer", "configuration_vanilla_transformer", "modeling_vanilla_transformer",
           "pipeline_vanilla_transformer", "generate_vanilla_transformer", "train_accelerate", "app"}
class OnlyTheSpace:
    @staticmethod
    def find_spec(name, path=None, target=None):
        if name.split(".")[0] in PROJECT:
            spec = importlib.machinery.PathFinder.find_spec(name, [os.getcwd()] if path is None else path)
            if spec is None:
                raise ImportError(f"{name} is not in the Space")
            return spec
sys.meta_path.insert(0, OnlyTheSpace)
"""


@pytest.mark.slow
def test_the_spaces_app_runs_its_own_copies_and_reads_the_model_from_its_card(tmp_path):
    space.write_space("someone/vanilla-en-de", tmp_path)
    code = ONLY_THE_SPACES_COPIES
    code += "import app, vanilla_transformer.serving.demo as d, vanilla_transformer.serving.translate as t, modeling_vanilla_transformer as m\n"
    code += "from pathlib import Path\n"
    code += "print(d.space_model(Path(app.__file__).with_name('README.md')), app.__file__, d.__file__, t.__file__, "
    code += "m.__file__, sep='\\n')"
    env = {key: value for key, value in os.environ.items() if key != "MODEL_ID"}
    result = subprocess.run(
        [sys.executable, "-c", code],
        cwd=tmp_path,
        env={**env, **SERVER_ENV},
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    model, *files = result.stdout.split()
    assert model == "someone/vanilla-en-de"
    assert all(Path(file).resolve().is_relative_to(tmp_path.resolve()) for file in files), files


def test_uploading_offline_says_so_in_one_line_and_keeps_the_files(tmp_path, monkeypatch, capsys):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "HF_HUB_OFFLINE", True)
    assert space_command.main(["someone/model", "--output_dir", str(tmp_path), "--space_id", "someone/demo"]) == 1
    error = capsys.readouterr().err
    assert error.count("\n") == 1 and "could not upload" in error and "offline mode is on (HF_HUB_OFFLINE" in error
    assert all((tmp_path / name).is_file() for name in space.SPACE_FILES)


def test_an_unreachable_hub_is_named_as_such(tmp_path, monkeypatch):
    from huggingface_hub import constants

    monkeypatch.setattr(constants, "ENDPOINT", f"http://127.0.0.1:{free_port()}")  # nothing listens there
    space.write_space("someone/model", tmp_path)
    with pytest.raises(space.SpaceError, match="the Hub cannot be reached"):
        space.upload_space(tmp_path, "someone/demo", token="hf_not_a_real_token")
    assert all((tmp_path / name).is_file() for name in space.SPACE_FILES)


def test_a_space_is_never_written_over_a_model_folder_or_another_card(memorising_folder, tmp_path):
    model_folder = memorising_folder[0]
    card = (model_folder / "README.md").read_text()
    with pytest.raises(space.SpaceError, match="is a model folder"):
        space.write_space("someone/model", model_folder)
    assert (model_folder / "README.md").read_text() == card and not (model_folder / "app.py").exists()
    (tmp_path / "README.md").write_text("# my notes\n")
    with pytest.raises(space.SpaceError, match="not a Space's card"):
        space.write_space("someone/model", tmp_path)


def test_the_space_writer_refuses_a_folder_of_the_users_files_even_with_overwrite(tmp_path, capsys):
    folder = tmp_path / "space"
    folder.mkdir()
    (folder / "app.py").write_text("# the user's own app\n")
    (folder / "notes.txt").write_text("mine\n")
    for overwrite in ([], ["--overwrite"]):
        assert space_command.main(["someone/model", "--output_dir", str(folder), *overwrite]) == 1
        error = capsys.readouterr().err
        assert error.count("\n") == 1 and "app.py" in error and "Traceback" not in error
    assert (folder / "app.py").read_text() == "# the user's own app\n" and sorted(os.listdir(folder)) == [
        "app.py",
        "notes.txt",
    ]


def test_overwrite_replaces_only_what_the_previous_space_export_wrote_and_only_unchanged(tmp_path):
    folder = tmp_path / "space"
    space.write_space("someone/old-model", folder)
    (folder / "notes.txt").write_text("mine\n")
    with pytest.raises(
        space.SpaceError, match="holds a Space that `vanilla-transformer space` wrote: add --overwrite to replace it"
    ):
        space.write_space("someone/new-model", folder)
    space.write_space("someone/new-model", folder, overwrite=True)
    assert "someone/new-model" in (folder / "README.md").read_text()
    assert (folder / "notes.txt").read_text() == "mine\n"

    (folder / "app.py").write_text("# edited since\n")
    with pytest.raises(space.SpaceError, match=r"app.py \(changed since vanilla-transformer space wrote it\)"):
        space.write_space("someone/new-model", folder, overwrite=True)
    assert (folder / "app.py").read_text() == "# edited since\n"


def test_overwrite_keeps_a_file_that_a_stopped_export_listed_but_never_wrote(tmp_path):
    folder = tmp_path / "space"
    space.write_space("someone/model", folder)
    record = json.loads((folder / space.SPACE_RECORD).read_text())
    record["files"]["app.py"] = None  # what an export stopped between listing and writing app.py leaves
    (folder / space.SPACE_RECORD).write_text(json.dumps(record))
    (folder / "app.py").write_text("# the user's own app\n")
    with pytest.raises(space.SpaceError, match=r"app.py \(listed by an export that did not finish"):
        space.write_space("someone/model", folder, overwrite=True)
    assert (folder / "app.py").read_text() == "# the user's own app\n"


@pytest.mark.parametrize("name", ["app.py", "README.md", "vanilla_transformer"])
def test_the_space_writer_never_writes_through_a_link(tmp_path, name):
    outside = tmp_path / "outside"
    outside.mkdir()
    (outside / "demo.py").write_text("# someone else's\n")
    target = outside if name == "vanilla_transformer" else outside / "demo.py"
    folder = tmp_path / "space"
    space.write_space("someone/model", folder)
    if name == "vanilla_transformer":
        shutil.rmtree(folder / name)
    else:
        (folder / name).unlink()
    (folder / name).symlink_to(target)
    with pytest.raises(space.SpaceError, match=f"{name} is a symbolic link"):
        space.write_space("someone/model", folder, overwrite=True)
    assert (outside / "demo.py").read_text() == "# someone else's\n" and os.listdir(outside) == ["demo.py"]


class RecordingSpaceApi:
    """Stands in for huggingface_hub.HfApi in the Space's upload: records the calls, touches no network."""

    calls: list = []

    def __init__(self, token=None):
        self.calls.append(("init", token))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", repo_id))
        return f"https://huggingface.co/spaces/{repo_id}"

    def create_commit(self, repo_id, operations, **kwargs):
        self.calls.append(("create_commit", {op.path_in_repo: op.path_or_fileobj for op in operations}))


def test_a_space_upload_sends_only_its_regular_files_and_never_a_links_target(tmp_path, monkeypatch):
    monkeypatch.setattr(RecordingSpaceApi, "calls", [])
    monkeypatch.setattr(space, "HfApi", RecordingSpaceApi)
    folder = tmp_path / "space"
    space.write_space("someone/model", folder)
    (folder / ".env").write_text("HF_TOKEN=hf_secret\n")
    space.upload_space(folder, "someone/demo")
    (_, sent), *_ = [call for call in RecordingSpaceApi.calls if call[0] == "create_commit"]
    assert sorted(sent) == sorted(space.SPACE_FILES)

    RecordingSpaceApi.calls.clear()
    token = tmp_path / "token"
    token.write_text("hf_secret_token\n")
    (folder / "requirements.txt").unlink()
    (folder / "requirements.txt").symlink_to(token)
    with pytest.raises(space.SpaceError, match="requirements.txt is a symbolic link"):
        space.upload_space(folder, "someone/demo")
    assert RecordingSpaceApi.calls == []
