"""Scoring benchmark (issue 7): our cover scorers against the naive algorithm and the work bound.

Every method runs the same LoGiC cover (`logic_cover`) on the same model and the same data, and the
bench fails unless all of them reach the same decisions (skipped turns and accepted flags):

  naive         the prototype's way: every candidate re-scores every turn 0..T-1, each turn with its
                own forward pass over that turn's whole prefix; no batching, no cache
  full-forward  one forward pass over the whole candidate, no cache, no batching
                (`HFScorer(batch_size=1, prefix_reuse=False)`)
  hf            ours: wavefront batching and KV-prefix reuse (`HFScorer`)
  vllm          ours through vLLM (only when vllm is importable)

The work bound is the tokens that must be computed (every trajectory once in full, then for each
candidate the suffix from the removed reasoning to the end of its last action) divided by the
model's raw forward throughput, measured in the same run with one long batched forward. Early
rejection scores fewer tokens than that bound; it is reported on the synthetic workload and on the
demo's calculator data.

Workloads are synthetic: N trajectories of T turns whose fields have exact token lengths, built from
words the tokenizer encodes as one token each. `--memory` shows that the peak RSS of the scoring
stage's sharded loop does not grow with N.
"""

from __future__ import annotations

import argparse
import json
import random
import resource
import subprocess
import sys
import time
from collections.abc import Callable, Hashable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from functools import partial
from pathlib import Path
from typing import Any

import numpy as np

from race_core.cover import DEFAULT_EPSILON, CoverResult, logic_cover
from race_core.render import OBSERVATION_PREFIX, Renderer
from race_core.schema import Trajectory, Turn
from race_core.scoring import Scorer, ScoreRequest

# torch and the scorers are imported where used, so that adding this parser to `race` stays cheap.

MODELS = ("tiny", "20m")
SWEEP_TURNS = (2, 4, 8, 16)


@dataclass(frozen=True)
class Workload:
    """N trajectories x T turns; every field has exactly this many tokens."""

    n: int = 64
    turns: int = 8
    question_tokens: int = 24
    reasoning_tokens: int = 40
    action_tokens: int = 10
    observation_tokens: int = 20
    seed: int = 0


# -- synthetic data ---------------------------------------------------------------------------
def single_token_words(renderer: Renderer) -> list[str]:
    """Alphabetic vocabulary entries with a leading space that encode to exactly one token: any
    concatenation of them encodes to one token per word (the pre-tokenizer splits at the spaces)."""
    vocab = renderer.tokenizer.get_vocab()
    words = sorted({renderer.tokenizer.convert_tokens_to_string([tok]) for tok in vocab})
    words = [w for w in words if len(w) > 1 and w[0] == " " and w[1:].isalpha()
             and len(renderer.encode(w)) == 1]
    if len(words) < 8:
        raise ValueError(f"the tokenizer has only {len(words)} single-token words; need at least 8")
    return words


def iter_synthetic(renderer: Renderer, workload: Workload) -> Iterator[Trajectory]:
    """Deterministic trajectories of the workload's shape, one at a time (for streaming)."""
    words = single_token_words(renderer)
    rng = random.Random(f"bench-scoring:{workload.seed}")

    def text(tokens: int, prefix: str = "") -> str:
        out = "".join(rng.choice(words) for _ in range(tokens))
        got = len(renderer.encode(prefix + out)) - len(renderer.encode(prefix))
        if got != tokens:
            raise AssertionError(f"synthetic text has {got} tokens, expected {tokens}")
        return out

    for i in range(workload.n):
        turns = tuple(Turn(reasoning=text(workload.reasoning_tokens), action=text(workload.action_tokens),
                           observation=text(workload.observation_tokens, OBSERVATION_PREFIX))
                      for _ in range(workload.turns))
        yield Trajectory(question=f"Task{i}:" + text(workload.question_tokens), environment="bench",
                         source_revision="bench-scoring", turns=turns)


def synthetic_trajectories(renderer: Renderer, workload: Workload) -> list[Trajectory]:
    return list(iter_synthetic(renderer, workload))


# -- the baselines as scorers -----------------------------------------------------------------
class NaiveScorer:
    """The prototype: for every request, every turn 0..last_turn is scored with its own forward
    pass over the whole prefix up to the end of that turn's action (no batching, no cache); only
    the turns asked for are returned."""

    name = "naive"

    def __init__(self, model, renderer: Renderer):
        from race_core.scoring.hf import ScorerStats

        self.model = model.eval()
        self.renderer = renderer
        self.stats = ScorerStats()

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        import torch

        decoder, head = self.model.get_decoder(), self.model.get_output_embeddings()
        out = []
        with torch.inference_mode():
            for r in requests:
                x = self.renderer.render(r.trajectory)
                scores = []
                for j in range(r.last_turn + 1):
                    start, end = x.action_spans[j]
                    ids = torch.from_numpy(x.input_ids[:end])[None]
                    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0, start - 1:end - 1]
                    logprobs = torch.log_softmax(head(hidden).float(), dim=-1)
                    targets = torch.from_numpy(x.input_ids[start:end])[:, None]
                    scores.append(float(logprobs.gather(1, targets).double().mean()))
                    self.stats.forward_calls += 1
                    self.stats.tokens_processed += end
                out.append(scores[r.from_turn:])
        self.stats.requests += len(requests)
        return out

    def release(self, keys: Sequence[Hashable] | None = None) -> None:
        return None


# -- measurements -----------------------------------------------------------------------------
def decisions(results: Sequence[CoverResult]) -> list[tuple]:
    """What must not depend on the method: skipped turns and the accepted flag of every candidate."""
    return [(r.skipped_turns, tuple((a["turn"], a["accepted"]) for a in r.audit)) for r in results]


def bound_tokens(renderer: Renderer, results: Sequence[CoverResult]) -> int:
    """Tokens the exact cover must compute: each trajectory once up to its last action, then for each
    candidate the suffix after the prefix it shares with the trajectory as held at that point."""
    total = 0
    for result in results:
        current = result.original
        held = renderer.render(current)
        total += held.action_spans[-1][1]
        accepted = set(result.skipped_turns)
        for t in range(1, len(current.turns)):
            if not current.turns[t].reasoning:
                continue
            candidate = current.without_reasoning(t)
            x = renderer.render(candidate)
            end = x.action_spans[-1][1]
            n = min(len(held), end)
            mismatch = np.flatnonzero(held.input_ids[:n] != x.input_ids[:n])
            total += end - (int(mismatch[0]) if mismatch.size else n)
            if t in accepted:
                current, held = candidate, x
    return total


def forward_throughput(model, renderer: Renderer, trajectories: Sequence[Trajectory], batch_size: int,
                       repeats: int = 3) -> tuple[float, float]:
    """Raw tokens per wall second and per CPU second of one batched forward (decoder only, no
    cache) over full-length trajectories; the best of `repeats` after one warm-up."""
    import torch

    rows = [renderer.render(t) for t in trajectories[:batch_size]]
    length = min(x.action_spans[-1][1] for x in rows)
    ids = torch.from_numpy(np.stack([x.input_ids[:length] for x in rows]))
    decoder = model.get_decoder()
    best_wall = best_cpu = float("inf")
    with torch.inference_mode():
        decoder(input_ids=ids, use_cache=False)  # warm-up (first calls pay one-off setup costs)
        for _ in range(repeats):
            wall, cpu = time.perf_counter(), time.process_time()
            decoder(input_ids=ids, use_cache=False)
            best_wall = min(best_wall, time.perf_counter() - wall)
            best_cpu = min(best_cpu, time.process_time() - cpu)
    return ids.numel() / best_wall, ids.numel() / best_cpu


@dataclass
class MethodRun:
    name: str
    wall_s: float  # scaled to the whole workload when measured on a subset
    cpu_s: float | None  # this process's CPU time (all threads), scaled likewise; None for vllm
    tokens_processed: int
    measured_on: int
    results: list[CoverResult]
    note: str = ""


def run_method(name: str, scorer: Scorer, trajectories: Sequence[Trajectory], n_total: int,
               epsilon: float, early_reject: bool = False) -> MethodRun:
    before = scorer.stats.tokens_processed
    start, cpu = time.perf_counter(), time.process_time()
    results = logic_cover(trajectories, scorer, epsilon, early_reject=early_reject)
    wall, cpu = time.perf_counter() - start, time.process_time() - cpu
    scale = n_total / len(trajectories)
    return MethodRun(name, wall * scale, cpu * scale, round((scorer.stats.tokens_processed - before) * scale),
                     len(trajectories), results)


def warm_hf_scorers(model, tokenizer, renderer: Renderer, trajectories: Sequence[Trajectory]):
    """A factory of HF scorers that share `renderer`, whose segment-token cache is filled here (a
    candidate's segments are its trajectory's): no timed method pays the tokenizer for another."""
    from race_core.scoring.hf import HFScorer

    for trajectory in trajectories:
        renderer.render(trajectory)
    return partial(HFScorer, model, tokenizer, renderer=renderer)


def check_identical(reference: Sequence[CoverResult], run: MethodRun) -> None:
    if decisions(reference[:run.measured_on]) != decisions(run.results):
        raise AssertionError(f"method {run.name!r} made different decisions than the reference")


# -- one benchmark run ------------------------------------------------------------------------
@dataclass(frozen=True)
class BenchOptions:
    models: tuple[str, ...] = MODELS
    turns: tuple[int, ...] = (8,)
    workload: Workload = Workload()
    batch_size: int = 64
    naive_subset: int = 8  # naive is timed on the first k trajectories and scaled (0 = all)
    full_forward_subset: int = 0
    vllm: str = "auto"  # auto | on | off
    early_reject: bool = True
    epsilon: float = DEFAULT_EPSILON
    cache_dir: str = ".race/checkpoints"
    demo_data: int = 64  # early rejection on expert_dataset(n) with the tiny model (0 = skip)


def vllm_available() -> bool:
    try:
        import vllm  # noqa: F401
    except ImportError:
        return False
    return True


def checkpoint_for(model: str, cache_dir: str) -> Path:
    from race_core.tiny import PRESETS, ensure_checkpoint

    return ensure_checkpoint(cache_dir, PRESETS[model])


def bench_one(model_name: str, checkpoint: Path, model, tokenizer, workload: Workload, options: BenchOptions,
              log: Callable[[str], None]) -> dict[str, Any]:
    """All methods on one (model, workload); returns the run's JSON record."""
    renderer = Renderer(tokenizer)
    trajectories = synthetic_trajectories(renderer, workload)
    n = len(trajectories)
    throughput, cpu_throughput = forward_throughput(model, renderer, trajectories, min(options.batch_size, 16))
    log(f"[{model_name} T={workload.turns}] raw forward throughput {throughput:,.0f} tokens/s "
        f"({cpu_throughput:,.0f} per CPU s)")

    # Warm-up, not timed: the first calls through each code path (cache, masks) pay one-off costs.
    scorer = warm_hf_scorers(model, tokenizer, renderer, trajectories)
    short = [replace(t, turns=t.turns[:3]) for t in trajectories[:2]]
    logic_cover(short, scorer(batch_size=options.batch_size), options.epsilon)
    logic_cover(short[:1], scorer(batch_size=1, prefix_reuse=False), options.epsilon)

    runs: list[MethodRun] = []
    runs.append(run_method("hf", scorer(batch_size=options.batch_size), trajectories, n, options.epsilon))
    reference = runs[0].results
    log(f"[{model_name} T={workload.turns}] hf {runs[-1].wall_s:.2f}s")
    if options.early_reject:
        early = run_method("hf+early-reject", scorer(batch_size=options.batch_size),
                           trajectories, n, options.epsilon, early_reject=True)
        runs.append(early)
    k = options.full_forward_subset or n
    runs.append(run_method("full-forward", scorer(batch_size=1, prefix_reuse=False),
                           trajectories[:k], n, options.epsilon))
    log(f"[{model_name} T={workload.turns}] full-forward {runs[-1].wall_s:.2f}s")
    k = options.naive_subset or n
    runs.append(run_method("naive", NaiveScorer(model, renderer), trajectories[:k], n, options.epsilon))
    log(f"[{model_name} T={workload.turns}] naive {runs[-1].wall_s:.2f}s (on {k})")
    notes = []
    use_vllm = options.vllm == "on" or (options.vllm == "auto" and vllm_available())
    if use_vllm:
        runs.append(_vllm_run(checkpoint, trajectories, n, options))
    else:
        notes.append("vllm skipped: " + ("--vllm off" if options.vllm == "off" else "vllm is not importable"))
    for run in runs[1:]:
        check_identical(reference, run)

    bound = bound_tokens(renderer, reference)
    bound_wall, bound_cpu = bound / throughput, bound / cpu_throughput
    naive = next(r for r in runs if r.name == "naive")
    methods = []
    for run in runs:
        method = {"name": run.name, "wall_s": run.wall_s, "tokens_processed": run.tokens_processed,
                  "tokens_per_s": run.tokens_processed / run.wall_s if run.wall_s else None,
                  "speedup_vs_naive": naive.wall_s / run.wall_s if run.wall_s else None,
                  "time_vs_bound": run.wall_s / bound_wall if bound_wall else None,
                  "cpu_s": run.cpu_s, "speedup_vs_naive_cpu": naive.cpu_s / run.cpu_s if run.cpu_s else None,
                  "cpu_vs_bound": run.cpu_s / bound_cpu if run.cpu_s and bound_cpu else None,
                  "measured_on": run.measured_on}
        if run.note:
            method["note"] = run.note
        methods.append(method)
    return {"model": model_name, "N": n, "T": workload.turns, "workload": asdict(workload),
            "batch_size": options.batch_size, "methods": methods,
            "bound": {"tokens": bound, "wall_s": bound_wall, "forward_tokens_per_s": throughput,
                      "cpu_s": bound_cpu, "forward_tokens_per_cpu_s": cpu_throughput},
            "accepted_removals": sum(len(r.skipped_turns) for r in reference),
            "candidates": sum(1 for r in reference for a in r.audit if not a["skipped_empty"]),
            "decisions_identical": True, "notes": notes}


def _vllm_run(checkpoint: Path, trajectories: Sequence[Trajectory], n: int, options: BenchOptions) -> MethodRun:
    import os

    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "2")
    from race_core.scoring.vllm import VLLMScorer

    scorer = VLLMScorer.from_pretrained(checkpoint, dtype="float32", batch_size=options.batch_size,
                                        enforce_eager=True)
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
    check_identical(full.results, early)
    candidates = sum(1 for r in full.results for a in r.audit if not a["skipped_empty"])
    return {"data": f"expert_dataset({options.demo_data}, seed={seed})", "N": len(trajectories),
            "candidates": candidates, "accepted_removals": sum(len(r.skipped_turns) for r in full.results),
            "bound_tokens": bound_tokens(renderer, full.results),
            "hf": {"wall_s": full.wall_s, "cpu_s": full.cpu_s, "tokens_processed": full.tokens_processed},
            "hf+early-reject": {"wall_s": early.wall_s, "cpu_s": early.cpu_s,
                                "tokens_processed": early.tokens_processed},
            "decisions_identical": True}


def run_bench(options: BenchOptions, log: Callable[[str], None] = lambda m: None) -> dict[str, Any]:
    """Every (model, T) of the options; the JSON-ready report."""
    import torch

    from race_core.policy import load_policy

    report: dict[str, Any] = {"runs": [], "torch_threads": torch.get_num_threads()}
    for model_name in options.models:
        checkpoint = checkpoint_for(model_name, options.cache_dir)
        model, tokenizer = load_policy(checkpoint)
        params = sum(p.numel() for p in model.parameters())
        log(f"model {model_name}: {params / 1e6:.1f}M parameters ({checkpoint})")
        for turns in options.turns:
            run = bench_one(model_name, checkpoint, model, tokenizer, replace(options.workload, turns=turns),
                            options, log)
            run["parameters"] = params
            report["runs"].append(run)
        if model_name == "tiny" and options.demo_data and options.early_reject:
            report["demo_early_reject"] = demo_early_reject(checkpoint, model, tokenizer, options)
    return report


# -- memory: peak RSS of the sharded cover, independent of N ----------------------------------
def memory_child(model_name: str, cache_dir: str, n: int, shard_size: int, turns: int, batch_size: int) -> dict:
    """Run in a fresh process: the scoring stage's loop (cover per shard, results dropped)."""
    from race_core.policy import load_policy
    from race_core.scoring.hf import HFScorer

    model, tokenizer = load_policy(checkpoint_for(model_name, cache_dir))
    renderer = Renderer(tokenizer)
    scorer = HFScorer(model, tokenizer, batch_size=batch_size)
    loaded = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    shard: list[Trajectory] = []
    accepted = 0
    for trajectory in iter_synthetic(renderer, Workload(n=n, turns=turns)):
        shard.append(trajectory)
        if len(shard) == shard_size:
            accepted += sum(len(r.skipped_turns) for r in logic_cover(shard, scorer))
            shard = []
    if shard:
        accepted += sum(len(r.skipped_turns) for r in logic_cover(shard, scorer))
    peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss
    return {"N": n, "shard_size": shard_size, "T": turns, "model": model_name, "accepted_removals": accepted,
            "rss_after_load_mb": loaded / 1024, "peak_rss_mb": peak / 1024}


def memory_bench(model_name: str, cache_dir: str, sizes: Sequence[int], shard_size: int, turns: int,
                 batch_size: int) -> list[dict]:
    checkpoint_for(model_name, cache_dir)  # build once, outside the measured processes
    out = []
    for n in sizes:
        code = ("import json, sys; from race_core.bench_scoring import memory_child; "
                f"print(json.dumps(memory_child({model_name!r}, {cache_dir!r}, {n}, {shard_size}, {turns}, "
                f"{batch_size})))")
        proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


# -- output -----------------------------------------------------------------------------------
def format_table(run: dict[str, Any]) -> str:
    bound = run["bound"]
    lines = [f"### model {run['model']} ({run['parameters'] / 1e6:.1f}M params), N={run['N']}, T={run['T']}, "
             f"hf batch {run['batch_size']}: {run['candidates']} candidates, {run['accepted_removals']} accepted",
             "",
             "| method | wall s | tokens processed | tokens/s | speed-up vs naive | time vs bound "
             "| CPU s | speed-up vs naive (CPU) | CPU vs bound |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    for m in run["methods"]:
        name = m["name"] + (f" (measured on {m['measured_on']}, scaled)" if m["measured_on"] < run["N"] else "")
        cpu = (f"{m['cpu_s']:.2f} | {m['speedup_vs_naive_cpu']:.1f}x | {m['cpu_vs_bound']:.2f}x"
               if m["cpu_s"] is not None else "n/a | n/a | n/a")
        lines.append(f"| {name} | {m['wall_s']:.2f} | {m['tokens_processed']:,} | {m['tokens_per_s']:,.0f} | "
                     f"{m['speedup_vs_naive']:.1f}x | {m['time_vs_bound']:.2f}x | {cpu} |")
    lines.append(f"| work bound | {bound['wall_s']:.2f} | {bound['tokens']:,} | {bound['forward_tokens_per_s']:,.0f} "
                 f"(raw forward) | | 1.00x | {bound['cpu_s']:.2f} | | 1.00x |")
    lines.append("")
    lines.append(f"decisions identical across methods: {run['decisions_identical']}")
    lines.append("CPU s = this process's CPU time over all threads: unlike wall time it is not inflated by "
                 "other jobs on a shared machine")
    lines.extend(run["notes"])
    lines.extend(f"{m['name']}: {m['note']}" for m in run["methods"] if m.get("note"))
    return "\n".join(lines)


def format_demo(demo: dict[str, Any]) -> str:
    full, early = demo["hf"], demo["hf+early-reject"]
    return (f"### early rejection on {demo['data']} (tiny model): {demo['candidates']} candidates, "
            f"{demo['accepted_removals']} accepted\n\n"
            "| method | wall s | CPU s | tokens processed | tokens vs bound |\n| --- | ---: | ---: | ---: | ---: |\n"
            f"| hf | {full['wall_s']:.2f} | {full['cpu_s']:.2f} | {full['tokens_processed']:,} | "
            f"{full['tokens_processed'] / demo['bound_tokens']:.2f}x |\n"
            f"| hf+early-reject | {early['wall_s']:.2f} | {early['cpu_s']:.2f} | {early['tokens_processed']:,} | "
            f"{early['tokens_processed'] / demo['bound_tokens']:.2f}x |\n\n"
            f"bound tokens {demo['bound_tokens']:,}; decisions identical: {demo['decisions_identical']}")


def format_memory(rows: Sequence[dict]) -> str:
    lines = ["### peak RSS of the sharded cover (one process per N)", "",
             "| model | N | shard size | T | RSS after model load MB | peak RSS MB |",
             "| --- | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['N']} | {r['shard_size']} | {r['T']} | {r['rss_after_load_mb']:.0f} | "
              f"{r['peak_rss_mb']:.0f} |" for r in rows]
    return "\n".join(lines)


# -- command line -----------------------------------------------------------------------------
def add_bench_parser(subparsers) -> argparse.ArgumentParser:
    """Add `bench scoring` to the `race` command's subparsers."""
    bench = subparsers.add_parser("bench", help="benchmarks")
    bench_sub = bench.add_subparsers(dest="bench", required=True)
    p = bench_sub.add_parser("scoring", help="cover scoring: naive, full-forward, hf, vllm vs the work bound")
    add_bench_arguments(p)
    p.set_defaults(func=cmd_bench_scoring)
    return p


def add_bench_arguments(p: argparse.ArgumentParser) -> None:
    w = Workload()
    p.add_argument("--json", help="write the report here")
    p.add_argument("--models", nargs="+", choices=MODELS, default=list(MODELS))
    p.add_argument("--n", type=int, default=w.n, help="trajectories")
    p.add_argument("--turns", type=int, nargs="+", default=[w.turns], help="turns per trajectory (T)")
    p.add_argument("--sweep", action="store_true", help=f"T over {', '.join(map(str, SWEEP_TURNS))}")
    p.add_argument("--question-tokens", type=int, default=w.question_tokens)
    p.add_argument("--reasoning-tokens", type=int, default=w.reasoning_tokens)
    p.add_argument("--action-tokens", type=int, default=w.action_tokens)
    p.add_argument("--observation-tokens", type=int, default=w.observation_tokens)
    p.add_argument("--seed", type=int, default=w.seed)
    p.add_argument("--batch-size", type=int, default=BenchOptions.batch_size, help="hf scorer batch size")
    p.add_argument("--naive-subset", type=int, default=BenchOptions.naive_subset,
                   help="time naive on the first K trajectories and scale to N (0 = all)")
    p.add_argument("--full-forward-subset", type=int, default=0, help="same for full-forward (0 = all)")
    p.add_argument("--vllm", choices=["auto", "on", "off"], default="auto")
    p.add_argument("--no-early-reject", action="store_true", help="skip the early-rejection runs")
    p.add_argument("--demo-data", type=int, default=64, help="expert trajectories for early rejection (0 = skip)")
    p.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
    p.add_argument("--cache-dir", default=".race/checkpoints", help="where the checkpoints are built")
    p.add_argument("--memory", action="store_true", help="only: peak RSS of the sharded cover for each --memory-n")
    p.add_argument("--memory-n", type=int, nargs="+", default=[64, 512])
    p.add_argument("--shard-size", type=int, default=64)


def options_from_args(args) -> BenchOptions:
    workload = Workload(n=args.n, question_tokens=args.question_tokens, reasoning_tokens=args.reasoning_tokens,
                        action_tokens=args.action_tokens, observation_tokens=args.observation_tokens,
                        seed=args.seed)
    return BenchOptions(models=tuple(args.models), turns=SWEEP_TURNS if args.sweep else tuple(args.turns),
                        workload=workload, batch_size=args.batch_size, naive_subset=args.naive_subset,
                        full_forward_subset=args.full_forward_subset, vllm=args.vllm,
                        early_reject=not args.no_early_reject, epsilon=args.epsilon, cache_dir=args.cache_dir,
                        demo_data=args.demo_data)


def cmd_bench_scoring(args) -> int:
    def log(message: str) -> None:
        print(message, file=sys.stderr, flush=True)

    if args.memory:
        model = args.models[0]
        rows = memory_bench(model, args.cache_dir, args.memory_n, args.shard_size, args.turns[0], args.batch_size)
        print(format_memory(rows))
        report: dict[str, Any] = {"memory": rows}
    else:
        report = run_bench(options_from_args(args), log)
        for run in report["runs"]:
            print(format_table(run) + "\n")
        if "demo_early_reject" in report:
            print(format_demo(report["demo_early_reject"]) + "\n")
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="bench_scoring", description=__doc__.splitlines()[0])
    add_bench_arguments(parser)
    return cmd_bench_scoring(parser.parse_args(argv))
