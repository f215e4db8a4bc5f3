"""Compressed trajectories as the trainers users already run read them (`race export`).

Every record names its trajectory (`id`, `environment`, `source_revision`, `successful`: so `race
import` reads an openai or sharegpt export back) and says per turn whether the cover removed its
reasoning (`reasoning_removed`). Texts are the trajectory's own: RACE's rendering glue (`\\nAction: `,
`Observation: `) is RACE's, not the data's.

- `openai`: `{"messages": [...], "tools": [...]}`, the conversational format of TRL's SFTTrainer and
  of transformers chat templates. An assistant message per turn: a text action is its `content`;
  tool calls are its `tool_calls` (`{"type": "function", "function": {"name", "arguments"}}`, arguments
  an object as chat templates take them, and the source's call `id` when the trajectory kept one) and
  their results `tool` messages (one per call, in call order; the turn's one observation is the first
  call's result). The reasoning goes where the target's chat
  template reads it (`REASONING_FIELDS`): `reasoning_content` (Qwen3, DeepSeek-R1, vLLM), `thinking`
  (GPT-OSS), or `content`, a `<think>...</think>` block opening the content, for templates without
  such a field. Removed reasoning is the empty string (an empty think block), so closing early is
  what the target learns there too. A text action's observation is a `user` message.
- `sharegpt`: LLaMA-Factory's `{"conversations": [{"from", "value"}], "system", "tools": "<JSON>"}`:
  `gpt` values open with the `<think>` block; a tool-call turn is a `function_call` entry (the think
  block, then the call's JSON object `{"name", "arguments"}`, or a list of them for parallel calls:
  the format has no place for call ids) and its result an `observation` entry; a text action's
  observation is a `human` entry. LLaMA-Factory wants an
  assistant entry last, so a last turn's observation is left out. `dataset_info_entry` is the
  description its `dataset_info.json` needs.
- `tokens`: the renderer's ids (`race_core.render`, the ids the cover and RACE's own trainers use),
  `assistant_mask` (the tokens the policy produced: SFT targets, RL policy tokens), per token its turn
  and role (`ROLE_NAMES`), and `reasoning_removed`: what a cover-aware RL in another trainer needs
  (mask the removed turns' reasoning, supervise their close marker).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from typing import Any

from race_core.render import ASSISTANT_ROLES, CLOSE_MARKER, OPEN_MARKER, Renderer, Role
from race_core.schema import Trajectory

FORMATS = ("openai", "sharegpt", "tokens")
REASONING_FIELDS = ("reasoning_content", "thinking", "content")
AUTO = "auto"
THINK_SEPARATOR = "\n"  # between `</think>` and the action where both share one text
ROLE_NAMES = {int(role): role.name.lower() for role in Role}


def think_block(reasoning: str) -> str:
    return f"{OPEN_MARKER}{reasoning}{CLOSE_MARKER}"


def _identity(trajectory: Trajectory, skipped_turns: Sequence[int]) -> dict[str, Any]:
    removed = set(skipped_turns)
    return {"id": trajectory.id, "environment": trajectory.environment, "source_revision": trajectory.source_revision,
            "successful": True, "reasoning_removed": [t in removed for t in range(len(trajectory.turns))]}


def openai_record(trajectory: Trajectory, skipped_turns: Sequence[int] = (),
                  reasoning_field: str = "reasoning_content") -> dict[str, Any]:
    """One trajectory as OpenAI chat messages (see the module docstring)."""
    if reasoning_field not in REASONING_FIELDS:
        raise ValueError(f"reasoning field {reasoning_field!r} is not one of {REASONING_FIELDS}")
    messages: list[dict[str, Any]] = [{"role": "system", "content": trajectory.system}] if trajectory.system else []
    messages.append({"role": "user", "content": trajectory.question})
    last = len(trajectory.turns) - 1
    for t, turn in enumerate(trajectory.turns):
        calls = turn.tool_calls
        text = "" if calls else turn.action_text
        message: dict[str, Any] = {"role": "assistant"}
        if reasoning_field == "content":
            message["content"] = think_block(turn.reasoning) + (THINK_SEPARATOR + text if text else "")
        else:
            message["content"] = text
            message[reasoning_field] = turn.reasoning
        if calls:
            message["tool_calls"] = [{"type": "function", **({"id": c.id} if c.id else {}),
                                      "function": {"name": c.name, "arguments": c.arguments}} for c in calls]
        messages.append(message)
        if t == last and not turn.observation:
            continue
        if calls:
            messages += [{"role": "tool", **({"tool_call_id": c.id} if c.id else {}), "name": c.name,
                          "content": turn.observation if k == 0 else ""} for k, c in enumerate(calls)]
        else:
            messages.append({"role": "user", "content": turn.observation})
    record: dict[str, Any] = {"messages": messages}
    if trajectory.tools:
        record["tools"] = list(trajectory.tools)
    return {**record, **_identity(trajectory, skipped_turns)}


def sharegpt_record(trajectory: Trajectory, skipped_turns: Sequence[int] = ()) -> dict[str, Any]:
    """One trajectory in LLaMA-Factory's ShareGPT format (see the module docstring)."""
    conversations = [{"from": "human", "value": trajectory.question}]
    last = len(trajectory.turns) - 1
    for t, turn in enumerate(trajectory.turns):
        calls = turn.tool_calls
        if calls:
            payload = [{"name": c.name, "arguments": c.arguments} for c in calls]
            body = json.dumps(payload[0] if len(payload) == 1 else payload, ensure_ascii=False)
            conversations.append({"from": "function_call", "value": think_block(turn.reasoning) + body})
        else:
            conversations.append({"from": "gpt", "value": think_block(turn.reasoning) + THINK_SEPARATOR
                                  + turn.action_text})
        if t < last:
            conversations.append({"from": "observation" if calls else "human", "value": turn.observation})
    record: dict[str, Any] = {"conversations": conversations, "system": trajectory.system,
                              "tools": json.dumps(list(trajectory.tools), ensure_ascii=False) if trajectory.tools
                              else ""}
    return {**record, **_identity(trajectory, skipped_turns)}


def dataset_info_entry(file_name: str) -> dict[str, Any]:
    """The description of a sharegpt export in LLaMA-Factory's `dataset_info.json`."""
    return {"file_name": file_name, "formatting": "sharegpt",
            "columns": {"messages": "conversations", "system": "system", "tools": "tools"}}


def tokens_record(renderer: Renderer, trajectory: Trajectory, skipped_turns: Sequence[int] = ()) -> dict[str, Any]:
    """One trajectory as the renderer's ids with the masks a cover-aware RL needs."""
    rendered = renderer.render(trajectory)
    return {"input_ids": rendered.input_ids.tolist(),
            "assistant_mask": rendered.mask(*ASSISTANT_ROLES).astype(int).tolist(),
            "token_turns": rendered.turns.tolist(), "token_roles": rendered.roles.tolist(),
            **_identity(trajectory, skipped_turns)}


def tokens_info(renderer: Renderer, checkpoint: str, model_digest: str) -> dict[str, Any]:
    """What a tokens export's records mean: the role codes, the rendering, the checkpoint."""
    return {"format": "race-tokens", "roles": ROLE_NAMES, "assistant_roles": [r.name.lower() for r in ASSISTANT_ROLES],
            "render_mode": renderer.render_mode, "checkpoint": checkpoint, "model_digest": model_digest,
            "token_turns": "the turn of each token (-1: before turn 0)",
            "reasoning_removed": "per turn: the cover removed its reasoning (its think block is empty)"}


def template_reasoning_field(tokenizer) -> str:
    """The field the tokenizer's chat template renders an assistant message's reasoning from:
    `reasoning_content`, `thinking`, or `content` when it reads neither (found by rendering a
    sentinel in each)."""
    if not getattr(tokenizer, "chat_template", None):
        return "content"
    sentinel = "RACE sentinel reasoning 5d1e"
    for name in REASONING_FIELDS[:2]:
        conversation = [{"role": "user", "content": "q"}, {"role": "assistant", "content": "a", name: sentinel}]
        try:
            text = tokenizer.apply_chat_template(conversation, tokenize=False)
        except Exception:  # noqa: BLE001 - a template that fails on the field does not read it
            continue
        if sentinel in text:
            return name
    return "content"
