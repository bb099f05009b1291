"""Formats of earlier releases, upgraded in one place, so that the Hub-facing files know the current format only.

The library reads old checkpoints through this module, and `vanilla-transformer refresh-code` rewrites an old model
folder with it.

What changed, and what this module converts:
- Until the projections became separate layers, self-attention's W^Q, W^K, W^V were one layer `qkv_proj` (rows q,
  k, v) and encoder-decoder attention's W^K, W^V one layer `kv_proj` (rows k, v): their weights and biases are split
  by rows into the separate `q_proj`, `k_proj`, `v_proj` (`split_fused_projections`), and Adam's state, which
  followed the old parameter order, the same way (`split_fused_optimizer_state`).
- config.json fields that were speed switches or training settings, not what the model is (OBSOLETE_CONFIG_FIELDS),
  are dropped; the fields added since (ADDED_CONFIG_FIELDS) get the values every earlier model had.
"""

import contextlib
import json
import re
from collections.abc import Iterable, Iterator
from pathlib import Path

import torch

FUSED_PROJECTIONS = {  # sub-layer: (the old fused layer, the layers it splits into, in its row order)
    "self_attn": ("qkv_proj", ("q_proj", "k_proj", "v_proj")),
    "encoder_attn": ("kv_proj", ("k_proj", "v_proj")),
}
OBSOLETE_CONFIG_FIELDS = ("label_smoothing", "onednn_linear", "grouped_beam_cross_attention", "fused_projections")
# fields added since, with the values every earlier model had (the paper's: interleaved sinusoids from position 0, no
# logits bias): a config recorded without them describes the same model
ADDED_CONFIG_FIELDS = {
    "position_layout": "interleaved",
    "position_frequencies": "paper",
    "position_offset": 0,
    "lm_head_bias": False,
    "share_encoder_decoder_embeddings": True,  # one vocabulary, one matrix three ways (decoder_vocab_size: below)
}
_FUSED_KEY = re.compile(
    r"(?P<prefix>.*?)(?P<stack>encoder|decoder)\.layers\.\d+\.(?P<layer>self_attn|encoder_attn)\."
    r"(?P<fused>qkv_proj|kv_proj)\.(?P<tensor>weight|bias)$"
)


def has_fused_projections(keys: Iterable[str]) -> bool:
    """Whether weights under these names were saved in the fused-projection format (qkv_proj, kv_proj)."""
    return any(_FUSED_KEY.match(key) for key in keys)


def split_fused_projections(state_dict: dict, config) -> dict:
    """`state_dict` with every fused `qkv_proj`/`kv_proj` weight and bias split into the rows of the separate
    projections, at the sizes `config` gives them (d_k may differ from d_v: Table 3, row B); a new dict. A fused
    tensor of another size (another model's) is left as it is, for the loader to report."""
    upgraded = {}
    for key, value in state_dict.items():
        match = _FUSED_KEY.match(key)
        sizes = _row_sizes(match, config) if match else None
        if sizes is None or value.dim() == 0 or value.shape[0] != sum(sizes):
            upgraded[key] = value
            continue
        start = key[: match.start("fused")]
        _, parts = FUSED_PROJECTIONS[match["layer"]]
        for part, rows in zip(parts, value.split(sizes), strict=True):
            upgraded[f"{start}{part}.{match['tensor']}"] = rows
    return upgraded


def _row_sizes(match: re.Match, config) -> list[int]:
    heads = config.encoder_attention_heads if match["stack"] == "encoder" else config.decoder_attention_heads
    v_size = config.d_model
    qk_size = heads * (config.qk_head_dim or config.d_model // heads)
    return [qk_size, qk_size, v_size] if match["fused"] == "qkv_proj" else [qk_size, v_size]


@contextlib.contextmanager
def splitting_fused_weights(model: torch.nn.Module) -> Iterator[None]:
    """While inside, `model.load_state_dict` (accelerate's `load_state` when resuming) splits an old checkpoint's
    fused projections."""

    def split(module, state_dict, prefix, *args):  # the root module's hook: the whole state dict, in place
        upgraded = split_fused_projections(state_dict, model.config)
        state_dict.clear()
        state_dict.update(upgraded)

    handle = model.register_load_state_dict_pre_hook(split)
    try:
        yield
    finally:
        handle.remove()


# --- Adam's state of a checkpoint saved with fused projections ------------------------------------------------------


def _attention_layer(name: str) -> tuple[str, str, str, str | None, tuple[str, ...]]:
    """A parameter name's attention, layer, tensor and that attention's old fused layer with its parts:
    "m.self_attn.q_proj.weight" -> ("m.self_attn", "q_proj", "weight", "qkv_proj", ("q_proj", "k_proj", "v_proj"))."""
    module, _, tensor = name.rpartition(".")
    attention, _, layer = module.rpartition(".")
    fused, parts = FUSED_PROJECTIONS.get(attention.rpartition(".")[2], (None, ()))
    return attention, layer, tensor, fused, parts


def old_parameter_names(model: torch.nn.Module) -> list[str]:
    """`model`'s parameters as the fused-projection code named and ordered them (`model.parameters()`' order, which
    the optimizer's state follows): each fused layer where its first part is."""
    names = {}
    for name, _ in model.named_parameters():
        attention, layer, tensor, fused, parts = _attention_layer(name)
        names.setdefault(f"{attention}.{fused}.{tensor}" if layer in parts else name)
    return list(names)


def split_fused_optimizer_state(model: torch.nn.Module, optimizer, state_dict: dict) -> dict | None:
    """torch.optim.Optimizer load_state_dict pre-hook: the state of an optimizer over the old code's parameters of
    `model` (`old_parameter_names`), split for the current ones: each fused parameter's state tensors (Adam's moving
    averages) by rows as the weights are split, its scalars (the step) copied to every part. A state of any other
    size is left as it is (None), for torch to check."""
    old_names, new_names = old_parameter_names(model), [name for name, _ in model.named_parameters()]
    old_ids = [old_id for group in state_dict["param_groups"] for old_id in group["params"]]
    if len(old_ids) != len(old_names):
        return None
    new_index = {name: index for index, name in enumerate(new_names)}
    parts_of, state = {}, {}  # old id -> new indices; new index -> its state
    for old_id, old_name in zip(old_ids, old_names, strict=True):
        attention, layer, tensor, fused, parts = _attention_layer(old_name)
        parts = [f"{attention}.{part}.{tensor}" for part in parts] if layer == fused else [old_name]
        parts_of[old_id] = [new_index[part] for part in parts]
        if old_id not in state_dict["state"]:
            continue
        fields = state_dict["state"][old_id]
        split = {
            field: split_fused_projections({old_name: value}, model.config)
            if isinstance(value, torch.Tensor) and value.dim() > 0
            else dict.fromkeys(parts, value)
            for field, value in fields.items()
        }
        for part in parts:  # copies: the optimizer updates each part's state in place (Adam's step too)
            state[new_index[part]] = {field: _copy(split[field][part]) for field in fields}
    groups = []
    for group in state_dict["param_groups"]:
        params = sorted(new for old_id in group["params"] for new in parts_of[old_id])
        groups.append({**group, "params": params})
        if "param_names" in group:
            groups[-1]["param_names"] = [new_names[index] for index in params]
    return {**state_dict, "state": state, "param_groups": groups}


def _copy(value):
    return value.clone() if isinstance(value, torch.Tensor) else value


# --- a model folder -------------------------------------------------------------------------------------------------


def upgrade_config(config: dict) -> dict:
    """A config's content (config.json, a checkpoint's record) in the current format: without the fields earlier
    releases wrote that are not what the model is, with the fields added since."""
    current = {name: value for name, value in config.items() if name not in OBSOLETE_CONFIG_FIELDS}
    upgraded = {**ADDED_CONFIG_FIELDS, **current}
    if upgraded["share_encoder_decoder_embeddings"] is not False:  # one vocabulary: the decoder's is vocab_size
        upgraded.pop("decoder_vocab_size", None)
    return upgraded


def folder_needs_upgrade(folder: Path, weight_keys: Iterable[str]) -> list[str]:
    """What in `folder` is in an earlier release's format, in words; [] when nothing."""
    config = json.loads((folder / "config.json").read_text(encoding="utf-8"))
    found = [f"config.json field {name}" for name in OBSOLETE_CONFIG_FIELDS if name in config]
    if has_fused_projections(weight_keys):
        found.append("fused qkv_proj/kv_proj attention weights")
    return found
