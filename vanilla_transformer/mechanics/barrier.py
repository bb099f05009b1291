"""Work that one process does while the others wait: preparing a corpus, training a tokenizer, claiming the output
folder. An error there reaches every process, so none is left waiting at a barrier for ever."""

import torch

from vanilla_transformer.mechanics.errors import VanillaTransformerError

WAIT_LONGER = "raise --ddp_timeout"
PREPARE_BEFOREHAND = "raise --ddp_timeout, or prepare the corpus beforehand (vanilla-transformer prepare)"


class CoordinationError(VanillaTransformerError):
    """Work on another process failed or took longer than the processes wait; the message says which and what to
    do."""


def run_while_others_wait(accelerator, work, what: str, selected: bool | None = None, if_too_slow: str = WAIT_LONGER):
    """Run `work` on each machine's first process (or where `selected`) while the others wait; an error there is
    raised after the wait on every process (the others get a `CoordinationError` that points to it). `what` names
    the work in messages; `if_too_slow` is the advice when a process waited past --ddp_timeout. Without an
    accelerator (one process), just run `work`."""
    if accelerator is None:
        return work()
    failure = None
    if accelerator.is_local_main_process if selected is None else selected:
        try:
            work()
        except Exception as error:  # raised below, once every process has reached the collective
            failure = error
    # the collective is the barrier: every process waits here until the work is done
    try:
        failed = accelerator.reduce(torch.tensor(float(failure is not None), device=accelerator.device), "sum").item()
    except Exception as error:  # torch raises RuntimeError or DistBackendError, with "timed out" or "Timeout"
        if failure is None and "time" in str(error).lower() and "out" in str(error).lower():
            raise CoordinationError(
                f"a process waited longer than --ddp_timeout for {what} elsewhere: {if_too_slow}"
            ) from error
        raise
    if failure is not None:
        raise failure
    if failed:
        raise CoordinationError(f"{what} failed on another process: see its error above")
