"""The run's set-up: its Accelerator, refusing set-ups that would train differently from the recipe, and the model's
config.

`make_accelerator` makes the Accelerator, `UnsupportedSetup` is the refusal, and `config_for_tokenizer` sizes the
model's config to the tokenizer."""

import os

import torch

from vanilla_transformer.mechanics.barrier import WAIT_LONGER, CoordinationError
from vanilla_transformer.mechanics.errors import VanillaTransformerError
from vanilla_transformer.training import checkpoint_folders


class UnsupportedSetup(VanillaTransformerError):
    """An accelerate set-up this recipe cannot run correctly; the message says what to use instead."""


def make_accelerator(**kwargs):
    """An Accelerator that really is distributed when launched as several processes, refusing set-ups that would
    train differently from the recipe (DeepSpeed, sharded FSDP checkpoints).

    On a machine without an accelerator device, `accelerate launch --multi_gpu --num_processes N` (or torchrun)
    starts N processes; without `cpu=True` each would build a single-process Accelerator and train alone.
    """
    from accelerate import Accelerator

    if os.environ.get("ACCELERATE_USE_DEEPSPEED", "false").lower() in ("1", "true", "yes"):
        raise UnsupportedSetup(DEEPSPEED_REFUSED)  # before Accelerator() imports and configures DeepSpeed
    has_device = torch.cuda.is_available() or (hasattr(torch, "xpu") and torch.xpu.is_available())
    has_device = has_device or torch.backends.mps.is_available()
    try:
        accelerator = Accelerator(cpu=not has_device, **kwargs)
    except (
        torch.distributed.DistStoreError
    ) as error:  # "Timed out after 3 seconds waiting for clients", "wait timeout"
        if not any(words in str(error).lower() for words in ("timeout", "timed out")):
            raise
        raise CoordinationError(
            f"a process waited longer than --ddp_timeout for the other processes to start: {WAIT_LONGER}"
        ) from error
    launched_as = int(os.environ.get("WORLD_SIZE", "1"))
    if accelerator.num_processes != launched_as:
        raise RuntimeError(
            f"Launched as {launched_as} processes but Accelerate set up {accelerator.num_processes}; "
            "check the launch command and the accelerate config."
        )
    check_distributed_setup(accelerator)
    accelerator.register_save_state_pre_hook(checkpoint_folders.save_tied_weights_once)
    return accelerator


DEEPSPEED_REFUSED = (
    "DeepSpeed is not supported: this script accumulates gradients itself (each optimizer step divides the summed "
    "loss by the step's target tokens over all micro-batches and processes, section 5.1), and DeepSpeed's engine "
    "would step the optimizer after every micro-batch. Use DDP (configs/accelerate/ddp_8gpu.yaml) or, for models "
    "past `big`, FSDP (configs/accelerate/fsdp.yaml)."
)


def check_distributed_setup(accelerator) -> None:
    from accelerate.utils import DistributedType

    if accelerator.distributed_type == DistributedType.DEEPSPEED:
        raise UnsupportedSetup(DEEPSPEED_REFUSED)
    if accelerator.distributed_type == DistributedType.FSDP:
        state_dict_type = str(accelerator.state.fsdp_plugin.state_dict_type)
        if "FULL_STATE_DICT" not in state_dict_type:
            raise UnsupportedSetup(
                f"FSDP with fsdp_state_dict_type {state_dict_type}: checkpoints must be FULL_STATE_DICT (one file of "
                "tensors, read without unpickling), which averaging and the final model need; see "
                "configs/accelerate/fsdp.yaml"
            )


def config_for_tokenizer(preset: str, tokenizer, **overrides):
    """The model config of a preset (configuration_vanilla_transformer.PRESETS) with `overrides`, sized to the
    tokenizer's vocabulary and using its special tokens (the decoder starts from <s>)."""
    from configuration_vanilla_transformer import VanillaTransformerConfig

    return VanillaTransformerConfig.from_preset(
        preset,
        **overrides,
        vocab_size=len(tokenizer),
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        decoder_start_token_id=tokenizer.bos_token_id,
    )
