"""SWE-agent trajectories: one `.traj` JSON document per run, `{"trajectory": [...], "history": [...],
"info": {...}, "replay_config": ...}` (0.x and 1.x).

- `trajectory` steps `{"thought", "action", "observation", ...}`: one turn each; the action is the
  shell or editor command as text.
- SWE-agent also writes each step the model saw into the history (an assistant entry with the
  step's `thought` and `action`, `message_type` "action" in 1.x). The history is what the model saw,
  so it is what is followed: the steps are paired with those entries in order (actions and thoughts
  compared without their surrounding whitespace), and a step with no entry is one the agent retried
  (its output could not be parsed, was blocked, or an edit the linter rejected) that the model never
  saw again: it is no turn, and is kept in `extra["left_out_steps"]` (its index, why, and its fields)
  and counted in the import's summary.
  A run made with function calling keeps the model's real call: the entry's `tool_calls` are the
  turn's action (`{"name": "bash", "arguments": {"command": ...}}`, call ids kept), and its
  `thinking_blocks` join the reasoning. When the steps and entries do not pair up (an entry no
  step matches), every step is a turn with its text action, and `extra["history_unpaired"]` says so.
- `history`: the first system message is the system prompt, the first user message (the problem
  statement with its instructions) the question. Demonstrations (`is_demo`, or `message_type`
  "demonstration") are examples the agent was shown, not this run: they are passed over.
- Success: `info.exit_status` exactly "submitted" (the agent submitted on its own; "submitted
  (exit_cost)" and the like were submitted for it when a limit ran out).
- `extra`: the instance id (the file's name, `<instance_id>.traj`), and everything the contract has
  no field for: `exit_status`, `submission` (the patch), `model_stats`, the rest of `info` (under
  `info`), the tool config (`replay_config.agent.tools`, under `tool_config`), `replay_config` as
  given, and each turn's step's other fields (`response`, `state`, `execution_time`, ...) under
  `steps`. A step's `query` / `messages` (copies of the history the model saw) are not kept.
"""

from __future__ import annotations

import json
from pathlib import PurePosixPath
from typing import Any

from race_core.importers.common import (
    MALFORMED_CALL,
    MALFORMED_MESSAGE,
    NO_QUESTION,
    NO_TURNS,
    Conversation,
    SkipRecord,
    call_objects,
    joined,
    required_list,
    text_of,
    tool_call,
)
from race_core.schema import EMPTY_ACTION

NAME = "swe-agent"
SUBMITTED = "submitted"
STEP_FIELDS = ("thought", "action", "observation")
RETRIED = "not in the history: retried, the model never saw it"
HISTORY_COPIES = ("query", "messages")  # per step: the history again, left out
INFO_FIELDS = ("exit_status", "submission", "model_stats")  # kept under their own names


def matches(record: dict[str, Any]) -> bool:
    """A `trajectory` list beside a `history` or an `info`."""
    return isinstance(record.get("trajectory"), list) and ("history" in record or "info" in record)


def success(record: dict[str, Any]) -> tuple[bool, str, Any] | None:
    """Whether the agent submitted on its own (see `common.success_flag`); None without an exit status."""
    info = record.get("info")
    status = info.get("exit_status") if isinstance(info, dict) else None
    return None if status is None else (status == SUBMITTED, "info.exit_status", status)


def convert(record: dict[str, Any], source: str) -> Conversation:
    steps = required_list(record, "trajectory", "the list of thought/action/observation steps")
    history = record.get("history")
    system, question = _prompt(history)
    checked = [_step(step, f"trajectory[{i}]") for i, step in enumerate(steps)]
    pairs = _paired(checked, history)
    turns = [_turn(checked[i], f"trajectory[{i}]", history, entry) for i, entry in pairs]
    if not turns:
        raise SkipRecord(NO_TURNS, "trajectory", "has no step")
    extra = _extra(record, source, [steps[i] for i, _ in pairs])
    if pairs and pairs[0][1] is None and any(_entries(history)):
        extra["history_unpaired"] = True
    retried = sorted(set(range(len(steps))) - {i for i, _ in pairs})
    left_out = [{"index": i, "why": RETRIED, **_kept(steps[i])} for i in retried]
    return Conversation(question=question, turns=turns, system=system, extra=extra, left_out=left_out,
                        consumed=("trajectory", "history", "info", "replay_config", "instance_id"))


def _prompt(history: Any) -> tuple[str, str]:
    """(system prompt, question) from the history's first system and first user message."""
    if not isinstance(history, list):
        raise SkipRecord(NO_QUESTION, "history", "is needed: its first user message is the problem statement")
    system = question = None
    for i, message in enumerate(history):
        if not isinstance(message, dict):
            raise SkipRecord(MALFORMED_MESSAGE, f"history[{i}]", f"must be an object, got {type(message).__name__}")
        if _is_demo(message):
            continue
        role = message.get("role")
        if role == "system" and system is None:
            system = text_of(message.get("content"), f"history[{i}].content").strip()
        elif role == "user" and question is None:
            question = text_of(message.get("content"), f"history[{i}].content").strip()
        if question is not None and system is not None:
            break
    if not question:
        raise SkipRecord(NO_QUESTION, "history", "has no user message with the problem statement")
    return system or "", question


def _is_demo(message: dict[str, Any]) -> bool:
    return bool(message.get("is_demo")) or message.get("message_type") == "demonstration"


def _step(step: Any, where: str) -> dict[str, str]:
    """A step's thought, action and observation (strings; missing or null: "")."""
    if not isinstance(step, dict):
        raise SkipRecord(MALFORMED_MESSAGE, where, f"must be an object, got {type(step).__name__}")
    values = {}
    for name in STEP_FIELDS:
        value = step.get(name)
        if value is not None and not isinstance(value, str):
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}.{name}", f"must be a string, got {type(value).__name__}")
        values[name] = value or ""
    return values


def _entries(history: list[Any]) -> list[int]:
    """The indices of the history's assistant entries that record a step (not demonstrations)."""
    return [i for i, m in enumerate(history) if m.get("role") == "assistant" and not _is_demo(m) and "action" in m]


def _same(entry: dict[str, Any], step: dict[str, str]) -> bool:
    said = (str(entry.get("action") or "").strip(), str(entry.get("thought") or "").strip())
    return said == (step["action"].strip(), step["thought"].strip())


def _paired(steps: list[dict[str, str]], history: list[Any]) -> list[tuple[int, int | None]]:
    """(step index, the index of its history entry) for each step that is a turn (see the module
    docstring); the entry index is None when the history holds no entries to pair with."""
    entries = _entries(history)
    pairs: list[tuple[int, int | None]] = []
    for k, step in enumerate(steps):
        if len(pairs) < len(entries) and _same(history[entries[len(pairs)]], step):
            pairs.append((k, entries[len(pairs)]))
    if not entries or len(pairs) < len(entries):
        return [(k, None) for k in range(len(steps))]
    return pairs


def _turn(step: dict[str, str], where: str, history: list[Any], entry: int | None) -> dict[str, Any]:
    if not step["action"].strip():
        raise SkipRecord(EMPTY_ACTION, f"{where}.action", "a step without a command")
    reasoning, action = step["thought"].strip(), step["action"].strip()
    message = history[entry] if entry is not None else {}
    if message.get("tool_calls"):
        action = _calls(message["tool_calls"], f"history[{entry}].tool_calls")
        reasoning = joined([_thinking(message.get("thinking_blocks"), f"history[{entry}].thinking_blocks"), reasoning],
                           "\n\n")
    return {"reasoning": reasoning, "action": action, "observation": step["observation"]}


def _calls(raw: Any, where: str) -> Any:
    calls = []
    for at, call in call_objects(raw, where):
        function = call.get("function")
        if not isinstance(function, dict):
            raise SkipRecord(MALFORMED_CALL, f"{at}.function", "must be an object with name and arguments")
        calls.append(tool_call(function.get("name"), function.get("arguments"), f"{at}.function", call.get("id")))
    return calls[0] if len(calls) == 1 else calls


def _thinking(blocks: Any, where: str) -> str:
    """The text of Anthropic thinking blocks (`{"type": "thinking", "thinking": ...}`)."""
    if not blocks:
        return ""
    if not isinstance(blocks, list):
        raise SkipRecord(MALFORMED_MESSAGE, where, f"must be a list, got {type(blocks).__name__}")
    return joined([b["thinking"].strip() for b in blocks if isinstance(b, dict) and isinstance(b.get("thinking"), str)],
                  "\n\n")


def _extra(record: dict[str, Any], source: str, steps: list[Any]) -> dict[str, Any]:
    extra: dict[str, Any] = {"instance_id": record.get("instance_id") or _instance_id(source)}
    info = record.get("info")
    if isinstance(info, dict):
        extra.update({k: info[k] for k in INFO_FIELDS if info.get(k) is not None})
        rest = {k: v for k, v in info.items() if k not in INFO_FIELDS}
        if rest:
            extra["info"] = rest
    elif info is not None:
        extra["info"] = info
    replay = record.get("replay_config")
    if replay is not None:
        config = _parsed(replay)
        tools = config.get("agent", {}).get("tools") if isinstance(config.get("agent"), dict) else None
        if tools is not None:
            extra["tool_config"] = tools
        extra["replay_config"] = replay
    kept = [_kept(step, STEP_FIELDS) for step in steps]
    if any(kept):
        extra["steps"] = kept
    return extra


def _kept(step: dict[str, Any], without: tuple[str, ...] = ()) -> dict[str, Any]:
    """The step's fields but its copies of the history and `without`."""
    return {k: v for k, v in step.items() if k not in (*HISTORY_COPIES, *without)}


def _parsed(replay: Any) -> dict[str, Any]:
    """The replay config as an object (SWE-agent 1.x writes it as a JSON string); {} when it is none."""
    if isinstance(replay, str):
        try:
            replay = json.loads(replay)
        except json.JSONDecodeError:
            return {}
    return replay if isinstance(replay, dict) else {}


def _instance_id(source: str) -> str:
    """`.../django__django-11099.traj` -> `django__django-11099`."""
    name = PurePosixPath(source.replace("\\", "/")).name
    for suffix in (".gz", ".traj", ".json"):
        name = name.removesuffix(suffix)
    return name
