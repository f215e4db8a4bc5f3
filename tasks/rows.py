"""Reading rows [start, stop) of a Parquet object of the store by range: only the footer and the row
groups that hold them, so a worker reads O(its rows) of a dataset, not all of it."""

from __future__ import annotations

import io
from typing import Any

from storage import ArtifactStore


class _Counted(io.RawIOBase):
    """A readable file that counts the bytes read through it."""

    def __init__(self, fh: Any):
        self._fh, self.bytes = fh, 0

    def readable(self) -> bool:
        return True

    def seekable(self) -> bool:
        return True

    def seek(self, offset: int, whence: int = 0) -> int:
        return self._fh.seek(offset, whence)

    def tell(self) -> int:
        return self._fh.tell()

    def read(self, size: int = -1) -> bytes:
        data = self._fh.read(size)
        self.bytes += len(data)
        return data

    def readinto(self, buffer: Any) -> int:
        data = self.read(len(buffer))
        buffer[:len(data)] = data
        return len(data)


def read_rows(store: ArtifactStore, digest: str, start: int, stop: int) -> tuple[list[dict[str, Any]], int]:
    """Rows [start, stop) of the Parquet object `digest`, reading only its footer and the row groups
    that hold them (ranged reads, no read-ahead); returns (rows, bytes read from the store). The rows
    are not verified against the object's digest here: the caller checks them (`read_shard`)."""
    import pyarrow.parquet as pq

    with store.fs.open(store.object_path(digest), "rb", cache_type="none") as raw:
        counted = _Counted(raw)
        metadata = _footer(counted, raw.seek(0, io.SEEK_END))
        parquet = pq.ParquetFile(counted, metadata=metadata)
        groups, first, at = [], None, 0
        for group in range(metadata.num_row_groups):
            rows = metadata.row_group(group).num_rows
            if at < stop and at + rows > start:
                groups.append(group)
                first = at if first is None else first
            at += rows
        if not groups:
            return [], counted.bytes
        table = parquet.read_row_groups(groups)
        return table.slice(start - first, stop - start).to_pylist(), counted.bytes


def _footer(counted: _Counted, size: int):
    """The file's Parquet metadata, read from its end alone (the reader's own first look would take
    the last 64 KiB, a small dataset's whole file)."""
    import pyarrow.parquet as pq

    if size < 12:
        raise ValueError(f"a Parquet file of {size} bytes is too short")
    counted.seek(size - 8)
    tail = counted.read(8)
    length = int.from_bytes(tail[:4], "little")
    if tail[4:] != b"PAR1" or length > size - 12:
        raise ValueError("not a Parquet file: no footer at its end")
    counted.seek(size - 8 - length)
    return pq.read_metadata(io.BytesIO(b"PAR1" + counted.read(length) + tail))
