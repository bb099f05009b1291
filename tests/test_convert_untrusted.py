"""Untrusted sources refused in one error line, with nothing run, built or written: checkpoints that would run code
or need unlisted classes, weights that lie about their size, sizes over the loader's bounds, links out of the source
folder, hostile names and Hub repositories' unread files."""

import collections
import json
import os
import re
import shutil
from pathlib import Path

import pytest
import safetensors.torch
import torch

from vanilla_transformer.commands.convert import main
from vanilla_transformer.converters.convert import convert
from vanilla_transformer.converters.core import ConversionError, Problems
from vanilla_transformer.converters.untrusted import check_sizes, hub_patterns
from vanilla_transformer.model.loading import MAX_LAYERS, ModelFolderError, check_folder_sizes

from .sources import fairseq_args, fairseq_state, fake_omegaconf, write_fairseq


class TrainingMeter:
    """A class a fairseq checkpoint might pickle (fairseq's meters): not on the converter's allow-list."""


class StopwatchMeter(TrainingMeter):
    """Another."""


def leave_marker(path: str) -> None:
    Path(path).touch()


class RunsCode:
    """Unpickling it would call leave_marker(marker): what a malicious checkpoint does, with a harmless function."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return leave_marker, (self.marker,)


class SubclassedOrderedDict(collections.OrderedDict):
    """A container subclass: a class of its own, not on the allow-list."""


class RunsShell:
    """Unpickling it would run a shell command (os.system) that leaves a marker."""

    def __init__(self, marker: Path):
        self.marker = str(marker)

    def __reduce__(self):
        return os.system, (f"touch {self.marker}",)


class Payload:
    """What a hostile pytorch_model.bin pickles: unpickling it would run `os.system`."""

    def __reduce__(self):
        return (os.system, ("touch ran",))


def lying_safetensors(path: Path, lie: str) -> None:
    """Rewrite the safetensors file at `path` with a header that lies about its data in one way."""
    raw = path.read_bytes()
    size = int.from_bytes(raw[:8], "little")
    header, data = json.loads(raw[8 : 8 + size]), raw[8 + size :]
    name = next(key for key in header if key != "__metadata__")
    entry = header[name]
    if lie == "header longer than the file":
        path.write_bytes((len(raw) * 2).to_bytes(8, "little") + raw[8:])
        return
    if lie == "header not JSON":
        text = b"{not json" + b" " * (size - 9)
        path.write_bytes(size.to_bytes(8, "little") + text + data)
        return
    if lie == "offsets past the data":
        entry["data_offsets"] = [entry["data_offsets"][0], len(data) + 4096]
    elif lie == "shape larger than its bytes":
        entry["shape"] = [dimension * 1000 for dimension in entry["shape"]]
    elif lie == "unknown dtype":
        entry["dtype"] = "Q13"
    elif lie == "negative shape":
        entry["shape"] = [-1, *entry["shape"][1:]]
    text = json.dumps(header).encode()
    path.write_bytes(len(text).to_bytes(8, "little") + text + data)


SAFETENSORS_LIES = [
    "header longer than the file",
    "header not JSON",
    "offsets past the data",
    "shape larger than its bytes",
    "unknown dtype",
    "negative shape",
]


@pytest.mark.parametrize("zip_format", [True, False])
def test_a_checkpoint_needing_an_unlisted_class_is_refused_naming_it(fsmt_model, fairseq_files, tmp_path, zip_format):
    args = fairseq_args()
    args.meter = TrainingMeter()
    path = write_fairseq(
        tmp_path / "wmt", fsmt_model, fairseq_files, args=args, _use_new_zipfile_serialization=zip_format
    )
    with pytest.raises(ConversionError, match=r"needs tests\.test_convert_untrusted\.TrainingMeter to be unpickled"):
        convert(path, tmp_path / "out")


def test_every_unlisted_class_of_a_zip_checkpoint_is_named_at_once(fsmt_model, fairseq_files, tmp_path):
    args = fairseq_args()
    args.meters = [TrainingMeter(), StopwatchMeter()]
    path = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files, args=args)
    with pytest.raises(
        ConversionError,
        match=r"needs tests\.test_convert_untrusted\.StopwatchMeter, tests\.test_convert_untrusted\.Train",
    ):
        convert(path, tmp_path / "out")


@pytest.mark.parametrize("zip_format", [True, False])
def test_a_checkpoint_that_would_run_code_is_refused_without_running_it(
    fsmt_model, fairseq_files, tmp_path, zip_format
):
    marker = tmp_path / "code-ran"
    path = write_fairseq(
        tmp_path / "wmt", fsmt_model, fairseq_files, args=RunsCode(marker), _use_new_zipfile_serialization=zip_format
    )
    with pytest.raises(ConversionError, match=r"needs tests\.test_convert_untrusted\.leave_marker"):
        convert(path, tmp_path / "out")
    assert not marker.exists()


@pytest.mark.parametrize("zip_format", [True, False])
@pytest.mark.parametrize(
    "inside, named",
    [
        (lambda marker: RunsShell(marker), f"{os.system.__module__}.system"),  # posix.system
        (lambda marker: SubclassedOrderedDict(a=1), "tests.test_convert_untrusted.SubclassedOrderedDict"),
    ],
)
def test_an_omegaconf_cfg_holding_any_other_class_is_refused_naming_it_and_runs_nothing(
    fsmt_model, fairseq_files, tmp_path, monkeypatch, zip_format, inside, named
):
    DictConfig = fake_omegaconf(monkeypatch)  # noqa: N806
    marker = tmp_path / "code-ran"
    path = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files)
    state = torch.load(path, weights_only=False)  # our own file
    cfg = DictConfig({"model": DictConfig(vars(fairseq_args())), "common": DictConfig({"x": inside(marker)})})
    torch.save({**state, "args": None, "cfg": cfg}, path, _use_new_zipfile_serialization=zip_format)
    with pytest.raises(ConversionError, match=rf"{re.escape(str(path))} needs {re.escape(named)}"):
        convert(path, tmp_path / "out")
    assert not marker.exists() and not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "abuse",
    [
        {"max_source_positions": "many"},
        {"encoder_embed_dim": [32]},
        {"dropout": "high"},
        {"activation_fn": 5},
        {"encoder_attention_heads": True},
        {"source_lang": ["en"]},
    ],
    ids=str,
)
def test_a_hand_made_namespace_of_wrong_types_is_one_error_line(fsmt_model, fairseq_files, tmp_path, abuse, capsys):
    """A checkpoint's `args` hold what anyone pickled: a value of the wrong type is named, never a traceback."""
    checkpoint = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files, args=fairseq_args(**abuse))
    assert main([str(checkpoint), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert error.strip().splitlines()[-1].startswith("error: ") and "Traceback" not in error, error
    assert next(iter(abuse)) in error, error
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize(
    "content, message",
    [
        (b"", "is not a torch checkpoint: it is empty"),
        (b'{"model": {}}', "is not a torch checkpoint: it is neither a zip archive nor a pickle"),
        (b"hello world\n", "is not a torch checkpoint: it is neither a zip archive nor a pickle"),
        (b"\x80\x02" + bytes(range(256)) * 8, "is not a readable torch checkpoint"),
    ],
    ids=["empty", "json", "text", "garbled pickle"],
)
def test_a_file_that_is_no_checkpoint_is_one_error_line(tmp_path, capsys, content, message):
    (tmp_path / "model.pt").write_bytes(content)
    code = main([str(tmp_path / "model.pt"), str(tmp_path / "out"), "--source_lang", "en", "--target_lang", "de"])
    error = capsys.readouterr().err
    assert code == 1 and error.startswith("error: ") and error.count("\n") == 1, error
    assert message in error


def test_a_tensor_that_repeats_its_storage_is_refused_before_it_is_copied(fsmt_model, fairseq_files, tmp_path):
    """A stride-0 view saves a few bytes and would become gigabytes once copied: refused, naming the tensor."""
    state = fairseq_state(fsmt_model)
    state["encoder.layers.0.fc1.bias"] = torch.zeros(1).expand(2 * 10**9)
    checkpoint = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files, state=state)
    assert checkpoint.stat().st_size < 10 * 2**20
    with pytest.raises(
        ConversionError, match=r"model.encoder.layers.0.fc1.bias holds 2,000,000,000 values over a storage of 1"
    ):
        convert(checkpoint, tmp_path / "out", source_lang="en", target_lang="de")
    assert not (tmp_path / "out").exists()


def test_a_pickled_pytorch_model_bin_is_one_error_line_and_never_runs(marian_source, tmp_path, capsys, monkeypatch):
    monkeypatch.chdir(tmp_path)
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    weights = {name: tensor for name, tensor in safetensors.torch.load_file(source / "model.safetensors").items()}
    (source / "model.safetensors").unlink()
    torch.save({**weights, "payload": Payload()}, source / "pytorch_model.bin")
    assert main([str(source), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert (
        error.strip().splitlines()[-1].startswith("error: ") and "pytorch_model.bin holds more than tensors" in error
    ), error
    assert "Traceback" not in error and not (tmp_path / "ran").exists()


@pytest.mark.parametrize("lie", SAFETENSORS_LIES)
def test_a_lying_safetensors_header_is_one_error_line(marian_source, tmp_path, lie, capsys):
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    lying_safetensors(source / "model.safetensors", lie)
    assert main([str(source), str(tmp_path / "out")]) == 1
    error = capsys.readouterr().err
    assert (
        error.strip().splitlines()[-1].startswith("error: ")
        and "model.safetensors" in error
        and "Traceback" not in error
    ), error
    assert len(error.strip().splitlines()) <= 3, error


@pytest.mark.parametrize("field", ["encoder_layers", "decoder_layers"])
def test_the_converters_layer_limit_is_the_loaders(tmp_path, field):
    """A stack the converter takes is one the loader takes, and one layer more is refused by both."""
    sizes = {
        "vocab_size": 100,
        "d_model": 8,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 1,
        "decoder_attention_heads": 1,
        "encoder_ffn_dim": 8,
        "decoder_ffn_dim": 8,
        "max_position_embeddings": 16,
    }
    for layers, accepted in ((MAX_LAYERS, True), (MAX_LAYERS + 1, False)):
        problems = Problems()
        check_sizes({**sizes, field: layers}, "source", problems)
        (tmp_path / "config.json").write_text(json.dumps({**sizes, field: layers}))
        try:
            check_folder_sizes(tmp_path)
            loads = True
        except ModelFolderError:
            loads = False
        assert (not problems.found) == accepted == loads, (layers, problems.found)


@pytest.mark.parametrize("field", ["max_position_embeddings", "vocab_size"])
def test_the_converters_table_bounds_are_the_loaders(tmp_path, field):
    """A position table is bounded at its peak (float64 with temporaries, 24 bytes an entry), an embedding matrix in
    float32, by the same limit as the loader's: a folder convert writes is one translate loads."""
    from vanilla_transformer.model.loading import MAX_TABLE_BYTES, POSITION_TABLE_BYTES

    d_model = 512
    per_entry = POSITION_TABLE_BYTES if field == "max_position_embeddings" else 4
    sizes = {
        "vocab_size": 1000,
        "d_model": d_model,
        "encoder_layers": 1,
        "decoder_layers": 1,
        "encoder_attention_heads": 8,
        "decoder_attention_heads": 8,
        "encoder_ffn_dim": 8,
        "decoder_ffn_dim": 8,
        "max_position_embeddings": 16,
    }
    limit = MAX_TABLE_BYTES // (per_entry * d_model)
    for rows, accepted in ((limit, True), (limit + 1, False)):
        problems = Problems()
        check_sizes({**sizes, field: rows}, "source", problems)
        (tmp_path / "config.json").write_text(json.dumps({**sizes, field: rows}))
        try:
            check_folder_sizes(tmp_path)
            loads = True
        except ModelFolderError:
            loads = False
        assert (not problems.found) == accepted == loads, (rows, problems.found)


def test_a_config_claiming_over_a_billion_weights_over_tiny_ones_is_refused_before_building(marian_source, tmp_path):
    """1.28e9 weights claimed (feed-forward layers of 5,000,000) over a tiny model's: refused from config.json alone,
    by the loader's bound, before transformers builds the source model (5 GB)."""
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    config = json.loads((source / "config.json").read_text())
    (source / "config.json").write_text(
        json.dumps({**config, "encoder_ffn_dim": 5_000_000, "decoder_ffn_dim": 5_000_000})
    )
    with pytest.raises(ConversionError, match="config.json"):
        convert(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_source_file_linked_out_of_the_source_folder_is_refused_and_nothing_is_written(marian_source, tmp_path):
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    secrets = tmp_path / "home" / ".docker" / "config.json"
    secrets.parent.mkdir(parents=True)
    settings = json.loads((source / "tokenizer_config.json").read_text())
    secrets.write_text(json.dumps({**settings, "auths": {"registry": {"auth": "c2VjcmV0"}}}))
    (source / "tokenizer_config.json").unlink()
    (source / "tokenizer_config.json").symlink_to(secrets)
    with pytest.raises(
        ConversionError, match="tokenizer_config.json is a symbolic link to .*outside the source folder"
    ):
        convert(source, tmp_path / "out")
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("name", ["dict.txt", "bpecodes"])
def test_a_fairseq_file_beside_the_checkpoint_linked_out_of_its_folder_is_refused(
    fsmt_model, fairseq_files, tmp_path, name
):
    path = write_fairseq(tmp_path / "wmt", fsmt_model, fairseq_files)
    outside = tmp_path / "elsewhere" / name
    outside.parent.mkdir()
    (path.parent / name).rename(outside)
    (path.parent / name).symlink_to(outside)
    with pytest.raises(ConversionError, match=f"{name} is a symbolic link to .*outside the source folder"):
        convert(path, tmp_path / "out")
    assert not (tmp_path / "out").exists()


def test_a_hub_snapshot_may_link_into_its_repositorys_blobs_only(tmp_path):
    from vanilla_transformer.converters.untrusted import check_no_link_leaves

    repo = tmp_path / "models--user--model"
    (repo / "blobs").mkdir(parents=True)
    (repo / "blobs" / "abc").write_text("{}")
    snapshot = repo / "snapshots" / "rev"
    snapshot.mkdir(parents=True)
    (snapshot / "config.json").symlink_to(repo / "blobs" / "abc")
    check_no_link_leaves(snapshot, allowed_root=repo)  # the cache's own layout
    (tmp_path / "elsewhere").write_text("{}")
    (snapshot / "vocab.json").symlink_to(tmp_path / "elsewhere")
    with pytest.raises(ConversionError, match="vocab.json is a symbolic link"):
        check_no_link_leaves(snapshot, allowed_root=repo)


def test_keys_a_tokenizer_does_not_take_are_not_carried_into_the_converted_folder(marian_source, tmp_path):
    source = Path(shutil.copytree(marian_source, tmp_path / "source"))
    settings = json.loads((source / "tokenizer_config.json").read_text())
    (source / "tokenizer_config.json").write_text(json.dumps({**settings, "auths": {"registry": "secret"}}))
    output = convert(source, tmp_path / "out")
    written = json.loads((output / "tokenizer_config.json").read_text())
    assert "auths" not in written
    assert written["tokenizer_class"] and written["eos_token"] == settings.get("eos_token", written["eos_token"])


def test_a_source_folders_name_goes_into_the_card_as_plain_text(marian_source, tmp_path):
    source = Path(shutil.copytree(marian_source, tmp_path / "m<img src=x onerror=alert(1)>\nodel"))
    card = (convert(source, tmp_path / "out") / "README.md").read_text()
    assert not re.search(r"(?<!\\)<img", card)  # no tag a Markdown renderer would show as HTML
    assert "m\\<img src=x onerror=alert\\(1\\)\\> odel" in card  # escaped, and on one line


def test_hub_weights_are_safetensors_where_there_are_some_else_pytorch_model_bin():
    common = ["config.json", "README.md", "source.spm", "tf_model.h5", "rust_model.ot", "flax_model.msgpack"]
    assert hub_patterns([*common, "pytorch_model.bin"]) == [
        "config.json",
        "README.md",
        "source.spm",
        "pytorch_model.bin",
    ]
    assert hub_patterns([*common, "pytorch_model.bin", "model.safetensors"])[-1] == "model.safetensors"


def test_a_hub_id_is_downloaded_with_only_the_files_the_conversion_reads(marian_source, monkeypatch, tmp_path):
    import huggingface_hub

    source, calls = marian_source, []
    files = [path.name for path in source.iterdir()] + ["pytorch_model.bin", "tf_model.h5", "rust_model.ot"]
    monkeypatch.setattr(huggingface_hub, "list_repo_files", lambda repo_id, revision=None: files)

    def snapshot_download(repo_id, revision=None, allow_patterns=None):
        calls.append((repo_id, revision, sorted(allow_patterns)))
        return str(source)

    monkeypatch.setattr(huggingface_hub, "snapshot_download", snapshot_download)
    folder = convert("Helsinki-NLP/opus-mt-tiny", tmp_path / "out", revision="main")
    assert calls[0][:2] == ("Helsinki-NLP/opus-mt-tiny", "main")
    assert "model.safetensors" in calls[0][2] and "pytorch_model.bin" not in calls[0][2]
    assert 'base_model: "Helsinki-NLP/opus-mt-tiny"' in (folder / "README.md").read_text()


def test_offline_a_hub_id_converts_from_the_local_cache(marian_source, monkeypatch, tmp_path):
    import huggingface_hub
    from huggingface_hub.errors import OfflineModeIsEnabled

    def offline(repo_id, revision=None):
        raise OfflineModeIsEnabled("offline mode is enabled")

    calls = []
    monkeypatch.setattr(huggingface_hub, "list_repo_files", offline)
    monkeypatch.setattr(
        huggingface_hub, "snapshot_download", lambda repo_id, **kwargs: calls.append(kwargs) or str(marian_source)
    )
    assert (convert("Helsinki-NLP/opus-mt-tiny", tmp_path / "out") / "model.safetensors").is_file()
    assert "*.safetensors" in calls[0]["allow_patterns"]
