"""Keep freed memory for reuse: generation's large tensors without a page fault per step.

generate() allocates large tensors at every step (the logits over the vocabulary and their log-softmax, the beams'
reordered key/value caches) and frees them a step later. glibc's malloc serves an allocation over its mmap threshold
(128 KiB, rising with use to 32 MiB at most) with fresh pages from the kernel and unmaps them on free, so every step
faults that memory in again. At the OPUS-MT size (58,101-token vocabulary) and beam 4, the logits of a batch past
about 32 sentences are over 32 MiB, so larger batches run slower per token, not faster: on 2 CPU threads a batch of
64 sentences takes 17.5 s where one of 32 takes 5.4 (a third of it in `index_select` on fresh caches).
`keep_freed_memory` asks glibc to serve allocations of any size from the heap and to keep what is freed there for the
next step, as CTranslate2's own allocator does: the batch of 64 then takes 10.5 s, and the translate command at
--max_tokens 8000 runs 1.11-1.15x faster (docs/BENCHMARKS.md, "Translating a corpus").

The cost is memory. Blocks freed at one step do not always fit the next step's sizes (a cache grows a position a
step, and small allocations split large free blocks), so the peak grows somewhat (up to 0.1 GB for the translate
command at --max_tokens 8000 at that size, the same row), and the process's memory no longer shrinks after a peak.
The translate command's model backend calls it for its own process; the library never changes a process it does not
own. Elsewhere than glibc (macOS, musl), or where the user set malloc's settings, it does nothing.
"""

import ctypes
import os
import platform

# mallopt's parameters (glibc's malloc.h)
M_TRIM_THRESHOLD, M_TOP_PAD, M_MMAP_THRESHOLD = -1, -2, -3
LARGEST = 2**31 - 1  # mallopt takes an int: no allocation under 2 GiB is mmapped, no free space under it trimmed
TOP_PAD = 256 << 20  # the heap grows 256 MiB at a time (address space: pages count once touched)


def keep_freed_memory() -> bool:
    """Serve this process's allocations from the heap and keep what is freed there (glibc only). True where it
    took effect; a user's own malloc settings (GLIBC_TUNABLES, MALLOC_*_ variables) are left as they are."""
    if platform.system() != "Linux" or platform.libc_ver()[0] != "glibc":
        return False
    if any(name == "GLIBC_TUNABLES" or name.startswith("MALLOC_") for name in os.environ):
        return False
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    settings = ((M_MMAP_THRESHOLD, LARGEST), (M_TRIM_THRESHOLD, LARGEST), (M_TOP_PAD, TOP_PAD))
    return all(mallopt(parameter, value) == 1 for parameter, value in settings)
