"""The check of an ONNX export against the PyTorch model it came from: exact, or refused.

On a batch of sentences, ONNX Runtime must give the model's logits (relative difference at most `RELATIVE`: the
largest difference over the largest logit) through the no-past branch on whole prefixes and through the with-past
branch step by step, and generate()'s greedy and beam-4 tokens through both. `check_onnx_export` raises
`OnnxCheckError` with the numbers otherwise; `agreement` measures a quantized variant against float32.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import torch

from vanilla_transformer.converters.onnx_decoding import Decoding, OnnxModel, search
from vanilla_transformer.mechanics.errors import VanillaTransformerError

RELATIVE = 1e-4
CHECK_BEAMS = (1, 4)


class OnnxCheckError(VanillaTransformerError, RuntimeError):
    """The export does not compute what the model computes; the message gives the numbers."""


def padded(batch: list[list[int]], pad: int) -> tuple[np.ndarray, np.ndarray]:
    """Right-padded int64 ids and their attention mask."""
    width = max(map(len, batch))
    ids = np.full((len(batch), width), pad, dtype=np.int64)
    mask = np.zeros((len(batch), width), dtype=np.int64)
    for row, sentence in enumerate(batch):
        ids[row, : len(sentence)], mask[row, : len(sentence)] = sentence, 1
    return ids, mask


def rows(sequences: torch.Tensor, pad: int | None) -> list[list[int]]:
    """Each sequence as a list, padding at its end left out (generate() pads a batch to its longest)."""
    found = []
    for row in sequences.tolist():
        while pad is not None and len(row) > 1 and row[-1] == pad:
            row.pop()
        found.append(row)
    return found


def logits_difference(model, onnx_model: OnnxModel, ids, mask, targets: torch.Tensor) -> dict[str, float]:
    """Relative logits differences of the no-past branch (whole prefix) and the with-past branch (step by step)."""
    with torch.no_grad():
        expected = model(
            input_ids=torch.from_numpy(ids), attention_mask=torch.from_numpy(mask), decoder_input_ids=targets
        ).logits.numpy()
    scale = float(np.abs(expected).max()) or 1.0
    hidden = onnx_model.encode(ids, mask)
    whole, _ = onnx_model.step(targets.numpy(), mask, hidden, None)
    steps, past = [], None
    for position in range(targets.shape[1]):
        logits, past = onnx_model.step(targets[:, position : position + 1].numpy(), mask, hidden, past)
        steps.append(logits)
    stepped = np.concatenate(steps, axis=1)
    return {
        "without the cache": float(np.abs(whole - expected).max()) / scale,
        "with the cache": float(np.abs(stepped - expected).max()) / scale,
    }


def reference_tokens(model, ids, mask, decoding: Decoding, max_new_tokens: int, beams: int) -> list[list[int]]:
    """generate()'s tokens for the batch at `beams`, with the folder's other settings."""
    with torch.no_grad():
        output = model.generate(
            input_ids=torch.from_numpy(ids),
            attention_mask=torch.from_numpy(mask),
            num_beams=beams,
            max_new_tokens=max_new_tokens,
            do_sample=False,
        )
    return rows(output, decoding.pad)


def check_onnx_export(
    model, folder: str | Path, batch: list[list[int]], decoding: Decoding, max_new_tokens: int = 20, name=None
):
    """Raise OnnxCheckError unless the export in `folder` gives `model`'s logits and tokens on `batch` (the module
    docstring); returns the measured differences. `name`: the folder as the refusal names it (default `folder`; the
    export command's OUT, not the staging folder it checks)."""
    import dataclasses

    onnx_model = OnnxModel(folder)
    ids, mask = padded(batch, decoding.pad if decoding.pad is not None else 0)
    max_length = max_new_tokens + 1
    targets = torch.tensor(
        [
            row + [row[-1]] * (max_length - len(row))
            for row in reference_tokens(model, ids, mask, decoding, max_new_tokens, 1)
        ]
    )
    found = logits_difference(model, onnx_model, ids, mask, targets)
    problems = [
        f"logits {name}: {value:.2e} relative (at most {RELATIVE:.0e})"
        for name, value in found.items()
        if not value <= RELATIVE
    ]
    for beams in CHECK_BEAMS:
        expected = reference_tokens(model, ids, mask, decoding, max_new_tokens, beams)
        settings = dataclasses.replace(decoding, num_beams=beams)
        for use_cache in (True, False):
            got = rows(search(onnx_model, ids, mask, settings, max_length, use_cache), decoding.pad)
            same = sum(a == b for a, b in zip(got, expected, strict=True))
            found[f"beam {beams} {'with' if use_cache else 'without'} the cache"] = same / len(batch)
            if same != len(batch):
                problems.append(
                    f"beam {beams} {'with' if use_cache else 'without'} the cache: {len(batch) - same} of "
                    f"{len(batch)} sentences get other tokens than the model's"
                )
    if problems:
        raise OnnxCheckError(
            f"the ONNX export {name or folder} does not compute the model's results: {'; '.join(problems)}"
        )
    return found


def agreement(folder: str | Path, suffix: str, batch: list[list[int]], decoding: Decoding, max_new_tokens=20):
    """The share of `batch`'s sentences whose tokens the `suffix` variant ("_quantized", "_fp16") gives as float32."""
    ids, mask = padded(batch, decoding.pad if decoding.pad is not None else 0)
    reference = rows(search(OnnxModel(folder), ids, mask, decoding, max_new_tokens + 1), decoding.pad)
    got = rows(search(OnnxModel(folder, suffix), ids, mask, decoding, max_new_tokens + 1), decoding.pad)
    return sum(a == b for a, b in zip(got, reference, strict=True)) / len(batch)
