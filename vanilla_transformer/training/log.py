"""The training log (`TrainingLog`): every --logging_steps, the mean loss per target token, the learning rate and
tokens/s.

They go into train_log.jsonl, accelerate's trackers and the progress bar."""

import json
import time
from pathlib import Path

from vanilla_transformer.mechanics.files import on_full_disk, replace_file
from vanilla_transformer.training import checkpointing
from vanilla_transformer.training.settings import CheckpointSettings


class TrainingLog:
    """Every --logging_steps: the mean loss per target token and tokens/s since the last line, into `file` (JSON
    lines, main process), accelerate's trackers and the progress bar."""

    def __init__(self, accelerator, file: Path, progress, start_step: int, run: CheckpointSettings):
        self.accelerator, self.progress, self.file, self.run = accelerator, progress, file, run
        self.loss, self.tokens, self.start = 0.0, 0.0, time.time()
        if accelerator.is_main_process and self.file.is_file():
            self.end_the_last_line()
            self.drop_lines_after(start_step)

    def end_the_last_line(self) -> None:
        """A run killed while writing a line leaves it cut, without its newline: the next line would be glued to it
        and both lost. A cut line is dropped (it is not a whole record); a whole record that only lacks its newline
        gets one."""
        text = self.file.read_text()
        if not text or text.endswith("\n"):
            return
        complete, _, last = text.rpartition("\n")
        complete += "\n" if complete else ""
        if _logged_step(last) >= 0:
            complete += last + "\n"
        else:
            self.accelerator.print(f"[log] {self.file}: dropped its last line, cut by an interruption: {last[:80]!r}")
        replace_file(self.file, complete, staging=self.file.with_name(self.file.name + ".tmp"))

    def drop_lines_after(self, step: int) -> None:
        """Resumed from `step`: the lines of later steps belong to steps trained again now, so each step keeps one."""
        lines = self.file.read_text().splitlines(keepends=True)
        kept = [line for line in lines if _logged_step(line) <= step]
        if len(kept) < len(lines):
            replace_file(self.file, "".join(kept), staging=self.file.with_name(self.file.name + ".tmp"))

    def add(self, step_loss, step_tokens) -> None:
        """A step's summed loss and its target tokens (on every process): tensors on the device, read in `write`."""
        self.loss, self.tokens = self.loss + step_loss, self.tokens + step_tokens

    def write(self, step: int, lr: float, epoch: int) -> None:
        tokens = float(self.tokens)  # the host's one wait for the device in --logging_steps steps
        loss_per_token = float(self.accelerator.reduce(self.loss, "sum")) / tokens
        tokens_per_second = tokens / (time.time() - self.start)
        record = {
            "step": step,
            "loss": loss_per_token,
            "lr": lr,
            "target_tokens_per_second": tokens_per_second,
            "epoch": epoch,
        }
        self.progress.set_postfix(loss=f"{loss_per_token:.3f}", lr=f"{lr:.2e}", tok_s=f"{tokens_per_second:.0f}")
        self.accelerator.log({"train/" + k: v for k, v in record.items() if k != "step"}, step=step)
        if self.accelerator.is_main_process:
            with (
                on_full_disk(checkpointing.disk_full(self.run, f"the training log {self.file.name}")),
                self.file.open("a") as log,
            ):
                log.write(json.dumps(record) + "\n")
        self.loss, self.tokens, self.start = 0.0, 0.0, time.time()


def _logged_step(line: str) -> float:
    try:
        return json.loads(line)["step"]
    except (ValueError, KeyError, TypeError):
        return -1  # a damaged line stays as it is
