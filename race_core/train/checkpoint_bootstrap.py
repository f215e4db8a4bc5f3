"""Any chat checkpoint into a policy of an environment (`race bootstrap --checkpoint DIR --out DIR2
[--env NAME]`; the calculator by default).

The checkpoint is given the environment in its own chat format (`AgentPrompt.for_renderer`: the
tools through its template where the template renders tool calls, else a system message and text
actions), the prompt is recorded in its tokenizer (so sampling, evaluation and training later give
the policy the same prompt), and it is trained until it plays, by one of two recipes:

- `expert-sft`: SFT on the environment's scripted expert's episodes (`Environment.expert_dataset`;
  the kinds expert by default, whose reasoning can carry a result to a later turn), dressed in the model's format
  (system prompt, tools, tool calls where it takes them) and rendered with its tokenizer's own ids.
- `expert-iteration`: rounds of sampling the current policy on training tasks, keeping the
  episodes the environment's private judge accepts (well-formed ones), and SFT of the policy on
  them; the model's own episodes are its only training data. While it samples, its system message
  also shows `demonstrations` worked expert episodes as text (a chat model that has never seen the
  format rarely writes it unprompted); the kept episodes are trained with the plain system message,
  so the policy learns to play without them. A round that keeps nothing leaves the policy as it is
  (and the report says so).

Either way the policy is then measured as the method's card measures it: fresh on-policy episodes
at temperature 1 on training tasks that no recipe round drew (`check_*`), success judged privately.
Expert data is bootstrap data only: RACE compresses the policy's own successful episodes, never these.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field, replace
from pathlib import Path
from typing import Any

from race_core.config import SFTConfig
from race_core.envs import DEFAULT_ENV, get_environment
from race_core.envs.agent import AgentPrompt
from race_core.render import ACTION_PREFIX, CLOSE_MARKER, OPEN_MARKER, Renderer
from race_core.rollout import Rollout, play_episodes
from race_core.sampling import SamplingParams
from race_core.schema import Trajectory

RECIPES = ("expert-sft", "expert-iteration")
_CALCULATOR_DEFAULT_SHAPE = "two-part"
REPORT_FILE = "race_bootstrap.json"
_CHECK_SEED_OFFSET = 7_777_777  # the check's tasks: a training seed no recipe round uses
_DEMONSTRATION_SEED_OFFSET = 5_555_555  # the demonstrations' tasks: another

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class AgentBootstrapConfig:
    """How a chat checkpoint is trained to play an environment (`race bootstrap`)."""

    recipe: str = "expert-sft"  # expert-sft (scripted expert's episodes) or expert-iteration (its own)
    env: str = DEFAULT_ENV  # the environment: calculator, or lookup (multi-hop lookups, 5-6 turns)
    shape: str = "two-part"  # calculator task shape: two-part (a result can be carried across turns) or random; another env: its own
    difficulty: int | None = None  # calculator: operations per random-shape task (None: 1-3); lookup: entries (3, 4)
    reasoning_kinds: bool = True  # expert-sft: the kinds expert (reasoning that can matter later)
    expert_tasks: int = 384  # expert-sft: expert episodes
    expert_seed: int = 0  # expert-sft: which training tasks
    empty_reasoning_share: float = 0.3  # expert-sft: share of later turns without reasoning
    rounds: int = 3  # expert-iteration: sample -> keep -> SFT rounds
    demonstrations: int = 1  # expert-iteration: worked expert episodes shown in the system message while sampling
    round_tasks: int = 64  # expert-iteration: training tasks sampled per round
    round_samples: int = 4  # expert-iteration: episodes per task and round
    temperature: float = 1.0  # expert-iteration and the check: sampling temperature
    max_new_tokens: int = 96  # tokens per assistant turn
    max_turns: int = 8  # turn budget of an episode
    check_tasks: int = 16  # fresh training tasks played at the end (the card: 64 episodes)
    check_samples: int = 4  # episodes per check task
    seed: int = 0  # sampling seeds
    sft: SFTConfig = field(default_factory=lambda: SFTConfig(
        lr=2e-4, epochs=1, batch_size=8, warmup_steps=10, min_lr_ratio=0.1, max_length=1024, seed=0))

    def __post_init__(self) -> None:
        if self.recipe not in RECIPES:
            raise ValueError(f"parameter 'recipe': {self.recipe!r} is not one of {RECIPES}")
        env = get_environment(self.env)
        if self.shape == _CALCULATOR_DEFAULT_SHAPE and self.shape not in env.shapes:
            object.__setattr__(self, "shape", env.shapes[0])  # the default names a calculator shape
        env.check(self.shape, self.difficulty)

    @property
    def environment(self):
        return get_environment(self.env)

    def key_fields(self) -> dict[str, Any]:
        """The fields the bootstrap stage's key hashes: `env` only when it is not the calculator (the
        keys of calculator bootstraps stay what they were), and a plug-in environment's code."""
        from race_core.envs import environment_code

        fields = asdict(self)
        if fields["env"] == DEFAULT_ENV:
            del fields["env"]
        elif code := environment_code(self.env):  # a plug-in's source and version: its expert writes the data
            fields["env_code"] = code
        return fields


@dataclass
class AgentBootstrapReport:
    """What a bootstrap did and reached (written as `race_bootstrap.json` beside the checkpoint)."""

    recipe: str
    agent: dict[str, Any]  # the prompt recorded in the tokenizer
    rounds: list[dict[str, Any]]  # per SFT run: its data, steps, first / last loss (and sampled figures)
    check: dict[str, Any]  # fresh on-policy episodes: played, succeeded, well-formed turns
    wall_seconds: float = 0.0

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)


def dress_expert_trajectories(config: AgentBootstrapConfig, agent: AgentPrompt):
    """The environment's scripted expert's successful episodes in the agent's format."""
    trajectories = config.environment.expert_dataset(config.expert_tasks, config.expert_seed, config.difficulty,
                                                     empty_reasoning_share=config.empty_reasoning_share,
                                                     reasoning_kinds=config.reasoning_kinds, shape=config.shape)
    return [agent.dress(t) for t in trajectories]


def _episode_figures(rollouts: list[Rollout]) -> dict[str, Any]:
    turns = sum(len(r.turns) for r in rollouts)
    return {"episodes": len(rollouts), "succeeded": sum(r.success for r in rollouts),
            "success_rate": sum(r.success for r in rollouts) / max(len(rollouts), 1),
            "well_formed_turns": sum(sum(r.well_formed) for r in rollouts), "turns": turns,
            "reasoning_tokens_per_episode": sum(r.reasoning_token_count() for r in rollouts) / max(len(rollouts), 1)}


def play(model, tokenizer, tasks, samples: int, config: AgentBootstrapConfig, seed: int,
         agent: AgentPrompt | None = None, label: str = "") -> list[Rollout]:
    params = SamplingParams(temperature=config.temperature, max_new_tokens=config.max_new_tokens, seed=seed)
    started = time.perf_counter()

    def progress(step: int, finished: int, episodes: int) -> None:  # a turn of every open episode can take minutes
        logger.info(f"bootstrap {label}: turn {step}/{config.max_turns}, {finished}/{episodes} episodes finished, "
                    f"elapsed {time.perf_counter() - started:.0f} s")

    return play_episodes(model, tokenizer, tasks, samples, params, config.max_turns, agent=agent, progress=progress)


def demonstrated(agent: AgentPrompt, renderer: Renderer, config: AgentBootstrapConfig) -> AgentPrompt:
    """`agent` whose system message also shows `config.demonstrations` expert episodes (of tasks of a
    seed no round draws), each turn as the model would write it (`<think>...</think>`, then its
    action in the agent's form) followed by the result."""
    if not config.demonstrations:
        return agent
    shown = config.environment.expert_dataset(config.demonstrations, config.seed + _DEMONSTRATION_SEED_OFFSET,
                                              config.difficulty, empty_reasoning_share=config.empty_reasoning_share,
                                              reasoning_kinds=config.reasoning_kinds, shape=config.shape)
    blocks = []
    for trajectory in (agent.dress(t) for t in shown):
        lines = [f"Task: {trajectory.question}"]
        for turn in trajectory.turns:
            action = (renderer.call_text(turn.tool_calls) if turn.tool_calls else ACTION_PREFIX + turn.action_text)
            lines += [f"{OPEN_MARKER}{turn.reasoning}{CLOSE_MARKER}{action}", f"Result: {turn.observation}"]
        blocks.append("\n".join(lines))
    return replace(agent, system=agent.system + "\n\nAn example of a whole task:\n" + "\n\n".join(blocks))


def bootstrap_agent(model, tokenizer, config: AgentBootstrapConfig = AgentBootstrapConfig(), options=None,
                    trained: Callable[[Any, Any], None] | None = None) -> AgentBootstrapReport:
    """Train `model` (in place) to play `config.env` by `config.recipe`; the tokenizer gets the
    agent prompt. Returns what was trained on and the fresh on-policy check. `options`: how the SFT
    runs train (`race_core.train.distributed.TrainOptions`: mixed precision, ...); `trained(model,
    tokenizer)` is called once training is done, before the check (to save the policy first)."""
    from race_core.memory import release_freed_memory
    from race_core.train.sft import train_sft

    started = time.perf_counter()
    env = config.environment
    agent = AgentPrompt.for_renderer(Renderer(tokenizer), env)
    agent.attach(tokenizer)
    logger.info(f"bootstrap: {config.recipe}; actions as {agent.actions} "
                f"({'the template renders tool calls' if agent.actions == 'tools' else 'described in the system message'})")

    def sft(trajectories, label: str) -> dict[str, Any]:
        every = 10

        def progress(step: int, total: int, loss: float) -> None:
            if step == 1 or step % every == 0 or step == total:
                logger.info(f"bootstrap {label}: sft step {step}/{total} loss {loss:.4f}")

        # each SFT run saves (and resumes) its state in a folder of its own: a round's state is not the next one's
        run_options = options
        if options is not None and options.state_dir:
            run_options = replace(options, state_dir=str(Path(options.state_dir) / label.replace(" ", "-")))
        report = train_sft(model, tokenizer, trajectories, config.sft, progress=progress, options=run_options)
        return {"trajectories": len(trajectories), "steps": report.steps, "first_loss": report.first_loss,
                "last_loss": report.last_loss, "target_tokens": report.target_tokens}

    rounds: list[dict[str, Any]] = []
    if config.recipe == "expert-sft":
        rounds.append({"data": "expert", **sft(dress_expert_trajectories(config, agent), "expert-sft")})
    else:
        prompted = demonstrated(agent, Renderer(tokenizer), config)
        for k in range(config.rounds):
            seed = config.seed + 1000 * (k + 1)
            tasks = env.generate_tasks(config.round_tasks, seed, config.difficulty, split="train", shape=config.shape)
            rollouts = play(model, tokenizer, tasks, config.round_samples, config, seed, prompted,
                            label=f"round {k + 1}/{config.rounds} sampling")
            kept: dict[str, Trajectory] = {}
            for rollout in rollouts:
                if (played := rollout.to_trajectory()) is not None:  # trained without the demonstrations
                    trajectory = replace(played, system=agent.system, id="")
                    kept[trajectory.id] = trajectory
            figures = _episode_figures(rollouts)
            logger.info(f"bootstrap round {k + 1}/{config.rounds}: {figures['succeeded']}/{figures['episodes']} "
                        f"episodes succeeded, {len(kept)} kept")
            entry = {"data": "own", "round": k + 1, "sampled": figures, "trajectories": len(kept)}
            if kept:
                entry.update(sft(list(kept.values()), f"round {k + 1}"))
            rounds.append(entry)
    if trained is not None:
        trained(model, tokenizer)
    release_freed_memory()  # the training's peak, which sampling does not reach again
    check_tasks = env.generate_tasks(config.check_tasks, config.seed + _CHECK_SEED_OFFSET, config.difficulty,
                                     split="train", shape=config.shape)
    check = _episode_figures(play(model, tokenizer, check_tasks, config.check_samples, config,
                                  config.seed + _CHECK_SEED_OFFSET, label="check"))
    logger.info(f"bootstrap check: {check['succeeded']} of {check['episodes']} fresh on-policy episodes succeeded")
    return AgentBootstrapReport(recipe=config.recipe, agent={"system": agent.system, "tools": list(agent.tools),
                                                             "actions": agent.actions},
                                rounds=rounds, check=check, wall_seconds=round(time.perf_counter() - started, 1))


def bootstrap_checkpoint(checkpoint: str | Path, out_dir: str | Path,
                         config: AgentBootstrapConfig = AgentBootstrapConfig(), *, device: str = "cpu",
                         dtype: str = "float32", mixed_precision: str = "no") -> AgentBootstrapReport:
    """Load a local chat checkpoint, bootstrap it (`bootstrap_agent`, its SFT under `mixed_precision`
    autocast: bf16, fp16 or no) and save the policy to `out_dir` (a `save_pretrained` folder whose
    tokenizer carries the agent prompt), with `race_bootstrap.json`."""
    from race_core.policy import load_policy, save_policy
    from race_core.train.distributed import TrainOptions

    model, tokenizer = load_policy(checkpoint, device=device, dtype=dtype)
    out = Path(out_dir)
    report = bootstrap_agent(model, tokenizer, config, options=TrainOptions(mixed_precision=mixed_precision),
                             trained=lambda m, t: save_policy(m, t, out))  # saved before the check: it is kept
    (out / REPORT_FILE).write_text(json.dumps({"source": str(checkpoint), "config": asdict(config),
                                               **report.to_dict()}, indent=1, default=str) + "\n")
    return report
