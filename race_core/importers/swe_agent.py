"""SWE-agent trajectories: one `.traj` JSON document per run, `{"trajectory": [...], "history": [...],
"info": {...}}` (0.x and 1.x).

- `trajectory` steps `{"thought", "action", "observation", ...}`: one turn each; the action is the
  shell or editor command as text.
- `history`: the first system message is the system prompt, the first user message (the problem
  statement with its instructions) the question. Demonstrations (`is_demo`, or `message_type`
  "demonstration") are examples the agent was shown, not this run: they are passed over.
- Success: `info.exit_status` exactly "submitted" (the agent submitted on its own; "submitted
  (exit_cost)" and the like were submitted for it when a limit ran out).
- The instance id (the file's name, `<instance_id>.traj`) and the exit status are kept in `extra`.
"""

from __future__ import annotations

from pathlib import PurePosixPath
from typing import Any

from race_core.importers.common import (
    MALFORMED_MESSAGE,
    NO_QUESTION,
    NO_TURNS,
    Conversation,
    SkipRecord,
    required_list,
    text_of,
)
from race_core.schema import EMPTY_ACTION

NAME = "swe-agent"
SUBMITTED = "submitted"


def success(record: dict[str, Any]) -> tuple[bool, str, Any] | None:
    """Whether the agent submitted on its own (see `common.success_flag`); None without an exit status."""
    info = record.get("info")
    status = info.get("exit_status") if isinstance(info, dict) else None
    return None if status is None else (status == SUBMITTED, "info.exit_status", status)


def convert(record: dict[str, Any], source: str) -> Conversation:
    steps = required_list(record, "trajectory", "the list of thought/action/observation steps")
    system, question = _prompt(record.get("history"))
    turns = [_turn(step, f"trajectory[{i}]") for i, step in enumerate(steps)]
    if not turns:
        raise SkipRecord(NO_TURNS, "trajectory", "has no step")
    extra: dict[str, Any] = {"instance_id": record.get("instance_id") or _instance_id(source)}
    info = record.get("info")
    if isinstance(info, dict) and info.get("exit_status") is not None:
        extra["exit_status"] = info["exit_status"]
    return Conversation(question=question, turns=turns, system=system, extra=extra,
                        consumed=("trajectory", "history", "info", "replay_config", "instance_id"))


def _prompt(history: Any) -> tuple[str, str]:
    """(system prompt, question) from the history's first system and first user message."""
    if not isinstance(history, list):
        raise SkipRecord(NO_QUESTION, "history", "is needed: its first user message is the problem statement")
    system = question = None
    for i, message in enumerate(history):
        if not isinstance(message, dict):
            raise SkipRecord(MALFORMED_MESSAGE, f"history[{i}]", f"must be an object, got {type(message).__name__}")
        if message.get("is_demo") or message.get("message_type") == "demonstration":
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


def _turn(step: Any, where: str) -> dict[str, str]:
    if not isinstance(step, dict):
        raise SkipRecord(MALFORMED_MESSAGE, where, f"must be an object, got {type(step).__name__}")
    values = {}
    for name in ("thought", "action", "observation"):
        value = step.get(name)
        if value is not None and not isinstance(value, str):
            raise SkipRecord(MALFORMED_MESSAGE, f"{where}.{name}", f"must be a string, got {type(value).__name__}")
        values[name] = value or ""
    if not values["action"].strip():
        raise SkipRecord(EMPTY_ACTION, f"{where}.action", "a step without a command")
    return {"reasoning": values["thought"].strip(), "action": values["action"].strip(),
            "observation": values["observation"]}


def _instance_id(source: str) -> str:
    """`.../django__django-11099.traj` -> `django__django-11099`."""
    name = PurePosixPath(source.replace("\\", "/")).name
    for suffix in (".gz", ".traj", ".json"):
        name = name.removesuffix(suffix)
    return name
