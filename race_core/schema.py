"""Trajectory data contract (docs/architecture.md §2).

A trajectory is a question followed by turns of (reasoning, action, observation), optionally with a
`system` prompt and the `tools` (JSON schemas) the agent was given. An action is text
(`calc[3+4]`) or tool calls: one `{"name", "arguments"}` object or a list of them (parallel calls,
one turn). Only successful
training trajectories are RACE inputs: every rule below has its own error code so a reject says
exactly what was wrong, and `read_jsonl` keeps going past bad lines, collecting them as rejects.
One bad line costs that line only: whatever Python raises while reading it becomes its reject, and
the reader holds at most one line (up to `Limits.max_line_bytes`) in memory.
"""

from __future__ import annotations

import gzip
import hashlib
import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Protocol

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
NON_FINITE_NUMBER = "non_finite_number"  # NaN / Infinity: not standard JSON, refused rather than altered
TOO_DEEP = "too_deep"
EXTRA_TOO_LARGE = "extra_too_large"
LINE_TOO_LONG = "line_too_long"
UNREADABLE = "unreadable"  # anything else Python raised while reading the line (or a corrupt gzip stream)
BAD_TOOL_CALL = "bad_tool_call"  # a tool call without a non-empty name, arguments not an object, ...
BAD_TOOLS = "bad_tools"  # `tools` not a list of JSON-schema objects
ERROR_CODES = (NOT_JSON, NOT_OBJECT, MISSING_FIELD, EMPTY_FIELD, WRONG_TYPE, BAD_SPLIT, NOT_SUCCESSFUL,
               BAD_TURNS, EMPTY_TURNS, BAD_TURN, EMPTY_ACTION, FIELD_TOO_LARGE, BAD_ID, BAD_TEXT,
               NON_FINITE_NUMBER, TOO_DEEP, EXTRA_TOO_LARGE, LINE_TOO_LONG, UNREADABLE, BAD_TOOL_CALL, BAD_TOOLS)

# Not an error: a line whose trajectory (same id) was read before is merged into it, counted and listed.
DUPLICATE = "duplicate"

REQUIRED_TEXT_FIELDS = ("question", "environment", "source_revision")
KNOWN_FIELDS = {*REQUIRED_TEXT_FIELDS, "split", "successful", "turns", "id", "system", "tools"}
TOOL_CALL_KEYS = ("name", "arguments", "id")


class SchemaError(ValueError):
    """A trajectory that breaks the input contract. `.code` is the rule, `.field` the bad field."""

    def __init__(self, code: str, field: str, message: str):
        super().__init__(f"{field}: {message} [{code}]")
        self.code = code
        self.field = field
        self.message = message


@dataclass(frozen=True)
class Limits:
    """Size limits on one input line. Generous defaults; 0 disables a limit."""

    max_field_chars: int = 1_000_000  # a text field, in characters
    max_turns: int = 512
    max_line_bytes: int = 16 << 20  # a whole line, in bytes (decompressed, for gzip input)
    max_extra_bytes: int = 1 << 20  # the keys outside the contract together, as canonical JSON bytes
    max_depth: int = 100  # JSON nesting (the record itself is depth 1)


DEFAULT_LIMITS = Limits()


@dataclass(frozen=True)
class ToolCall:
    """One call of a tool: its name and its arguments (a JSON object). `id` is the source's call id,
    kept (and hashed with the turn) but never rendered."""

    name: str
    arguments: dict[str, Any] = field(default_factory=dict)
    id: str = ""

    def to_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {"name": self.name, "arguments": self.arguments}
        if self.id:
            out["id"] = self.id
        return out


Action = str | tuple[ToolCall, ...]


@dataclass(frozen=True)
class Turn:
    """`action` is the action text, or the turn's tool calls in call order (parallel calls stay
    one turn; their observations are joined into `observation`)."""

    reasoning: str
    action: Action
    observation: str = ""

    def __post_init__(self) -> None:
        if not isinstance(self.action, str):
            object.__setattr__(self, "action", tuple(self.action))

    @property
    def tool_calls(self) -> tuple[ToolCall, ...]:
        """The turn's tool calls; () for a text action."""
        return () if isinstance(self.action, str) else self.action

    @property
    def action_text(self) -> str:
        """The action as text: itself, or its tool calls as JSON (the rendering of tool calls when
        the chat template has no tool support, docs/architecture.md §3)."""
        return self.action if isinstance(self.action, str) else tool_calls_text(self.action)

    def to_dict(self) -> dict[str, Any]:
        return {"reasoning": self.reasoning, "action": action_to_json(self.action), "observation": self.observation}


def action_to_json(action: Action) -> Any:
    """The contract's form of an action: the text, one call object, or a list of call objects."""
    if isinstance(action, str):
        return action
    calls = [call.to_dict() for call in action]
    return calls[0] if len(calls) == 1 else calls


def tool_calls_text(calls: tuple[ToolCall, ...]) -> str:
    """Tool calls as JSON text, `{"name": ..., "arguments": {...}}` (a list for parallel calls),
    keys in the source's order, non-ASCII kept."""
    objects = [{"name": call.name, "arguments": call.arguments} for call in calls]
    return json.dumps(objects[0] if len(objects) == 1 else objects, ensure_ascii=False)


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
    system: str = ""  # the system prompt the agent ran with ("" when the source has none)
    tools: tuple[dict[str, Any], ...] = ()  # the tools' JSON schemas, as the source gave them

    def __post_init__(self) -> None:
        object.__setattr__(self, "turns", tuple(self.turns))
        object.__setattr__(self, "tools", tuple(self.tools))
        if not self.id:
            object.__setattr__(self, "id", trajectory_id(self))

    # -- construction -------------------------------------------------------------------------
    @classmethod
    def from_dict(cls, d: Any, limits: Limits = DEFAULT_LIMITS) -> Trajectory:
        """Validate one input record (docs/architecture.md §2); raise `SchemaError` naming the bad field."""
        if not isinstance(d, dict):
            raise SchemaError(NOT_OBJECT, "<record>", f"expected a JSON object, got {type(d).__name__}")
        if limits.max_depth and _nested_deeper_than(d, limits.max_depth):
            raise SchemaError(TOO_DEEP, "<record>", f"JSON nested over the limit of {limits.max_depth} levels")
        _check_standard_json(d)
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
        system = d.get("system")
        if system is None:
            system = ""
        if not isinstance(system, str):
            raise SchemaError(WRONG_TYPE, "system", f"must be a string, got {type(system).__name__}")
        _check_size("system", system, limits)
        tools = _tools_from_json(d.get("tools"))
        given_id = d.get("id")
        if given_id is not None and (not isinstance(given_id, str) or not given_id.strip()):
            raise SchemaError(BAD_ID, "id", "must be a non-empty string when given")
        extra = {k: v for k, v in d.items() if k not in KNOWN_FIELDS}
        _check_extra_size(extra, limits)
        trajectory = cls(
            question=d["question"],
            environment=d["environment"],
            source_revision=d["source_revision"],
            turns=tuple(turns),
            split="train",
            successful=True,
            extra=extra,
            system=system,
            tools=tools,
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
        if self.system:
            out["system"] = self.system
        if self.tools:
            out["tools"] = list(self.tools)
        out.update({k: v for k, v in self.extra.items() if k not in out})
        return out

    # -- derived ------------------------------------------------------------------------------
    def without_reasoning(self, turn: int) -> Trajectory:
        """The same trajectory with turn `turn`'s reasoning removed (LoGiC candidate)."""
        turns = list(self.turns)
        turns[turn] = replace(turns[turn], reasoning="")
        return replace(self, turns=tuple(turns))


def _nested_deeper_than(value: Any, limit: int) -> bool:
    """Whether `value` nests lists/objects more than `limit` levels (iterative: no recursion limit)."""
    stack = [(value, 1)]
    while stack:
        node, depth = stack.pop()
        if depth > limit:
            return True
        children = node.values() if isinstance(node, dict) else node
        stack.extend((child, depth + 1) for child in children if isinstance(child, (dict, list)))
    return False


def _check_standard_json(d: dict[str, Any]) -> None:
    """The record must be writable as standard UTF-8 JSON: no lone surrogate, no NaN or Infinity."""
    try:
        json.dumps(d, ensure_ascii=False, allow_nan=False).encode("utf-8")
    except UnicodeEncodeError as exc:  # a lone surrogate, e.g. the escape "\ud800"
        raise SchemaError(BAD_TEXT, "<record>", f"text is not valid Unicode: {exc.reason}") from None
    except ValueError:  # NaN, Infinity, or a float literal too large for a double (1e999)
        bad = next((k for k, v in d.items() if not _is_finite_json(v)), "<record>")
        raise SchemaError(NON_FINITE_NUMBER, bad, "NaN or Infinity is not standard JSON") from None


def _is_finite_json(value: Any) -> bool:
    try:
        json.dumps(value, allow_nan=False)
    except ValueError:
        return False
    return True


def _check_extra_size(extra: dict[str, Any], limits: Limits) -> None:
    if not (limits.max_extra_bytes and extra):
        return
    size = len(canonical_json(extra).encode("utf-8"))
    if size > limits.max_extra_bytes:
        largest = max(extra, key=lambda k: len(canonical_json(extra[k])))
        raise SchemaError(EXTRA_TOO_LARGE, largest, f"the keys outside the contract ({len(extra)}) take {size} "
                                                    f"bytes, over the limit of {limits.max_extra_bytes}")


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
    action = _action_from_json(t["action"], f"{where}.action")
    values = {"action": action} if isinstance(action, str) else {}
    for name in ("reasoning", "observation"):
        value = t.get(name, "")
        if value is None:
            value = ""
        if not isinstance(value, str):
            raise SchemaError(WRONG_TYPE, f"{where}.{name}", f"must be a string, got {type(value).__name__}")
        values[name] = value
    for name, value in values.items():
        _check_size(f"{where}.{name}", value, limits)
    if not isinstance(action, str):
        _check_size(f"{where}.action", tool_calls_text(action), limits)
    return Turn(reasoning=values["reasoning"], action=action, observation=values["observation"])


def _action_from_json(action: Any, where: str) -> Action:
    """A text action, one tool call object, or a non-empty list of them (docs/architecture.md §2)."""
    if isinstance(action, str):
        if not action.strip():
            raise SchemaError(EMPTY_ACTION, where, "must not be empty")
        return action
    if isinstance(action, dict):
        return (_tool_call_from_json(action, where),)
    if isinstance(action, list):
        if not action:
            raise SchemaError(EMPTY_ACTION, where, "a list of tool calls must not be empty")
        return tuple(_tool_call_from_json(call, f"{where}[{k}]") for k, call in enumerate(action))
    raise SchemaError(WRONG_TYPE, where, f"must be a string, a tool call object or a list of them, "
                                         f"got {type(action).__name__}")


def _tool_call_from_json(call: Any, where: str) -> ToolCall:
    if not isinstance(call, dict):
        raise SchemaError(BAD_TOOL_CALL, where, f"a tool call must be an object, got {type(call).__name__}")
    unknown = sorted(set(call) - set(TOOL_CALL_KEYS))
    if unknown:
        hint = " (an OpenAI-style message? see `race import --format openai`)" if "function" in unknown else ""
        raise SchemaError(BAD_TOOL_CALL, f"{where}.{unknown[0]}",
                          f"unknown key in a tool call; a call has {list(TOOL_CALL_KEYS[:2])} (and an optional id){hint}")
    name = call.get("name")
    if not isinstance(name, str) or not name.strip():
        raise SchemaError(BAD_TOOL_CALL, f"{where}.name", f"must be a non-empty string, got {name!r}")
    arguments = call.get("arguments", {})
    if not isinstance(arguments, dict):
        hint = " (a JSON string? decode it first, or import with --format openai)" if isinstance(arguments, str) else ""
        raise SchemaError(BAD_TOOL_CALL, f"{where}.arguments",
                          f"must be a JSON object, got {type(arguments).__name__}{hint}")
    call_id = call.get("id", "")
    if call_id is None:
        call_id = ""
    if not isinstance(call_id, str):
        raise SchemaError(BAD_TOOL_CALL, f"{where}.id", f"must be a string when given, got {type(call_id).__name__}")
    return ToolCall(name=name, arguments=arguments, id=call_id)


def _tools_from_json(tools: Any) -> tuple[dict[str, Any], ...]:
    """`tools`: absent, null or a list of JSON-schema objects (OpenAI `{"type": "function",
    "function": {...}}` or a bare `{"name", "parameters", ...}`), kept as given for the template."""
    if tools is None:
        return ()
    if not isinstance(tools, list):
        raise SchemaError(BAD_TOOLS, "tools", f"must be a list of JSON-schema objects, got {type(tools).__name__}")
    for k, tool in enumerate(tools):
        if not isinstance(tool, dict):
            raise SchemaError(BAD_TOOLS, f"tools[{k}]", f"must be a JSON-schema object, got {type(tool).__name__}")
        spec = tool.get("function", tool)
        if not isinstance(spec, dict) or not isinstance(spec.get("name"), str) or not spec["name"].strip():
            raise SchemaError(BAD_TOOLS, f"tools[{k}]", "has no non-empty name (expected {\"name\", \"parameters\"} "
                                                        "or {\"type\": \"function\", \"function\": {...}})")
    return tuple(tools)


def canonical_json(obj: Any) -> str:
    """One byte string per value: sorted keys, no whitespace, UTF-8 kept."""
    return json.dumps(obj, sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def trajectory_id(t: Trajectory) -> str:
    """sha256 of the canonical JSON of (question, environment, source_revision, turns), with
    (system, tools) appended when the trajectory has either: the ids of trajectories without them
    are those of earlier versions."""
    payload: list[Any] = [t.question, t.environment, t.source_revision, [x.to_dict() for x in t.turns]]
    if t.system or t.tools:
        payload += [t.system, list(t.tools)]
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


class ByteStream(Protocol):
    """What the reader needs of a binary file: `read(size)`, returning b"" at the end."""

    def read(self, size: int = -1, /) -> bytes: ...


GZIP_MAGIC = b"\x1f\x8b"
UTF8_BOM = b"\xef\xbb\xbf"
READ_CHUNK_BYTES = 1 << 20
# What a damaged gzip stream raises. Any other OSError comes from the storage and fails the read
# (the task's retry may fix it): it must not become a reject cached with the file's key.
_DAMAGED_STREAM = (EOFError, zlib.error, gzip.BadGzipFile)


class Duplicates:
    """The first trajectory of each id, across every file read with this object: a later one with
    the same id becomes a `duplicate` reject that names where the first was (nothing is dropped
    without a word)."""

    def __init__(self) -> None:
        self._first: dict[str, tuple[str, int]] = {}

    def check(self, item: Trajectory | Reject, source: str, line: int) -> Trajectory | Reject:
        if isinstance(item, Reject):
            return item
        first = self._first.get(item.id)
        if first is None:
            self._first[item.id] = (source, line)
            return item
        return Reject(source, line, DUPLICATE, "<record>", f"the same trajectory (id {item.id[:12]}) as "
                                                           f"{first[0]}:{first[1]}; merged into it", item.id)


def iter_jsonl_stream(binary: ByteStream, source: str, limits: Limits = DEFAULT_LIMITS,
                      duplicates: Duplicates | None = None) -> Iterator[Trajectory | Reject]:
    """Yield a Trajectory or a Reject for every non-blank line of a JSONL byte stream; never raises
    on bad data. gzip is recognised by its magic bytes, a leading UTF-8 BOM is dropped. The stream
    is read in chunks: a line over `limits.max_line_bytes` is skipped to its newline, never held
    whole. Bytes that are not UTF-8 reject their line; a damaged gzip stream rejects the line it
    broke in and ends the file (the lines before it are kept). With `duplicates`, a trajectory read
    before (in any file it has seen) is a `duplicate` reject."""
    for number, line in enumerate(_bounded_lines(_decompressed(binary), limits.max_line_bytes), start=1):
        if number == 1 and isinstance(line, bytes) and line.startswith(UTF8_BOM):
            line = line[len(UTF8_BOM):]
        if isinstance(line, _Skipped):
            yield _line_too_long(source, number, line.size, limits)
        elif isinstance(line, _Damaged):
            yield Reject(source, number, UNREADABLE, "<file>", line.message)
        elif (item := _read_line(line, source, number, limits)) is not None:
            yield duplicates.check(item, source, number) if duplicates is not None else item


def iter_jsonl(lines: Iterable[str], source: str, limits: Limits = DEFAULT_LIMITS
               ) -> Iterator[Trajectory | Reject]:
    """`iter_jsonl_stream` over lines of text already in memory."""
    for number, line in enumerate(lines, start=1):
        if (item := _read_line(line.encode("utf-8", errors="surrogatepass"), source, number, limits)) is not None:
            yield item


def _read_line(raw: bytes, source: str, number: int, limits: Limits) -> Trajectory | Reject | None:
    """One line -> its Trajectory or its Reject (None for a blank line). Raises nothing but
    BaseExceptions that are not errors (KeyboardInterrupt, SystemExit)."""
    if limits.max_line_bytes and len(raw) > limits.max_line_bytes:
        return _line_too_long(source, number, len(raw), limits)
    # Undecodable bytes become lone surrogates, which from_dict rejects as BAD_TEXT (or json.loads
    # as NOT_JSON), so the reject carries the right line number.
    text = raw.decode("utf-8", errors="surrogateescape")
    if not text.strip():
        return None
    try:
        return Trajectory.from_dict(json.loads(text), limits)
    except json.JSONDecodeError as exc:
        return Reject(source, number, NOT_JSON, "<line>", f"not valid JSON: {exc.msg} at column {exc.colno}")
    except SchemaError as exc:
        return Reject(source, number, exc.code, exc.field, exc.message)
    except Exception as exc:  # noqa: BLE001 - e.g. RecursionError, a 5000-digit integer: this line's reject
        return Reject(source, number, UNREADABLE, "<line>", _describe(exc))


def _describe(exc: Exception) -> str:
    if isinstance(exc, RecursionError):
        return "JSON nested too deeply to read (RecursionError)"
    text = f"{type(exc).__name__}: {exc}"
    return text if len(text) <= 300 else text[:297] + "..."


def _line_too_long(source: str, number: int, size: int, limits: Limits) -> Reject:
    return Reject(source, number, LINE_TOO_LONG, "<line>",
                  f"{size} bytes exceed the line limit of {limits.max_line_bytes} bytes")


@dataclass(frozen=True)
class _Skipped:
    """A line over the byte limit, skipped: only its size was kept."""

    size: int


@dataclass(frozen=True)
class _Damaged:
    """The stream broke (a damaged gzip file): nothing after this point can be read."""

    message: str


class _Replayed:
    """`rest` with `head`, bytes already read from it, put back in front."""

    def __init__(self, head: bytes, rest: ByteStream):
        self._head, self._rest = head, rest

    def read(self, size: int = -1, /) -> bytes:
        if not self._head:
            return self._rest.read(size)
        if size < 0:
            data, self._head = self._head + self._rest.read(), b""
        else:
            data, self._head = self._head[:size], self._head[size:]
        return data


def _decompressed(binary: ByteStream) -> ByteStream:
    """`binary` itself, or its decompressed bytes when it starts with the gzip magic bytes."""
    head = binary.read(len(GZIP_MAGIC))
    while 0 < len(head) < len(GZIP_MAGIC) and (more := binary.read(len(GZIP_MAGIC) - len(head))):
        head += more
    stream = _Replayed(head, binary)
    return gzip.GzipFile(fileobj=stream, mode="rb") if head == GZIP_MAGIC else stream


def _bounded_lines(stream: ByteStream, max_bytes: int) -> Iterator[bytes | _Skipped | _Damaged]:
    """The lines of `stream` without their newline, read in chunks. A line longer than `max_bytes`
    (0: no limit) is counted to its newline but not kept: memory stays under max_bytes + a chunk."""
    line = bytearray()
    skipped = 0  # > 0 while skipping an over-long line: its size so far
    # read1 (gzip) returns what is decompressed so far, so a damaged end loses no line before it
    read = getattr(stream, "read1", stream.read)
    while True:
        try:
            chunk = read(READ_CHUNK_BYTES)
        except _DAMAGED_STREAM as exc:
            if skipped or line:  # what came before the damage, judged like any line
                yield _Skipped(skipped) if skipped else bytes(line)
            yield _Damaged(f"the compressed stream is damaged here, the rest of the file is lost: "
                           f"{type(exc).__name__}: {exc}")
            return
        if not chunk:
            break
        start = 0
        while True:
            newline = chunk.find(b"\n", start)
            stop = len(chunk) if newline < 0 else newline
            if skipped or (max_bytes and len(line) + stop - start > max_bytes):
                skipped = (skipped or len(line)) + stop - start
                line.clear()
            elif newline >= 0 and not line:
                yield chunk[start:stop]  # the common case: a whole line inside one chunk
                start = newline + 1
                continue
            else:
                line += chunk[start:stop]
            if newline < 0:
                break
            yield _Skipped(skipped) if skipped else bytes(line)
            line.clear()
            skipped = 0
            start = newline + 1
    if skipped or line:
        yield _Skipped(skipped) if skipped else bytes(line)


def read_jsonl(
    paths: Iterable[str | Path], limits: Limits = DEFAULT_LIMITS, duplicates: list[Reject] | None = None
) -> tuple[list[Trajectory], list[Reject]]:
    """Read JSONL files (plain or gzip): the good trajectories (duplicates by id kept once) and every
    reject. The `duplicate` rejects go to `duplicates` when it is given, else nowhere."""
    good: list[Trajectory] = []
    rejects: list[Reject] = []
    first = Duplicates()
    for path in paths:
        with open(path, "rb") as fh:
            for item in iter_jsonl_stream(fh, str(path), limits, first):
                if isinstance(item, Trajectory):
                    good.append(item)
                elif item.code != DUPLICATE:
                    rejects.append(item)
                elif duplicates is not None:
                    duplicates.append(item)
    return good, rejects
