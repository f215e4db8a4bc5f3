"""A chat checkpoint plays the calculator in its own format: the prompt travels with the tokenizer, the
tools reach the template as `tools=` where it renders tool calls (else a system message and text
actions), tool-call generations are parsed and tagged as the renderer renders them, and a policy
fitted in that format plays episodes whose ids are the renderer's own."""

from __future__ import annotations

import json
import logging
import logging.handlers
from dataclasses import replace

import pytest
from fitting import fit_until_greedy

from race_core.chat_templates import with_chat_template
from race_core.config import SFTConfig
from race_core.envs.calculator import (
    BARE,
    CALCULATOR_TOOLS,
    INVALID_ACTION_OBSERVATION,
    AgentPrompt,
    CalculatorEnv,
    action_as_text,
    generate_tasks,
)
from race_core.envs.expert import expert_dataset
from race_core.policy import load_policy, load_tokenizer, save_policy
from race_core.render import Renderer, Role
from race_core.rollout import parse_generation, parse_tool_calls, run_rollouts
from race_core.sampling import SamplingParams, stop_token_ids
from race_core.sampling.hf import HFSampler
from race_core.schema import ToolCall, Turn
from race_core.train.checkpoint_bootstrap import (
    AgentBootstrapConfig,
    bootstrap_agent,
    dress_expert_trajectories,
)


@pytest.fixture(scope="module")
def tools_checkpoint(tiny_checkpoint, tmp_path_factory):
    """The tiny model laid out like a Qwen2.5-style tool model: ChatML's special tokens (two new
    embedding rows) and the ChatML-with-tools template (Hermes `<tool_call>` blocks)."""
    folder = tmp_path_factory.mktemp("tools")
    model, tokenizer = load_policy(tiny_checkpoint)
    tokenizer.add_tokens(["<|im_start|>", "<|im_end|>"], special_tokens=True)
    model.resize_token_embeddings(len(tokenizer))
    return with_chat_template(save_policy(model, tokenizer, folder / "tiny-chatml"), "chatml-tools",
                              folder / "tiny-tools")


def test_the_prompt_follows_the_template_tools_where_it_renders_them_else_text(tiny_checkpoint, tools_checkpoint):
    text = AgentPrompt.for_renderer(Renderer(load_tokenizer(tiny_checkpoint)))
    tools = AgentPrompt.for_renderer(Renderer(load_tokenizer(tools_checkpoint)))
    assert (text.actions, text.tools) == ("text", ())
    assert "Action: calc[<expression>]" in text.system and "finish[<number>]" in text.system
    assert (tools.actions, tools.tools) == ("tools", CALCULATOR_TOOLS)
    names = [tool["function"]["name"] for tool in tools.tools]
    assert names == ["calc", "finish"]


def test_the_prompt_is_saved_with_the_tokenizer_and_absent_means_bare(tools_checkpoint, tmp_path):
    model, tokenizer = load_policy(tools_checkpoint)
    assert AgentPrompt.of(tokenizer) == BARE
    agent = AgentPrompt.for_renderer(Renderer(tokenizer))
    agent.attach(tokenizer)
    saved = save_policy(model, tokenizer, tmp_path / "policy")
    config = json.loads((saved / "tokenizer_config.json").read_text())
    assert config["race_agent"]["actions"] == "tools"
    assert AgentPrompt.of(load_tokenizer(saved)) == agent


def test_a_tool_call_runs_in_the_env_as_its_text_action():
    task = generate_tasks(1, 0, 1)[0]
    by_text, by_call = CalculatorEnv(task), CalculatorEnv(task)
    expression = task.expression
    assert by_call.step((ToolCall("calc", {"expression": expression}),)) == by_text.step(f"calc[{expression}]")
    assert action_as_text((ToolCall("finish", {"answer": 12}),)) == "finish[12]"
    for bad in [(ToolCall("calc", {"expr": "1+2"}),), (ToolCall("search", {"expression": "1"}),),
                (ToolCall("calc", {"expression": "1"}), ToolCall("calc", {"expression": "2"})),
                (ToolCall("finish", {"answer": True}),)]:
        assert action_as_text(bad) == ""
        assert CalculatorEnv(task).step(bad).observation == INVALID_ACTION_OBSERVATION


def test_expert_episodes_dressed_for_tools_render_as_the_templates_tool_calls(tools_checkpoint):
    tokenizer = load_tokenizer(tools_checkpoint)
    renderer = Renderer(tokenizer)
    agent = AgentPrompt.for_renderer(renderer)
    plain = expert_dataset(3, 0)[0]
    dressed = agent.dress(plain)
    assert dressed.system == agent.system and dressed.tools == CALCULATOR_TOOLS
    assert dressed.id != plain.id and dressed.id == replace(dressed, id="").id  # the id of what it holds now
    for before, after in zip(plain.turns, dressed.turns, strict=True):
        assert isinstance(after.action, tuple) and action_as_text(after.action) == before.action
        assert after.reasoning == before.reasoning and after.observation == before.observation
    text = tokenizer.decode(renderer.render(dressed).input_ids.tolist())
    first = plain.turns[0].action[len("calc["):-1]
    assert f'<tool_call>\n{{"name": "calc", "arguments": {{"expression": "{first}"}}}}\n</tool_call>' in text
    assert "<tools>" in text and agent.system in text and "Action: " not in text


def test_parse_tool_calls_reads_the_formats_templates_write():
    hermes = '\n<tool_call>\n{"name": "calc", "arguments": {"expression": "1 + 2"}}\n</tool_call>'
    assert parse_tool_calls(hermes) == (ToolCall("calc", {"expression": "1 + 2"}),)
    llama = '{"name": "finish", "parameters": {"answer": "3"}}'
    assert parse_tool_calls(llama) == (ToolCall("finish", {"answer": "3"}),)
    mistral = '[TOOL_CALLS] [{"name": "calc", "arguments": "{\\"expression\\": \\"4\\"}"}, {"name": "finish", ' \
              '"arguments": {"answer": "4"}}]'
    assert parse_tool_calls(mistral) == (ToolCall("calc", {"expression": "4"}), ToolCall("finish", {"answer": "4"}))
    for not_a_call in ('{"name": "calc"}', '{"arguments": {}}', "calc[1 + 2]", '{"name": "calc", "arguments": [1]}',
                       '<tool_call>{"name": "calc", "arguments": {"expression": </tool_call>'):
        assert parse_tool_calls(not_a_call) == ()


def test_a_generated_tool_call_is_parsed_and_tagged_as_the_renderer_tags_it(tools_checkpoint):
    tokenizer = load_tokenizer(tools_checkpoint)
    renderer = Renderer(tokenizer)
    agent = AgentPrompt.for_renderer(renderer)
    turn = Turn("add them", (ToolCall("calc", {"expression": "1 + 2"}),), "3")
    rendered = renderer.render_turns("Compute 1 + 2.", [turn, Turn("", "finish[3]")], system=agent.system,
                                     tools=agent.tools)
    generated = [i for i, (t, policy_role) in enumerate(zip(rendered.turns, rendered.roles, strict=True))
                 if t == 0 and policy_role != Role.CONTEXT and policy_role != Role.OBSERVATION]
    ids = rendered.input_ids[generated[0]:generated[-1] + 1].tolist()
    stop = ids.index(stop_token_ids(tokenizer, renderer)[0]) + 1  # a generation ends at its first stop token
    parsed = parse_generation(renderer, ids[:stop], stopped=True, actions=agent.actions)
    assert parsed.well_formed and parsed.reasoning == "add them" and parsed.action == turn.action
    assert list(parsed.roles) == rendered.roles[generated[0]:generated[0] + stop].tolist()
    text_action = list(renderer.encode("<think></think>\nAction: calc[1 + 2]")) + [ids[stop - 1]]
    assert not parse_generation(renderer, text_action, stopped=True, actions="tools").well_formed


@pytest.fixture(scope="module")
def tools_policy(tools_checkpoint):
    """The tiny tools checkpoint fitted for seconds to expert episodes of four one-operation tasks,
    in tool-call form (bootstrap recipe expert-sft), then trained on until greedy decoding provably
    writes each of those episodes (`fitting.fit_until_greedy`): it replays those tasks on any CPU, not
    a capable policy. (A fixed 200 steps played 3 or 4 of them on an AMD EPYC and 2 on an Intel Xeon.)"""
    model, tokenizer = load_policy(tools_checkpoint)
    config = AgentBootstrapConfig(recipe="expert-sft", shape="random", difficulty=1, reasoning_kinds=False,
                                  expert_tasks=4, expert_seed=3, empty_reasoning_share=0.0, check_tasks=1,
                                  check_samples=1, max_new_tokens=160, max_turns=3,
                                  sft=SFTConfig(lr=1e-2, steps=200, batch_size=4, warmup_steps=5, max_length=2048,
                                                length_grouping=False))
    logged = logging.handlers.BufferingHandler(capacity=1 << 20)  # a module fixture: no caplog, a handler of its own
    logger = logging.getLogger("race_core.train.checkpoint_bootstrap")
    logger.addHandler(logged)
    try:
        report = bootstrap_agent(model, tokenizer, config)
    finally:
        logger.removeHandler(logged)
    lines = [record.getMessage() for record in logged.buffer]
    assert report.rounds[0]["last_loss"] < report.rounds[0]["first_loss"] / 4
    assert any(line.startswith("bootstrap check: turn 1/3, ") for line in lines)  # sampling shows its progress
    more = fit_until_greedy(model, tokenizer, dress_expert_trajectories(config, AgentPrompt.of(tokenizer)),
                            SFTConfig(lr=1e-3, steps=50, batch_size=4, max_length=2048, length_grouping=False))
    print(f"tools policy: {more} more round(s) of 50 SFT steps until greedy decoding writes its 4 episodes")
    return model, tokenizer


def test_a_policy_fitted_in_tool_form_plays_episodes_whose_ids_are_the_renderers(tools_policy):
    model, tokenizer = tools_policy
    renderer = Renderer(tokenizer)
    agent = AgentPrompt.of(tokenizer)
    assert agent.actions == "tools"
    rollouts = run_rollouts(HFSampler(model, tokenizer, renderer=renderer), renderer, generate_tasks(4, 3, 1), 1,
                            SamplingParams(greedy=True, max_new_tokens=160), max_turns=3)
    exact = 0
    for rollout in rollouts:
        assert rollout.system == agent.system and rollout.tools == list(CALCULATOR_TOOLS)
        assert rollout.token_ids[:rollout.prompt_length] == renderer.prompt_ids(rollout.question, [], agent.system,
                                                                                 agent.tools)
        if not rollout.all_well_formed:
            continue
        assert all(isinstance(turn.action, tuple) for turn in rollout.turns)
        canonical = renderer.render_turns(rollout.question, rollout.turns, system=agent.system, tools=agent.tools)
        exact += list(canonical.input_ids) == rollout.token_ids
        trajectory = rollout.to_trajectory()
        assert trajectory is None or (trajectory.tools == CALCULATOR_TOOLS and trajectory.system == agent.system)
    # greedy decoding writes the 4 training episodes (the fixture fitted it until it provably does)
    assert exact == 4 and all(r.success for r in rollouts), [(r.success, r.turns) for r in rollouts]


def test_expert_iteration_samples_its_rounds_keeps_what_the_judge_accepts_and_trains_the_plain_prompt(tools_policy,
                                                                                                     caplog):
    """The expert-iteration recipe on a copy of the fitted tiny policy: one round of 4 tasks x 2 samples,
    SFT on the episodes the judge accepted. (Without demonstrations: the tiny policy was fitted to the
    bare system message and writes nothing well-formed under a longer one; they are checked apart.)"""
    import copy

    import torch

    from race_core.train.checkpoint_bootstrap import demonstrated

    model, tokenizer = (copy.deepcopy(x) for x in tools_policy)  # the recipe trains in place
    before = {name: weight.detach().clone() for name, weight in model.named_parameters()}
    plain = AgentPrompt.of(tokenizer)
    config = AgentBootstrapConfig(recipe="expert-iteration", shape="random", difficulty=1, reasoning_kinds=False,
                                  rounds=1, round_tasks=4, round_samples=2, demonstrations=0, check_tasks=1,
                                  check_samples=1, max_new_tokens=160, max_turns=3, temperature=0.2,
                                  seed=3 - 1000,  # round 1 plays the tasks of seed 3: the ones the policy was fitted to
                                  sft=SFTConfig(lr=1e-3, steps=4, batch_size=4, max_length=2048,
                                                length_grouping=False))
    caplog.set_level(logging.INFO, logger="race_core.train.checkpoint_bootstrap")
    report = bootstrap_agent(model, tokenizer, config)
    lines = caplog.messages
    (entry,) = report.rounds
    assert (entry["data"], entry["round"], entry["sampled"]["episodes"]) == ("own", 1, 8)
    assert 0 < entry["trajectories"] <= entry["sampled"]["succeeded"]  # kept: the judge's successes, deduplicated
    # trained on them: 4 steps moved the weights. (Not last loss < first: the policy already fits its
    # own successes to a loss near 0.005, where one Adam step can as well raise it.)
    assert entry["steps"] == 4 and 0 < entry["last_loss"] < 0.1
    assert any(not torch.equal(weight, before[name]) for name, weight in model.named_parameters())
    assert report.check["episodes"] == 1 and AgentPrompt.of(tokenizer) == plain
    shown = demonstrated(plain, Renderer(tokenizer), replace(config, demonstrations=2))
    assert shown.system.startswith(plain.system + "\n\nAn example of a whole task:\n")
    assert shown.system.count("Task: ") == 2 and shown.tools == plain.tools
    assert any(line.startswith("bootstrap round 1/1 sampling: turn 1/3, ") for line in lines)
    assert any(line.startswith("bootstrap round 1/1: ") and line.endswith(f"{entry['trajectories']} kept")
               for line in lines)
