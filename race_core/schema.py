"""Trajectory data contract (DESIGN §2).

A trajectory is a question followed by turns of (reasoning, action, observation). Only successful
training trajectories are RACE inputs: every rule below has its own error code so a reject says
exactly what was wrong, and `read_jsonl` keeps going past bad lines, collecting them as rejects.
"""

from __future__ import annotations

import hashlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

# Error codes: one per rule, stable (they end up in rejects.parquet).
NOT_JSON = "not_json"
NOT_OBJECT = "not_object"
MISSING_FIELD = "missing_field"
EMPTY_FIELD = "empty_field"
WRONG_TYPE = "wrong_type"
BAD_SPLIT = "bad_split"
NOT_SUCCESSFUL = "not_successful"
BAD_TURNS = "bad_turns"
EMPTY_TURNS = "empty_turns"
BAD_TURN = "bad_turn"
EMPTY_ACTION = "empty_action"
FIELD_TOO_LARGE = "field_too_large"
BAD_ID = "bad_id"
BAD_TEXT = "bad_text"
ERROR_CODES = (NOT_JSON, NOT_OBJECT, MISSING_FIELD, EMPTY_FIELD, WRONG_TYPE, BAD_SPLIT, NOT_SUCCESSFUL,
               BAD_TURNS, EMPTY_TURNS, BAD_TURN, EMPTY_ACTION, FIELD_TOO_LARGE, BAD_ID, BAD_TEXT)

REQUIRED_TEXT_FIELDS = ("question", "environment", "source_revision")
KNOWN_FIELDS = {*REQUIRED_TEXT_FIELDS, "split", "successful", "turns", "id"}


class SchemaError(ValueError):
    """A trajectory that breaks the input contract. `.code` is the rule, `.field` the bad field."""

    def __init__(self, code: str, field: str, message: str):
        super().__init__(f"{field}: {message} [{code}]")
        self.code = code
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Limits:
    """Size limits on text fields, in characters. Generous defaults; 0 disables a limit."""

    max_field_chars: int = 1_000_000
    max_turns: int = 512


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class Turn:
    reasoning: str
    action: str
    observation: str = ""

    def to_dict(self) -> dict[str, str]:
        return {"reasoning": self.reasoning, "action": self.action, "observation": self.observation}


@dataclass(frozen=True)
class Trajectory:
    question: str
    environment: str
    source_revision: str
    turns: tuple[Turn, ...]
    split: str = "train"
    successful: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", tuple(self.turns))
        if not self.id:
            object.__setattr__(self, "id", trajectory_id(self))

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Any, limits: Limits = DEFAULT_LIMITS) -> Trajectory:
        """Validate one input record (DESIGN §2); raise `SchemaError` naming the bad field."""
        if not isinstance(d, dict):
            raise SchemaError(NOT_OBJECT, "<record>", f"expected a JSON object, got {type(d).__name__}")
        try:
            canonical_json(d).encode("utf-8")
        except UnicodeEncodeError as exc:  # a lone surrogate, e.g. the escape "\ud800"
            raise SchemaError(BAD_TEXT, "<record>", f"text is not valid Unicode: {exc.reason}") from None
        for name in REQUIRED_TEXT_FIELDS:
            if name not in d:
                raise SchemaError(MISSING_FIELD, name, "is required")
            value = d[name]
            if not isinstance(value, str):
                raise SchemaError(WRONG_TYPE, name, f"must be a string, got {type(value).__name__}")
            if not value.strip():
                raise SchemaError(EMPTY_FIELD, name, "must not be empty")
            _check_size(name, value, limits)
        split = d.get("split", "train")
        if split != "train":
            raise SchemaError(BAD_SPLIT, "split", f"must be 'train' (evaluation data never trains), got {split!r}")
        if "successful" not in d:
            raise SchemaError(MISSING_FIELD, "successful", "is required and must be true")
        if d["successful"] is not True:
            raise SchemaError(NOT_SUCCESSFUL, "successful", f"must be exactly true, got {d['successful']!r}")
        if "turns" not in d:
            raise SchemaError(MISSING_FIELD, "turns", "is required")
        raw_turns = d["turns"]
        if not isinstance(raw_turns, list):
            raise SchemaError(BAD_TURNS, "turns", f"must be a list, got {type(raw_turns).__name__}")
        if not raw_turns:
            raise SchemaError(EMPTY_TURNS, "turns", "must hold at least one turn")
        if limits.max_turns and len(raw_turns) > limits.max_turns:
            raise SchemaError(FIELD_TOO_LARGE, "turns", f"{len(raw_turns)} turns exceed the limit of {limits.max_turns}")
        turns = [_turn_from_dict(i, t, limits) for i, t in enumerate(raw_turns)]
        given_id = d.get("id")
        if given_id is not None and (not isinstance(given_id, str) or not given_id.strip()):
            raise SchemaError(BAD_ID, "id", "must be a non-empty string when given")
        extra = {k: v for k, v in d.items() if k not in KNOWN_FIELDS}
        trajectory = cls(
            question=d["question"],
            environment=d["environment"],
            source_revision=d["source_revision"],
            turns=tuple(turns),
            split="train",
            successful=True,
            extra=extra,
        )
        if given_id is not None and given_id != trajectory.id:
            # The id is ours (a content hash); a different one from the source is kept, not trusted.
            extra["source_id"] = given_id
        return trajectory

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {
            "id": self.id,
            "question": self.question,
            "environment": self.environment,
            "source_revision": self.source_revision,
            "split": self.split,
            "successful": self.successful,
            "turns": [t.to_dict() for t in self.turns],
        }
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    # -- derived ------------------------------------------------------------------------------
    def without_reasoning(self, turn: int) -> Trajectory:
        """The same trajectory with turn `turn`'s reasoning removed (LoGiC candidate)."""
        turns = list(self.turns)
        turns[turn] = replace(turns[turn], reasoning="")
        return replace(self, turns=tuple(turns))


def _check_size(name: str, value: str, limits: Limits) -> None:
    if limits.max_field_chars and len(value) > limits.max_field_chars:
        raise SchemaError(
            FIELD_TOO_LARGE, name, f"{len(value)} characters exceed the limit of {limits.max_field_chars}"
        )


def _turn_from_dict(i: int, t: Any, limits: Limits) -> Turn:
    where = f"turns[{i}]"
    if not isinstance(t, dict):
        raise SchemaError(BAD_TURN, where, f"must be an object, got {type(t).__name__}")
    if "action" not in t:
        raise SchemaError(EMPTY_ACTION, f"{where}.action", "is required")
    action = t["action"]
    if not isinstance(action, str):
        raise SchemaError(WRONG_TYPE, f"{where}.action", f"must be a string, got {type(action).__name__}")
    if not action.strip():
        raise SchemaError(EMPTY_ACTION, f"{where}.action", "must not be empty")
    values = {"action": action}
    for name in ("reasoning", "observation"):
        value = t.get(name, "")
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise SchemaError(WRONG_TYPE, f"{where}.{name}", f"must be a string, got {type(value).__name__}")
        values[name] = value
    for name, value in values.items():
        _check_size(f"{where}.{name}", value, limits)
    return Turn(reasoning=values["reasoning"], action=values["action"], observation=values["observation"])


def canonical_json(obj: Any) -> str:
    """One byte string per value: sorted keys, no whitespace, UTF-8 kept."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def trajectory_id(t: Trajectory) -> str:
    """sha256 of the canonical JSON of (question, environment, source_revision, turns)."""
    payload = [t.question, t.environment, t.source_revision, [x.to_dict() for x in t.turns]]
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()


@dataclass(frozen=True)
class Reject:
    file: str
    line: int
    code: str
    field: str
    message: str
    trajectory_id: str | None = None  # set where the line was valid but its trajectory is refused later

    def to_dict(self) -> dict[str, Any]:
        return {"file": self.file, "line": self.line, "code": self.code, "field": self.field, "message": self.message,
                "trajectory_id": self.trajectory_id}


def iter_jsonl(
    lines: Iterable[str], source: str, limits: Limits = DEFAULT_LIMITS
) -> Iterator[Trajectory | Reject]:
    """Yield a Trajectory or a Reject for every non-blank line; never raises on bad data."""
    for number, line in enumerate(lines, start=1):
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            yield Reject(source, number, NOT_JSON, "<line>", f"not valid JSON: {exc.msg} at column {exc.colno}")
            continue
        try:
            yield Trajectory.from_dict(record, limits)
        except SchemaError as exc:
            yield Reject(source, number, exc.code, exc.field, exc.message)
        except RecursionError:
            yield Reject(source, number, NOT_JSON, "<line>", "nested too deeply")


def iter_jsonl_stream(binary: Iterable[bytes], source: str, limits: Limits = DEFAULT_LIMITS
                      ) -> Iterator[Trajectory | Reject]:
    """Like `iter_jsonl` over the lines of a binary file; bytes that are not UTF-8 reject their line."""
    yield from iter_jsonl(_decoded_lines(binary), source, limits)


def _decoded_lines(binary: Iterable[bytes]) -> Iterator[str]:
    for raw in binary:
        # Undecodable bytes become lone surrogates, which from_dict rejects as BAD_TEXT (or
        # json.loads as NOT_JSON), so the reject carries the right line number.
        yield raw.decode("utf-8", errors="surrogateescape")


def read_jsonl(
    paths: Iterable[str | Path], limits: Limits = DEFAULT_LIMITS
) -> tuple[list[Trajectory], list[Reject]]:
    """Read JSONL files: the good trajectories (duplicates by id kept once) and every reject."""
    good: dict[str, Trajectory] = {}
    rejects: list[Reject] = []
    for path in paths:
        with open(path, "rb") as fh:
            for item in iter_jsonl_stream(fh, str(path), limits):
                if isinstance(item, Reject):
                    rejects.append(item)
                else:
                    good.setdefault(item.id, item)
    return list(good.values()), rejects
