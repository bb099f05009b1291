"""The Hub-ready folder: every file and config entry, the problems hub_folder_problems finds, the upload (no
network)."""

import json
import shutil
import sys
from pathlib import Path

import pytest
import torch
from huggingface_hub import constants as hub_constants
from huggingface_hub import get_session
from huggingface_hub.errors import OfflineModeIsEnabled
from safetensors.torch import save_file
from transformers import AutoModelForSeq2SeqLM, AutoTokenizer

from vanilla_transformer.commands import push as push_command
from vanilla_transformer.hub import upload
from vanilla_transformer.hub.model_card import MODEL_ID_PLACEHOLDER
from vanilla_transformer.hub.model_folder import files_to_upload, hub_folder_problems, save_model_folder
from vanilla_transformer.mechanics.names import CODE_FILES, CUSTOM_GENERATE

from .helpers import CARD_VALUES, ENGLISH, random_tiny_model, save_tiny_model_folder, train_tiny_tokenizer


@pytest.fixture
def model_folder(tmp_path) -> Path:
    return save_tiny_model_folder(tmp_path / "model", CARD_VALUES)


def test_saved_folder_has_every_file_and_config_entry(model_folder):
    for name in (
        "config.json",
        "model.safetensors",
        "generation_config.json",
        "tokenizer.json",
        "tokenizer_config.json",
        "README.md",
        *CODE_FILES,
    ):
        assert (model_folder / name).is_file(), name
    project_root = Path(upload.__file__).resolve().parents[2]
    for name in CODE_FILES:  # the Hub gets the project's current code
        assert (model_folder / name).read_text() == (project_root / name).read_text()

    config = json.loads((model_folder / "config.json").read_text())
    assert config["auto_map"]["AutoConfig"] == "configuration_vanilla_transformer.VanillaTransformerConfig"
    assert config["auto_map"]["AutoModelForSeq2SeqLM"] == (
        "modeling_vanilla_transformer.VanillaTransformerForConditionalGeneration"
    )
    assert config["custom_pipelines"] == {
        "translation": {
            "impl": "pipeline_vanilla_transformer.VanillaTransformerTranslationPipeline",
            "pt": ["AutoModelForSeq2SeqLM"],
        }
    }
    generation = json.loads((model_folder / "generation_config.json").read_text())
    assert {key: generation.get(key) for key in ("num_beams", "length_penalty", "early_stopping")} == {
        "num_beams": 4,
        "length_penalty": 0.6,
        "early_stopping": True,
    }
    special_ids = ("decoder_start_token_id", "bos_token_id", "eos_token_id", "pad_token_id")
    assert [generation[key] for key in special_ids] == [1, 1, 2, 0]
    assert hub_folder_problems(model_folder) == []


def test_loading_from_the_saved_folder_gives_the_same_model(tmp_path):
    tokenizer = train_tiny_tokenizer()
    model = random_tiny_model(len(tokenizer))
    folder = save_model_folder(model, tokenizer, tmp_path / "model")
    reloaded_tokenizer = AutoTokenizer.from_pretrained(folder)
    reloaded = AutoModelForSeq2SeqLM.from_pretrained(folder).eval()
    inputs = reloaded_tokenizer(ENGLISH[:2], padding=True, return_tensors="pt")
    assert inputs["input_ids"].tolist() == tokenizer(ENGLISH[:2], padding=True)["input_ids"]
    decoder_input_ids = inputs["input_ids"][:, :4]
    assert torch.equal(
        reloaded(**inputs, decoder_input_ids=decoder_input_ids).logits,
        model(**inputs, decoder_input_ids=decoder_input_ids).logits,
    )
    assert reloaded.generation_config.num_beams == 4 and reloaded.generation_config.length_penalty == 0.6


def test_the_folder_decodes_as_its_scores_were_measured(tmp_path):
    tokenizer = train_tiny_tokenizer()
    decoding = {"num_beams": 5, "length_penalty": 1.2}
    folder = save_model_folder(random_tiny_model(len(tokenizer)), tokenizer, tmp_path / "model", decoding=decoding)
    generation = AutoModelForSeq2SeqLM.from_pretrained(folder).generation_config
    assert (generation.num_beams, generation.length_penalty, generation.early_stopping) == (5, 1.2, True)
    assert "beam size 5 and length penalty 1.2" in (folder / "README.md").read_text()


def test_check_model_folder_names_missing_files_and_entries(model_folder, tmp_path):
    (model_folder / "pipeline_vanilla_transformer.py").unlink()
    (model_folder / "tokenizer.json").unlink()
    config = json.loads((model_folder / "config.json").read_text())
    del config["auto_map"]["AutoModelForSeq2SeqLM"]
    (model_folder / "config.json").write_text(json.dumps(config))
    problems = hub_folder_problems(model_folder)
    assert "missing pipeline_vanilla_transformer.py" in problems
    assert "missing tokenizer.json" in problems
    assert "config.json: auto_map has no AutoModelForSeq2SeqLM" in problems
    assert any("refers to pipeline_vanilla_transformer" in problem for problem in problems)
    assert hub_folder_problems(tmp_path / "nowhere") == [f"{tmp_path / 'nowhere'} is not a folder"]


def test_check_model_folder_finds_a_missing_pipeline_entry_and_weights(model_folder):
    config = json.loads((model_folder / "config.json").read_text())
    del config["custom_pipelines"]
    (model_folder / "config.json").write_text(json.dumps(config))
    (model_folder / "model.safetensors").unlink()
    assert hub_folder_problems(model_folder) == [
        "missing the weights: no .safetensors file",
        "config.json: custom_pipelines has no translation pipeline",
    ]


class RecordingHfApi:
    """Stands in for huggingface_hub.HfApi: records the calls, touches no network."""

    calls: list = []

    def __init__(self, token=None):
        self.calls.append(("init", {"token": token}))

    def create_repo(self, repo_id, **kwargs):
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        return f"https://huggingface.co/{repo_id}"

    def create_commit(self, repo_id, operations, **kwargs):
        self.calls.append(("create_commit", {"repo_id": repo_id, "operations": list(operations), **kwargs}))


@pytest.fixture
def recording_api(monkeypatch):
    monkeypatch.setattr(RecordingHfApi, "calls", [])
    monkeypatch.setattr(upload, "HfApi", RecordingHfApi)
    return RecordingHfApi


def uploaded(recording_api) -> dict:
    """path in repo -> what the recorded commit would send (bytes, or the local path it reads)."""
    (_, commit), *_ = [call for call in recording_api.calls if call[0] == "create_commit"]
    return {operation.path_in_repo: operation.path_or_fileobj for operation in commit["operations"]}


def test_push_folder_to_hub_creates_the_repo_and_uploads_the_model_files(model_folder, recording_api):
    url = upload.push_folder_to_hub(model_folder, "someone/vanilla-en-de", token="hf_x", private=True)

    assert url == "https://huggingface.co/someone/vanilla-en-de"
    (_, init), (_, create), (_, commit) = recording_api.calls
    assert init == {"token": "hf_x"}
    assert create == {"repo_id": "someone/vanilla-en-de", "private": True, "exist_ok": True}
    assert commit["repo_id"] == "someone/vanilla-en-de"
    files = uploaded(recording_api)
    assert set(files) == {path.name for path in model_folder.iterdir() if path.is_file()} | {CUSTOM_GENERATE}
    assert Path(files["model.safetensors"]) == model_folder / "model.safetensors"
    readme = (model_folder / "README.md").read_text()
    assert files["README.md"] == readme.encode("utf-8")
    assert MODEL_ID_PLACEHOLDER not in readme and 'model="someone/vanilla-en-de"' in readme


def test_push_uploads_only_the_model_repository_files_never_secrets_logs_or_results(
    model_folder, recording_api, capsys
):
    model_files = {path.name for path in model_folder.iterdir() if path.is_file()} | {CUSTOM_GENERATE}
    local_only = {
        ".env": "HF_TOKEN=hf_secret\n",
        "notes.txt": "my notes\n",
        "train_log.jsonl": "{}\n",
        "results.json": "{}\n",
        "validation.hyp.txt": "a\n",
        "test.hyp.txt": "b\n",
        "eval_results.json": "{}\n",
        "optimizer.bin": "x",
    }
    for name, text in local_only.items():
        (model_folder / name).write_text(text)
    (model_folder / "checkpoints" / "step_000100").mkdir(parents=True)
    (model_folder / "checkpoints" / "step_000100" / "model.safetensors").write_bytes(b"not uploaded")

    upload.push_folder_to_hub(model_folder, "someone/vanilla-en-de")
    assert set(uploaded(recording_api)) == model_files
    printed = capsys.readouterr().out
    assert "model.safetensors" in printed and ".env" not in printed and "results.json" not in printed


def test_a_sharded_model_uploads_its_shards_and_index(model_folder, recording_api):
    (model_folder / "model.safetensors").rename(model_folder / "model-00001-of-00002.safetensors")
    save_file({"shard": torch.zeros(2)}, model_folder / "model-00002-of-00002.safetensors")
    (model_folder / "model.safetensors.index.json").write_text("{}")
    assert hub_folder_problems(model_folder) == []
    upload.push_folder_to_hub(model_folder, "someone/vanilla-en-de")
    files = uploaded(recording_api)
    assert {
        "model-00001-of-00002.safetensors",
        "model-00002-of-00002.safetensors",
        "model.safetensors.index.json",
    } <= set(files)


@pytest.mark.parametrize("name", ["model.safetensors", "README.md", "tokenizer.json", "special_tokens_map.json"])
def test_a_linked_file_is_never_uploaded_and_is_named_in_the_error(model_folder, tmp_path, recording_api, name):
    token = tmp_path / "token"
    token.write_text("hf_secret_token\n")
    (model_folder / name).unlink(missing_ok=True)
    (model_folder / name).symlink_to(token)
    assert name not in files_to_upload(model_folder)
    with pytest.raises(upload.FolderNotReadyError, match=f"{name} is a symbolic link \\(to {token}\\)"):
        upload.push_folder_to_hub(model_folder, "someone/vanilla-en-de")
    assert recording_api.calls == [] and token.read_text() == "hf_secret_token\n"


def test_a_file_that_is_not_what_its_name_says_is_refused_before_the_upload(model_folder, recording_api):
    (model_folder / "tokenizer.json").write_text("HF_TOKEN=hf_secret")
    (model_folder / "model-00002-of-00002.safetensors").write_bytes(b"not weights")
    (model_folder / "pipeline_vanilla_transformer.py").write_text("def broken(:\n")
    problems = hub_folder_problems(model_folder)
    assert any(problem.startswith("tokenizer.json is not valid JSON") for problem in problems), problems
    assert any(problem.startswith("model-00002-of-00002.safetensors is not valid safetensors") for problem in problems)
    assert any(problem.startswith("pipeline_vanilla_transformer.py is not valid Python") for problem in problems)
    with pytest.raises(ValueError, match="is not ready for the Hub"):
        upload.push_folder_to_hub(model_folder, "someone/vanilla-en-de")
    assert recording_api.calls == []


def test_the_card_is_rewritten_after_the_upload_by_replacing_it_never_through_a_link(
    model_folder, tmp_path, recording_api, monkeypatch
):
    outside = tmp_path / "my_card.md"
    outside.write_text("the user's own card")

    class LinkingHfApi(RecordingHfApi):  # the card becomes a link while the upload runs
        def create_commit(self, repo_id, operations, **kwargs):
            (model_folder / "README.md").unlink()
            (model_folder / "README.md").symlink_to(outside)

    monkeypatch.setattr(upload, "HfApi", LinkingHfApi)
    upload.push_folder_to_hub(model_folder, "someone/vanilla-en-de")
    assert outside.read_text() == "the user's own card"
    readme = model_folder / "README.md"
    assert not readme.is_symlink() and 'model="someone/vanilla-en-de"' in readme.read_text()


def test_weights_under_another_name_are_not_taken_for_the_model(model_folder):
    (model_folder / "model.safetensors").rename(model_folder / "backup.safetensors")
    assert "missing the weights: no .safetensors file" in hub_folder_problems(model_folder)


class UnreachableHfApi(RecordingHfApi):
    error: Exception | None = None

    def create_repo(self, repo_id, **kwargs):
        raise self.error


def hub_client_error(name: str, message: str) -> Exception:
    """The exception `name` of the HTTP library the installed huggingface_hub uses (httpx for 1.x, httpx2 for 2.x)."""
    client_library = sys.modules[type(get_session()).__module__.split(".")[0]]
    return getattr(client_library, name)(message)


@pytest.mark.parametrize(
    "error, says",
    [
        (OfflineModeIsEnabled("Cannot reach https://huggingface.co: offline mode is enabled."), "offline mode is on"),
        (
            hub_client_error("ConnectError", "[Errno -2] Name or service not known"),
            "the Hub cannot be reached (ConnectError",
        ),
        (ConnectionError("connection refused"), "the Hub cannot be reached"),
        (RuntimeError("401 Unauthorized"), "the Hub refused it (RuntimeError: 401 Unauthorized); check the token"),
    ],
)
def test_a_failed_upload_says_why_and_changes_nothing_locally(model_folder, monkeypatch, error, says):
    monkeypatch.setattr(UnreachableHfApi, "error", error)
    monkeypatch.setattr(upload, "HfApi", UnreachableHfApi)
    before = {path.name: path.read_bytes() for path in model_folder.iterdir() if path.is_file()}
    with pytest.raises(upload.HubUploadError, match="Nothing was uploaded") as failed:
        upload.push_folder_to_hub(model_folder, "someone/vanilla-en-de")
    assert says in str(failed.value)
    assert {path.name: path.read_bytes() for path in model_folder.iterdir() if path.is_file()} == before


def test_offline_the_push_command_ends_in_a_clear_error_not_a_traceback(model_folder, monkeypatch, capsys):
    monkeypatch.setattr(hub_constants, "HF_HUB_OFFLINE", True)  # the real HfApi, stopped before any request
    readme = (model_folder / "README.md").read_text()
    assert push_command.main([str(model_folder), "--hub_model_id", "someone/x"]) == 1
    err = capsys.readouterr().err
    assert err.startswith("error: could not upload") and "offline mode is on" in err and "Traceback" not in err
    assert (model_folder / "README.md").read_text() == readme


def test_push_refuses_an_incomplete_folder(model_folder, recording_api):
    (model_folder / "generation_config.json").unlink()
    with pytest.raises(ValueError, match="missing generation_config.json"):
        upload.push_folder_to_hub(model_folder, "someone/vanilla-en-de")
    assert recording_api.calls == []


def test_push_command_checks_then_uploads(model_folder, tmp_path, recording_api, capsys):
    incomplete = tmp_path / "incomplete"
    shutil.copytree(model_folder, incomplete)
    (incomplete / "README.md").unlink()
    assert push_command.main([str(incomplete), "--hub_model_id", "someone/x"]) == 1
    assert "missing README.md" in capsys.readouterr().err
    assert recording_api.calls == []

    assert push_command.main([str(model_folder), "--hub_model_id", "someone/x", "--private"]) == 0
    assert [name for name, _ in recording_api.calls] == ["init", "create_repo", "create_commit"]
    assert recording_api.calls[1][1]["private"] is True
    assert "https://huggingface.co/someone/x" in capsys.readouterr().out


def test_every_file_of_a_saved_folder_is_written_with_the_users_umask(tmp_path, umask):
    folder = save_tiny_model_folder(tmp_path / "model")
    modes = {
        str(path.relative_to(folder)): path.stat().st_mode & 0o777 for path in folder.rglob("*") if path.is_file()
    }
    assert "model.safetensors" in modes and set(modes.values()) == {0o666 & ~umask}, modes
