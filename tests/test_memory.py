"""keep_freed_memory (vanilla_transformer/mechanics/memory.py): freed memory is reused without faulting pages in."""

import os
import platform
import subprocess
import sys

import pytest

from vanilla_transformer.mechanics import memory

GLIBC = platform.system() == "Linux" and platform.libc_ver()[0] == "glibc"

# A fresh interpreter decodes as generation does: each of 20 steps makes a 64 MiB tensor (the logits) and a cache one
# MiB longer than the last, and frees the previous ones; it prints the page faults of the 20 steps.
STEPS = """
import resource, sys
import torch
from vanilla_transformer.mechanics.memory import keep_freed_memory
said = keep_freed_memory() if sys.argv[1] == "kept" else "plain"
cache = torch.zeros(1)
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
for step in range(20):
    logits = torch.empty(16 << 20).fill_(1.0)
    cache = torch.cat([cache, torch.ones(1 << 18)])
    del logits
print(said, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""
PAGES_OF_64_MIB = 16_384  # of 4 KiB
WITHOUT_MALLOC_SETTINGS = {
    name: value for name, value in os.environ.items() if name != "GLIBC_TUNABLES" and not name.startswith("MALLOC_")
}


def page_faults(mode: str) -> tuple[str, int]:
    result = subprocess.run(
        [sys.executable, "-c", STEPS, mode], capture_output=True, text=True, check=True, env=WITHOUT_MALLOC_SETTINGS
    )
    said, faults = result.stdout.split()
    return said, int(faults)


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt: elsewhere keep_freed_memory does nothing")
def test_decoding_steps_reuse_freed_memory_instead_of_faulting_it_in_each_step():
    said, faults = page_faults("kept")
    assert said == "True"
    assert faults < 6 * PAGES_OF_64_MIB, faults  # a few steps fault in new memory, the rest reuse it


@pytest.mark.skipif(not GLIBC, reason="glibc's mallopt")
def test_without_it_glibc_faults_a_large_tensor_in_at_every_step():
    """Why it exists: glibc maps a block this large afresh each time (this test fails where malloc does not)."""
    _, faults = page_faults("plain")
    assert faults > 15 * PAGES_OF_64_MIB, faults


def test_a_users_own_malloc_settings_are_left_as_they_are(monkeypatch):
    monkeypatch.setenv("MALLOC_ARENA_MAX", "2")
    assert memory.keep_freed_memory() is False
