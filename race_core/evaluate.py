"""Policy evaluation on an environment's held-out tasks: success rate, reasoning tokens, the skip
ratio, reasoning tokens per thinking turn, turns.

Episodes are played by `race_core.rollout.play_episodes` (the same driver as RL sampling), greedy
or sampled; success is the environment's private judge. Use held-out tasks (`heldout_tasks`: they
share no question with any training draw).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from race_core.envs import DEFAULT_ENV, get_environment
from race_core.envs.base import Task
from race_core.envs.calculator import DEFAULT_MAX_TURNS
from race_core.rollout import Rollout, play_episodes
from race_core.sampling import Sampler, SamplingParams


def episode_metrics(episodes: Sequence[Rollout]) -> dict[str, float]:
    """The paper's figures of a set of episodes: success, reasoning tokens per episode, the skip ratio
    (share of turns acted on with no reasoning), reasoning tokens per thinking turn, turns per episode."""
    turns = sum(len(e.turns) for e in episodes)
    thinking = sum(1 for e in episodes for t in e.turns if t.reasoning.strip())
    reasoning = sum(e.reasoning_token_count() for e in episodes)
    n = max(len(episodes), 1)
    return {"success_rate": sum(e.success for e in episodes) / n,
            "reasoning_tokens_per_episode": reasoning / n,
            "skip_ratio": (turns - thinking) / max(turns, 1),
            "reasoning_tokens_per_thinking_turn": reasoning / max(thinking, 1),
            "turns_per_episode": turns / n}


@dataclass
class EvalReport:
    success_rate: float
    reasoning_tokens_per_episode: float  # generated reasoning tokens, mean over episodes
    turns_per_episode: float
    episodes: list[Rollout]
    well_formed_rate: float = 0.0  # share of turns that followed the <think>…</think>\nAction: format
    greedy: bool = True

    def summary(self) -> dict:
        """The figures of `episode_metrics`, the standard error of the success rate, the format rate."""
        metrics = episode_metrics(self.episodes)
        n = len(self.episodes)
        p = metrics["success_rate"]
        return {"episodes": n, **metrics, "success_stderr": (p * (1 - p) / n) ** 0.5 if n else 0.0,
                "well_formed_rate": self.well_formed_rate, "greedy": self.greedy}


def heldout_tasks(n: int, seed: int = 0, difficulty: int | None = None, shape: str = "random",
                  env: str = DEFAULT_ENV) -> list[Task]:
    """`n` held-out tasks of environment `env` (never drawn for training, whatever the training seed)."""
    return get_environment(env).heldout_tasks(n, seed, difficulty, shape)


def evaluate_policy(
    model,
    tokenizer,
    tasks: Sequence[Task],
    greedy: bool = True,
    samples: int = 1,
    seed: int = 0,
    *,
    temperature: float = 1.0,
    top_p: float = 1.0,
    max_turns: int = DEFAULT_MAX_TURNS,
    max_new_tokens: int = 96,
    batch_size: int = 64,
    sampler: Sampler | None = None,
) -> EvalReport:
    """Play every task (`samples` times when sampling; once when greedy) and summarise. `sampler`:
    another backend over the same policy (`play_episodes`)."""
    if not tasks:
        raise ValueError("evaluate_policy needs at least one task")
    params = SamplingParams(temperature=temperature, top_p=top_p, max_new_tokens=max_new_tokens, seed=seed,
                            greedy=greedy)
    episodes = play_episodes(model, tokenizer, tasks, 1 if greedy else samples, params, max_turns,
                             batch_size=batch_size, sampler=sampler)
    metrics = episode_metrics(episodes)
    turns = sum(len(e.turns) for e in episodes)
    return EvalReport(
        success_rate=metrics["success_rate"],
        reasoning_tokens_per_episode=metrics["reasoning_tokens_per_episode"],
        turns_per_episode=metrics["turns_per_episode"],
        episodes=episodes,
        well_formed_rate=sum(sum(e.well_formed) for e in episodes) / max(turns, 1),
        greedy=greedy,
    )
