"""On-policy sampling and the RL update as two separate steps, so a pipeline can run, cache and
retry them as separate stages: `sample_rollouts` plays the calculator with the current policy,
`rl_update` applies one cover-aware update to that policy from those rollouts. Rollouts travel as
JSON (`rollouts_to_json` / `rollouts_from_json`): token ids, roles, masks and old log-probs exact.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from dataclasses import asdict
from pathlib import Path

import torch

from race_core.envs.calculator import generate_tasks
from race_core.render import Renderer
from race_core.rollout import Rollout, run_rollouts
from race_core.sampling import SamplingParams
from race_core.schema import Trajectory, Turn

ROLLOUT_FORMAT = "race.rollouts/v1"


def rollouts_to_json(rollouts: Sequence[Rollout]) -> str:
    return json.dumps({"format": ROLLOUT_FORMAT, "rollouts": [asdict(r) for r in rollouts]})


def rollouts_from_json(text: str) -> list[Rollout]:
    payload = json.loads(text)
    if payload.get("format") != ROLLOUT_FORMAT:
        raise ValueError(f"not a rollouts document (format {payload.get('format')!r}, expected {ROLLOUT_FORMAT})")
    rollouts = []
    for record in payload["rollouts"]:
        record["turns"] = [Turn(**t) for t in record["turns"]]
        rollouts.append(Rollout(**record))
    return rollouts


def training_tasks(config, iteration: int):
    """The tasks of RL iteration `iteration` (training split, seed config.seed + iteration)."""
    return generate_tasks(config.tasks_per_iteration, config.seed + iteration, config.difficulty, split="train")


def sample_rollouts(checkpoint: str | Path, config, iteration: int = 0) -> list[Rollout]:
    """G rollouts for each of K training tasks from the policy at `checkpoint` (RLConfig `config`)."""
    from race_core.policy import load_policy
    from race_core.sampling.hf import HFSampler

    model, tokenizer = load_policy(checkpoint)
    renderer = Renderer(tokenizer)
    params = SamplingParams(temperature=config.temperature, top_p=config.top_p,
                            max_new_tokens=config.max_new_tokens, seed=config.seed + iteration)
    return run_rollouts(HFSampler(model, tokenizer, renderer=renderer), renderer, training_tasks(config, iteration),
                        config.group_size, params, config.max_turns)


def sample_successful_trajectories(checkpoint: str | Path, tasks: int, samples: int, seed: int,
                                   temperature: float = 1.0) -> tuple[list[Trajectory], int]:
    """Play `samples` episodes of each of `tasks` training tasks; return the successful, well-formed
    ones as Trajectories (the policy's own data, RACE's input) and the number of episodes played."""
    from race_core.policy import load_policy
    from race_core.sampling.hf import HFSampler

    model, tokenizer = load_policy(checkpoint)
    renderer = Renderer(tokenizer)
    params = SamplingParams(temperature=temperature, seed=seed)
    rollouts = run_rollouts(HFSampler(model, tokenizer, renderer=renderer), renderer,
                            generate_tasks(tasks, seed, split="train"), samples, params)
    trajectories = {t.id: t for r in rollouts if (t := r.to_trajectory()) is not None}
    return list(trajectories.values()), len(rollouts)


def rl_update(model, tokenizer, rollouts: Sequence[Rollout], config, optimizer=None):
    """One cover-aware update of `model` (in place) from its own rollouts; returns the RLReport."""
    from race_core.train.rl import update_from_rollouts

    torch.manual_seed(config.seed)
    return update_from_rollouts(model, tokenizer, rollouts, config, optimizer=optimizer)
