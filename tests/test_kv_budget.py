"""The HF scorer's KV-prefix copies stay within a byte budget (issue 16): dropping copies costs time,
never decisions; the budget is a resource, not part of the cover's key; a shard out of memory is scored
again with half the batch and the budget, on every executor (the unit worker does it)."""

import logging
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from flows.cli import build_parser
from flows.options import config_from_args
from race_core.config import CoverConfig, PipelineConfig, Resources
from race_core.cover import logic_cover
from race_core.memory import KV_MEMORY_SHARE, automatic_kv_budget, available_memory, format_size, parse_size
from race_core.policy import checkpoint_digest
from race_core.scoring import ScoreRequest
from race_core.scoring.hf import HFScorer
from storage import ArtifactStore
from tasks import stages
from tasks.cover_scoring import KV_BUDGET_FLOOR, can_shrink, shrunk
from tasks.units import UnitWorker, out_of_memory

EPS = 1e-3
UNBOUNDED = 10**15
DROP_TOLERANCE = 1e-6  # float summation order only (see tests/test_cover.py)


def tensor_bytes(scorer: HFScorer) -> int:
    """Bytes of the memory the kept copies keep alive, counted from the tensors themselves: each
    storage once, however many segments are views of it and copies share them, not from the
    scorer's own tally."""
    store = scorer._prefixes  # the private store: this test checks its bookkeeping against the tensors
    segments = {id(s): s for key in list(store._by_key) for copy in store.get(key) for s, _ in copy.parts}
    tensors = [t for s in segments.values()
               for t in ([s.data] if isinstance(s.data, torch.Tensor) else [t for kv in s.data for t in kv])]
    return sum({t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in tensors}.values())


def test_kv_bytes_per_token_from_the_config_is_what_the_kept_copies_take(tiny_policy, expert_trajectories):
    model, tokenizer = tiny_policy
    scorer = HFScorer(model, tokenizer, kv_budget=UNBOUNDED)
    scorer.score([ScoreRequest(i, t) for i, t in enumerate(expert_trajectories[:3])])
    store = scorer._prefixes
    tokens = sum(p.ids.size for key in list(store._by_key) for p in store.get(key))
    assert scorer.kv_bytes_per_token == 2 * 2 * 1 * 32 * 4  # TINY: 2 layers x K,V x 1 kv head x 32 x float32
    assert scorer.kv_bytes_held == tensor_bytes(scorer) == tokens * scorer.kv_bytes_per_token > 0
    assert scorer.stats.kv_bytes_peak == scorer.kv_bytes_held
    scorer.release()
    assert scorer.kv_bytes_held == tensor_bytes(scorer) == 0


@pytest.mark.parametrize("budget_tokens", [0, 300, 1200])  # 0: one byte, nothing is kept; one trajectory is ~100-400
def test_a_small_kv_budget_gives_the_decisions_and_drops_of_an_unbounded_one(tiny_policy, expert_trajectories,
                                                                             budget_tokens):
    model, tokenizer = tiny_policy
    trajectories = expert_trajectories[:10]
    unbounded = HFScorer(model, tokenizer, batch_size=4, kv_budget=UNBOUNDED)
    reference = logic_cover(trajectories, unbounded, EPS)
    budget = max(1, budget_tokens * unbounded.kv_bytes_per_token)
    bounded = HFScorer(model, tokenizer, batch_size=4, kv_budget=budget)
    held_after_rounds = []

    def after_round(t: int, n: int, last: int) -> None:
        held_after_rounds.append((bounded.kv_bytes_held, tensor_bytes(bounded)))

    results = logic_cover(trajectories, bounded, EPS, progress=after_round)
    assert [r.skipped_turns for r in results] == [r.skipped_turns for r in reference]
    assert any(r.skipped_turns for r in reference) and any(
        not e["accepted"] for r in reference for e in r.audit if not e["skipped_empty"])
    for got, want in zip(results, reference, strict=True):
        assert got.trajectory == want.trajectory
        assert [(e["turn"], e["accepted"]) for e in got.audit] == [(e["turn"], e["accepted"]) for e in want.audit]
        for a, b in zip(got.audit, want.audit, strict=True):
            assert a["drops"] == pytest.approx(b["drops"], abs=DROP_TOLERANCE)
    assert held_after_rounds and all(held == counted <= budget for held, counted in held_after_rounds)
    assert bounded.stats.kv_bytes_peak <= budget < unbounded.stats.kv_bytes_peak
    assert bounded.stats.evictions > 0 and unbounded.stats.evictions == 0
    assert bounded.stats.tokens_processed > unbounded.stats.tokens_processed  # the dropped prefixes were fed again
    if budget_tokens == 0:
        assert bounded.stats.kv_bytes_peak == 0 and bounded.stats.tokens_reused == 0


def test_the_automatic_budget_is_a_share_of_the_free_memory(tiny_policy):
    model, tokenizer = tiny_policy
    free = available_memory("cpu")
    scorer = HFScorer(model, tokenizer)  # kv_budget 0: automatic
    assert 0 < scorer.kv_budget <= KV_MEMORY_SHARE * free * 1.5  # the free memory moves a little meanwhile
    assert scorer.stats.extra["kv_budget"] == scorer.kv_budget
    assert 0 < automatic_kv_budget("cpu") < free * 1.5
    with pytest.raises(ValueError, match="kv_budget must be >= 0"):
        HFScorer(model, tokenizer, kv_budget=-1)


# A fresh process's heap: a phase's 2 GiB used, then freed below a live block, where glibc never trims
# by itself (its heap holds no free block the live one could take); read on its own resident memory.
HEAP_PEAK = """
import ctypes, ctypes.util, resource
from race_core.memory import keep_freed_memory
assert keep_freed_memory()
libc = ctypes.CDLL(ctypes.util.find_library("c"))
libc.malloc.restype, libc.malloc.argtypes, libc.free.argtypes = ctypes.c_void_p, [ctypes.c_size_t], [ctypes.c_void_p]
above = []
def resident():
    return int(open("/proc/self/statm").read().split()[1]) * resource.getpagesize()
def peak():  # 8 x 256 MiB: under the kept threshold, so heap blocks; then a live block above them, then freed
    blocks = [libc.malloc(2**28) for _ in range(8)]
    for block in blocks:
        ctypes.memset(block, 1, 2**28)
    above.append(libc.malloc(2**26))
    for block in blocks:
        libc.free(block)
"""

FREED_THEN_BUDGET = HEAP_PEAK + """
from race_core.memory import automatic_kv_budget
peak()
kept = resident()
automatic_kv_budget("cpu")
print(kept - resident())
"""


def test_the_automatic_budget_counts_what_this_process_freed_as_free():
    """With freed memory kept (glibc's thresholds raised), blocks an earlier phase freed stay in the
    process's heap, resident and out of the kernel's MemAvailable, so a budget taken then came out
    small: the automatic budget hands them back first (HEAP_PEAK: in a fresh process, on its own
    resident memory, which other processes do not move)."""
    from race_core.memory import keep_freed_memory

    if not keep_freed_memory():
        pytest.skip("glibc's malloc keeps no freed memory here (not glibc, or RACE_KEEP_FREED_MEMORY=0)")
    run = subprocess.run([sys.executable, "-c", FREED_THEN_BUDGET], capture_output=True, text=True, timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout) > 2**30 * 1.9  # the 2 GiB freed are handed back (without the release: none)


def test_sizes_are_read_as_people_write_them_and_a_bad_one_names_the_option():
    assert [parse_size(x) for x in ("2GiB", "512 MiB", "1.5GB", "1000000", "64kib", 7)] == [
        2 * 2**30, 512 * 2**20, 1_500_000_000, 1_000_000, 64 * 1024, 7]
    assert format_size(3 * 2**29) == "1.5 GiB" and format_size(512) == "512 B"
    assert Resources(kv_budget="2GiB").kv_budget == 2 * 2**30
    for bad in ("2 parsecs", "-1", -5, "GiB"):
        with pytest.raises(ValueError, match="parameter 'resources.kv_budget'"):
            Resources(kv_budget=bad)
    args = build_parser().parse_args(["run", "--input", "a.jsonl", "--checkpoint", "/m", "--kv-budget", "512MiB"])
    assert config_from_args(PipelineConfig(), args).resources.kv_budget == 512 * 2**20


def test_the_kv_budget_is_not_part_of_the_cover_key(tiny_checkpoint, demo_inputs, tmp_path, caplog):
    caplog.set_level(logging.INFO, logger="race_core.progress")
    store = ArtifactStore(str(tmp_path / "store"))
    trajectories = stages.ingest(store, demo_inputs)["objects"]["trajectories"]
    first = stages.cover(store, trajectories, str(tiny_checkpoint), checkpoint_digest(tiny_checkpoint), CoverConfig(),
                         Resources(kv_budget="128KiB", batch_size=4))
    assert first["cached"] is False
    assert first["metrics"]["kv_evictions"] > 0 and 0 < first["metrics"]["kv_bytes_peak"] <= 128 * 1024
    assert any("KV-prefix copies kept within 128.0 KiB (512 B per token)" in line for line in caplog.messages)
    again = stages.cover(store, trajectories, str(tiny_checkpoint), checkpoint_digest(tiny_checkpoint), CoverConfig(),
                         Resources(batch_size=4))  # automatic budget: the same decisions, so the same key
    assert again["cached"] is True and again["objects"] == first["objects"]


def test_out_of_memory_halves_the_batch_and_the_kv_budget_down_to_their_floors():
    smaller, change = shrunk(Resources(batch_size=16, kv_budget="1GiB"))
    assert smaller == Resources(batch_size=8, kv_budget="512MiB")
    assert change == "batch size 8 (was 16) and KV budget 512.0 MiB (was 1.0 GiB)"
    automatic, change = shrunk(Resources(batch_size=8))  # an automatic budget is resolved on the memory free now
    assert automatic.batch_size == 4 and KV_BUDGET_FLOOR <= automatic.kv_budget <= automatic_kv_budget("cpu")
    assert "(was automatic: half the free memory, " in change and change.endswith(" now)")
    sizes, resources = [], Resources(batch_size=2, kv_budget=4 * KV_BUDGET_FLOOR)
    while can_shrink(resources):
        resources, _ = shrunk(resources)
        sizes.append((resources.batch_size, resources.kv_budget))
    assert sizes == [(1, 2 * KV_BUDGET_FLOOR), (1, KV_BUDGET_FLOOR)]


def test_a_shard_out_of_memory_is_scored_again_smaller_and_decides_what_a_run_at_that_size_decides(
        tiny_checkpoint, demo_inputs, tmp_path, monkeypatch, caplog):
    from tasks import shards

    caplog.set_level(logging.INFO, logger="race_core.progress")
    real, built = shards.cover_scorer, []

    def scorer_that_runs_out(config, checkpoint, resources):
        """The real scorer; above batch 4 its second call raises the CPU allocator's out-of-memory
        error (a fault injected on purpose: a real one would need the machine's memory filled)."""
        scorer, calls = real(config, checkpoint, resources), []
        built.append(resources.batch_size)
        if resources.batch_size > 4:
            score = scorer.score

            def short_of_memory(requests):
                calls.append(1)
                if len(calls) > 1:
                    raise RuntimeError("[enforce fail at alloc_cpu.cpp:127] DefaultCPUAllocator: can't allocate "
                                       "memory: you tried to allocate 2147483648 bytes (injected)")
                return score(requests)

            scorer.score = short_of_memory
        return scorer

    monkeypatch.setattr(shards, "cover_scorer", scorer_that_runs_out)
    digest = checkpoint_digest(tiny_checkpoint)
    store = ArtifactStore(str(tmp_path / "store"))
    trajectories = stages.ingest(store, demo_inputs)["objects"]["trajectories"]
    figures = []
    shrinking = stages.cover(store, trajectories, str(tiny_checkpoint), digest, CoverConfig(),
                             Resources(batch_size=16, kv_budget="1GiB", shard_size=4), on_progress=figures.append)
    assert built == [16, 8, 4]  # two tries of the first shard ran out; the rest ran at batch 4
    retries = [line for line in caplog.messages if "out of memory" in line]
    assert retries == ["cover: out of memory on shard 0: scoring it again with batch size 8 (was 16) and KV budget "
                       "512.0 MiB (was 1.0 GiB)",
                       "cover: out of memory on shard 0: scoring it again with batch size 4 (was 8) and KV budget "
                       "256.0 MiB (was 512.0 MiB)"]
    n = shrinking["metrics"]["trajectories"]
    assert figures[-1].trajectories_begun == n  # the failed tries' progress was taken back
    clean_store = ArtifactStore(str(tmp_path / "clean"))
    clean = stages.cover(clean_store, stages.ingest(clean_store, demo_inputs)["objects"]["trajectories"],
                         str(tiny_checkpoint), digest, CoverConfig(), Resources(batch_size=4, shard_size=4))
    assert clean["objects"] == shrinking["objects"]  # the same bytes


class _Worker(UnitWorker):
    """A worker whose every try runs out of memory (injected), or fails otherwise."""

    def __init__(self, error: Exception, shrinks: int):
        self.error, self.left, self.tries = error, shrinks, 0

    def do(self, unit, force=False):
        self.tries += 1
        raise self.error

    def can_shrink(self):
        return self.left > 0

    def shrink(self):
        self.left -= 1


def test_a_unit_out_of_memory_is_raised_once_nothing_can_shrink_and_other_errors_are_not_retried():
    worker = _Worker(MemoryError("injected"), shrinks=2)
    with pytest.raises(MemoryError, match="injected"):
        worker.run({"index": 0})
    assert worker.tries == 3 and worker.left == 0
    worker = _Worker(ValueError("a bad row, not memory"), shrinks=2)
    with pytest.raises(ValueError, match="a bad row"):
        worker.run({"index": 0})
    assert worker.tries == 1 and worker.left == 2
    assert out_of_memory(RuntimeError("CUDA out of memory. Tried to allocate 2.00 GiB"))
    assert not out_of_memory(RuntimeError("shape mismatch: out of memory is not in this one"))


def test_the_memory_bench_reports_peak_rss_and_the_kv_bytes_held_at_the_peak(tiny_checkpoint):
    from bench.memory import format_rows, memory_bench

    [row] = memory_bench("tiny", str(tiny_checkpoint.parent), [3], shard_size=2, turns=2, batch_size=2,
                         kv_budget=128 * 1024)
    assert (row["N"], row["shard_size"], row["T"]) == (3, 2, 2)
    assert 0 <= row["accepted_removals"] <= 3
    assert row["peak_rss_mb"] >= row["rss_after_load_mb"] > 0
    assert 0 < row["kv_bytes_peak"] <= row["kv_budget"] == 128 * 1024 and row["kv_evictions"] > 0
    assert "| tiny | 3 | 2 | 2 |" in format_rows([row]) and "128.0 KiB" in format_rows([row])


STAGE_FREES_THEN_ENDS = HEAP_PEAK + """
from tasks.declarations import Stage
from tasks.pipeline_tasks import _stage_run
def phase(store, config, only_cached, force):  # a stage's peak
    peak()
    return {"resident": resident()}
stage = Stage("toy", 1, (), None, "__main__:phase", gpu=GPU)
print(_stage_run(stage)("file:///unused", config=None)["resident"] - resident())
"""


@pytest.mark.parametrize("gpu", [True, False])
def test_a_stage_that_loads_a_model_hands_its_freed_heap_back_when_it_ends(gpu):
    """An ablation's flow process (every stage in one process, freed memory kept) grew to 19.7 GB and
    was OOM-killed beside a vLLM engine: a model stage's peak stayed resident after it. A stage that
    loads a model (`gpu`) hands it back when it ends; one that does not is left alone (the check
    stages, which run often). In a fresh process, on its own resident memory."""
    from race_core.memory import keep_freed_memory

    if not keep_freed_memory():
        pytest.skip("glibc's malloc keeps no freed memory here (not glibc, or RACE_KEEP_FREED_MEMORY=0)")
    script = STAGE_FREES_THEN_ENDS.replace("GPU", str(gpu))
    run = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr[-2000:]
    released = int(run.stdout.split()[-1])
    assert released > 2**30 * 1.9 if gpu else released < 2**28, released


TRAINING_STEP_FREES = HEAP_PEAK + """
import torch
from transformers import LlamaConfig, LlamaForCausalLM
from race_core.train.distributed import TrainOptions, TrainRun
model = LlamaForCausalLM(LlamaConfig(vocab_size=32, hidden_size=8, intermediate_size=16, num_hidden_layers=1,
                                     num_attention_heads=2, num_key_value_heads=2))
run = TrainRun(model, torch.optim.SGD(model.parameters(), lr=0.1), TrainOptions())
peak()  # a step's activations: used, then freed below a live block
kept = resident()
run.after_step(1, 2, {})
print(kept - resident())
"""


def test_a_training_step_on_a_cpu_hands_its_freed_activations_back():
    """Batches of changing lengths fragment a heap that keeps freed memory and is never trimmed: the
    bootstrap's SFT of SmolLM2 grew to 24 GB and was OOM-killed near its last step. After each
    optimizer step a CPU run hands the freed heap back (a real TrainRun under accelerate, a tiny
    Llama; in a fresh process, on its own resident memory)."""
    from race_core.memory import keep_freed_memory

    if not keep_freed_memory():
        pytest.skip("glibc's malloc keeps no freed memory here (not glibc, or RACE_KEEP_FREED_MEMORY=0)")
    run = subprocess.run([sys.executable, "-c", TRAINING_STEP_FREES], capture_output=True, text=True, timeout=180,
                         cwd=Path(__file__).resolve().parents[1])
    assert run.returncode == 0, run.stderr[-2000:]
    assert int(run.stdout.split()[-1]) > 2**30 * 1.9  # the 2 GiB freed are handed back (without the change: none)
