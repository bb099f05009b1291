"""The model as the ONNX graphs transformers.js runs for an encoder-decoder: `encoder_model.onnx` and
`decoder_model_merged.onnx`.

The layout is the one optimum writes for Marian; the graphs are made with torch's own exporter (`torch.onnx.export`).

The merged decoder is one graph for every decoding step. Its inputs are `input_ids`, `encoder_attention_mask`,
`encoder_hidden_states`, `past_key_values.{i}.decoder.key|value` and `past_key_values.{i}.encoder.key|value`
([batch, heads, length, head_dim]) and `use_cache_branch` (bool, [1]); its outputs `logits`,
`present.{i}.decoder.key|value` and `present.{i}.encoder.key|value`. An ONNX `If` on `use_cache_branch` runs one of
two exported graphs: without the past (the first step, or a whole prefix: the past inputs are not read, and
transformers.js gives them with length 0), the decoder over `input_ids` that computes every key and value; with the
past, the decoder over the new tokens that appends their keys and values to the past's, and passes the encoder's
keys and values through (transformers.js keeps its own from the first step). Each branch is the graph torch
exported, its values renamed apart; the weights are the outer graph's, once.

Both decoders are the model's own modules, fed an `EncoderDecoderCache` built from the past tensors: the exported
arithmetic is the model's, not a second implementation of it (the export's check, `onnx_check.py`, compares them).
"""

from __future__ import annotations

import hashlib
from pathlib import Path

import torch
from torch import nn

ENCODER = "encoder_model.onnx"
DECODER = "decoder_model_merged.onnx"
OPSET = 18
# the positions a sinusoidal model's graphs hold (the PyTorch model grows its table on demand): a source of the
# model's positions (longer ones are cut to them) and its output, section 6.1's source + 50, after the start token
EXTRA_ROWS = 51
PAST_KINDS = ("decoder.key", "decoder.value", "encoder.key", "encoder.value")


def past_names(layers: int, prefix: str = "past_key_values") -> list[str]:
    """The cache's names in transformers.js's order: each layer's decoder key, value, then encoder key, value."""
    return [f"{prefix}.{layer}.{kind}" for layer in range(layers) for kind in PAST_KINDS]


class EncoderGraph(nn.Module):
    """input_ids, attention_mask -> last_hidden_state."""

    def __init__(self, model):
        super().__init__()
        self.encoder = model.model.encoder

    def forward(self, input_ids, attention_mask):
        return self.encoder(input_ids=input_ids, attention_mask=attention_mask).last_hidden_state


def _presents(cache) -> list[torch.Tensor]:
    flat = []
    for own, cross in zip(cache.self_attention_cache.layers, cache.cross_attention_cache.layers, strict=True):
        flat += [own.keys, own.values, cross.keys, cross.values]
    return flat


def _decode(model, input_ids, encoder_attention_mask, encoder_hidden_states, cache):
    """The model's decoder over `input_ids` with `cache`, given the encoder's output: both decoder graphs' step."""
    return model(
        attention_mask=encoder_attention_mask,
        decoder_input_ids=input_ids,
        encoder_outputs=(encoder_hidden_states,),
        cache=cache,
        use_cache=True,
    )


class FirstStepGraph(nn.Module):
    """The decoder without a past: logits and every layer's keys and values (its own and the encoder output's)."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states):
        from transformers.cache_utils import DynamicCache, EncoderDecoderCache

        cache = EncoderDecoderCache(DynamicCache(config=self.model.config), DynamicCache(config=self.model.config))
        output = _decode(self.model, input_ids, encoder_attention_mask, encoder_hidden_states, cache)
        return (output.logits, *_presents(output.cache))


class NextStepGraph(nn.Module):
    """The decoder with a past: logits, its keys and values with the new tokens', and the encoder's passed through."""

    def __init__(self, model):
        super().__init__()
        self.model = model

    def forward(self, input_ids, encoder_attention_mask, encoder_hidden_states, past):
        from transformers.cache_utils import EncoderDecoderCache

        cache = EncoderDecoderCache([tuple(past[index : index + 4]) for index in range(0, len(past), 4)])
        cache.is_updated = dict.fromkeys(range(len(past) // 4), True)  # the encoder's keys and values: the past's
        output = _decode(self.model, input_ids, encoder_attention_mask, encoder_hidden_states, cache)
        presents = _presents(output.cache)
        for index in range(2, len(presents), 4):  # the encoder's, as given (copies: ONNX outputs are new values)
            presents[index], presents[index + 1] = past[index] + 0.0, past[index + 1] + 0.0
        return (output.logits, *presents)


def _export(module: nn.Module, inputs: tuple, names: list[str], outputs: list[str], dynamic: dict, path: Path):
    dynamic_shapes = [dynamic.get(name, {}) for name in names[:3]]
    if len(names) > 3:  # the past: one argument, a tuple
        dynamic_shapes.append(tuple(dynamic[name] for name in names[3:]))
    program = torch.onnx.export(
        module,
        inputs,
        input_names=names,
        output_names=outputs,
        dynamic_shapes=dynamic_shapes,
        opset_version=OPSET,
        dynamo=True,
        optimize=True,
        verbose=False,
    )
    model = program.model_proto
    for node in model.graph.node:  # the exporter's notes on each node (stack traces): most of a small graph's bytes
        del node.metadata_props[:]
        node.doc_string = ""
    import onnx

    onnx.save(model, str(path))


def export_graphs(model, folder: Path) -> tuple[Path, Path, Path]:
    """The encoder, the first-step decoder and the next-step decoder exported into `folder` (float32)."""
    import onnx  # noqa: F401  (the exporter's own requirement, said early)

    config, layers = model.config, model.config.decoder_layers
    for stack in (model.model.encoder, model.model.decoder):  # the graphs hold the sinusoid table as it is now
        if hasattr(stack.embed_positions, "grow"):
            stack.embed_positions.grow(config.max_position_embeddings + EXTRA_ROWS)
    heads, head_dim = config.decoder_attention_heads, config.d_model // config.decoder_attention_heads
    generator = torch.Generator().manual_seed(0)
    ids = lambda *shape: torch.randint(4, config.vocab_size, shape, generator=generator)  # noqa: E731
    batch, source, target, past = 2, 7, 3, 4
    source_ids, mask = ids(batch, source), torch.ones(batch, source, dtype=torch.int64)
    mask[1, -2:] = 0
    hidden = EncoderGraph(model)(source_ids, mask).detach()
    batch_dim, source_dim = torch.export.Dim("batch_size"), torch.export.Dim("encoder_sequence_length")
    target_dim, past_dim = (
        torch.export.Dim("decoder_sequence_length"),
        torch.export.Dim("past_decoder_sequence_length"),
    )
    dynamic = {
        "input_ids": {0: batch_dim, 1: source_dim},
        "attention_mask": {0: batch_dim, 1: source_dim},
        "encoder_attention_mask": {0: batch_dim, 1: source_dim},
        "encoder_hidden_states": {0: batch_dim, 1: source_dim},
    }
    paths = folder / "encoder.onnx", folder / "first_step.onnx", folder / "next_step.onnx"
    _export(
        EncoderGraph(model),
        (source_ids, mask),
        ["input_ids", "attention_mask"],
        ["last_hidden_state"],
        dynamic,
        paths[0],
    )
    names = ["input_ids", "encoder_attention_mask", "encoder_hidden_states"]
    outputs = ["logits", *past_names(layers, "present")]
    first = {**dynamic, "input_ids": {0: batch_dim, 1: target_dim}}
    _export(FirstStepGraph(model), (ids(batch, target), mask, hidden), names, outputs, first, paths[1])
    pasts = []
    for kind in PAST_KINDS * layers:
        length = past if kind.startswith("decoder") else source
        pasts.append(torch.randn(batch, heads, length, head_dim, generator=generator))
    following = {**dynamic, "input_ids": {0: batch_dim}}
    for name, kind in zip(past_names(layers), PAST_KINDS * layers, strict=True):
        following[name] = {0: batch_dim, 2: past_dim if kind.startswith("decoder") else source_dim}
    _export(
        NextStepGraph(model),
        (ids(batch, 1), mask, hidden, tuple(pasts)),
        names + past_names(layers),
        outputs,
        following,
        paths[2],
    )
    return paths


def _rename_apart(graph, prefix: str, keep: set[str]) -> None:
    """Every value of `graph` not in `keep` (the outer graph's inputs and initializers) renamed with `prefix`."""
    renamed = {}

    def name(value: str) -> str:
        if not value or value in keep:
            return value
        return renamed.setdefault(value, prefix + value)

    for node in graph.node:
        node.input[:] = [name(value) for value in node.input]
        node.output[:] = [name(value) for value in node.output]
        if node.name:
            node.name = prefix + node.name
    for output in graph.output:
        output.name = name(output.name)
    for info in graph.value_info:
        info.name = name(info.name)


def _branch(model_proto, prefix: str, weights: dict, outer_inputs: set[str]):
    """The exported model's graph as an `If` branch: no inputs, its initializers moved to `weights` (by content: one
    copy of each tensor, whatever its name in each branch), its other values renamed apart."""
    from onnx import helper

    graph = model_proto.graph
    _rename_apart(graph, prefix, outer_inputs | {tensor.name for tensor in graph.initializer})
    renames = {}
    for tensor in graph.initializer:
        own_name = tensor.name
        tensor.name = ""
        digest = hashlib.sha256(tensor.SerializeToString()).hexdigest()
        if digest not in weights:
            name = own_name if all(kept.name != own_name for kept in weights.values()) else prefix + own_name
            tensor.name = name
            weights[digest] = tensor
        renames[own_name] = weights[digest].name
    for node in graph.node:
        node.input[:] = [renames.get(value, value) for value in node.input]
    for output in graph.output:
        output.name = renames.get(output.name, output.name)
    keep = outer_inputs | set(renames.values())
    nodes = list(graph.node)
    for output in graph.output:
        if output.name in keep:  # an outer value given back as it is: a value of the branch's own
            nodes.append(helper.make_node("Identity", [output.name], [prefix + output.name]))
            output.name = prefix + output.name
    return helper.make_graph(nodes, prefix.rstrip("/"), [], list(graph.output))


def merge_decoders(first_step: Path, next_step: Path, config):
    """One decoder graph switched by `use_cache_branch` (the module docstring) from the two exported decoders (or
    their quantized variants: the types are theirs)."""
    import onnx
    from onnx import TensorProto, helper

    first, following = onnx.load(str(first_step)), onnx.load(str(next_step))
    floating = {value.name: value.type.tensor_type.elem_type for value in following.graph.input}
    floating |= {value.name: value.type.tensor_type.elem_type for value in first.graph.output}
    layers, heads = config.decoder_layers, config.decoder_attention_heads
    head_dim = config.d_model // heads
    inputs = [
        helper.make_tensor_value_info("input_ids", TensorProto.INT64, ["batch_size", "decoder_sequence_length"]),
        helper.make_tensor_value_info(
            "encoder_attention_mask", TensorProto.INT64, ["batch_size", "encoder_sequence_length"]
        ),
        helper.make_tensor_value_info(
            "encoder_hidden_states",
            floating["encoder_hidden_states"],
            ["batch_size", "encoder_sequence_length", config.d_model],
        ),
    ]
    for name in past_names(layers):
        length = "past_decoder_sequence_length" if ".decoder." in name else "encoder_sequence_length_out"
        inputs.append(helper.make_tensor_value_info(name, floating[name], ["batch_size", heads, length, head_dim]))
    inputs.append(helper.make_tensor_value_info("use_cache_branch", TensorProto.BOOL, [1]))
    outer = {value.name for value in inputs}
    weights = {}
    with_past = _branch(following, "with_past/", weights, outer)
    without_past = _branch(first, "without_past/", weights, outer)
    names = ["logits", *past_names(layers, "present")]
    vocab = config.decoder_vocab_size if not config.share_encoder_decoder_embeddings else config.vocab_size
    outputs = [
        helper.make_tensor_value_info("logits", floating["logits"], ["batch_size", "decoder_sequence_length", vocab])
    ]
    for name in names[1:]:
        length = "present_decoder_sequence_length" if ".decoder." in name else "encoder_sequence_length_out"
        outputs.append(helper.make_tensor_value_info(name, floating[name], ["batch_size", heads, length, head_dim]))
    switch = helper.make_node(
        "If", ["use_cache_branch"], names, then_branch=with_past, else_branch=without_past, name="use_cache_branch"
    )
    graph = helper.make_graph([switch], "decoder_model_merged", inputs, outputs, list(weights.values()))
    merged = helper.make_model(graph, opset_imports=list(first.opset_import), ir_version=first.ir_version)
    functions = {function.name: function for function in [*first.functions, *following.functions]}
    merged.functions.extend(functions.values())
    onnx.checker.check_model(merged, full_check=False)
    return merged
