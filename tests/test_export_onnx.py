"""`export-onnx`: the transformers.js layout checked against the model through ONNX Runtime (logits, greedy and
beam-4 tokens, with and without the cache branch), the quantized variant, a tampered graph refused, the output rule,
and the ONNX backend's translations."""

import dataclasses
import shutil

import pytest
import torch

pytest.importorskip("onnxruntime", reason="the ONNX export needs the onnx extra: pip install -e '.[onnx]'")
pytest.importorskip("onnxscript", reason="torch.onnx.export needs onnxscript: pip install -e '.[onnx]'")

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration  # noqa: E402
from vanilla_transformer.commands.main import subcommand_main  # noqa: E402
from vanilla_transformer.converters.export_onnx import export_onnx, sentences_to_check  # noqa: E402
from vanilla_transformer.converters.onnx_check import OnnxCheckError, check_onnx_export  # noqa: E402
from vanilla_transformer.converters.onnx_decoding import Decoding  # noqa: E402
from vanilla_transformer.data.tokenization import load_tokenizer  # noqa: E402
from vanilla_transformer.model.loading import read_json_file  # noqa: E402

from .helpers import run_in_this_process, save_tiny_model_folder  # noqa: E402

SENTENCES = 50


def loaded(folder):
    model = VanillaTransformerForConditionalGeneration.from_pretrained(folder).eval()
    generation = read_json_file(folder / "generation_config.json") or {}
    return model, Decoding.from_generation(generation, model.config.to_dict())


@pytest.fixture(scope="module")
def trained_export(tmp_path_factory):
    base = tmp_path_factory.mktemp("onnx_trained")
    folder = save_tiny_model_folder(base / "model", init_std=1.0)
    export_onnx(folder, base / "export")
    return folder, base / "export"


@pytest.fixture(scope="module")
def opus_export(marian_vocabulary, tmp_path_factory):
    from vanilla_transformer.converters.convert import convert

    from .sources import write_marian

    base = tmp_path_factory.mktemp("onnx_opus")
    folder = convert(write_marian(base / "source", marian_vocabulary), base / "model")
    export_onnx(folder, base / "export")
    return base / "model", base / "export"


def flip_largest_weight(graph, rank: int = 0):
    """`graph` (an onnx ModelProto) with the sign of its largest float32 weight (or the `rank`-th largest after it)
    flipped, in place."""
    import numpy as np
    from onnx import numpy_helper

    by_size = sorted(graph.graph.initializer, key=lambda tensor: -int(np.prod(tensor.dims)) * (tensor.data_type == 1))
    weight = by_size[rank]
    weight.CopyFrom(numpy_helper.from_array(-numpy_helper.to_array(weight), weight.name))
    return graph


def tampered_copy(export, folder, rank: int = 0):
    """A copy of `export` in `folder` whose decoder has a weight flipped (`flip_largest_weight`)."""
    import onnx

    shutil.copytree(export, folder)
    path = folder / "onnx" / "decoder_model_merged.onnx"
    onnx.save(flip_largest_weight(onnx.load(str(path)), rank), str(path))
    return folder


def check_on_50_sentences(folder, export):
    model, decoding = loaded(folder)
    return check_onnx_export(model, export, sentences_to_check(load_tokenizer(folder), SENTENCES), decoding)


@pytest.mark.slow
def test_a_trained_models_export_gives_its_logits_and_greedy_and_beam_tokens_with_and_without_the_cache(
    trained_export,
):
    found = check_on_50_sentences(*trained_export)
    assert found["without the cache"] <= 1e-4 and found["with the cache"] <= 1e-4
    assert [value for name, value in found.items() if name.startswith("beam")] == [1.0] * 4


@pytest.mark.slow
def test_a_converted_opus_mt_export_gives_its_logits_and_greedy_and_beam_tokens_with_and_without_the_cache(
    opus_export,
):
    found = check_on_50_sentences(*opus_export)
    assert found["without the cache"] <= 1e-4 and found["with the cache"] <= 1e-4
    assert [value for name, value in found.items() if name.startswith("beam")] == [1.0] * 4


@pytest.mark.slow
def test_a_converted_opus_mt_export_has_the_layout_transformers_js_loads(opus_export):
    import onnx

    folder, export = opus_export
    decoder = onnx.load(str(export / "onnx" / "decoder_model_merged.onnx"), load_external_data=False)
    inputs = [value.name for value in decoder.graph.input]
    assert inputs[:3] == ["input_ids", "encoder_attention_mask", "encoder_hidden_states"]
    assert inputs[-1] == "use_cache_branch" and "past_key_values.1.encoder.value" in inputs
    assert [value.name for value in decoder.graph.output][:2] == ["logits", "present.0.decoder.key"]
    config = read_json_file(export / "config.json")
    assert config["model_type"] == "marian" and config["decoder_start_token_id"] == loaded(folder)[1].decoder_start
    assert sorted(path.name for path in export.iterdir() if not path.name.startswith(".")) == [
        "config.json",
        "generation_config.json",
        "onnx",
        "tokenizer.json",
        "tokenizer_config.json",
    ]


@pytest.mark.slow
@pytest.mark.parametrize("which", ["trained", "opus"])
def test_the_exported_tokenizer_reads_and_writes_as_the_folders_and_states_what_transformers_js_would_guess(
    which, trained_export, opus_export
):
    from transformers import PreTrainedTokenizerFast

    folder, export = trained_export if which == "trained" else opus_export
    settings = read_json_file(export / "tokenizer_config.json")
    original = load_tokenizer(folder)
    assert settings["tokenizer_class"] == "PreTrainedTokenizerFast"
    assert settings["clean_up_tokenization_spaces"] is bool(getattr(original, "clean_up_tokenization_spaces", False))
    assert settings["model_max_length"] <= read_json_file(folder / "config.json")["max_position_embeddings"]
    exported = PreTrainedTokenizerFast.from_pretrained(export)
    ids = sentences_to_check(original, 20)
    assert [exported(text)["input_ids"] for text in original.batch_decode(ids, skip_special_tokens=True)] == [
        original(text)["input_ids"] for text in original.batch_decode(ids, skip_special_tokens=True)
    ]
    assert exported.batch_decode(ids, skip_special_tokens=True) == original.batch_decode(ids, skip_special_tokens=True)


@pytest.mark.slow
def test_a_flipped_weight_is_refused_by_the_check(trained_export, tmp_path):
    folder, export = trained_export
    tampered = tampered_copy(export, tmp_path / "tampered")
    model, decoding = loaded(folder)
    with pytest.raises(OnnxCheckError, match="relative"):
        check_onnx_export(model, tampered, sentences_to_check(load_tokenizer(folder), 8), decoding)


@pytest.mark.slow
def test_the_export_commands_refusal_names_the_users_folder_and_leaves_it_unwritten(
    trained_export, tmp_path, monkeypatch
):
    from vanilla_transformer.converters import export_onnx as exporting

    merge_decoders = exporting.merge_decoders
    monkeypatch.setattr(exporting, "merge_decoders", lambda *args: flip_largest_weight(merge_decoders(*args)))
    output = tmp_path / "export"
    result = run_in_this_process(subcommand_main("export-onnx"), [str(trained_export[0]), str(output)])
    refusal = [line for line in result.stderr.splitlines() if "does not compute" in line]
    assert result.returncode != 0 and len(refusal) == 1, result.stderr[-2000:]
    assert f"the ONNX export {output} does not compute the model's results: logits" in refusal[0]
    assert refusal[0].endswith(f"{output} was left as it was") and ".export." not in refusal[0]
    assert not output.exists() and list(tmp_path.iterdir()) == []


@pytest.mark.slow
def test_q8_gives_float32s_tokens_on_90_percent_of_sentences_in_under_35_percent_of_its_size(tmp_path):
    folder = save_tiny_model_folder(
        tmp_path / "model",
        init_std=1.0,
        d_model=128,
        encoder_ffn_dim=512,
        decoder_ffn_dim=512,
        encoder_attention_heads=4,
        decoder_attention_heads=4,
    )
    found = export_onnx(folder, tmp_path / "export", quantize=("q8",), check_count=SENTENCES)
    sizes = {
        suffix: sum(
            (tmp_path / "export" / "onnx" / f"{name}{suffix}.onnx").stat().st_size
            for name in ("encoder_model", "decoder_model_merged")
        )
        for suffix in ("", "_quantized")
    }
    assert found["q8: same tokens as float32"] >= 0.9
    assert sizes["_quantized"] < 0.35 * sizes[""], sizes


@pytest.mark.slow
def test_overwrite_replaces_a_previous_export_and_a_foreign_folder_is_refused(trained_export, tmp_path):
    folder, export = trained_export
    output = tmp_path / "export"
    shutil.copytree(export, output)
    result = run_in_this_process(subcommand_main("export-onnx"), [str(folder), str(output), "--overwrite"])
    assert result.returncode == 0, result.stderr[-2000:]
    (output / "notes.txt").write_text("mine")
    result = run_in_this_process(subcommand_main("export-onnx"), [str(folder), str(output), "--overwrite"])
    assert result.returncode != 0 and "notes.txt" in result.stderr
    assert (output / "notes.txt").read_text() == "mine"


@pytest.mark.slow
@pytest.mark.parametrize("num_beams", [1, 4])
def test_the_onnx_backend_translates_as_the_model_backend(opus_export, num_beams):
    from vanilla_transformer.model.decoding import ModelBackend
    from vanilla_transformer.serving.onnx_backend import OnnxBackend

    folder, export = opus_export
    model, _ = loaded(folder)
    tokenizer = load_tokenizer(folder)
    batch = sentences_to_check(tokenizer, 16)
    with torch.no_grad():
        expected = ModelBackend(model, tokenizer, num_beams=num_beams).translate(batch)
    assert OnnxBackend(folder, export, num_beams=num_beams).translate(batch) == expected


def test_a_generation_setting_the_search_does_not_reproduce_is_refused_by_name():
    with pytest.raises(ValueError, match="do_sample"):
        Decoding.from_generation({"do_sample": True}, {"decoder_start_token_id": 1})
    assert dataclasses.replace(Decoding.from_generation({}, {"decoder_start_token_id": 1}), num_beams=4).num_beams == 4


@pytest.mark.slow
def test_serve_with_the_onnx_backend_answers_as_translate_does(trained_export, tmp_path):
    from .helpers import Served, translate

    folder, export = trained_export
    # a text that is not the model's comes from ONNX Runtime; the largest weight (lm_head) flipped makes this random
    # model say only control characters, which translate writes as blank lines: a feed-forward weight instead
    export = tampered_copy(export, tmp_path / "tampered", rank=2)
    lines = [f"the {adjective} dog number {n} sees a cat" for n, adjective in enumerate(["red", "small", "old"])]
    source = tmp_path / "lines.en"
    source.write_text("\n".join(lines) + "\n", encoding="utf-8")
    flags = ["--max_new_tokens", 8, "--device", "cpu"]
    onnx = ["--backend", "onnx", "--onnx_dir", export]
    result, model = translate(folder, "--input", source, *flags, *onnx), translate(folder, "--input", source, *flags)
    assert result.returncode == 0 and model.returncode == 0, result.stderr + model.stderr
    expected = result.stdout.splitlines()
    assert len(expected) == len(lines) and any(expected) and expected != model.stdout.splitlines()
    server = Served(folder, *flags, *onnx)
    try:
        answers = [server.request("/translate", {"q": line, "source": "en", "target": "de"}) for line in lines]
        listed = server.request("/translate", {"q": lines, "source": "en", "target": "de"})
    finally:
        assert server.stop() == 0
    assert [(status, answer["translatedText"]) for status, _, answer in answers] == [(200, text) for text in expected]
    assert listed[0] == 200 and listed[2]["translatedText"] == expected


@pytest.mark.slow
def test_translate_onnx_variant_q8_decodes_with_the_quantized_files(trained_export, tmp_path):
    from .helpers import translate

    folder, export = trained_export
    source = tmp_path / "lines.en"
    source.write_text("the red dog sees a cat\nthe old dog number 2\n", encoding="utf-8")

    def run(onnx_dir, *flags):
        return translate(
            folder, "--input", source, "--backend", "onnx", "--onnx_dir", onnx_dir, "--device", "cpu", *flags
        )

    missing = run(export, "--onnx_variant", "q8")
    assert missing.returncode != 0 and "has no q8 variant" in missing.stderr and "--quantize q8" in missing.stderr
    quantized = tmp_path / "quantized"
    shutil.copytree(export, quantized)
    for name in ("encoder_model", "decoder_model_merged"):  # the float32 graphs under the q8 names: the same text
        shutil.copyfile(export / "onnx" / f"{name}.onnx", quantized / "onnx" / f"{name}_quantized.onnx")
    float32, q8 = run(quantized), run(quantized, "--onnx_variant", "q8")
    assert float32.returncode == 0 and q8.returncode == 0 and q8.stdout == float32.stdout != ""
    (quantized / "onnx" / "decoder_model_merged_quantized.onnx").write_bytes(b"not a graph")
    assert run(quantized, "--onnx_variant", "q8").returncode != 0 and run(quantized).returncode == 0
    refused = translate(folder, "--input", source, "--onnx_variant", "q8")
    assert refused.returncode == 2 and "--onnx_variant is for --backend onnx" in refused.stderr


@pytest.mark.slow
def test_an_output_length_past_the_exports_positions_is_refused_by_name(opus_export):
    from vanilla_transformer.converters.export_onnx import OnnxExportError
    from vanilla_transformer.serving.onnx_backend import OnnxBackend

    folder, export = opus_export
    backend = OnnxBackend(folder, export, threads=1)
    with pytest.raises(OnnxExportError, match=f"past the {backend.max_output} target positions"):
        OnnxBackend(folder, export, max_new_tokens=backend.max_output + 1, threads=1)
    with pytest.raises(OnnxExportError, match="target positions"):
        backend.with_decoding(max_new_tokens=backend.max_output + 1)
    [[ids]] = [backend.encode(["a dog"])]
    texts, _ = backend.with_decoding(max_new_tokens=backend.max_output).translate([ids])  # the most it holds runs
    assert len(texts) == 1
