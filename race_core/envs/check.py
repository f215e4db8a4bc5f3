"""`race env check NAME`: what a plug-in environment is missing, one line per problem.

It draws a few tasks of each split, plays the expert on them, replays the expert's actions through a
fresh episode of each task (the judge must call them won, and must not raise), reads each action back
through the environment's tools (text `name[value]` <-> the call), checks the reasoning kinds the
expert labels against `reasoning_kind`, and, given a checkpoint, renders the expert's episodes in its
chat template and runs the cover on them (transformers, on CPU unless told).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from race_core.envs import get_environment
from race_core.envs.base import REASONING_KINDS, heldout_seed


@dataclass
class EnvCheck:
    """What `check_environment` found: `problems` (one line each; none: the environment is fit to play)
    and what it measured."""

    name: str
    problems: list[str] = field(default_factory=list)
    facts: dict[str, Any] = field(default_factory=dict)

    @property
    def ok(self) -> bool:
        return not self.problems


def check_environment(name: str, *, tasks: int = 4, seed: int = 0, checkpoint: str | None = None,
                      epsilon: float = 0.1, device: str = "cpu") -> EnvCheck:
    """Check the environment `name` (any name or reference `get_environment` takes); never raises for
    what the environment does wrong: each fault is a problem line."""
    result = EnvCheck(name)
    problem = result.problems.append
    try:
        env = get_environment(name)
    except ValueError as exc:
        problem(str(exc))
        return result
    drawn: dict[str, list] = {}
    for split, split_seed in (("train", seed), ("heldout", heldout_seed(seed))):
        found = _guarded(problem, f"generate_tasks({tasks}, seed {split_seed}, split {split!r})",
                         lambda s=split, k=split_seed: env.generate_tasks(tasks, k, split=s))
        if found is None:
            continue
        if len(found) != tasks or len({t.task_id for t in found}) != len(found):
            problem(f"generate_tasks gave {len(found)} tasks with {len({t.task_id for t in found})} distinct task_id "
                    f"for the {split} split; asked for {tasks}")
        drawn[split] = found
    if "train" in drawn and "heldout" in drawn:
        shared = {t.question for t in drawn["train"]} & {t.question for t in drawn["heldout"]}
        if shared:
            problem(f"no held-out split: {len(shared)} question(s) drawn for both train and held-out, e.g. "
                    f"{next(iter(shared))!r}")
    result.facts["tasks"] = {split: len(found) for split, found in drawn.items()}

    experts = _guarded(problem, "expert_dataset", lambda: env.expert_dataset(tasks, seed, reasoning_kinds=True))
    if experts is None:
        return result
    by_id = {t.task_id: t for t in drawn.get("train", ())}
    result.facts["expert_won"] = f"{len(experts)}/{tasks}"
    if len(experts) < tasks:
        problem(f"the expert won {len(experts)} of {tasks} training tasks: expert_dataset keeps only won episodes")
    for trajectory in experts:
        _check_expert_episode(env, trajectory, by_id.get(trajectory.extra.get("task_id")), problem)
    if checkpoint and experts:
        result.facts["cover"] = _guarded(problem, "the cover on the expert's episodes",
                                         lambda: _cover(env, experts, checkpoint, epsilon, device))
    return result


def _check_expert_episode(env, trajectory, task, problem: Callable[[str], None]) -> None:
    where = f"expert episode {trajectory.extra.get('task_id', trajectory.id[:12])}"
    if trajectory.environment != env.environment:
        problem(f"{where}: its environment field is {trajectory.environment!r}, not {env.environment!r}")
    kinds = trajectory.extra.get("reasoning_kinds")
    if not isinstance(kinds, list) or len(kinds) != len(trajectory.turns):
        problem(f"{where}: extra['reasoning_kinds'] must list one kind per turn ({len(trajectory.turns)})")
    else:
        for i, (turn, kind) in enumerate(zip(trajectory.turns, kinds, strict=True)):
            if kind not in REASONING_KINDS:
                problem(f"{where}, turn {i}: kind {kind!r} is none of {REASONING_KINDS}")
            elif (read := env.reasoning_kind(turn.reasoning)) != kind:
                problem(f"{where}, turn {i}: reasoning_kind reads {read!r} from the text the expert labelled {kind!r}")
    for i, turn in enumerate(trajectory.turns):
        if not isinstance(turn.action, str):
            continue
        call = env.text_to_call(turn.action)
        if call is None or env.action_as_text(call) != turn.action.strip():
            problem(f"{where}, turn {i}: the action {turn.action!r} is no call of the environment's tools "
                    "(text_to_call / action_as_text cannot read it back)")
    if task is None:
        problem(f"{where}: no task of generate_tasks with this task_id (the expert must play the tasks drawn)")
        return
    episode = env.episode(task, len(trajectory.turns))
    try:
        episode.reset()
        for turn in trajectory.turns:
            episode.step(turn.action)
        if not episode.success:
            problem(f"{where}: replayed on a fresh episode, the judge calls it lost")
    except Exception as exc:  # a plug-in's judge may raise anything: the problem names it
        problem(f"{where}: replaying it raised {type(exc).__name__}: {exc}")


def _cover(env, experts, checkpoint: str, epsilon: float, device: str) -> dict[str, Any]:
    from race_core.cover import logic_cover
    from race_core.envs.agent import AgentPrompt
    from race_core.scoring import make_scorer

    scorer = make_scorer("hf", checkpoint, device=device)
    try:
        agent = AgentPrompt.for_renderer(scorer.renderer, env)
        results = logic_cover([agent.dress(t) for t in experts], scorer, epsilon)
    finally:
        scorer.close()
    audits = [a for r in results for a in r.audit if not a["skipped_empty"]]
    return {"epsilon": epsilon, "actions": agent.actions, "candidates": len(audits),
            "removed": sum(a["accepted"] for a in audits)}


def _guarded(problem: Callable[[str], None], what: str, call: Callable[[], Any]) -> Any:
    try:
        return call()
    except Exception as exc:  # a plug-in may raise anything: the problem names it
        problem(f"{what} raised {type(exc).__name__}: {exc}")
        return None
