"""Freed memory kept for the next forward (`race_core.memory.keep_freed_memory`): counted in page
faults, which do not depend on the machine's speed. Each case runs in its own process, since the
setting is process-wide and cannot be undone."""

from __future__ import annotations

import os
import platform
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
glibc = pytest.mark.skipif(platform.libc_ver()[0] != "glibc", reason="mallopt's thresholds are glibc's")

FORWARDS = """
import resource, sys, torch
from race_core.memory import keep_freed_memory
from race_core.policy import load_policy

model, _ = load_policy(sys.argv[1])
decoder = model.get_decoder()
# two shapes in turn, as a scorer's batches come; the MLP's blocks (rows x length x 128 floats) pass
# 32 MiB, the most glibc's own threshold rises to, so by default every forward maps them afresh
shapes = [(128, 640), (112, 700)]
with torch.inference_mode():
    for rows, length in shapes:  # each shape once first: what is faulted in then is not counted
        decoder(input_ids=torch.zeros(rows, length, dtype=torch.long), use_cache=False)
    before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
    for _ in range(5):
        for rows, length in shapes:
            decoder(input_ids=torch.zeros(rows, length, dtype=torch.long), use_cache=False)
    print(keep_freed_memory(), resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


def forwards(checkpoint, keep: bool) -> tuple[bool, int]:
    """(whether freed memory was kept, page faults of 10 forwards after a warm-up) in a fresh process."""
    env = {**os.environ, "RACE_KEEP_FREED_MEMORY": "1" if keep else "0"}
    done = subprocess.run([sys.executable, "-c", FORWARDS, str(checkpoint)], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    kept, faults = done.stdout.split()
    return kept == "True", int(faults)


@glibc
def test_forwards_of_changing_shapes_reuse_freed_memory_instead_of_faulting_it_in_again(tiny_checkpoint):
    """Without the setting every forward's large blocks come back from the kernel zero-filled (measured:
    773,000 to 1,300,000 faults over these 10 forwards of the tiny model); with it they are reused
    (5,000 to 20,000, what the heap still grows by). Blocks under 32 MiB made the default count move
    with the threads' timing (15,700 to 106,000: glibc raises its threshold as blocks are freed), and
    a CI run failed on it; above it, the default cannot keep them."""
    kept, faults_kept = forwards(tiny_checkpoint, keep=True)
    not_kept, faults_default = forwards(tiny_checkpoint, keep=False)
    assert kept and not not_kept
    assert faults_default > 200_000, "the workload no longer makes glibc map and unmap its blocks"
    assert faults_kept * 10 < faults_default, (faults_kept, faults_default)


@glibc
def test_the_scorer_says_whether_freed_memory_is_kept(tiny_policy):
    """A model built by the caller (not `load_policy`) gets the setting from the scorer; its stats say so."""
    from race_core.scoring.hf import HFScorer

    model, tokenizer = tiny_policy
    scorer = HFScorer(model, tokenizer)
    assert scorer.stats.extra["freed_memory_kept"] is (os.environ.get("RACE_KEEP_FREED_MEMORY", "1") != "0")


# A cover's round frees its rejected candidates' copies at the top of the heap (2 GB a round at 64 x 16 turns
# of the 20M model) and the next round allocates as much again: 8 x 256 MiB here, touched, freed, taken again.
ROUNDS = """
import ctypes, ctypes.util, resource
from race_core.memory import keep_freed_memory
assert keep_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
def a_round():
    blocks = [libc.malloc(2**28) for _ in range(8)]
    for block in blocks:
        ctypes.memset(block, 1, 2**28)
    for block in blocks:
        libc.free(block)
a_round()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
a_round()
print(resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before)
"""


@glibc
def test_memory_freed_at_the_top_of_the_heap_is_kept_for_the_next_round():
    """With a trim threshold (1 GiB before) glibc handed the top of the heap back whenever that much was
    free there, and the next round faulted its 2 GiB in again (524,000 pages; a cover of 64 x 16 turns of
    the 20M model took 131.5 s with it, 113.7 s never trimmed, one run each); never trimmed, the round
    reuses it. In a fresh process, counted in page faults."""
    from race_core.memory import keep_freed_memory

    if not keep_freed_memory():
        pytest.skip("glibc's malloc keeps no freed memory here (not glibc, or RACE_KEEP_FREED_MEMORY=0)")
    run = subprocess.run([sys.executable, "-c", ROUNDS], cwd=REPO, capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout) < 2**31 // 4096 // 20, run.stdout  # a twentieth of the pages at most (none measured)
