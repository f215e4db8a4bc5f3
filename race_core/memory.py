"""Memory the HF scorer may keep (docs/architecture.md §9): byte sizes written for people (`2GiB`), the memory a
device has free, and the automatic KV budget.

The scorer keeps copies of the keys/values of each trajectory's prefix so later rounds of the cover
feed only the changed suffix (`race_core.scoring.hf`). Those copies are the only part of its memory
that grows with the work given to it, so they are held under a byte budget. The automatic budget
(`Resources.kv_budget = 0`) is KV_MEMORY_SHARE of what the device has free when the scorer is built,
after the model is loaded: the other half stays for the forward's working set (the batch's padded
cache, activations, logits) and for the rest of the process. Free memory is, on CUDA,
`torch.cuda.mem_get_info` plus what torch's allocator has reserved but not handed out; on the CPU,
the kernel's `MemAvailable` (/proc/meminfo) or, where there is none, psutil's `available`.

`keep_freed_memory` is about speed, not budgets. glibc's malloc serves a large block (a forward's
activations, logits, a batch's cache) with its own `mmap` and hands it back to the kernel when freed,
so the next forward of another shape faults its pages in again, zero-filled; a forward over large
batches on a CPU spent up to a third of its time there (measured: the 20M model's decoder over
64 x 710 positions at 3,250 tokens/s, 4,890 with freed memory kept; SmolLM2 over 16 x 216 at 656
and 795). Same-shape repeats hide it (glibc raises its threshold after a free, up to 32 MiB), which
is why a benchmark's raw forward ran faster than the same layers inside the scorer. Raising the mmap
threshold keeps freed blocks in the heap for the next forward, and the heap is never trimmed by itself: the
process's resident memory stays at its peak instead of falling back between forwards. (A trim threshold,
even of 1 GiB, still handed back the top of the heap whenever that much was free there: a cover's rejected
candidates, 2 GB a round at 64 x 16 turns of the 20M model, or an earlier cover's kept copies, and the
next round faulted them in again: 1.95 M page faults and 131.5 s for that cover on an Intel Xeon under
KVM, 65,000 and 113.7 s never trimmed.) `release_freed_memory` hands it back after a
phase whose peak the next will not reach: the bootstrap between training and sampling, the automatic KV
budget before it reads what is free, a CPU training run after each optimizer step (batches of changing
lengths fragment a heap never trimmed), and every stage that loads a model (`gpu` in its declaration)
when it ends (`tasks.pipeline_tasks`), so a process that runs many stages, an ablation's flow, does not
hold each one's peak (it grew to 19.7 GB and was OOM-killed beside a vLLM engine before).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import re

KV_MEMORY_SHARE = 0.5
KEEP_FREED_BYTES = 2**30  # glibc: blocks up to this size come from the heap
NEVER_TRIM = -1  # glibc's trim threshold as a size_t: the largest, so free() never trims the heap
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # mallopt parameters (malloc.h)
_kept: bool | None = None  # keep_freed_memory's outcome, once per process
_UNITS = {"": 1, "b": 1, "k": 10**3, "kb": 10**3, "m": 10**6, "mb": 10**6, "g": 10**9, "gb": 10**9,
          "t": 10**12, "tb": 10**12, "kib": 2**10, "mib": 2**20, "gib": 2**30, "tib": 2**40}
_SIZE = re.compile(r"\s*(\d+(?:\.\d*)?|\.\d+)\s*([a-z]*)\s*")


def parse_size(value: int | str) -> int:
    """Bytes from an int or a size such as `2GiB`, `512 MiB`, `1.5GB` or `1000000` (binary units
    KiB..TiB, decimal kB..TB); ValueError naming the accepted forms otherwise."""
    if isinstance(value, bool):
        raise ValueError(f"{value!r} is not a byte size")
    if isinstance(value, int):
        if value < 0:
            raise ValueError(f"{value} is not a byte size: it is negative")
        return value
    match = _SIZE.fullmatch(str(value).lower())
    if not match or match[2] not in _UNITS:
        raise ValueError(f"{value!r} is not a byte size: expected bytes (1000000) or a number with one of "
                         f"the units KiB, MiB, GiB, TiB, kB, MB, GB, TB (2GiB, 512MiB)")
    return int(float(match[1]) * _UNITS[match[2]])


def format_size(n: int) -> str:
    """`1536` -> `1.5 KiB`: bytes in the largest binary unit below them."""
    for unit, size in (("TiB", 2**40), ("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10)):
        if n >= size:
            return f"{n / size:.1f} {unit}"
    return f"{n} B"


def available_memory(device: str) -> int:
    """Bytes free on `device` (`cpu`, `cuda`, `cuda:N`) now; see the module docstring."""
    if device.startswith("cuda"):
        import torch

        index = torch.device(device).index
        index = torch.cuda.current_device() if index is None else index
        free, _ = torch.cuda.mem_get_info(index)
        return int(free + torch.cuda.memory_reserved(index) - torch.cuda.memory_allocated(index))
    try:
        with open("/proc/meminfo") as fh:
            for line in fh:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    try:
        import psutil
    except ImportError:
        raise RuntimeError("cannot tell how much memory is free here (no /proc/meminfo, psutil not "
                           "installed): set the KV budget yourself (--kv-budget, e.g. 2GiB)") from None
    return int(psutil.virtual_memory().available)


def automatic_kv_budget(device: str) -> int:
    """KV_MEMORY_SHARE of the memory free on `device` now, in bytes. On a CPU the heap's free memory
    is handed back to the kernel first (`release_freed_memory`): with `keep_freed_memory` the blocks
    this process freed (an earlier scorer's kept copies, a training step's activations) stay in its
    heap, reusable by it but not counted by the kernel as available, and a budget taken then came
    out small enough to evict and recompute prefixes (a second cover in one process fed 1.6x the
    work bound's tokens)."""
    if not device.startswith("cuda"):
        release_freed_memory()
    return int(KV_MEMORY_SHARE * available_memory(device))


def release_freed_memory(collect: bool = True) -> bool:
    """Hand the heap's free memory back to the kernel now (glibc's `malloc_trim(0)`), after a phase
    whose peak the next one will not reach again (training, before sampling), or whose freed blocks
    the next would only fragment (a training step): with `keep_freed_memory` the heap otherwise stays
    at that peak. `collect`: Python's cycle collector runs first (a tenth of a second in a process
    that imported transformers; a training step's activations are freed without it). False where it
    does not apply."""
    import gc

    if collect:
        gc.collect()
    try:
        trim = ctypes.CDLL(ctypes.util.find_library("c")).malloc_trim
    except (OSError, AttributeError, TypeError):
        return False
    trim.argtypes, trim.restype = [ctypes.c_size_t], ctypes.c_int
    return bool(trim(0))


def keep_freed_memory() -> bool:
    """Make glibc's malloc keep freed large blocks for reuse instead of returning them to the kernel
    (see the module's notes): the mmap threshold at KEEP_FREED_BYTES and no trim threshold, which
    also ends glibc's own threshold tuning (setting one of them alone leaves blocks over 128 KiB on
    `mmap`: slower than not setting either); the heap is handed back only by `release_freed_memory`.
    Once per process; False where it does not apply: not glibc (macOS, musl), a refused setting, or
    RACE_KEEP_FREED_MEMORY=0 in the environment."""
    global _kept
    if _kept is None:
        _kept = False
        if os.environ.get("RACE_KEEP_FREED_MEMORY", "1") != "0":
            try:
                libc = ctypes.CDLL(ctypes.util.find_library("c"))
                mallopt = libc.mallopt
            except (OSError, AttributeError, TypeError):
                return _kept
            mallopt.argtypes, mallopt.restype = [ctypes.c_int, ctypes.c_int], ctypes.c_int
            _kept = bool(mallopt(_M_MMAP_THRESHOLD, KEEP_FREED_BYTES)) and bool(
                mallopt(_M_TRIM_THRESHOLD, NEVER_TRIM))
    return _kept


def freed_memory_kept() -> bool:
    """Whether `keep_freed_memory` took effect in this process (it is not called here)."""
    return bool(_kept)
