from pathlib import Path

import pytest
import torch
from safetensors.torch import save_file

from vanilla_transformer.checkpoints import (
    WEIGHTS_NAME,
    average_checkpoints,
    checkpoint_dir,
    finalize_checkpoint,
    latest_checkpoint,
    list_checkpoints,
    prune_checkpoints,
    staging_dir,
)


def write_checkpoint(root: Path, step: int, tensors: dict[str, torch.Tensor] | None = None) -> Path:
    """Save like the training script: into a staging folder, then rename it into place."""
    staging = staging_dir(root, step)
    staging.mkdir(parents=True)
    save_file(tensors or {"weight": torch.full((2,), float(step))}, str(staging / WEIGHTS_NAME))
    (staging / "optimizer.bin").write_bytes(b"")
    return finalize_checkpoint(staging, checkpoint_dir(root, step))


def test_numeric_sorting(tmp_path: Path) -> None:
    for step in (10, 2, 100, 1):
        write_checkpoint(tmp_path, step)
    (tmp_path / "step_3").mkdir()  # no weights: interrupted save_state
    (tmp_path / "step_4.bak").mkdir()
    (tmp_path / "notes.txt").write_text("not a checkpoint")
    assert [path.name for path in list_checkpoints(tmp_path)] == [
        "step_000001",
        "step_000002",
        "step_000010",
        "step_000100",
    ]
    # Numeric, not lexicographic, even without zero padding.
    for name in ("step_9", "step_1000000"):
        (tmp_path / name).mkdir()
        save_file({"weight": torch.zeros(2)}, str(tmp_path / name / WEIGHTS_NAME))
    assert [path.name for path in list_checkpoints(tmp_path)][-3:] == ["step_000010", "step_000100", "step_1000000"]


def test_incomplete_checkpoints_are_ignored(tmp_path: Path) -> None:
    assert latest_checkpoint(tmp_path / "missing") is None
    write_checkpoint(tmp_path, 5)
    staging_dir(tmp_path, 7).mkdir()  # save in progress
    save_file({"weight": torch.zeros(2)}, str(staging_dir(tmp_path, 7) / WEIGHTS_NAME))
    checkpoint_dir(tmp_path, 9).mkdir()  # weights never written
    assert latest_checkpoint(tmp_path) == checkpoint_dir(tmp_path, 5)


def test_finalize_refuses_incomplete_and_replaces_existing(tmp_path: Path) -> None:
    staging_dir(tmp_path, 1).mkdir()
    with pytest.raises(FileNotFoundError):
        finalize_checkpoint(staging_dir(tmp_path, 1), checkpoint_dir(tmp_path, 1))
    save_file({"weight": torch.zeros(2)}, str(staging_dir(tmp_path, 1) / WEIGHTS_NAME))
    finalize_checkpoint(staging_dir(tmp_path, 1), checkpoint_dir(tmp_path, 1))

    final = write_checkpoint(tmp_path, 1, {"weight": torch.ones(2)})
    assert torch.equal(average_checkpoints([final])["weight"], torch.ones(2))
    assert sorted(path.name for path in tmp_path.iterdir()) == ["step_000001"]


def test_prune_keeps_newest(tmp_path: Path) -> None:
    for step in (1, 2, 10, 20):
        write_checkpoint(tmp_path, step)
    staging_dir(tmp_path, 30).mkdir()
    assert prune_checkpoints(tmp_path, None) == []
    assert prune_checkpoints(tmp_path, 0) == []
    assert len(list_checkpoints(tmp_path)) == 4

    deleted = prune_checkpoints(tmp_path, 2)
    assert [path.name for path in deleted] == ["step_000001", "step_000002"]
    assert list_checkpoints(tmp_path) == [checkpoint_dir(tmp_path, 10), checkpoint_dir(tmp_path, 20)]
    assert staging_dir(tmp_path, 30).is_dir()

    prune_checkpoints(tmp_path, 1)
    assert list_checkpoints(tmp_path) == [checkpoint_dir(tmp_path, 20)]


def test_average_of_three_is_the_mean(tmp_path: Path) -> None:
    generator = torch.Generator().manual_seed(0)
    states = [
        {"linear.weight": torch.randn(3, 4, generator=generator), "steps": torch.tensor([7, 8])} for _ in range(3)
    ]
    paths = [write_checkpoint(tmp_path, step, state) for step, state in enumerate(states)]
    paths[2] = paths[2] / WEIGHTS_NAME  # files and folders both work

    averaged = average_checkpoints(paths)
    expected = torch.stack([state["linear.weight"] for state in states]).mean(dim=0)
    assert set(averaged) == {"linear.weight", "steps"}
    torch.testing.assert_close(averaged["linear.weight"], expected)
    assert averaged["linear.weight"].dtype == torch.float32
    assert torch.equal(averaged["steps"], torch.tensor([7, 8]))


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_average_keeps_low_precision_dtype(tmp_path: Path, dtype: torch.dtype) -> None:
    values = [torch.tensor([1.0, 2.0]), torch.tensor([2.0, 4.0])]
    paths = [write_checkpoint(tmp_path, step, {"weight": value.to(dtype)}) for step, value in enumerate(values)]
    averaged = average_checkpoints(paths)["weight"]
    assert averaged.dtype == dtype
    assert torch.equal(averaged, torch.tensor([1.5, 3.0], dtype=dtype))


def test_average_rejects_mismatches(tmp_path: Path) -> None:
    base = write_checkpoint(tmp_path, 1, {"a": torch.zeros(2), "b": torch.zeros(2)})
    other_keys = write_checkpoint(tmp_path, 2, {"a": torch.zeros(2), "c": torch.zeros(2)})
    other_shape = write_checkpoint(tmp_path, 3, {"a": torch.zeros(2), "b": torch.zeros(3)})
    other_ints = write_checkpoint(tmp_path, 4, {"i": torch.tensor([2])})

    with pytest.raises(ValueError, match=r"missing keys \['b'\], extra keys \['c'\]") as error:
        average_checkpoints([base, other_keys])
    assert "step_000002" in str(error.value)
    with pytest.raises(ValueError, match=r"'b'.*step_000003.*shape \(3,\)"):
        average_checkpoints([base, other_shape])
    with pytest.raises(ValueError, match=r"'i'.*differs"):
        average_checkpoints([write_checkpoint(tmp_path, 5, {"i": torch.tensor([1])}), other_ints])
    with pytest.raises(ValueError, match="at least one"):
        average_checkpoints([])
    with pytest.raises(FileNotFoundError):
        average_checkpoints([tmp_path / "step_000099"])
