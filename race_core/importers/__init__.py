"""Agent logs -> the input contract (DESIGN §2): what `race import` writes and what the ingest stage
reads when its `format` is not `race`.

`import_stream(binary, source, format)` reads a file's records (`reader.RecordReader`: JSONL, one
JSON document, or a JSON array; plain or gzip), converts each with its format's module and
validates the result with `Trajectory.from_dict`, yielding a `Trajectory` per record that passes
and a `Reject` (file, line the record starts on, reason code, field, message) per record that
does not. One bad record never stops the others, and nothing is held but the record at hand.

What every record gets, whatever its format:
- success: the record's `successful` / `success` / `resolved` (true or false) or `reward` (>= 1 is
  success), else the format's own flag (SWE-agent: `info.exit_status` "submitted"); a record with
  none is skipped (`no_success_flag`) unless `assume_successful`, which takes it as successful and
  is counted (`ImportStats.assumed_successful`) so the caller can warn. A flag that says failure
  always skips (`not_successful`).
- `environment` / `source_revision`: the record's own, else the options', else the format's name
  and "unknown". `split` is the record's if it has one (anything but "train" is refused).
- `extra`: `source_format`, `source_file`, `source_line`, the format's identifiers (SWE-agent's
  instance id) and every record key the format did not read (a key named like a contract field,
  `id` included, is kept as `source_<key>`). Tool call ids stay on their calls (`{"id": ...}`).
"""

from __future__ import annotations

from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from race_core.importers import openai, react, sharegpt, swe_agent
from race_core.importers.common import (
    NO_SUCCESS_FLAG,
    REWARD_KEY,
    SUCCESS_KEYS,
    Conversation,
    SkipRecord,
    success_flag,
)
from race_core.importers.reader import RecordReader
from race_core.schema import (
    DEFAULT_LIMITS,
    KNOWN_FIELDS,
    NOT_OBJECT,
    NOT_SUCCESSFUL,
    UNREADABLE,
    ByteStream,
    Limits,
    Reject,
    SchemaError,
    Trajectory,
    _describe,
)

RACE = "race"  # the contract itself: read as it is, nothing to import
DEFAULT_SOURCE_REVISION = "unknown"


def _no_flag(record: dict[str, Any]) -> None:
    return None


@dataclass(frozen=True)
class Format:
    name: str
    convert: Callable[[dict[str, Any], str], Conversation]
    success: Callable[[dict[str, Any]], tuple[bool, str, Any] | None] = _no_flag


FORMATS = {f.name: f for f in (Format(openai.NAME, openai.convert), Format(sharegpt.NAME, sharegpt.convert),
                               Format(swe_agent.NAME, swe_agent.convert, swe_agent.success),
                               Format(react.NAME, react.convert))}
INPUT_FORMATS = (RACE, *FORMATS)  # what the ingest stage reads


@dataclass(frozen=True)
class ImportOptions:
    """What a record that does not say takes (see the module docstring)."""

    environment: str = ""  # "" : the format's name
    source_revision: str = ""  # "" : DEFAULT_SOURCE_REVISION
    assume_successful: bool = False


@dataclass
class ImportStats:
    """Counts of one import, for its summary."""

    imported: int = 0
    skipped: Counter = field(default_factory=Counter)  # reason code -> records
    assumed_successful: int = 0  # records without a success flag taken as successful

    def add(self, item: Trajectory | Reject) -> None:
        if isinstance(item, Reject):
            self.skipped[item.code] += 1
        else:
            self.imported += 1


def format_named(name: str) -> Format:
    """The importer of `name`; an unknown name is an error listing the formats."""
    try:
        return FORMATS[name]
    except KeyError:
        raise ValueError(f"unknown format {name!r}: expected one of {list(FORMATS)}") from None


def import_stream(binary: ByteStream, source: str, format: str, options: ImportOptions = ImportOptions(),
                  limits: Limits = DEFAULT_LIMITS, stats: ImportStats | None = None
                  ) -> Iterator[Trajectory | Reject]:
    """The trajectories of one file in `format`, and a Reject for every record skipped, in file order.
    `limits.max_line_bytes` bounds one record; the other limits apply to the converted trajectory."""
    spec = format_named(format)
    stats = stats if stats is not None else ImportStats()
    for item in RecordReader(binary, source, limits.max_line_bytes).records():
        if not isinstance(item, Reject):
            item = _trajectory(spec, *item, source, options, limits, stats)
        stats.add(item)
        yield item


def _trajectory(spec: Format, line: int, record: Any, source: str, options: ImportOptions, limits: Limits,
                stats: ImportStats) -> Trajectory | Reject:
    try:
        return Trajectory.from_dict(contract_record(spec, record, source, line, options, stats), limits)
    except (SkipRecord, SchemaError) as exc:
        return Reject(source, line, exc.code, exc.field, exc.message + _record_id(record))
    except Exception as exc:  # noqa: BLE001 - whatever a record makes Python raise is that record's reject
        return Reject(source, line, UNREADABLE, "<record>", _describe(exc) + _record_id(record))


def contract_record(spec: Format, record: Any, source: str, line: int, options: ImportOptions = ImportOptions(),
                    stats: ImportStats | None = None) -> dict[str, Any]:
    """One source record as a contract record (DESIGN §2), not yet validated; raises `SkipRecord`."""
    if not isinstance(record, dict):
        raise SkipRecord(NOT_OBJECT, "<record>", f"expected a JSON object, got {type(record).__name__}")
    verdict = success_flag(record) or spec.success(record)
    if verdict is None and not options.assume_successful:
        raise SkipRecord(NO_SUCCESS_FLAG, "<record>", f"no success flag ({', '.join(SUCCESS_KEYS)} or "
                                                      f"{REWARD_KEY}); pass --assume-successful if every record "
                                                      f"of this input succeeded")
    if verdict is not None and not verdict[0]:
        raise SkipRecord(NOT_SUCCESSFUL, verdict[1], f"the record did not succeed: {verdict[1]} is {verdict[2]!r}")
    if verdict is None and stats is not None:
        stats.assumed_successful += 1
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
    read = {*conversation.consumed, "environment", "source_revision", "split", *SUCCESS_KEYS, REWARD_KEY}
    for key, value in record.items():
        if key not in read:
            extra["source_" + key if key in KNOWN_FIELDS or key in extra else key] = value
    return {**out, **extra}


def _given(record: dict[str, Any], key: str, default: str) -> Any:
    value = record.get(key)
    return default if value is None else value


def _record_id(record: Any) -> str:
    """` (record id 'x')` when the source record has an id, to find it by."""
    value = record.get("id") if isinstance(record, dict) else None
    return f" (record id {value!r})" if isinstance(value, (str, int)) and not isinstance(value, bool) else ""


__all__ = ["FORMATS", "INPUT_FORMATS", "RACE", "Format", "ImportOptions", "ImportStats", "contract_record",
           "format_named", "import_stream"]
