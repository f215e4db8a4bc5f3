"""`race bench sampling`: the same tasks played by the transformers sampler and by vLLM's, in one run.

Sampling and evaluation are most of a real-model ablation's wall time on a CPU (every RL iteration
plays its rollouts, every arm plays its held-out episodes), so which backend plays them is measured
before it is chosen. Each backend plays the same tasks of one environment with the same prompt,
turn budget and sampling parameters, through the same driver as RL sampling and evaluation
(`race_core.rollout.run_rollouts`):

- `start_s`: building the sampler (loading the model; vLLM's engine start);
- `play_s`: playing every episode; `generated_tokens` (the policy's own), `prompt_tokens` (what each
  step's prompts hold: hf re-reads them at every step, vLLM's prefix cache may not);
- the episodes' success, turns and well-formed turns, so a faster backend that plays worse shows;
- with greedy decoding (temperature 0): how many episodes each backend played token for token as
  the first one did (both decode the same policy; float noise can flip a near-tie).

The speed-ups are against the first backend, in the same run on the same machine (its CPU model and
matrix extensions are part of the report, `race_core.cpu`).
"""

from __future__ import annotations

import argparse
import json
import logging
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from race_core.cpu import cpu_facts
from race_core.envs import env_argument, env_help, get_environment
from race_core.envs.agent import AgentPrompt
from race_core.rollout import Rollout, run_rollouts
from race_core.sampling import SamplingParams, make_sampler

logger = logging.getLogger(__name__)

BACKENDS = ("hf", "vllm")


def _episode_figures(rollouts: Sequence[Rollout]) -> dict[str, Any]:
    turns = sum(len(r.well_formed) for r in rollouts)
    return {"episodes": len(rollouts), "succeeded": sum(r.success for r in rollouts), "turns": turns,
            "well_formed_turns": sum(sum(r.well_formed) for r in rollouts),
            "generated_tokens": sum(sum(r.policy_mask) for r in rollouts),
            "reasoning_tokens": sum(r.reasoning_token_count() for r in rollouts)}


def _by_group(rollouts: Sequence[Rollout], group_of: dict[str, str]) -> dict[str, dict[str, Any]]:
    """Episodes, wins and turns per task group (the environment's `task_group`: ScienceWorld's task type)."""
    groups: dict[str, list[Rollout]] = {}
    for r in rollouts:
        groups.setdefault(group_of[r.task_id], []).append(r)
    return {name: {"episodes": len(rs), "succeeded": sum(r.success for r in rs),
                   "turns_per_episode": round(sum(len(r.well_formed) for r in rs) / len(rs), 2)}
            for name, rs in sorted(groups.items())}


def _prompt_tokens(rollouts: Sequence[Rollout]) -> int:
    """The tokens the step prompts held: a turn's prompt is everything before its first generated token."""
    total = 0
    for r in rollouts:
        previous = None
        for i, generated in enumerate(r.policy_mask):
            if generated and previous is not True:
                total += i
            previous = generated
    return total


def run_sampling(checkpoint: str, env: str = "lookup", tasks: int = 16, samples: int = 1, temperature: float = 0.0,
                 max_new_tokens: int = 96, max_turns: int = 8, backends: Sequence[str] = BACKENDS,
                 device: str = "cpu", dtype: str = "float32", batch_size: int = 32, seed: int = 0,
                 vllm_eager: bool = True, difficulty: int | None = None, shape: str = "random") -> dict[str, Any]:
    """Every backend plays `samples` episodes of each of `tasks` held-out tasks of `env` (of its `shape`
    and `difficulty`)."""
    import torch

    environment = get_environment(env)
    environment.check(shape, difficulty)
    drawn = environment.heldout_tasks(tasks, seed, difficulty, shape)
    params = SamplingParams(temperature=temperature, max_new_tokens=max_new_tokens, seed=seed)
    runs: list[dict[str, Any]] = []
    played: dict[str, list[Rollout]] = {}
    for backend in backends:
        options: dict[str, Any] = {"device": device, "dtype": dtype, "batch_size": batch_size}
        if backend == "vllm" and vllm_eager:
            options["enforce_eager"] = True
        began = time.perf_counter()
        sampler = make_sampler(backend, checkpoint, **options)
        start_s = time.perf_counter() - began
        try:
            stored = AgentPrompt.of(sampler.renderer.tokenizer)
            agent = stored if stored.environment == environment.name and stored.system else \
                AgentPrompt.for_renderer(sampler.renderer, environment)
            began = time.perf_counter()
            rollouts = run_rollouts(sampler, sampler.renderer, drawn, samples, params, max_turns, 0, agent)
            play_s = time.perf_counter() - began
        finally:
            close = getattr(sampler, "close", None)
            if close is not None:
                close()
        played[backend] = rollouts
        entry = {"backend": backend, "start_s": start_s, "play_s": play_s, **_episode_figures(rollouts),
                 "prompt_tokens": _prompt_tokens(rollouts)}
        entry["generated_per_s"] = entry["generated_tokens"] / play_s
        if (task_group := getattr(environment, "task_group", None)) is not None:
            entry["by_group"] = _by_group(rollouts, {t.task_id: str(task_group(t)) for t in drawn})
        runs.append(entry)
        logger.info(f"{backend}: started in {start_s:.1f} s, played {entry['episodes']} episodes in {play_s:.1f} s "
            f"({entry['generated_tokens']} tokens generated, {entry['generated_per_s']:.1f}/s, "
            f"{entry['succeeded']} won)")
    reference = runs[0]
    greedy = temperature <= 0
    for entry in runs:
        entry["play_speedup"] = reference["play_s"] / entry["play_s"]
        entry["total_speedup"] = (reference["start_s"] + reference["play_s"]) / (entry["start_s"] + entry["play_s"])
        entry["generated_rate_speedup"] = entry["generated_per_s"] / reference["generated_per_s"]
        if greedy:
            entry["episodes_as_reference"] = sum(a.token_ids == b.token_ids for a, b in zip(
                played[reference["backend"]], played[entry["backend"]], strict=True))
    return {"checkpoint": str(checkpoint), "env": env, "difficulty": difficulty, "shape": shape, "tasks": tasks,
            "samples": samples, "temperature": temperature,
            "max_new_tokens": max_new_tokens, "max_turns": max_turns, "device": device, "dtype": dtype,
            "batch_size": batch_size, "torch_threads": torch.get_num_threads(), "cpu": cpu_facts(),
            "reference": reference["backend"], "runs": runs}


def format_sampling(report: dict[str, Any]) -> str:
    cpu = report["cpu"]
    ref = report["reference"]
    greedy = report["temperature"] <= 0
    which = "".join(f", {name} {report[name]}" for name in ("shape", "difficulty")
                    if report.get(name) not in (None, "random"))
    lines = [f"### {Path(report['checkpoint']).name} playing {report['env']}{which}: {report['tasks']} tasks x "
             f"{report['samples']}, temperature {report['temperature']:g}, {report['max_new_tokens']} new tokens, "
             f"{report['max_turns']} turns, {report['dtype']} on {report['device']}, batch {report['batch_size']}; "
             f"CPU {cpu['model']} ({', '.join(cpu['matrix_extensions']) or 'none'}), {report['torch_threads']} threads",
             "",
             f"| backend | start s | play s | play vs {ref} | start + play vs {ref} | generated tokens | generated/s | "
             f"prompt tokens | won | turns (well formed) |" + (f" episodes as {ref}'s |" if greedy else ""),
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |" + (" ---: |" if greedy else "")]
    for e in report["runs"]:
        row = (f"| {e['backend']} | {e['start_s']:.1f} | {e['play_s']:.1f} | {e['play_speedup']:.2f}x | "
               f"{e['total_speedup']:.2f}x | {e['generated_tokens']:,} | {e['generated_per_s']:.1f} | "
               f"{e['prompt_tokens']:,} | {e['succeeded']} / {e['episodes']} | {e['turns']} ({e['well_formed_turns']}) |")
        if greedy:
            row += f" {e['episodes_as_reference']} / {e['episodes']} |"
        lines.append(row)
    for e in report["runs"]:
        if e.get("by_group"):
            lines += ["", f"{e['backend']}, by task group: " + "; ".join(
                f"{name} {g['succeeded']} / {g['episodes']} won, {g['turns_per_episode']} turns"
                for name, g in e["by_group"].items())]
    return "\n".join(lines)


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, metavar="DIR", help="a save_pretrained folder (the policy)")
    p.add_argument("--env", type=env_argument, default="lookup", metavar="ENV", help=env_help())
    p.add_argument("--tasks", type=int, default=16, help="held-out tasks")
    p.add_argument("--difficulty", type=int, default=None,
                   help="the held-out tasks' difficulty (the environment's: lookup entries, cooking ingredients)")
    p.add_argument("--shape", default="random", help="the held-out tasks' shape (the environment's own)")
    p.add_argument("--samples", type=int, default=1, help="episodes per task")
    p.add_argument("--temperature", type=float, default=0.0, help="0: greedy (the evaluation's decoding)")
    p.add_argument("--max-new-tokens", type=int, default=96)
    p.add_argument("--max-turns", type=int, default=8)
    p.add_argument("--backends", nargs="+", choices=BACKENDS, default=list(BACKENDS), help="the first is the reference")
    p.add_argument("--batch-size", type=int, default=32, help="hf: prompts per generate call; vllm: max_num_seqs")
    p.add_argument("--dtype", default="float32")
    p.add_argument("--device", default="cpu")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--no-vllm-eager", dest="vllm_eager", action="store_false",
                   help="let vLLM compile its graphs (a minute more to start on CPU)")
    p.add_argument("--json", help="write the report here")


def cmd_bench_sampling(args: argparse.Namespace) -> int:
    from race_core.policy import check_checkpoint_dir

    checkpoint = check_checkpoint_dir(args.checkpoint)
    report = run_sampling(str(checkpoint), args.env, args.tasks, args.samples, args.temperature, args.max_new_tokens,
                          args.max_turns, args.backends, args.device, args.dtype, args.batch_size, args.seed,
                          args.vllm_eager, args.difficulty, args.shape)
    print(format_sampling(report))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(report, indent=1) + "\n")
    return 0
