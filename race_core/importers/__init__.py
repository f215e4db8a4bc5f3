"""Agent logs -> the input contract (docs/architecture.md §2): what `race import` writes and what the ingest stage
reads when its `format` is not `race`.

`import_stream(binary, source, format)` reads a file's records (`reader.RecordReader`: JSONL, one
JSON document, or a JSON array; plain or gzip), converts each with its format's module and
validates the result with `Trajectory.from_dict`, yielding a `Trajectory` per record that passes
and a `Reject` (file, line the record starts on, reason code, field, message) per record that
does not. One bad record never stops the others, and nothing is held but the record at hand.
With a `schema.Duplicates`, a trajectory already read (in this file or another) is a `duplicate`
reject naming the first: every record read is written, skipped with a code, or a duplicate.

`format="auto"` picks the format per file: the first record a format recognises (each format
module's `matches`, tried in `FORMATS` order; a contract record is read as it is) decides the
file's format (`ImportStats.formats`); the records before it that none recognises are skipped
(`unknown_format`).

What every record gets, whatever its format:
- success: the record's `successful` / `success` / `resolved` (true or false) or `reward` (true /
  false, or a number: >= 1 is success), else the format's own flag (SWE-agent: `info.exit_status`
  "submitted"; a LangSmith run that raised: failure); a record with none is skipped
  (`no_success_flag`) unless `assume_successful`, which takes it as successful; the trajectories
  written that way are counted (`ImportStats.assumed_successful`) so the caller can warn. A flag
  that says failure always skips (`not_successful`).
- `environment` / `source_revision`: the record's own, else the options', else the format's name
  and "unknown". `split` is the record's if it has one (anything but "train" is refused).
- `extra`: `source_format`, `source_file`, `source_line`, what the format keeps beyond the contract
  (SWE-agent's instance id, patch and model stats, ...) and every record key the format did not
  read (a key named like a contract field, `id` included, is kept as `source_<key>`). Tool call
  ids stay on their calls (`{"id": ...}`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from race_core.importers import langchain, openai, react, responses, sharegpt, swe_agent
from race_core.importers.common import (
    LEFT_OUT,
    NO_SUCCESS_FLAG,
    REWARD_KEY,
    SUCCESS_KEYS,
    UNKNOWN_FORMAT,
    Conversation,
    SkipRecord,
    normalised_calls,
    success_flag,
)
from race_core.importers.reader import RecordReader
from race_core.schema import (
    DEFAULT_LIMITS,
    DUPLICATE,
    KNOWN_FIELDS,
    MISSING_FIELD,
    NOT_OBJECT,
    NOT_SUCCESSFUL,
    UNREADABLE,
    ByteStream,
    Duplicates,
    Limits,
    Reject,
    SchemaError,
    Trajectory,
    _describe,
)

RACE = "race"  # the contract itself: read as it is, nothing to import
AUTO = "auto"  # the format of each file, picked from its records
DEFAULT_SOURCE_REVISION = "unknown"


def _no_flag(record: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class Format:
    name: str
    convert: Callable[[dict[str, Any], str], Conversation]
    matches: Callable[[dict[str, Any]], bool]  # whether a record looks like this format's (--format auto)
    success: Callable[[dict[str, Any]], tuple[bool, str, Any] | None] = _no_flag
    success_keys: str = ""  # what `success` reads, for the message of a record without a flag


# In the order --format auto tries them: the more specific shapes first.
FORMATS = {f.name: f for f in (
    Format(swe_agent.NAME, swe_agent.convert, swe_agent.matches, swe_agent.success, "info.exit_status"),
    Format(responses.NAME, responses.convert, responses.matches),
    Format(langchain.NAME, langchain.convert, langchain.matches, langchain.success, "a LangSmith run's error"),
    Format(sharegpt.NAME, sharegpt.convert, sharegpt.matches),
    Format(openai.NAME, openai.convert, openai.matches),
    Format(react.NAME, react.convert, react.matches),
)}
INPUT_FORMATS = (RACE, AUTO, *FORMATS)  # what the ingest stage reads


@dataclass(frozen=True)
class ImportOptions:
    """What a record that does not say takes (see the module docstring)."""

    environment: str = ""  # "" : the format's name
    source_revision: str = ""  # "" : DEFAULT_SOURCE_REVISION
    assume_successful: bool = False


@dataclass
class ImportStats:
    """Counts of one import, for its summary: every record read is imported, skipped or a duplicate."""

    imported: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason code -> records
    duplicates: int = 0  # records whose trajectory was read before: merged into the first
    assumed_successful: int = 0  # trajectories imported without a success flag, taken as successful
    left_out_steps: int = 0  # steps of a run's other record that the one followed leaves out (extra.left_out_steps)
    left_out_trajectories: int = 0  # trajectories with such steps
    formats: dict[str, str] = field(default_factory=dict)  # file -> the format --format auto picked for it

    @property
    def read(self) -> int:
        return self.imported + sum(self.skipped.values()) + self.duplicates

    def add(self, item: Trajectory | Reject, assumed: bool = False) -> None:
        if isinstance(item, Trajectory):
            self.imported += 1
            self.assumed_successful += assumed
            left_out = len(item.extra.get(LEFT_OUT) or ())
            self.left_out_steps += left_out
            self.left_out_trajectories += left_out > 0
        elif item.code == DUPLICATE:
            self.duplicates += 1
        else:
            self.skipped[item.code] += 1


def left_out_text(stats: ImportStats) -> str:
    """The summary line of the steps left out (`ImportStats.left_out_steps`)."""
    return (f"{stats.left_out_steps} step(s) of {stats.left_out_trajectories} trajectories left out: the run's "
            "other record has them, the history the model saw does not (kept in extra.left_out_steps)")


def format_named(name: str) -> Format:
    """The importer of `name`; an unknown name is an error listing the formats."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}: expected one of {list(FORMATS)}") from None


def detect(record: Any) -> str | None:
    """The format a record looks like (`RACE` for a contract record), or None."""
    if not isinstance(record, dict):
        return None
    if "turns" in record and "question" in record:
        return RACE
    return next((name for name, spec in FORMATS.items() if spec.matches(record)), None)


def import_stream(binary: ByteStream, source: str, format: str, options: ImportOptions = ImportOptions(),
                  limits: Limits = DEFAULT_LIMITS, stats: ImportStats | None = None,
                  duplicates: Duplicates | None = None) -> Iterator[Trajectory | Reject]:
    """The trajectories of one file in `format` (or `AUTO`), and a Reject for every record skipped
    (or, with `duplicates`, read before), in file order. `limits.max_line_bytes` bounds one record;
    the other limits apply to the converted trajectory."""
    spec: Format | str | None = format_named(format) if format != AUTO else None
    stats = stats if stats is not None else ImportStats()
    for item in RecordReader(binary, source, limits.max_line_bytes).records():
        assumed = False
        if not isinstance(item, Reject):
            line, record = item
            if spec is None:
                picked = detect(record)
                spec = (picked if picked == RACE else FORMATS[picked]) if picked else None
                if picked:
                    stats.formats[source] = picked
            if spec is None:
                item = Reject(source, line, UNKNOWN_FORMAT if isinstance(record, dict) else NOT_OBJECT, "<record>",
                              _unknown(record))
            else:
                item, assumed = _trajectory(spec, line, record, source, options, limits)
                if duplicates is not None:
                    item = duplicates.check(item, source, line)
        stats.add(item, assumed)
        yield item


def _unknown(record: Any) -> str:
    if not isinstance(record, dict):
        return f"expected a JSON object, got {type(record).__name__}"
    return (f"no format recognises a record with the keys {sorted(record)[:12]}: expected `turns` (the contract), "
            f"`trajectory` + `history` (swe-agent), `input` / `output` items (responses), LangChain messages or a "
            f"LangSmith run (langchain), `conversations` (sharegpt), `messages` (openai), or ReAct text under "
            f"{list(react.TEXT_KEYS)} / `instruction` (react); pass --format")


def _trajectory(spec: Format | str, line: int, record: Any, source: str, options: ImportOptions, limits: Limits
                ) -> tuple[Trajectory | Reject, bool]:
    """(the record's Trajectory or Reject, whether it was taken as successful without a flag)."""
    try:
        if spec == RACE:
            return Trajectory.from_dict(record, limits), False
        contract, assumed = contract_record(spec, record, source, line, options)
        return Trajectory.from_dict(contract, limits), assumed
    except (SkipRecord, SchemaError) as exc:
        message = exc.message + _hint(spec, exc, record) + _record_id(record)
        return Reject(source, line, exc.code, exc.field, message), False
    except Exception as exc:  # noqa: BLE001 - whatever a record makes Python raise is that record's reject
        return Reject(source, line, UNREADABLE, "<record>", _describe(exc) + _record_id(record)), False


def contract_record(spec: Format, record: Any, source: str, line: int, options: ImportOptions = ImportOptions()
                    ) -> tuple[dict[str, Any], bool]:
    """One source record as a contract record (docs/architecture.md §2), not yet validated, and whether it was
    taken as successful for want of a flag (`options.assume_successful`); raises `SkipRecord`."""
    if not isinstance(record, dict):
        raise SkipRecord(NOT_OBJECT, "<record>", f"expected a JSON object, got {type(record).__name__}")
    verdict = success_flag(record) or spec.success(record)
    if verdict is None and not options.assume_successful:
        looked = ", ".join((*SUCCESS_KEYS, REWARD_KEY, *([spec.success_keys] if spec.success_keys else ())))
        raise SkipRecord(NO_SUCCESS_FLAG, "<record>", f"no success flag (looked for {looked}); pass "
                                                      f"--assume-successful if every record of this input succeeded")
    if verdict is not None and not verdict[0]:
        raise SkipRecord(NOT_SUCCESSFUL, verdict[1], f"the record did not succeed: {verdict[1]} is {verdict[2]!r}")
    with normalised_calls() as normalised:
        conversation = spec.convert(record, source)
    out: dict[str, Any] = {
        "question": conversation.question,
        "environment": _given(record, "environment", options.environment or spec.name),
        "source_revision": _given(record, "source_revision", options.source_revision or DEFAULT_SOURCE_REVISION),
        "split": record.get("split", "train"),
        "successful": True,
        "turns": conversation.turns,
    }
    if conversation.system:
        out["system"] = conversation.system
    if conversation.tools:
        out["tools"] = conversation.tools
    extra = {"source_format": spec.name, "source_file": source, "source_line": line, **conversation.extra}
    if normalised:  # calls read as Python literals: their text as the source wrote it
        extra["tool_call_text"] = normalised
    if conversation.left_out:
        extra[LEFT_OUT] = conversation.left_out
    read = {*conversation.consumed, "environment", "source_revision", "split", *SUCCESS_KEYS, REWARD_KEY}
    for key, value in record.items():
        if key not in read:
            extra["source_" + key if key in KNOWN_FIELDS or key in extra else key] = value
    return {**out, **extra}, verdict is None


def _given(record: dict[str, Any], key: str, default: str) -> Any:
    value = record.get(key)
    return default if value is None else value


def _hint(spec: Format | str, exc: SkipRecord | SchemaError, record: Any) -> str:
    """For a field the format missed, the format the record looks like (` (this record looks like ...)`)."""
    name = spec if isinstance(spec, str) else spec.name
    looks = detect(record) if exc.code == MISSING_FIELD else None
    return f" (this record looks like {looks}: --format {looks}, or --format auto)" if looks not in (None, name) else ""


def _record_id(record: Any) -> str:
    """` (record id 'x')` when the source record has an id, to find it by."""
    value = record.get("id") if isinstance(record, dict) else None
    return f" (record id {value!r})" if isinstance(value, (str, int)) and not isinstance(value, bool) else ""


__all__ = ["AUTO", "FORMATS", "INPUT_FORMATS", "RACE", "Format", "ImportOptions", "ImportStats", "contract_record",
           "detect", "format_named", "import_stream"]
