"""Rendering: action spans, stable prefixes, chat template and plain fallback, templates that rewrite
reasoning (the tokenizer's-own-ids property itself: test_render_canonical.py)."""

import copy

import numpy as np
import pytest

from race_core.render import CLOSE_MARKER, OPEN_MARKER, Renderer, Role
from race_core.schema import Trajectory, Turn


@pytest.fixture(params=["template", "plain"])
def renderer(request, tiny_policy):
    _, tokenizer = tiny_policy
    if request.param == "template":
        return Renderer(tokenizer)
    plain = copy.deepcopy(tokenizer)
    plain.chat_template = None
    return Renderer(plain)


def test_action_tokens_decode_to_exactly_the_action(renderer, expert_trajectories):
    tok = renderer.tokenizer
    odd = Trajectory("Compute 1 + 1 — ünïcode ✓?", "calc", "r", [Turn(" lead space", "  calc[1 + 1]  ", "2"),
                                                               Turn("", "finish[2]", "")])
    for trajectory in [*expert_trajectories, odd]:
        rendered = renderer.render(trajectory)
        assert len(rendered.action_spans) == len(trajectory.turns)
        for turn, (a, b) in zip(trajectory.turns, rendered.action_spans, strict=True):
            # the tokens that overlap the action: the action, perhaps with the prefix's last space
            assert tok.decode(rendered.input_ids[a:b]) in (turn.action, " " + turn.action)
            assert set(rendered.roles[a:b]) == {Role.ACTION}
        for t, turn in enumerate(trajectory.turns):
            reasoning = rendered.input_ids[rendered.mask(Role.REASONING, turn=t)]
            assert tok.decode(reasoning) == turn.reasoning


def test_ids_before_turn_t_do_not_depend_on_turn_t(renderer, expert_trajectories):
    trajectory = max(expert_trajectories, key=lambda t: len(t.turns))
    base = renderer.render(trajectory)
    for t in range(1, len(trajectory.turns)):
        changed = renderer.render(trajectory.without_reasoning(t))
        start = base.turn_starts[t]
        assert changed.turn_starts[t] == start
        assert np.array_equal(base.input_ids[:start], changed.input_ids[:start])
        assert not np.array_equal(base.input_ids[start:], changed.input_ids[start:])


def test_removed_reasoning_renders_as_an_empty_think_block(renderer, expert_trajectories):
    trajectory = expert_trajectories[0].without_reasoning(1)
    rendered = renderer.render(trajectory)
    start = rendered.turn_starts[1]
    open_len, close_len = len(renderer.encode(OPEN_MARKER)), len(renderer.encode(CLOSE_MARKER))
    assert renderer.tokenizer.decode(rendered.input_ids[start:start + open_len + close_len]) == "<think></think>"
    assert rendered.reasoning_token_count(turn=1) == 0


def test_every_token_has_a_turn_and_role(renderer, expert_trajectories):
    rendered = renderer.render(expert_trajectories[1])
    assert len(rendered.turns) == len(rendered.roles) == len(rendered)
    assert set(np.unique(rendered.roles)) >= {Role.CONTEXT, Role.OPEN, Role.CLOSE, Role.ACTION, Role.OBSERVATION}
    assert np.all(rendered.turns[rendered.roles == Role.ACTION] >= 0)
    assert np.all(np.diff(rendered.turns) >= 0)  # turns appear in order


def test_chat_template_supplies_only_the_wrappers(tiny_policy):
    _, tokenizer = tiny_policy
    renderer = Renderer(tokenizer)
    w = renderer.wrappers
    assert (w.head, w.user_to_assistant, w.assistant_end, w.assistant_to_user) == (
        "<|user|>\n", "<|end|>\n<|assistant|>\n", "<|end|>\n", "<|user|>\n")
    trajectory = Trajectory("Q?", "calc", "r", [Turn("think", "calc[1]", "1"), Turn("", "finish[1]", "")])
    text = tokenizer.decode(renderer.render(trajectory).input_ids)
    assert text == ("<|bos|><|user|>\nQ?<|end|>\n<|assistant|>\n<think>think</think>\nAction: calc[1]<|end|>\n"
                    "<|user|>\nObservation: 1<|end|>\n<|assistant|>\n<think></think>\nAction: finish[1]<|end|>\n")


def test_prompt_ids_end_where_the_next_turn_begins(tiny_policy, expert_trajectories):
    _, tokenizer = tiny_policy
    renderer = Renderer(tokenizer)
    trajectory = expert_trajectories[2]
    full = renderer.render(trajectory)
    for t in range(len(trajectory.turns)):
        prompt = renderer.prompt_ids(trajectory.question, trajectory.turns[:t])
        assert prompt == full.input_ids[:full.turn_starts[t]].tolist()


def test_template_that_rewrites_past_think_blocks_does_not_touch_our_reasoning(tiny_policy):
    _, tokenizer = tiny_policy
    rewriting = copy.deepcopy(tokenizer)
    # A template that strips think blocks from assistant history, as some reasoning models' do.
    rewriting.chat_template = (
        "{{ bos_token }}{% for m in messages %}<|{{ m['role'] }}|>\n"
        "{{ m['content'].split('</think>')[-1] }}<|end|>\n{% endfor %}"
        "{% if add_generation_prompt %}<|assistant|>\n{% endif %}")
    trajectory = Trajectory("Q?", "calc", "r", [Turn("keep me", "calc[1]", "1"), Turn("me too", "finish[1]", "")])
    renderer = Renderer(rewriting)
    text = rewriting.decode(renderer.render(trajectory).input_ids)
    assert "<think>keep me</think>" in text and "<think>me too</think>" in text
    assert renderer.template_mode == "strips-reasoning" and renderer.render_mode == "canonical/strips-reasoning"
    assert Renderer(tokenizer).template_mode == "keeps-reasoning"


QWEN3_STYLE_TEMPLATE = (
    # the part of Qwen3's template that matters here: assistant messages before the last user
    # message lose their think block; the last ones keep it
    "{%- set ns = namespace(last_query=messages|length - 1) -%}"
    "{%- for m in messages[::-1] -%}{%- set i = messages|length - 1 - loop.index0 -%}"
    "{%- if m.role == 'user' and ns.last_query == messages|length - 1 and loop.index0 > 0 -%}"
    "{%- set ns.last_query = i -%}{%- endif -%}{%- endfor -%}"
    "{%- for m in messages -%}"
    "{%- if m.role == 'assistant' -%}{%- set content = m.content -%}"
    "{%- if loop.index0 < ns.last_query and '</think>' in content -%}"
    "{%- set content = content.split('</think>')[-1].lstrip('\\n') -%}{%- endif -%}"
    "{{ '<|im_start|>assistant\\n' + content + '<|im_end|>\\n' }}"
    "{%- else -%}{{ '<|im_start|>' + m.role + '\\n' + m.content + '<|im_end|>\\n' }}{%- endif -%}"
    "{%- endfor -%}{%- if add_generation_prompt -%}{{ '<|im_start|>assistant\\n' }}{%- endif -%}")


def test_qwen3_style_template_on_the_smollm2_tokenizer_keeps_every_turns_reasoning(smollm2_checkpoint):
    from race_core.policy import load_tokenizer

    tokenizer = load_tokenizer(smollm2_checkpoint)
    stripping = copy.deepcopy(tokenizer)
    stripping.chat_template = QWEN3_STYLE_TEMPLATE
    conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "<think>r1</think>\na1"},
                    {"role": "user", "content": "o"}, {"role": "assistant", "content": "<think>r2</think>\na2"}]
    assert "r1" not in stripping.apply_chat_template(conversation, tokenize=False)  # it does strip
    renderer = Renderer(stripping)
    assert renderer.template_mode == "strips-reasoning"
    assert renderer.tokenization == "canonical", renderer.fallback_reason
    trajectory = Trajectory("Q?", "calc", "r", [Turn("first thought", "calc[1]", "1"),
                                                Turn("second thought", "finish[1]", "")])
    text = stripping.decode(renderer.render(trajectory).input_ids)
    assert "<think>first thought</think>" in text and "<think>second thought</think>" in text
    assert text.startswith("<|im_start|>user\nQ?<|im_end|>\n<|im_start|>assistant\n")
