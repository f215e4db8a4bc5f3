"""Turns from a chat: the messages of any chat format (OpenAI chat, ShareGPT, the Responses API,
LangChain), once each format module has read them into `Message`s.

- `system` messages before the first step: the system prompt; after it, an error.
- `user` messages before the first step: the question. After a step, results when they are
  `<tool_response>` blocks or start with `Observation:` (ReAct, and how `race_core.render` writes
  observations), else user text that joins the observation of the turn before.
- `assistant` messages: one step each, or several when their text is a ReAct log that holds its
  observations. Their calls are the source's native ones (`calls`); without them, the text is read
  by `turn_text.assistant_steps` (a `<think>` block, Hermes `<tool_call>` blocks, ReAct labels, or
  a text action). Reasoning: the source's own field (`reasoning`), then the think block, then any
  text beside native calls (what the model said before acting). An assistant message with text
  only, directly followed by an assistant message that calls, is what the model said before that
  call: the call turn's reasoning.
- `tool` messages: the results of the turn's calls (by call id, else in call order; Hermes
  `<tool_response>` blocks are one result each), or a text action's observation.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from race_core.importers.common import (
    MALFORMED_MESSAGE,
    NO_QUESTION,
    NO_TURNS,
    SkipRecord,
    TurnBuilder,
    joined,
    split_think,
)
from race_core.importers.turn_text import Step, assistant_steps, is_structured, observation_text, results_of

SYSTEM, USER, ASSISTANT, TOOL = "system", "user", "assistant", "tool"


@dataclass
class Message:
    """One message as a format module read it. `where` names it in the source (`messages[3]`)."""

    role: str  # SYSTEM, USER, ASSISTANT or TOOL
    where: str
    text: str = ""
    reasoning: str = ""  # the source's own reasoning field or parts, apart from the text
    calls: list[dict[str, Any]] = field(default_factory=list)  # native calls, in the contract's form
    call_id: Any = None  # a tool result: the call it answers (None: the next one not yet answered)


@dataclass
class Chat:
    question: str
    system: str
    turns: list[dict[str, Any]]


def chat_turns(messages: Sequence[Message], key: str, result_per_call: bool = True) -> Chat:
    """The question, system prompt and turns of `messages` (`key`: the record's field that holds
    them, for messages about the whole list). `result_per_call=False`: results name no call, and a
    calling turn needs at least one."""
    system: list[str] = []
    question: list[str] = []
    turns = TurnBuilder(result_per_call)
    said = ""  # reasoning of a text-only assistant message, when an assistant message with calls follows
    for i, message in enumerate(messages):
        if message.role == SYSTEM:
            if turns.started or said:
                raise SkipRecord(MALFORMED_MESSAGE, message.where, "a system message after the first assistant message")
            system.append(message.text.strip())
        elif message.role == USER:
            if turns.started:
                _user_after_step(message, turns)
            else:
                question.append(message.text.strip())
        elif message.role == ASSISTANT:
            following = messages[i + 1] if i + 1 < len(messages) else None
            said = _assistant(message, turns, said, following)
        elif message.role == TOOL:
            blocks, rest = results_of(message.text)
            _results(turns, message, blocks or [message.text], rest if blocks else "")
        else:
            raise AssertionError(f"a format module made a message of role {message.role!r}")
    if not any(question):
        raise SkipRecord(NO_QUESTION, key, "no user message before the first assistant message")
    steps = turns.turns()
    if not steps:
        raise SkipRecord(NO_TURNS, key, "no assistant message")
    return Chat(joined(question, "\n\n"), joined(system, "\n\n"), steps)


def _user_after_step(message: Message, turns: TurnBuilder) -> None:
    blocks, rest = results_of(message.text)
    if blocks:
        _results(turns, message, blocks, rest)
        return
    observed = observation_text(message.text)
    if observed is not None:
        turns.observe(observed, message.where)
    else:
        turns.note(message.text)


def _results(turns: TurnBuilder, message: Message, results: list[str], rest: str) -> None:
    """The message's results (one: for its call id, if it names one), then any text beside them."""
    for result in results:
        turns.result(result, message.call_id if len(results) == 1 else None, message.where)
    if rest:
        turns.note(rest)


def _assistant(message: Message, turns: TurnBuilder, said: str, following: Message | None) -> str:
    """Add the message's steps; return its reasoning and text when it is said before the next
    message's calls (then it is no step of its own)."""
    if message.calls:
        inline, rest = split_think(message.text, f"{message.where}.content")
        turns.step(joined([said, message.reasoning, inline, rest], "\n\n"), message.calls, "", message.where)
        return ""
    steps = assistant_steps(message.text, f"{message.where}.content")
    if not is_structured(message.text) and following is not None and following.role == ASSISTANT and following.calls:
        step = steps[0] if steps else Step("", [], "")
        return joined([said, message.reasoning, step.reasoning, step.text], "\n\n")
    if not steps:
        steps = [Step("", [], "")]  # no text: an empty action, refused by the turn builder
    steps[0].reasoning = joined([said, message.reasoning, steps[0].reasoning], "\n\n")
    for step in steps:
        turns.step(step.reasoning, step.calls, step.text, message.where)
        if step.observation is not None:
            turns.observe(step.observation, message.where)
    return ""
