"""Shared fixtures: a tiny config and model, as transformers' own model testers use."""

import os

import pytest
import torch

from configuration_vanilla_transformer import VanillaTransformerConfig
from modeling_vanilla_transformer import VanillaTransformerForConditionalGeneration

TINY = dict(
    vocab_size=61,
    d_model=32,
    encoder_layers=2,
    decoder_layers=2,
    encoder_attention_heads=4,
    decoder_attention_heads=4,
    encoder_ffn_dim=64,
    decoder_ffn_dim=64,
    max_position_embeddings=32,
)


@pytest.fixture(autouse=True, scope="session")
def private_hf_home(tmp_path_factory):
    """Training runs in subprocesses cache their prepared corpora under $HF_HOME: keep them out of the user's cache."""
    previous = os.environ.get("HF_HOME")
    os.environ["HF_HOME"] = str(tmp_path_factory.mktemp("hf_home"))
    yield
    if previous is None:
        del os.environ["HF_HOME"]
    else:
        os.environ["HF_HOME"] = previous


@pytest.fixture(autouse=True, scope="session")
def one_torch_thread():
    """Tiny models run fastest on one thread: on a shared 2-core CPU, several threads mostly wait for each other."""
    threads = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(threads)


@pytest.fixture
def tiny_config() -> VanillaTransformerConfig:
    return VanillaTransformerConfig(**TINY)


@pytest.fixture
def tiny_model(tiny_config) -> VanillaTransformerForConditionalGeneration:
    torch.manual_seed(0)
    return VanillaTransformerForConditionalGeneration(tiny_config).eval()


@pytest.fixture
def source_batch(tiny_config):
    """Two right-padded source sentences: the second has 3 padding positions."""
    generator = torch.Generator().manual_seed(1)
    input_ids = torch.randint(4, tiny_config.vocab_size, (2, 9), generator=generator)
    attention_mask = torch.ones_like(input_ids)
    input_ids[1, 6:] = tiny_config.pad_token_id
    attention_mask[1, 6:] = 0
    return input_ids, attention_mask
