"""Scoring benchmark (issue 7): our cover scorers against the naive algorithm and the work bound.

Every method runs the same LoGiC cover (`logic_cover`) on the same model and the same data, and the
bench fails unless all of them reach the same decisions (skipped turns and accepted flags) as `hf`;
the report records what was compared (`decisions_compared`):

  naive         the prototype's way: every candidate re-scores every turn 0..T-1, each turn with its
                own forward pass over that turn's whole prefix; no batching, no cache
  full-forward  one forward pass over the whole candidate, no cache, no batching
                (`HFScorer(batch_size=1, prefix_reuse=False)`)
  hf            ours: wavefront batching and KV-prefix reuse (`HFScorer`), prefixes read in place
                where the model's attention allows (`race_core.scoring.attention`)
  hf (prefix copied)  the same, each batch's prefixes copied into its cache (the path before in-place
                reading, and the one a GPU or a sliding-window model takes); run when hf reads in place
  vllm          ours through vLLM (only when vllm is importable)

The work bound is the tokens that must be computed (every trajectory once in full, then for each
candidate the suffix from the removed reasoning to the end of its last action) divided by the
model's raw forward throughput: one long batched forward is timed right before each method runs, and
the bound takes the fastest of these measurements, for every method. (Each method's ratio once used
the measurement just before it, for the same load on a shared machine; but a process's first
measurement ran up to 25% slower than the later ones even on a quiet machine, which put hf, timed
first, below a bound it had not reached. The per-method measurements stay in the report.) The raw
forward times the decoder alone: the head over the action tokens the cover scores is timed apart
(`head_throughput`), and each method's time is also given against the bound plus that head time. Early rejection scores
fewer tokens than that bound; it is reported on the synthetic workload and on the demo's calculator
data. Each method also records its work counters (`race_core.scoring.WorkCounters`: forwards, rows,
fed and padded positions, attention pairs, KV bytes copied, evictions), which do not depend on the
machine, counted on the trajectories it ran (a subset for a scaled method).

With `--workload long` (`bench.workload.LongWorkload`) each model runs once on episodes of 5-40
turns with observations of 20-400 tokens and reasoning of 0-150 tokens per turn, cut to the model's
context; with `--checkpoint DIR` and no input file, on that checkpoint (its own chat template:
SmolLM2's for `race model smollm2`).

With a checkpoint and an input file (`race bench scoring --checkpoint DIR --input FILE.jsonl`) the
same methods run on that model and on the file's trajectories instead (issue 16): read with the
schema reader (its rejects and the trajectories longer than the model's context are reported, not
scored), the forward throughput measured at the hf batch size, and each method's decision mix
(accepted / candidates) reported, so a reader sees whether ε made the decisions mixed.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass, field, replace
from functools import partial
from pathlib import Path
from typing import Any

from bench.baselines import (
    NaiveScorer,
    bound_pairs,
    bound_tokens,
    bound_work,
    forward_prices,
    forward_throughput,
    head_throughput,
)
from bench.workload import (
    MODELS,
    LongWorkload,
    Workload,
    checkpoint_for,
    long_trajectories,
    synthetic_trajectories,
)
from race_core.cover import DEFAULT_EPSILON, CoverResult, check_noise, logic_cover
from race_core.render import Renderer
from race_core.schema import Trajectory
from race_core.scoring import Scorer, ScoreRequest

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class BenchOptions:
    models: tuple[str, ...] = MODELS
    turns: tuple[int, ...] = (8,)
    workload: Workload = Workload()
    long: LongWorkload | None = None  # --workload long: these episodes instead of `workload` and `turns`
    batch_size: int = 64
    naive_subset: int = 8  # naive is timed on the first k trajectories and scaled (0 = all)
    naive: bool = True  # False (--no-naive): skip it (on long episodes one trajectory takes it minutes to hours)
    full_forward_subset: int = 0
    vllm: str = "auto"  # auto | on | off
    early_reject: bool = True
    epsilon: float = DEFAULT_EPSILON
    cache_dir: str = ".race/checkpoints"
    demo_data: int = 64  # early rejection on expert_dataset(n) with the tiny model (0 = skip)
    checkpoint: str | None = None  # real-model mode: this save_pretrained folder and ...
    input: str | None = None  # ... the trajectories of this JSONL file, instead of the synthetic runs
    limit: int = 0  # real-model mode: the first N valid trajectories of the file (0 = all)
    device: str = "cpu"  # real-model mode: where the model runs (hf and vllm)
    dtype: str = "float32"
    repeats: int = 1  # hf, hf+early-reject and full-forward: the fastest of this many runs is reported
    profile: bool = False  # after the timed methods, one more hf cover under torch.profiler (bench.profile)
    # before the timed methods, one untimed hf cover of the whole workload: the process's heap grows to
    # the cover's footprint there (fresh, zero-filled pages), as the raw forward of the bound is timed warm
    warm_cover: bool = True


@dataclass
class MethodRun:
    name: str
    wall_s: float  # scaled to the whole workload when measured on a subset
    cpu_s: float | None  # this process's CPU time (all threads), scaled likewise; None for vllm
    tokens_processed: int
    measured_on: int
    results: list[CoverResult]
    note: str = ""
    work: dict[str, int] = field(default_factory=dict)  # the scorer's work counters, unscaled
    throughput: tuple[float, float] | None = None  # the raw forward's tokens per wall and CPU second just before
    scorer_facts: dict[str, Any] = field(default_factory=dict)  # hf: the forward overhead its batch plan used


def page_faults() -> int | None:
    """This process's minor page faults so far (pages it touched first); None where not counted."""
    try:
        import resource
    except ImportError:  # not a Unix
        return None
    return resource.getrusage(resource.RUSAGE_SELF).ru_minflt


def run_method(name: str, scorer: Scorer, trajectories: Sequence[Trajectory], n_total: int,
               epsilon: float, early_reject: bool = False) -> MethodRun:
    before, faults = scorer.stats.work(), page_faults()
    start, cpu = time.perf_counter(), time.process_time()
    results = logic_cover(trajectories, scorer, epsilon, early_reject=early_reject)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    faults = page_faults() - faults if faults is not None else None
    scale = n_total / len(trajectories)
    work = (scorer.stats.work() - before).counts()
    facts = {k: scorer.stats.extra[k] for k in ("forward_overhead", "overhead_measured", "freed_memory_kept",
                                               "prefix_in_place")
             if k in scorer.stats.extra}
    return MethodRun(name, wall * scale, cpu * scale, round(work["tokens_processed"] * scale),
                     len(trajectories), results, work=work, scorer_facts={**facts, "page_faults": faults})


def fastest_run(repeats: int, run: Callable[[], MethodRun]) -> MethodRun:
    """The fastest of `repeats` runs of a method, each with a fresh scorer: on a shared machine the
    slower ones lost time to other jobs (the forward throughput is the best of its repeats too)."""
    return min((run() for _ in range(max(repeats, 1))), key=lambda r: r.wall_s)


def warm_hf_scorers(model, tokenizer, renderer: Renderer, trajectories: Sequence[Trajectory]):
    """A factory of HF scorers that share `renderer`, whose segment-token cache is filled here (a
    candidate's segments are its trajectory's): no timed method pays the tokenizer for another.

    The scorers share one KV budget, resolved here as the pipeline's cover stage resolves it once for
    the one scorer it keeps over all its shards (`race_core.memory.automatic_kv_budget`): a scorer
    built with an automatic budget hands the process's freed heap back to the kernel first, and the
    next cover faulted it in again, zero-filled (a cover of the 20M model over 16 x 8 turns on an Intel
    Xeon: 520,000-546,000 page faults against 190,000-230,000 with the budget resolved once, and
    4-5% of its time, four interleaved pairs), which a stage scoring shard after shard pays once and
    the raw forward of the bound, timed warm, not at all."""
    from race_core.memory import automatic_kv_budget
    from race_core.scoring.hf import HFScorer

    for trajectory in trajectories:
        renderer.render(trajectory)
    budget = automatic_kv_budget(str(next(model.parameters()).device))
    return partial(HFScorer, model, tokenizer, renderer=renderer, forward_overhead="measure",  # this device's price
                   kv_budget=budget)


# -- decisions: what must not depend on the method ---------------------------------------------
def decisions(results: Sequence[CoverResult]) -> list[tuple]:
    """Skipped turns and the accepted flag of every candidate."""
    return [(r.skipped_turns, tuple((a["turn"], a["accepted"]) for a in r.audit)) for r in results]


def candidate_count(results: Sequence[CoverResult]) -> int:
    """Candidate turns the cover scored (turns with no reasoning to remove are not candidates)."""
    return sum(1 for r in results for a in r.audit if not a["skipped_empty"])


def accepted_removals(results: Sequence[CoverResult]) -> int:
    return sum(len(r.skipped_turns) for r in results)


def compare_decisions(reference: MethodRun, runs: Sequence[MethodRun]) -> dict[str, Any]:
    """Each run's decisions against the reference's on the trajectories it ran (a method timed on a
    subset is compared on that subset): what was compared, and whether it matched."""
    compared = []
    for run in runs:
        expected = reference.results[:run.measured_on]
        compared.append({"method": run.name, "trajectories": len(run.results),
                         "candidates": candidate_count(expected),
                         "identical": decisions(expected) == decisions(run.results)})
    return {"reference": reference.name, "methods": compared}


def check_identical(comparison: dict[str, Any]) -> bool:
    """True when every compared method matched the reference; raises otherwise (the bench fails)."""
    different = [c["method"] for c in comparison["methods"] if not c["identical"]]
    if different:
        raise AssertionError(f"method(s) {different} made different decisions than {comparison['reference']!r}")
    return True


# -- one benchmark run -------------------------------------------------------------------------
def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def bench_one(model_name: str, checkpoint: Path, model, tokenizer, workload: Workload, options: BenchOptions
              ) -> dict[str, Any]:
    """All methods on one (model, synthetic workload); returns the run's JSON record."""
    renderer = Renderer(tokenizer)
    trajectories = synthetic_trajectories(renderer, workload)
    run = bench_methods(f"{model_name} T={workload.turns}", checkpoint, model, tokenizer, renderer, trajectories,
                        options, throughput_rows=min(options.batch_size, 16))
    return {"model": model_name, "N": run.pop("N"), "T": workload.turns, "workload": asdict(workload), **run}


def bench_long(model_name: str, checkpoint: Path, model, tokenizer, workload: LongWorkload, options: BenchOptions
               ) -> dict[str, Any]:
    """All methods on one (model, long workload); returns the run's JSON record."""
    renderer = Renderer(tokenizer)
    trajectories = long_trajectories(renderer, workload, model_context(model))
    turns = [len(t.turns) for t in trajectories]
    tag = f"{model_name} long T={min(turns)}-{max(turns)}"
    run = bench_methods(tag, checkpoint, model, tokenizer, renderer, trajectories, options,
                        throughput_rows=min(options.batch_size, 16))
    return {"model": model_name, "N": run.pop("N"), "T": f"{min(turns)}-{max(turns)}", "workload": "long",
            "long": asdict(workload), "tokens": sum(len(renderer.render(t)) for t in trajectories), **run}


def model_context(model) -> int:
    """The longest sequence the model takes (its config's max_position_embeddings)."""
    return int(model.config.get_text_config().max_position_embeddings)


def bench_methods(tag: str, checkpoint: Path, model, tokenizer, renderer: Renderer,
                  trajectories: Sequence[Trajectory], options: BenchOptions, throughput_rows: int, vllm_device: str | None = None) -> dict[str, Any]:
    """Every method's cover of `trajectories`, decisions compared, next to the work bound."""
    n = len(trajectories)

    def after_throughput(run: Callable[[], MethodRun]) -> MethodRun:
        """`run`, with the raw forward's throughput measured just before it (the same load)."""
        throughput = forward_throughput(model, renderer, trajectories, throughput_rows)
        method = run()
        method.throughput = throughput
        logger.info(f"[{tag}] {method.name} {method.wall_s:.2f}s; raw forward just before: {throughput[0]:,.0f} "
            f"tokens/s ({throughput[1]:,.0f} per CPU s)")
        return method

    # Warm-up, not timed: the first calls through each code path (cache, masks) pay one-off costs.
    scorer = warm_hf_scorers(model, tokenizer, renderer, trajectories)
    short = [replace(t, turns=t.turns[:3]) for t in trajectories[:2]]
    logic_cover(short, scorer(batch_size=options.batch_size), options.epsilon)
    logic_cover(short[:1], scorer(batch_size=1, prefix_reuse=False), options.epsilon)
    warm_up = {}
    if options.warm_cover:  # the whole workload once, so that no timed method grows the heap for the others
        first = run_method("hf", scorer(batch_size=options.batch_size), trajectories, n, options.epsilon)
        warm_up = {"method": "hf", "wall_s": first.wall_s, "cpu_s": first.cpu_s,
                   "page_faults": first.scorer_facts["page_faults"]}
        logger.info(f"[{tag}] warm-up: hf's first cover of the workload {first.wall_s:.2f}s "
                    f"({warm_up['page_faults'] or 0:,} page faults), not timed")

    runs: list[MethodRun] = []
    repeats = options.repeats
    runs.append(after_throughput(lambda: fastest_run(repeats, lambda: run_method(
        "hf", scorer(batch_size=options.batch_size), trajectories, n, options.epsilon))))
    reference = runs[0].results
    if options.early_reject:
        runs.append(after_throughput(lambda: fastest_run(repeats, lambda: run_method(
            "hf+early-reject", scorer(batch_size=options.batch_size), trajectories, n, options.epsilon,
            early_reject=True))))
    if scorer(batch_size=options.batch_size).in_place:  # the copying path beside it, in the same run
        logic_cover(short, scorer(batch_size=options.batch_size, prefix_in_place=False), options.epsilon)
        runs.append(after_throughput(lambda: fastest_run(repeats, lambda: run_method(
            "hf (prefix copied)", scorer(batch_size=options.batch_size, prefix_in_place=False), trajectories, n,
            options.epsilon))))
    k = options.full_forward_subset or n
    runs.append(after_throughput(lambda: fastest_run(repeats, lambda: run_method(
        "full-forward", scorer(batch_size=1, prefix_reuse=False), trajectories[:k], n, options.epsilon))))
    k = options.naive_subset or n
    if options.naive:
        runs.append(after_throughput(lambda: run_method("naive", NaiveScorer(model, renderer), trajectories[:k], n,
                                                        options.epsilon)))
    notes = []
    use_vllm = options.vllm == "on" or (options.vllm == "auto" and vllm_available())
    if use_vllm:
        runs.append(after_throughput(lambda: _vllm_run(checkpoint, trajectories, n, options, vllm_device)))
    else:
        notes.append("vllm skipped: " + ("--vllm off" if options.vllm == "off" else "vllm is not importable"))
    if not options.naive:
        notes.append("naive skipped: --no-naive")
    comparison = compare_decisions(runs[0], runs[1:])
    identical = check_identical(comparison)
    profiled = {}
    if options.profile:  # not timed: the profiler slows what it watches
        from bench.profile import profile_cover

        profiled["profile"] = profile_cover(scorer(batch_size=options.batch_size), trajectories, options.epsilon)

    # The raw forward times the decoder only; scoring also runs the head over the scored action tokens.
    bound, targets = bound_work(renderer, reference)
    # The machine's fastest raw forward in this run: the strictest bound, the same for every method.
    throughput = max(run.throughput[0] for run in runs)
    cpu_throughput = max(run.throughput[1] for run in runs)
    bound_wall, bound_cpu = bound / throughput, bound / cpu_throughput
    head_rate = head_throughput(model)
    head_wall = targets / head_rate
    attention = attention_bound(model, renderer, trajectories, reference, bound)
    naive = next((r for r in runs if r.name == "naive"), None)
    methods = []
    for run in runs:
        method = {"name": run.name, "wall_s": run.wall_s, "tokens_processed": run.tokens_processed,
                  "tokens_per_s": run.tokens_processed / run.wall_s if run.wall_s else None,
                  "speedup_vs_naive": naive.wall_s / run.wall_s if naive and run.wall_s else None,
                  "time_vs_bound": run.wall_s / bound_wall if bound_wall else None,
                  "time_vs_bound_with_head": run.wall_s / (bound_wall + head_wall) if bound_wall else None,
                  "time_vs_attention_bound": run.wall_s / attention["wall_s"] if attention["wall_s"] else None,
                  "tokens_vs_bound": run.tokens_processed / bound if bound else None,
                  "cpu_s": run.cpu_s, "speedup_vs_naive_cpu": naive.cpu_s / run.cpu_s if naive and run.cpu_s else None,
                  "cpu_vs_bound": run.cpu_s / bound_cpu if run.cpu_s and bound_cpu else None,
                  "measured_on": run.measured_on, "accepted_removals": accepted_removals(run.results),
                  "candidates": candidate_count(run.results), "work": run.work,
                  "bound_wall_s": bound_wall, "bound_cpu_s": bound_cpu,
                  "forward_tokens_per_s_before": run.throughput[0],
                  "forward_tokens_per_cpu_s_before": run.throughput[1], **run.scorer_facts}
        if run.note:
            method["note"] = run.note
        methods.append(method)
    return {"N": n, "batch_size": options.batch_size, "repeats": repeats, "methods": methods,
            "bound": {"tokens": bound, "wall_s": bound / throughput, "forward_tokens_per_s": throughput,
                      "cpu_s": bound / cpu_throughput, "forward_tokens_per_cpu_s": cpu_throughput,
                      "throughput_rows": min(throughput_rows, n),
                      "head_targets": targets, "head_tokens_per_s": head_rate, "head_wall_s": head_wall,
                      "attention": attention,
                      "measured": "the fastest of the raw forwards timed just before each method "
                                  "(each method's own: forward_tokens_per_s_before)"},
            "accepted_removals": accepted_removals(reference), "candidates": candidate_count(reference),
            "decisions_compared": comparison, "decisions_identical": identical, "notes": notes,
            "warm_up": warm_up, **profiled}


def attention_bound(model, renderer: Renderer, trajectories: Sequence[Trajectory], results: Sequence[CoverResult],
                    tokens: int) -> dict[str, Any]:
    """The work bound with the attention every candidate must compute: the bound's tokens at the raw
    forward's price of a position through the layers, plus the (query, key) pairs its fed tokens
    attend over (`bound_pairs`: a candidate's suffix over its whole prefix) at the price of a pair,
    both fitted on raw forwards of as many positions in rows of the workload's longest rendered
    length and of a quarter, a sixteenth and a sixty-fourth of it (`forward_prices`). The raw-forward
    bound times everything at one length, the shortest trajectory's, where attention is a small part:
    on long episodes it is not a bound on what an exact cover must compute."""
    longest = max(renderer.render(t).action_spans[-1][1] for t in trajectories)
    lengths = [longest >> k for k in range(6, -1, -2) if longest >> k >= 32]  # longest / 64, / 16, / 4, longest
    prices = forward_prices(model, tokens=max(longest, 2048), lengths=lengths)
    pairs = bound_pairs(renderer, results)
    return {"pairs": pairs, "pairs_per_token": pairs / tokens if tokens else None, **prices,
            "wall_s": tokens * prices["per_token_s"] + pairs * prices["per_pair_s"],
            "attention_share": pairs * prices["per_pair_s"] / (tokens * prices["per_token_s"]
                                                                 + pairs * prices["per_pair_s"])}


def _vllm_run(checkpoint: Path, trajectories: Sequence[Trajectory], n: int, options: BenchOptions,
              device: str | None = None) -> MethodRun:
    """vLLM's cover; `device` (None: vLLM's platform) is checked against the build vLLM has."""
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from race_core.scoring.vllm import VLLMScorer

    # On a GPU the hf model of this process is still loaded: vLLM takes half of the device, not 90%.
    gpu = {"gpu_memory_utilization": 0.5} if device and device.startswith("cuda") else {}
    scorer = VLLMScorer.from_pretrained(checkpoint, dtype=options.dtype, device=device,
                                        batch_size=options.batch_size, enforce_eager=True, **gpu)
    try:
        scorer.score([ScoreRequest("warmup", trajectories[0])])  # engine warm-up, not timed
        run = run_method("vllm", scorer, trajectories, n, options.epsilon)
    finally:
        scorer.close()
    run.note = "engine start not timed; CPU time not measured (the engine runs in other processes)"
    run.cpu_s = None
    return run


def demo_early_reject(checkpoint: Path, model, tokenizer, options: BenchOptions, seed: int = 0) -> dict[str, Any]:
    """hf with and without early rejection on the demo's calculator data (expert_dataset)."""
    from race_core.envs.expert import expert_dataset

    trajectories = expert_dataset(options.demo_data, seed=seed)
    renderer = Renderer(tokenizer)
    scorer = warm_hf_scorers(model, tokenizer, renderer, trajectories)
    full = run_method("hf", scorer(batch_size=options.batch_size), trajectories,
                      len(trajectories), options.epsilon)
    early = run_method("hf+early-reject", scorer(batch_size=options.batch_size),
                       trajectories, len(trajectories), options.epsilon, early_reject=True)
    comparison = compare_decisions(full, [early])
    identical = check_identical(comparison)
    return {"data": f"expert_dataset({options.demo_data}, seed={seed})", "N": len(trajectories),
            "candidates": candidate_count(full.results), "accepted_removals": accepted_removals(full.results),
            "bound_tokens": bound_tokens(renderer, full.results),
            "hf": {"wall_s": full.wall_s, "cpu_s": full.cpu_s, "tokens_processed": full.tokens_processed},
            "hf+early-reject": {"wall_s": early.wall_s, "cpu_s": early.cpu_s,
                                "tokens_processed": early.tokens_processed},
            "decisions_compared": comparison, "decisions_identical": identical}


def run_bench(options: BenchOptions) -> dict[str, Any]:
    """Every (model, T) of the options (or, with `options.checkpoint`, the real-model run); the
    JSON-ready report."""
    import torch

    from race_core.policy import load_policy

    if options.checkpoint or options.input:
        return run_real_bench(options)
    report: dict[str, Any] = {"runs": [], "torch_threads": torch.get_num_threads()}
    for model_name in options.models:
        checkpoint = checkpoint_for(model_name, options.cache_dir)
        model, tokenizer = load_policy(checkpoint)
        params = sum(p.numel() for p in model.parameters())
        logger.info(f"model {model_name}: {params / 1e6:.1f}M parameters ({checkpoint})")
        if options.long is not None:
            run = bench_long(model_name, checkpoint, model, tokenizer, options.long, options)
            run["parameters"] = params
            report["runs"].append(run)
        for turns in () if options.long is not None else options.turns:
            run = bench_one(model_name, checkpoint, model, tokenizer, replace(options.workload, turns=turns),
                            options)
            run["parameters"] = params
            report["runs"].append(run)
        if model_name == "tiny" and options.demo_data and options.early_reject:
            report["demo_early_reject"] = demo_early_reject(checkpoint, model, tokenizer, options)
    return report


# -- a real checkpoint on real trajectories (issue 16) -------------------------------------------
def read_input(path: str, renderer: Renderer, max_length: int | None, limit: int = 0
               ) -> tuple[list[Trajectory], list[dict[str, Any]]]:
    """The valid trajectories of a JSONL file (`read_jsonl`), those that fit the model's context,
    the first `limit` of them (0 = all); and the rejects (the reader's, then `too_long`). An input
    with nothing to score is an error naming the file."""
    from race_core.schema import read_jsonl

    if not Path(path).is_file():
        raise FileNotFoundError(f"--input {path!r}: no such file")
    good, rejects = read_jsonl([path])
    refused = [r.to_dict() for r in rejects]
    kept = []
    for trajectory in good:
        length = len(renderer.render(trajectory))
        if max_length is not None and length > max_length:
            refused.append({"file": path, "line": None, "code": "too_long", "field": "turns",
                            "message": f"renders to {length} tokens, over the model's context of {max_length}",
                            "trajectory_id": trajectory.id})
        else:
            kept.append(trajectory)
    if not kept:
        first = f"; first: line {refused[0]['line']}: [{refused[0]['code']}] {refused[0]['field']}: " \
                f"{refused[0]['message']}" if refused else ""
        raise ValueError(f"--input {path!r}: no trajectory to score ({len(refused)} rejected{first})")
    return kept[:limit] if limit else kept, refused


def decision_mix_note(accepted: int, candidates: int, epsilon: float) -> str | None:
    """A warning when ε made every decision the same (the bench then measures only one path)."""
    if candidates == 0:
        return "no candidate turns: every trajectory has one turn or no reasoning to remove"
    if accepted == 0:
        return f"epsilon {epsilon:g} rejected every candidate: raise --epsilon for mixed decisions"
    if accepted == candidates:
        return f"epsilon {epsilon:g} accepted every candidate: lower --epsilon for mixed decisions"
    return None


def run_real_bench(options: BenchOptions) -> dict[str, Any]:
    """Every method on `options.checkpoint` over the trajectories of `options.input`."""
    import torch
    from transformers import AutoConfig

    from race_core.policy import check_checkpoint_dir, load_policy, load_tokenizer

    if not options.checkpoint or not (options.input or options.long):
        raise ValueError("--checkpoint goes with --input FILE.jsonl or --workload long: a real checkpoint is "
                         "benchmarked on a JSONL file or on the long synthetic episodes")
    checkpoint = check_checkpoint_dir(options.checkpoint)
    # Read (and reject) the input before the model is loaded: a bad file fails in a second.
    renderer = Renderer(load_tokenizer(checkpoint))
    config = AutoConfig.from_pretrained(checkpoint, local_files_only=True).get_text_config()
    max_length = getattr(config, "max_position_embeddings", None)
    if options.input:
        trajectories, rejects = read_input(options.input, renderer, max_length, options.limit)
        logger.info(f"input {options.input}: {len(trajectories)} trajectories to score, {len(rejects)} rejected")
    else:  # the long workload, rendered with the checkpoint's own chat template
        trajectories, rejects = long_trajectories(renderer, options.long, max_length), []
        logger.info(f"long workload: {len(trajectories)} episodes of {min(len(t.turns) for t in trajectories)}-"
            f"{max(len(t.turns) for t in trajectories)} turns")
    model, tokenizer = load_policy(checkpoint, device=options.device, dtype=options.dtype)
    params = sum(p.numel() for p in model.parameters())
    logger.info(f"model {checkpoint.name}: {params / 1e6:.1f}M parameters on {options.device} ({options.dtype})")

    from race_core.scoring.hf import HFScorer

    noise_scorer = HFScorer(model, tokenizer, renderer=renderer, batch_size=options.batch_size)
    noise = noise_scorer.measure_noise([ScoreRequest(("noise", i), t) for i, t in enumerate(trajectories[:4])])
    check_noise(noise, options.epsilon)  # as the cover stage does: decisions must not depend on batching
    logger.info(f"scorer noise {noise:.2e} (epsilon {options.epsilon:g})")
    run = bench_methods(checkpoint.name, checkpoint, model, tokenizer, renderer, trajectories, options,
                        throughput_rows=options.batch_size, vllm_device=options.device)
    note = decision_mix_note(run["accepted_removals"], run["candidates"], options.epsilon)
    if note:
        run["notes"].append(note)
    turns = [len(t.turns) for t in trajectories]
    run.update(model=checkpoint.name, checkpoint=str(checkpoint), parameters=params,
               input=options.input or "long workload", **({} if options.input else {"long": asdict(options.long)}),
               T=f"{min(turns)}-{max(turns)}" if min(turns) != max(turns) else turns[0],
               tokens=sum(len(renderer.render(t)) for t in trajectories), epsilon=options.epsilon,
               device=options.device, dtype=options.dtype, scorer_noise=noise,
               rejects=len(rejects), first_rejects=rejects[:5])
    return {"runs": [run], "torch_threads": torch.get_num_threads(), "mode": "checkpoint"}
