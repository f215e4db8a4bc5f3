"""Records out of whatever agent frameworks write: JSONL, one JSON document per file (a SWE-agent
`.traj`, pretty-printed or not), or a JSON array of records (LLaMA-Factory datasets), plain or gzip.

One rule covers them all: the file is a sequence of JSON values; each value is a record, except a
top-level array, whose elements are the records. The values are parsed one at a time from a
buffer that holds at most one record and a chunk (a 10 GB array is read in constant memory), and
each record is numbered by the line it starts on. A value that is not JSON, or longer than the
limit, is a reject; reading goes on at the next line that does not start with whitespace or a
closing bracket (the next JSONL line; inside a pretty-printed document nested lines are indented,
so nothing in between is taken for a record). Inside a top-level array there is no such line: a bad element ends the array.
"""

from __future__ import annotations

import codecs
import json
import re
from collections.abc import Iterator
from typing import Any

from race_core.schema import (
    _DAMAGED_STREAM,
    LINE_TOO_LONG,
    NOT_JSON,
    READ_CHUNK_BYTES,
    UNREADABLE,
    ByteStream,
    Reject,
    _decompressed,
)

_WHITESPACE = re.compile(r"[ \t\r\n]*")
_NEXT_RECORD = re.compile(r"\n(?=[^\s\]},:])")  # a line that may start a top-level value
_DECODER = json.JSONDecoder()
_LONGEST_TOKEN = 16  # longer than any literal (-Infinity) or escape (a surrogate pair, 12)


class _Failed(Exception):
    """The value at the reader's position cannot be read: `.code` and `.message` say why."""

    def __init__(self, code: str, message: str):
        super().__init__(message)
        self.code, self.message = code, message


class RecordReader:
    """`records()` yields `(line, value)` for each record of a byte stream, or a `Reject`; it never
    raises on bad data. `max_chars` (0: no limit) bounds one record, in characters."""

    def __init__(self, binary: ByteStream, source: str, max_chars: int = 0):
        stream = _decompressed(binary)
        self._read = getattr(stream, "read1", stream.read)
        self._decode = codecs.getincrementaldecoder("utf-8")(errors="surrogateescape").decode
        self.source, self.max_chars = source, max_chars
        self._buf, self._pos, self._line = "", 0, 1  # the line number at _pos
        self._eof, self._damage, self._started = False, "", False

    def records(self) -> Iterator[tuple[int, Any] | Reject]:
        while self._skip_space():
            if self._buf[self._pos] == "[":
                yield from self._array()
            else:
                line = self._line
                try:
                    yield line, self._value()
                except _Failed as exc:
                    yield Reject(self.source, line, exc.code, "<record>", exc.message)
                    self._resync()
        if self._damage:
            yield Reject(self.source, self._line, UNREADABLE, "<file>", self._damage)

    def _array(self) -> Iterator[tuple[int, Any] | Reject]:
        start = self._line
        self._advance(self._pos + 1)
        first = True
        while True:
            if not self._skip_space():
                yield Reject(self.source, start, NOT_JSON, "<record>",
                             f"the JSON array that starts on line {start} is never closed")
                return
            if self._buf[self._pos] == "]":
                self._advance(self._pos + 1)
                return
            if not first:
                if self._buf[self._pos] != ",":
                    yield Reject(self.source, self._line, NOT_JSON, "<record>",
                                 "expected ',' or ']' between the array's records; the rest of the array is lost")
                    self._resync()
                    return
                self._advance(self._pos + 1)
                if not self._skip_space():
                    continue
            first = False
            line = self._line
            try:
                yield line, self._value()
            except _Failed as exc:
                yield Reject(self.source, line, exc.code, "<record>", f"{exc.message}; the rest of the array is lost")
                self._resync()
                return

    def _value(self) -> Any:
        """Parse the value at the position and move past it, reading more while it may be incomplete."""
        while True:
            try:
                value, end = _DECODER.raw_decode(self._buf, self._pos)
            except json.JSONDecodeError as exc:
                if self._incomplete(exc) and self._more():
                    continue
                line = self._line + self._buf.count("\n", self._pos, exc.pos)
                raise _Failed(NOT_JSON, f"not valid JSON: {exc.msg} (line {line})") from None
            except RecursionError:
                raise _Failed(UNREADABLE, "JSON nested too deeply to read (RecursionError)") from None
            except ValueError as exc:  # e.g. an integer of more digits than Python converts
                raise _Failed(UNREADABLE, f"{type(exc).__name__}: {str(exc)[:200]}") from None
            if end == len(self._buf) and self._more():
                continue  # `12` may be the start of `123`
            if self.max_chars and end - self._pos > self.max_chars:
                raise _Failed(LINE_TOO_LONG, self._too_long(end - self._pos))
            self._advance(end)
            return value

    def _incomplete(self, exc: json.JSONDecodeError) -> bool:
        """Whether the error may be only the buffer's end cutting a token (`tr` of `true`, half of a
        `\\uXXXX` escape): more input could still complete the value. A string cannot hold a raw
        newline, so an unterminated string always runs to the buffer's end."""
        rest = self._buf[exc.pos:].strip()
        return exc.msg.startswith("Unterminated string") or (len(rest) < _LONGEST_TOKEN and "\n" not in rest)

    def _more(self) -> bool:
        """Read another chunk into the buffer (at least as much as the value holds so far, so a large
        value is parsed a logarithmic number of times); False at the end of the input. Over the
        limit, the value is refused unread."""
        if self._eof:
            return False
        held = len(self._buf) - self._pos
        if self.max_chars and held > self.max_chars:
            raise _Failed(LINE_TOO_LONG, self._too_long(held, at_least=True))
        return self._fill(max(READ_CHUNK_BYTES, held))

    def _fill(self, size: int = 0) -> bool:
        try:
            chunk = self._read(size or READ_CHUNK_BYTES)
        except _DAMAGED_STREAM as exc:
            self._damage = (f"the compressed stream is damaged here, the rest of the file is lost: "
                            f"{type(exc).__name__}: {exc}")
            chunk = b""
        text = self._decode(chunk, final=not chunk)
        if not self._started and text:
            text, self._started = text.removeprefix("\ufeff"), True
        if self._pos > len(self._buf) // 2:  # keep the buffer to one value plus a chunk
            self._buf, self._pos = self._buf[self._pos:], 0
        self._buf += text
        self._eof = not chunk
        return bool(chunk) or bool(text)

    def _skip_space(self) -> bool:
        """Move past whitespace; False at the end of the input."""
        while True:
            self._advance(_WHITESPACE.match(self._buf, self._pos).end())
            if self._pos < len(self._buf):
                return True
            if self._eof or not self._fill():
                return False

    def _advance(self, to: int) -> None:
        self._line += self._buf.count("\n", self._pos, to)
        self._pos = to

    def _resync(self) -> None:
        """Skip to the next line that may start a value (see the module docstring), holding no more
        than a chunk."""
        while True:
            found = _NEXT_RECORD.search(self._buf, self._pos)
            if found:
                self._advance(found.end())
                return
            self._advance(max(self._pos, len(self._buf) - 1))  # a newline at the end may start the match
            if self._eof or not self._fill():
                self._advance(len(self._buf))
                return

    def _too_long(self, size: int, at_least: bool = False) -> str:
        more = "over " if at_least else ""
        return (f"the record takes {more}{size} characters, over the limit of {self.max_chars} "
                f"(max_line_bytes); it is skipped")
