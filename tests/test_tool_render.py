"""Tool calls rendered as the model's own (docs/architecture.md §3), on the real SmolLM2 tokenizer: with a
template that renders tool calls, a trajectory's ids are the tokenizer's own ids of the template's
text and each action span is exactly the tool-call tokens; with one that does not, the documented
JSON fallback, recorded in the render mode."""

import json

import pytest

from race_core.render import CLOSE_MARKER, OPEN_MARKER, TOOLS_JSON, TOOLS_TEMPLATE, Renderer, Role
from race_core.schema import ToolCall, Trajectory, Turn

SEARCH = {"type": "function", "function": {"name": "search", "description": "Search the web.",
          "parameters": {"type": "object", "properties": {"query": {"type": "string"}, "k": {"type": "integer"}},
                         "required": ["query"]}}}
CALC = {"name": "calc", "description": "Evaluate arithmetic.", "parameters": {"type": "object"}}


def trajectories():
    yield Trajectory("Who wrote Dune, and when?", "web", "r1", [
        Turn("I should search.", (ToolCall("search", {"query": "Dune author", "k": 3}),), "Frank Herbert, 1965."),
        Turn("", (ToolCall("search", {"query": "Herbert"}), ToolCall("calc", {"expr": "2025-1965"})),
             "novelist\n\n60"),
        Turn("Both found ✓", "finish[Frank Herbert, 1965]", ""),
    ], system="You are a careful researcher.", tools=(SEARCH, CALC))
    yield Trajectory("  Ünïcode  question\n", "web", "r2", [
        Turn(" x ", (ToolCall("search", {"query": "naïve — ✓", "k": 1}),), ""),
    ], tools=(SEARCH,))
    yield Trajectory("Plain text actions beside tools.", "web", "r3", [
        Turn("think", "calc[1+1]", "2"),
        Turn("", (ToolCall("calc", {"expr": "2*3"}),), " 6 "),
        Turn("done", "finish[6]", ""),
    ], system="Be brief.", tools=(CALC,))


@pytest.fixture(scope="module")
def tools_renderer(smollm2_tools_checkpoint):
    from race_core.policy import load_tokenizer

    return Renderer(load_tokenizer(smollm2_tools_checkpoint))


@pytest.fixture(scope="module")
def own_renderer(smollm2_checkpoint):
    from race_core.policy import load_tokenizer

    return Renderer(load_tokenizer(smollm2_checkpoint))


@pytest.mark.parametrize("k", range(3))
def test_tool_calls_render_to_the_tokenizers_own_ids_of_the_templates_text(tools_renderer, k):
    renderer, tokenizer = tools_renderer, tools_renderer.tokenizer
    trajectory = list(trajectories())[k]
    assert renderer.tool_mode == TOOLS_TEMPLATE and renderer.tool_fallback_reason is None
    assert renderer.render_mode_of(trajectory) == "canonical/keeps-reasoning+tools:template"
    text = tokenizer.apply_chat_template(renderer.chat_messages(trajectory), tools=list(trajectory.tools),
                                         tokenize=False)
    rendered = renderer.render(trajectory)
    assert rendered.input_ids.tolist() == tokenizer(text, add_special_tokens=False)["input_ids"]
    assert "<tools>" in text and json.dumps(trajectory.tools[0], ensure_ascii=False) in text
    if trajectory.system:
        assert trajectory.system in tokenizer.decode(rendered.input_ids[:rendered.turn_starts[0]])
    for t, turn in enumerate(trajectory.turns):
        a, b = rendered.action_spans[t]
        action = tokenizer.decode(rendered.input_ids[a:b])
        if turn.tool_calls:
            # exactly the tool-call tokens: one <tool_call> block per call, in call order, nothing else
            blocks = [f'<tool_call>\n{{"name": "{c.name}", "arguments": {json.dumps(c.arguments, ensure_ascii=False)}}}'
                      "\n</tool_call>" for c in turn.tool_calls]
            assert action == "\n".join(blocks)
            assert (rendered.roles[a:b] == int(Role.ACTION)).all()
            assert rendered.roles[a - 1] in (int(Role.ACTION_PREFIX), int(Role.CLOSE))
        else:
            assert action.strip() == turn.action
        if turn.observation and t + 1 < len(trajectory.turns):
            observed = tokenizer.decode(rendered.input_ids[rendered.mask(Role.OBSERVATION, turn=t)])
            assert observed == turn.observation if turn.tool_calls else observed == "Observation: " + turn.observation


def test_removing_a_tool_turns_reasoning_changes_no_id_before_it(tools_renderer):
    trajectory = next(trajectories())
    full = tools_renderer.render(trajectory)
    for t in range(len(trajectory.turns)):
        cut = tools_renderer.render(trajectory.without_reasoning(t))
        start = full.turn_starts[t]
        assert cut.input_ids[:start].tolist() == full.input_ids[:start].tolist() and cut.turn_starts[t] == start
        assert tools_renderer.tokenizer.decode(cut.input_ids[start:start + 8]).startswith(OPEN_MARKER + CLOSE_MARKER)
        prompt = tools_renderer.prompt_ids(trajectory.question, trajectory.turns[:t], system=trajectory.system,
                                           tools=trajectory.tools)
        assert prompt == full.input_ids[:start].tolist()


def test_a_template_without_tool_support_falls_back_to_json_text_and_says_so(own_renderer):
    trajectory = next(trajectories())
    assert own_renderer.tool_mode == TOOLS_JSON
    assert "does not render tool calls" in own_renderer.tool_fallback_reason
    assert own_renderer.render_mode_of(trajectory) == "canonical/keeps-reasoning+tools:json"
    plain = Trajectory("q", "e", "r", [Turn("", "finish[1]")])
    assert own_renderer.render_mode_of(plain) == "canonical/keeps-reasoning"
    rendered = own_renderer.render(trajectory)
    tokenizer = own_renderer.tokenizer
    text = tokenizer.apply_chat_template(own_renderer.chat_messages(trajectory), tokenize=False)
    assert rendered.input_ids.tolist() == tokenizer(text, add_special_tokens=False)["input_ids"]
    a, b = rendered.action_spans[1]
    assert json.loads(tokenizer.decode(rendered.input_ids[a:b])) == [
        {"name": "search", "arguments": {"query": "Herbert"}}, {"name": "calc", "arguments": {"expr": "2025-1965"}}]
    head = tokenizer.decode(rendered.input_ids[:rendered.turn_starts[0]])
    assert "You are a careful researcher." in head and json.dumps(CALC) in head  # schemas as text, documented


def test_without_a_chat_template_tools_and_system_open_the_plain_rendering(tiny_checkpoint):
    from race_core.policy import load_tokenizer

    renderer = Renderer(load_tokenizer(tiny_checkpoint), use_chat_template=False)
    trajectory = list(trajectories())[2]
    assert renderer.tool_mode == TOOLS_JSON and renderer.tool_fallback_reason == "no chat template"
    rendered = renderer.render(trajectory)
    head = renderer.tokenizer.decode(rendered.input_ids[:rendered.turn_starts[0]])
    assert head.removeprefix("<|bos|>").startswith("System: Be brief.") and '"name": "calc"' in head
    assert [renderer.tokenizer.decode(rendered.input_ids[a:b]).strip() for a, b in rendered.action_spans] == [
        "calc[1+1]", '{"name": "calc", "arguments": {"expr": "2*3"}}', "finish[6]"]
