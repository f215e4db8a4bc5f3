"""The people-lookup environment with a real instruct model (SmolLM2-135M-Instruct, never trained on
it): its episodes are judged privately and take turns of the budget, and on a lookup trajectory built
so that a note is the only source of a later action's number, RACE's cross-turn check rejects the
note that a local-only cover removes, and the cover counts it."""

from __future__ import annotations

from dataclasses import replace

import pytest

from race_core.cover import logic_cover
from race_core.decisions import CoverContext, cross_turn_figure, decision_rows, local_accepted_race_rejected
from race_core.envs.agent import AgentPrompt
from race_core.envs.lookup import LOOKUP, generate_tasks, judge
from race_core.schema import Turn


@pytest.fixture(scope="module")
def smollm2(smollm2_checkpoint):
    from race_core.policy import load_policy

    model, tokenizer = load_policy(smollm2_checkpoint)
    return model, tokenizer


def test_smollm2_plays_lookup_episodes_the_judge_decides(smollm2):
    """Two greedy episodes of the untrained chat model with the lookup prompt, 3 turns of budget: every
    turn is the environment's (a search answers an entry or says there is none), and an episode ends
    at the budget or at a finish the private judge decides."""
    from race_core.render import Renderer
    from race_core.rollout import play_episodes
    from race_core.sampling import SamplingParams

    model, tokenizer = smollm2
    agent = AgentPrompt.for_renderer(Renderer(tokenizer), LOOKUP)
    tasks = generate_tasks(2, seed=11)
    rollouts = play_episodes(model, tokenizer, tasks, 1, SamplingParams(greedy=True, max_new_tokens=48), max_turns=3,
                             agent=agent)
    for task, rollout in zip(tasks, rollouts, strict=True):
        assert rollout.environment == "people-lookup-v1" and rollout.system == agent.system
        assert 1 <= len(rollout.turns) <= 3 and (rollout.finished or len(rollout.turns) == 3)
        finish = rollout.turns[-1].action if rollout.finished else None
        assert rollout.success == (finish is not None and judge(task, finish[len("finish["):-1]))
        for turn, well_formed in zip(rollout.turns, rollout.well_formed, strict=True):
            assert turn.observation  # every turn answered: an entry, "No entry ...", a value or an error text
            if not well_formed:
                assert turn.observation.startswith("Invalid action")


def built_to_bind():
    """An expert lookup episode whose `later` note is the only source of its number: the entry it was
    read from no longer states it. The later calc copies it from the note alone; the note's own
    turn's action (the next search) does not use it."""
    from race_core.envs.lookup import _ATTRIBUTES

    expert = LOOKUP.expert_dataset(1, seed=2, reasoning_kinds=True, empty_reasoning_share=0.0)[0]
    later = expert.extra["reasoning_kinds"].index("later")
    turns = list(expert.turns)
    source = turns[later - 1].observation  # the entry the note read its number from
    value = turns[later].reasoning.split(" is ")[-1].split(";")[0].rstrip(".")
    stated = next(text.format(v=value) for text in (t for _, t, _ in _ATTRIBUTES.values())
                  if text.format(v=value) in source)
    turns[later - 1] = replace(turns[later - 1], observation=source.replace(stated + ", ", "", 1))
    assert value not in turns[later - 1].observation.split(": ", 1)[1].split(", ")
    assert value not in turns[later].action and any(value in t.action for t in turns[later + 1:])
    return replace(expert, turns=tuple(Turn(t.reasoning, t.action, t.observation) for t in turns), id=""), later


def test_the_cross_turn_check_binds_where_a_note_is_a_later_actions_only_source(smollm2):
    from race_core.render import Renderer
    from race_core.scoring.hf import HFScorer

    model, tokenizer = smollm2
    trajectory, later = built_to_bind()
    agent = AgentPrompt.for_renderer(Renderer(tokenizer), LOOKUP)
    trajectory = agent.dress(trajectory)
    scorer = HFScorer(model, tokenizer, batch_size=8)
    epsilon = 0.1  # between the two drops measured here: the own action -0.02, the later calc +0.27
    race = logic_cover([trajectory], scorer, epsilon)[0]
    local = logic_cover([trajectory], scorer, epsilon, local_only=True)[0]
    audit = {entry["turn"]: entry for entry in race.audit}
    note = audit[later]
    print(f"turn {later}: own action's drop {note['drops'][0]:+.3f}, largest later drop {max(note['drops']):+.3f}")
    assert not note["accepted"] and note["drops"][0] <= epsilon < max(note["drops"][1:])
    assert later not in race.skipped_turns and later in local.skipped_turns
    rows = list(decision_rows([race], Renderer(tokenizer), CoverContext("m", epsilon, "hf")))
    figure = cross_turn_figure(rows)
    assert figure["rejected_by_later"] >= 1 and figure["candidates"] == len(trajectory.turns) - 1
    gap = local_accepted_race_rejected({trajectory.id: race.skipped_turns}, {trajectory.id: local.skipped_turns})
    assert gap["race_rejected"] >= 1 and gap["local_accepted"] >= gap["race_rejected"]
