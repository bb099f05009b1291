"""Formats of earlier releases, upgraded in one place (vanilla_transformer/model/upgrade.py): folders and checkpoints saved
before the attention's projections were separate layers, and config fields that are gone."""

import copy
import json
from functools import partial
from types import SimpleNamespace

import pytest
import torch
from safetensors.torch import save_file

from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration
from vanilla_transformer.hub.model_folder import save_model_folder
from vanilla_transformer.hub.refresh_code import refresh
from vanilla_transformer.model import upgrade
from vanilla_transformer.training import checkpoint_folders, checkpointing
from vanilla_transformer.training.settings import CheckpointSettings, OutputSettings

from .fixtures.old_checkpoints import fused, make_old_folder
from .helpers import (
    CARD_VALUES,
    model_with_attention,
    random_ids,
    random_tiny_model,
    save_tiny_model_folder,
    train_tiny_tokenizer,
)


def trained_a_step(model, optimizer, source_batch) -> None:
    input_ids, attention_mask = source_batch
    labels = random_ids(model.config, (2, 5), seed=6)
    model(input_ids=input_ids, attention_mask=attention_mask, labels=labels).loss.backward()
    optimizer.step()
    optimizer.zero_grad()


@pytest.mark.parametrize("qk_head_dim", [None, 4])  # 4: Table 3 row (B), whose fused rows are not of equal size
def test_an_old_folder_upgraded_by_refresh_code_decodes_the_tokens_of_the_model_it_was_made_from(
    tmp_path, qk_head_dim
):
    """The installed code reads the current format only: an old folder's fused `qkv_proj` and `kv_proj` are reported
    by the loader (as for any model); `refresh-code` splits them, and the folder then loads completely and decodes
    as the model it was made from."""
    tokenizer = train_tiny_tokenizer()
    model = random_tiny_model(len(tokenizer), qk_head_dim=qk_head_dim).eval()
    folder = save_model_folder(model, tokenizer, tmp_path / "old", CARD_VALUES)
    make_old_folder(folder)
    _, loading = VanillaTransformerForConditionalGeneration.from_pretrained(folder, output_loading_info=True)
    assert any("qkv_proj" in key for key in loading["unexpected_keys"])
    assert any("self_attn.q_proj" in key for key in loading["missing_keys"])

    _, changes = refresh(folder)

    assert "fused qkv_proj/kv_proj attention weights" in changes
    loaded, loading = VanillaTransformerForConditionalGeneration.from_pretrained(folder, output_loading_info=True)
    assert not (loading["missing_keys"] or loading["unexpected_keys"] or loading["mismatched_keys"])
    for name, tensor in model.state_dict().items():
        assert torch.equal(loaded.state_dict()[name], tensor), name
    input_ids = random_ids(model.config, (2, 9))
    for num_beams in (1, 4):
        settings = dict(num_beams=num_beams, max_new_tokens=8, do_sample=False)
        assert torch.equal(loaded.eval().generate(input_ids, **settings), model.generate(input_ids, **settings))


def test_refresh_code_drops_the_config_fields_of_earlier_releases(tmp_path):
    folder = save_tiny_model_folder(tmp_path / "old", CARD_VALUES)
    config = json.loads((folder / "config.json").read_text())
    old = {**config, "label_smoothing": 0.1, "onednn_linear": True, "grouped_beam_cross_attention": True}
    (folder / "config.json").write_text(json.dumps(old))

    _, changes = refresh(folder)

    assert "config.json field label_smoothing" in changes
    saved = json.loads((folder / "config.json").read_text())
    assert not set(upgrade.OBSOLETE_CONFIG_FIELDS) & set(saved)
    assert saved["d_model"] == config["d_model"]


def test_load_state_dict_splits_an_old_checkpoints_fused_projections_while_upgrading(tiny_model):
    """What accelerate's load_state goes through when a run resumes from an old checkpoint."""
    old = fused(tiny_model.state_dict())
    fresh = VanillaTransformerForConditionalGeneration(tiny_model.config)
    with upgrade.splitting_fused_weights(fresh):
        assert fresh.load_state_dict(old, strict=True)  # no missing, no unexpected key
    for name, tensor in tiny_model.state_dict().items():
        assert torch.equal(fresh.state_dict()[name], tensor), name
    assert "model.encoder.layers.0.self_attn.qkv_proj.weight" in old  # the caller's dict is left as it was
    with pytest.raises(RuntimeError, match="qkv_proj"):  # outside, the model knows the current format only
        fresh.load_state_dict(old, strict=True)


def test_an_old_checkpoints_adam_state_resumes_as_it_was(tiny_config, source_batch):
    """The training script's checkpoints hold Adam's state by the old code's parameter order, where each fused layer
    had one state: it is split for the separate layers, and training goes on exactly as it would have."""
    tiny_config.dropout = 0.0
    torch.manual_seed(0)
    model = VanillaTransformerForConditionalGeneration(tiny_config).train()
    optimizer = torch.optim.Adam(model.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9)
    trained_a_step(model, optimizer, source_batch)
    saved, names = optimizer.state_dict(), [name for name, _ in model.named_parameters()]
    by_name = {name: saved["state"][index] for index, name in enumerate(names)}
    old_names = list(fused(dict(model.named_parameters())))
    old_state = {
        field: fused({name: state[field] for name, state in by_name.items()}) for field in ("exp_avg", "exp_avg_sq")
    }
    old_saved = {
        "state": {
            index: {"step": by_name[names[0]]["step"].clone(), **{f: old_state[f][name] for f in old_state}}
            for index, name in enumerate(old_names)
        },
        "param_groups": [{**saved["param_groups"][0], "params": list(range(len(old_names)))}],
    }

    resumed_model = copy.deepcopy(model)
    resumed = torch.optim.Adam(resumed_model.parameters(), lr=1e-2, betas=(0.9, 0.98), eps=1e-9)
    assert upgrade.old_parameter_names(resumed_model) == old_names
    resumed.register_load_state_dict_pre_hook(partial(upgrade.split_fused_optimizer_state, resumed_model))
    resumed.load_state_dict(old_saved)
    for index, name in enumerate(names):
        for field, value in resumed.state_dict()["state"][index].items():
            assert torch.equal(value, by_name[name][field]), (name, field)
    for _ in range(2):  # Adam's step of each part moves on its own
        trained_a_step(model, optimizer, source_batch)
        trained_a_step(resumed_model, resumed, source_batch)
    for (name, parameter), resumed_parameter in zip(model.named_parameters(), resumed_model.parameters(), strict=True):
        assert torch.equal(parameter, resumed_parameter), name


def test_averaging_and_checking_old_and_new_checkpoints_of_one_run(tmp_path, tiny_model):
    """A run resumed after the change holds old checkpoints and new ones: they average by the current names."""
    settings = CheckpointSettings(OutputSettings(str(tmp_path)), average_last=2)
    other = VanillaTransformerForConditionalGeneration(tiny_model.config)
    for step, weights in ((1, fused(tiny_model.state_dict())), (2, other.state_dict())):
        folder = checkpoint_folders.checkpoint_dir(settings.root, step)
        folder.mkdir(parents=True)
        save_file(
            {k: v.contiguous() for k, v in weights.items() if "embed_tokens" not in k and "lm_head" not in k},
            folder / checkpoint_folders.WEIGHTS_NAME,
        )
    old_checkpoint = checkpoint_folders.checkpoint_dir(settings.root, 1)
    assert upgrade.has_fused_projections(checkpoint_folders.weight_shapes(old_checkpoint))
    assert not upgrade.has_fused_projections(
        checkpoint_folders.weight_shapes(checkpoint_folders.checkpoint_dir(settings.root, 2))
    )
    identity = checkpointing.run_identity(tiny_model.config, "tokenizer")
    checkpointing.check_checkpoint_matches(old_checkpoint, identity, tiny_model)  # by shapes: no model_config there
    with pytest.raises(checkpoint_folders.CheckpointError, match="another model"):
        checkpointing.check_checkpoint_matches(old_checkpoint, identity, model_with_attention("sdpa", qk_head_dim=4))

    final = VanillaTransformerForConditionalGeneration(tiny_model.config)
    printed = []
    assert checkpointing.load_averaged_weights(final, SimpleNamespace(print=printed.append), settings, None) == 2
    for name, tensor in final.state_dict().items():
        if not name.endswith("embed_positions.table"):
            expected = (tiny_model.state_dict()[name].double() + other.state_dict()[name].double()) / 2
            torch.testing.assert_close(tensor, expected.float(), msg=name)
