"""Content-addressed artifact store over any fsspec filesystem (docs/architecture.md §7).

Layout under the root (a local folder or an fsspec URL such as `memory://x`, `s3://bucket/prefix`):

    objects/<aa>/<sha256>        immutable bytes, named by their sha256 (aa = first two hex chars)
    stages/<stage>/<key>.json    manifests: the commit point of a stage, written last
    catalog/...                  catalog entries (storage.catalog), JSON records like manifests
    quarantine/<sha256>          objects a read found corrupt, moved aside (removed by `gc`)

Manifest convention: a manifest references objects through its `objects` key, a dict
name -> digest (a value may also be a list of digests). `gc` keeps exactly the objects reachable
from those references in every JSON record under `stages/` and `catalog/`, following tree objects.

A tree object stores a folder: canonical JSON `{"_tree": "race.tree/v1", "files": {relpath: digest}}`
(paths in POSIX form). Its digest is the folder's digest.

Atomicity. Local root: every file is written to a temporary name in the same directory, flushed,
fsynced, then `os.replace`d to its final name, so no partially written file is ever visible under
a final name. Other filesystems: bytes are written with one whole-object `pipe_file` (and files with
`put_file`, multipart for large files on S3); object stores make an object visible only once its
upload completes, so the same holds there. (A non-object remote filesystem without atomic uploads,
e.g. SFTP, does not get this guarantee.)

Create-if-absent (`write_record(..., overwrite=False)`, the catalog's appends): locally the temp
file is hard-linked to its final name (`os.link` fails if the name exists: atomic, and the file is
complete when it appears); on S3 a conditional PUT (`If-None-Match: *`, s3fs `mode="create"`;
an S3-compatible server that ignores the header silently overwrites). Other fsspec filesystems get
their `mode="create"`, for most an exists-then-write, atomic only within one process (memory://).
A lost race is a `FileExistsError`, never an overwrite.

Damage. A manifest records each object's size (`object_sizes`, trees followed). `manifest_damage`
checks existence and size, one stat per object, before a stage reuses its output; a read verifies
the digest, and a corrupt object is moved to `quarantine/<digest>` so that the next hit check finds
it missing and the stage that produced it is recomputed.

Garbage: `gc` (`storage.gc`) takes nothing younger than a grace period, measured on the store's
own clock; reusing an existing object refreshes its age.

Faults of the filesystem under the store (a full disk, a read-only filesystem, a folder this user
may not write, an object store that keeps answering 5xx or throttling) surface as one
`StoreIOError`: one line naming the path or URL, the cause and what to do. A write that fails
leaves nothing under a final name (the temp file is removed), and no manifest is written after a
failed object, so the stage did not commit and a rerun once the cause is gone computes it whole.
S3 requests are retried by botocore's standard retry mode (exponential backoff with jitter, each
wait at most 20 s), `S3_MAX_ATTEMPTS` tries in all unless the storage options say otherwise.
"""

from __future__ import annotations

import errno
import hashlib
import json
import os
import re
import shutil
import uuid
from collections.abc import Iterable, Iterator
from contextlib import contextmanager
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

import fsspec
from fsspec.implementations.local import LocalFileSystem

from race_core.schema import canonical_json

CHUNK = 1 << 20
TREE_FORMAT = "race.tree/v1"
_TREE_PREFIX = b'{"_tree":'
_DIGEST = re.compile(r"^[0-9a-f]{64}$")
_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.\-]*$")
REFERENCE_ROOTS = ("stages", "catalog")
QUARANTINE = "quarantine"
TEMP_PREFIX = ".tmp-"
DEFAULT_GRACE_HOURS = 6.0
S3_MAX_ATTEMPTS = int(os.environ.get("RACE_S3_MAX_ATTEMPTS", "5"))  # every S3 request, first try included
# multipart part size of S3 uploads (s3fs's default, 50 MiB, unless set; S3's minimum is 5 MiB)
S3_PART_BYTES = int(os.environ.get("RACE_S3_PART_BYTES", "0")) or None


class CorruptObjectError(IOError):
    """An object whose bytes no longer hash to its name (it is moved to quarantine when found)."""

    def __init__(self, digest: str, actual: str, not_moved: str | None = None):
        where = (f"it could not be moved to {QUARANTINE}/ ({not_moved}): remove it by hand, and" if not_moved
                 else f"it was moved to {QUARANTINE}/{digest}, and")
        super().__init__(f"object {digest} is corrupt (its bytes hash to {actual}); {where} the next run "
                         f"recomputes the stage that produced it")
        self.digest = digest
        self.actual = actual


class MissingObjectError(FileNotFoundError):
    """A digest that the store does not hold."""

    def __init__(self, digest: str):
        super().__init__(f"object {digest} is not in the store; the next run recomputes the stage that "
                         f"produces it")
        self.digest = digest


_WHAT_TO_DO = {
    errno.ENOSPC: "free space on it and run again",
    errno.EDQUOT: "free space (or raise the quota) and run again",
    errno.EROFS: "the filesystem is mounted read-only: remount it read-write or use another store",
    errno.EACCES: "this user lacks the permission: fix its permissions or use another store",
    errno.EPERM: "this user lacks the permission: fix its permissions or use another store",
}


class StoreIOError(OSError):
    """A read or write that the store's filesystem refused or kept failing (module doc: Faults)."""

    def __init__(self, action: str, where: str, cause: str, advice: str, code: int | None = None):
        super().__init__(code or errno.EIO, f"cannot {action} {where}: {cause}; {advice}")
        self.where, self.cause = where, cause
        # a full disk, a read-only filesystem, a missing permission: a retry seconds later fails the same way
        self.lasting = code in _WHAT_TO_DO

    def __str__(self) -> str:
        return self.strerror or ""

    @classmethod
    def of(cls, exc: BaseException, action: str, where: str) -> StoreIOError:
        """The one-line error for `exc`, raised while trying to `action` `where`."""
        if isinstance(exc, StoreIOError):
            return exc
        code = getattr(exc, "errno", None)
        remote = _remote_cause(exc)
        if remote is not None:
            cause, advice = remote, "the store kept failing: run again when it answers"
        elif isinstance(code, int) and code in errno.errorcode:
            cause = f"{os.strerror(code)} ({errno.errorcode[code]})"
            advice = _WHAT_TO_DO.get(code, "fix the store and run again")
        else:
            cause, advice = f"{type(exc).__name__}: {exc}", "fix the store and run again"
        if action == "write":  # the write was atomic and the stage's manifest comes after its objects
            advice = f"nothing was committed: {advice}"
        return cls(action, where, " ".join(cause.split()), advice, code if isinstance(code, int) else None)


def _remote_cause(exc: BaseException) -> str | None:
    """What an object store answered (status, error code, message, tries), from the botocore error
    behind s3fs's translation; None for an error that is not a remote answer."""
    for link in (exc, exc.__cause__, exc.__context__):
        response = getattr(link, "response", None)
        if isinstance(response, dict) and "Error" in response:
            error, meta = response.get("Error", {}), response.get("ResponseMetadata", {})
            status = meta.get("HTTPStatusCode", "?")
            tries = meta.get("RetryAttempts", 0) + 1
            return (f"HTTP {status} {error.get('Code', '')}: {error.get('Message', '')} "
                    f"({tries} tr{'y' if tries == 1 else 'ies'})")
    name = type(exc).__name__
    if name in ("EndpointConnectionError", "ConnectTimeoutError", "ReadTimeoutError", "ConnectionClosedError"):
        return f"{name}: {exc}"
    return None


def sha256_bytes(data: bytes) -> str:
    """Hex sha256 of `data`."""
    return hashlib.sha256(data).hexdigest()


def sha256_file(path: str | os.PathLike[str]) -> str:
    """Hex sha256 of a local file, read in chunks (memory stays flat)."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        for chunk in iter(lambda: fh.read(CHUNK), b""):
            h.update(chunk)
    return h.hexdigest()


def code_version() -> str:
    """The installed race-pipeline version (recorded in manifests), or "unknown"."""
    try:
        from importlib.metadata import version

        return version("race-pipeline")
    except Exception:
        return "unknown"


def check_digest(digest: str) -> str:
    """Return `digest` if it is a sha256 hex string, else raise ValueError."""
    if not isinstance(digest, str) or not _DIGEST.match(digest):
        raise ValueError(f"not a sha256 hex digest: {digest!r}")
    return digest


def _check_name(kind: str, name: str) -> str:
    if not isinstance(name, str) or not _NAME.match(name):
        raise ValueError(f"bad {kind} name {name!r}: use letters, digits, '_', '-', '.'")
    return name


class ArtifactStore:
    """Content-addressed objects plus stage manifests under one root (local path or fsspec URL)."""

    def __init__(self, root: str | os.PathLike[str], storage_options: dict[str, Any] | None = None):
        self.url = str(root)
        self.fs, path = fsspec.core.url_to_fs(self.url, **_with_retries(self.url, storage_options or {}))
        self._upload_options: dict[str, Any] = {}
        if "s3" in _protocols(self.fs):
            self.fs.retries = 1  # s3fs's own loop would multiply botocore's tries (module doc)
            if S3_PART_BYTES:
                self._upload_options["chunksize"] = S3_PART_BYTES
        self.local = isinstance(self.fs, LocalFileSystem)
        self.root = (os.path.abspath(path) if self.local else path).rstrip("/")
        if self.local:
            try:
                os.makedirs(self.root, exist_ok=True)
            except OSError as exc:
                raise StoreIOError.of(exc, "create the store folder", self.root) from None

    def __repr__(self) -> str:
        return f"ArtifactStore({self.url!r})"

    # -- paths --------------------------------------------------------------------------------
    def _path(self, *parts: str) -> str:
        return "/".join([self.root, *parts])

    def _where(self, path: str) -> str:
        """`path` as the user names it: a local path, or the URL with its protocol."""
        if self.local:
            return path
        return f"{_protocols(self.fs)[0]}://{path}"

    def object_path(self, digest: str) -> str:
        """Where the object lives in the store's filesystem (for diagnostics and tests)."""
        check_digest(digest)
        return self._path("objects", digest[:2], digest)

    def manifest_path(self, stage: str, key: str) -> str:
        """Where the manifest of (stage, key) lives."""
        return self._path("stages", _check_name("stage", stage), _check_name("key", key) + ".json")

    # -- low-level atomic writes ---------------------------------------------------------------
    @contextmanager
    def _faults(self, action: str, path: str) -> Iterator[None]:
        """Turn what the filesystem raises while we `action` `path` into a `StoreIOError`; a missing
        file, a lost create race and the store's own errors pass as they are."""
        try:
            yield
        except (FileNotFoundError, FileExistsError, StoreIOError, CorruptObjectError):
            raise
        except Exception as exc:  # noqa: BLE001 - OSError, or what a remote filesystem's client raises
            if not isinstance(exc, OSError) and _remote_cause(exc) is None:
                raise
            raise StoreIOError.of(exc, action, self._where(path)) from None

    def _write_bytes_atomic(self, path: str, data: bytes, create: bool = False) -> None:
        """Write `path` whole or not at all; with `create`, a `FileExistsError` if it exists."""
        with self._faults("write", path):
            self._write_bytes(path, data, create)

    def _write_bytes(self, path: str, data: bytes, create: bool) -> None:
        if self.local:
            directory = os.path.dirname(path)
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}-{os.path.basename(path)}")
            try:
                with open(tmp, "wb") as fh:
                    fh.write(data)
                    fh.flush()
                    os.fsync(fh.fileno())
                if create:
                    os.link(tmp, path)  # fails if `path` exists; the file is complete when it appears
                else:
                    os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        else:
            # one whole-object PUT: atomic on object stores; "create" is If-None-Match: * on S3
            self.fs.pipe_file(path, data, **({"mode": "create"} if create else {}))
            self.fs.invalidate_cache(path)

    def _write_file_atomic(self, path: str, source: str | os.PathLike[str]) -> None:
        with self._faults("write", path):
            self._write_file(path, source)

    def _write_file(self, path: str, source: str | os.PathLike[str]) -> None:
        if self.local:
            directory = os.path.dirname(path)
            os.makedirs(directory, exist_ok=True)
            tmp = os.path.join(directory, f"{TEMP_PREFIX}{uuid.uuid4().hex}-{os.path.basename(path)}")
            try:
                with open(source, "rb") as src, open(tmp, "wb") as dst:
                    shutil.copyfileobj(src, dst, CHUNK)
                    dst.flush()
                    os.fsync(dst.fileno())
                os.replace(tmp, path)
            finally:
                if os.path.exists(tmp):
                    os.unlink(tmp)
        else:
            self.fs.put_file(str(source), path, **self._upload_options)  # multipart: visible when complete
            self.fs.invalidate_cache(path)

    def _exists(self, path: str) -> bool:
        if self.local:
            return os.path.exists(path)
        with self._faults("read", path):
            self.fs.invalidate_cache(path)
            return self.fs.exists(path)

    # -- objects ------------------------------------------------------------------------------
    def has_object(self, digest: str) -> bool:
        """True if an object named `digest` exists (not verified; see `verify_object`)."""
        return self._exists(self.object_path(digest))

    def _hash_stored(self, digest: str) -> str:
        h = hashlib.sha256()
        with self._faults("read", self.object_path(digest)), self.fs.open(self.object_path(digest), "rb") as fh:
            for chunk in iter(lambda: fh.read(CHUNK), b""):
                h.update(chunk)
        return h.hexdigest()

    def verify_object(self, digest: str) -> bool:
        """True if the object exists and its bytes hash to its name."""
        return self.has_object(digest) and self._hash_stored(digest) == digest

    def _kept(self, digest: str) -> bool:
        """True if a good local copy of `digest` exists; its age is then refreshed, so that `gc` does
        not take an old unreferenced object that a running stage has just reused. Remote copies are
        always written again (the upload refreshes the age and costs what verifying would)."""
        if not (self.local and self.verify_object(digest)):
            return False
        try:
            os.utime(self.object_path(digest))
        except FileNotFoundError:  # a gc took it meanwhile: write it again
            return False
        except OSError:  # a store this user may not write (or read-only): the good copy is what counts
            pass
        return True

    def put_bytes(self, data: bytes) -> str:
        """Store `data`; return its sha256. An existing good copy is kept; a corrupt one is replaced."""
        digest = sha256_bytes(data)
        if not self._kept(digest):
            self._write_bytes_atomic(self.object_path(digest), bytes(data))
        return digest

    def put_file(self, path: str | os.PathLike[str]) -> str:
        """Store a local file (streamed, memory stays flat); return its sha256."""
        digest = sha256_file(path)
        if not self._kept(digest):
            self._write_file_atomic(self.object_path(digest), path)
        return digest

    def _object_size(self, digest: str) -> int | None:
        """The object's size in bytes, or None if it is missing (one stat, nothing read)."""
        path = self.object_path(digest)
        try:
            with self._faults("read", path):
                if self.local:
                    return os.path.getsize(path)
                self.fs.invalidate_cache(path)
                return int(self.fs.size(path))
        except FileNotFoundError:
            return None

    def _quarantine(self, digest: str, actual: str) -> CorruptObjectError:
        """Move a corrupt object out of `objects/` (so that it reads as missing) and return the error."""
        source, target = self.object_path(digest), self._path(QUARANTINE, digest)
        try:
            if self.local:
                os.makedirs(os.path.dirname(target), exist_ok=True)
                os.replace(source, target)
            else:
                self.fs.mv(source, target)
                self.fs.invalidate_cache()
        except FileNotFoundError:
            pass  # another reader moved it first
        except Exception as exc:  # noqa: BLE001 - a store we may not write: say so, the corruption first
            return CorruptObjectError(digest, actual, StoreIOError.of(exc, "move", self._where(source)).cause)
        return CorruptObjectError(digest, actual)

    def put_json(self, obj: Any) -> str:
        """Store the canonical JSON of `obj` as an object; return its digest."""
        return self.put_bytes(canonical_json(obj).encode("utf-8"))

    def get_bytes(self, digest: str) -> bytes:
        """The object's bytes, verified; `CorruptObjectError` names the digest on mismatch."""
        path = self.object_path(digest)
        if not self._exists(path):
            raise MissingObjectError(digest)
        with self._faults("read", path):
            data = self.fs.cat_file(path)
        actual = sha256_bytes(data)
        if actual != digest:
            raise self._quarantine(digest, actual)
        return data

    def get_json(self, digest: str) -> Any:
        """The object parsed as JSON (verified)."""
        return json.loads(self.get_bytes(digest).decode("utf-8"))

    def get_file(self, digest: str, dest: str | os.PathLike[str]) -> Path:
        """Copy the object to local `dest`, streamed and verified; `dest` appears only if it verifies."""
        path = self.object_path(digest)
        if not self._exists(path):
            raise MissingObjectError(digest)
        dest = Path(dest)
        dest.parent.mkdir(parents=True, exist_ok=True)
        tmp = dest.with_name(f"{TEMP_PREFIX}{uuid.uuid4().hex}-{dest.name}")
        h = hashlib.sha256()
        try:
            with self._faults("copy", f"{self._where(path)} to {tmp}"), self.fs.open(path, "rb") as src, \
                    open(tmp, "wb") as dst:
                for chunk in iter(lambda: src.read(CHUNK), b""):
                    h.update(chunk)
                    dst.write(chunk)
                dst.flush()
                os.fsync(dst.fileno())
            if h.hexdigest() != digest:
                raise self._quarantine(digest, h.hexdigest())
            os.replace(tmp, dest)
        finally:
            if tmp.exists():
                tmp.unlink()
        return dest

    def iter_objects(self) -> Iterator[str]:
        """Every object digest in the store (temporary files are never listed)."""
        base = self._path("objects")
        if not self._exists(base):
            return
        with self._faults("list", base):
            paths = self.fs.find(base)
        for path in paths:
            name = path.rstrip("/").rsplit("/", 1)[-1]
            if _DIGEST.match(name):
                yield name

    # -- folders (trees) -----------------------------------------------------------------------
    def put_folder(self, folder: str | os.PathLike[str]) -> str:
        """Store every file of a local folder plus a tree object; return the tree's digest."""
        folder = Path(folder)
        if not folder.is_dir():
            raise NotADirectoryError(f"not a folder: {folder}")
        files: dict[str, str] = {}
        for path in sorted(folder.rglob("*")):
            if path.is_symlink():
                raise ValueError(f"symlinks are not stored: {path}")
            if path.is_file():
                files[path.relative_to(folder).as_posix()] = self.put_file(path)
        return self.put_json({"_tree": TREE_FORMAT, "files": files})

    def read_tree(self, digest: str) -> dict[str, str]:
        """The relative path -> digest listing of a tree object."""
        tree = self.get_json(digest)
        if not isinstance(tree, dict) or tree.get("_tree") != TREE_FORMAT:
            raise ValueError(f"object {digest} is not a folder tree")
        return dict(tree["files"])

    def restore_folder(self, digest: str, dest: str | os.PathLike[str]) -> Path:
        """Materialize a tree under local `dest`. Idempotent: files that already verify are kept."""
        dest = Path(dest)
        dest.mkdir(parents=True, exist_ok=True)
        for rel, file_digest in self.read_tree(digest).items():
            target = dest / rel
            if rel.startswith("/") or ".." in Path(rel).parts:
                raise ValueError(f"tree {digest} holds an unsafe path {rel!r}")
            if target.is_file() and sha256_file(target) == file_digest:
                continue
            self.get_file(file_digest, target)
        return dest

    # -- records (manifests, catalog entries) --------------------------------------------------
    def write_record(self, relative_path: str, record: dict[str, Any], *, overwrite: bool = True) -> str:
        """Write a JSON record atomically at `root/relative_path`; return its full path.

        With `overwrite=False` the write is create-if-absent: if the record exists (or another
        writer creates it first) it raises `FileExistsError` and the existing record is kept.
        """
        path = self._path(*relative_path.strip("/").split("/"))
        data = json.dumps(record, sort_keys=True, indent=1, ensure_ascii=False).encode("utf-8")
        try:
            self._write_bytes_atomic(path, data, create=not overwrite)
        except FileExistsError:
            raise FileExistsError(f"record already exists: {path}") from None
        return path

    def read_record(self, relative_path: str) -> dict[str, Any] | None:
        """A JSON record, or None if there is none."""
        path = self._path(*relative_path.strip("/").split("/"))
        if not self._exists(path):
            return None
        return self._read_json(path)

    def _read_json(self, path: str) -> dict[str, Any]:
        with self._faults("read", path):
            data = self.fs.cat_file(path)
        try:
            return json.loads(data.decode("utf-8"))
        except ValueError as exc:
            raise ValueError(f"record {self._where(path)} is not readable JSON ({exc}); it was not written by "
                             f"this store (its writes are atomic): remove it and run again") from None

    def list_records(self, relative_dir: str) -> list[str]:
        """Names (not paths) of the JSON records directly under `relative_dir`, sorted."""
        base = self._path(*relative_dir.strip("/").split("/"))
        if not self._exists(base):
            return []
        with self._faults("list", base):
            names = [p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(base, detail=False)]
        return sorted(n for n in names if n.endswith(".json") and not n.startswith(TEMP_PREFIX))

    # -- manifests ----------------------------------------------------------------------------
    def write_manifest(self, stage: str, key: str, manifest: dict[str, Any]) -> dict[str, Any]:
        """Commit a stage: write its manifest (last, atomically); return what was written.

        Adds `stage`, `key`, `created_at` and `code_version` unless given, and `object_sizes`: the
        size of every object it reaches (trees followed), which `manifest_damage` checks. Every
        digest under `objects` must already be in the store: a manifest never points at missing bytes.
        """
        record = dict(manifest)
        record.setdefault("stage", stage)
        record.setdefault("key", key)
        record.setdefault("created_at", datetime.now(timezone.utc).isoformat())
        record.setdefault("code_version", code_version())
        sizes: dict[str, int] = {}
        for digest in sorted(self._reachable(_referenced(record))):
            size = self._object_size(digest)
            if size is None:
                raise MissingObjectError(digest)
            sizes[digest] = size
        record["object_sizes"] = sizes
        self.write_record(f"stages/{_check_name('stage', stage)}/{_check_name('key', key)}.json", record)
        return record

    def read_manifest(self, stage: str, key: str) -> dict[str, Any] | None:
        """The manifest of (stage, key), or None if the stage has not committed."""
        return self.read_record(f"stages/{_check_name('stage', stage)}/{_check_name('key', key)}.json")

    def manifest_damage(self, manifest: dict[str, Any]) -> str | None:
        """Why a committed manifest's output cannot be reused: an object missing or of another size
        than recorded (None: all there). One stat per object, no hashing: reads verify digests."""
        sizes = manifest.get("object_sizes")
        if not isinstance(sizes, dict):  # written before sizes were recorded: existence only
            sizes = dict.fromkeys(_referenced(manifest))
        for digest, size in sizes.items():
            actual = self._object_size(digest)
            if actual is None:
                return f"object {digest} is missing"
            if size is not None and actual != size:
                return f"object {digest} holds {actual} bytes, not the {size} recorded"
        return None

    def has(self, stage: str, key: str) -> bool:
        """True if (stage, key) has a manifest: the stage is done and is not run again."""
        return self._exists(self.manifest_path(stage, key))

    def list_stages(self) -> list[str]:
        """Stage names that have at least one manifest folder."""
        base = self._path("stages")
        if not self._exists(base):
            return []
        with self._faults("list", base):
            return sorted(p.rstrip("/").rsplit("/", 1)[-1] for p in self.fs.ls(base, detail=False))

    def list_manifests(self, stage: str) -> list[str]:
        """Keys of the committed manifests of `stage`."""
        return [n[: -len(".json")] for n in self.list_records(f"stages/{_check_name('stage', stage)}")]

    # -- garbage collection -------------------------------------------------------------------
    def referenced_objects(self) -> set[str]:
        """Digests reachable from every record under stages/ and catalog/ (trees followed)."""
        roots: set[str] = set()
        for top in REFERENCE_ROOTS:
            base = self._path(top)
            if not self._exists(base):
                continue
            with self._faults("list", base):
                paths = self.fs.find(base)
            for path in paths:
                if path.endswith(".json") and not path.rsplit("/", 1)[-1].startswith(TEMP_PREFIX):
                    roots.update(_referenced(self._read_json(path)))
        return self._reachable(roots)

    def _reachable(self, roots: Iterable[str]) -> set[str]:
        seen: set[str] = set()
        todo = list(roots)
        while todo:
            digest = todo.pop()
            if digest in seen:
                continue
            seen.add(digest)
            if self._is_tree(digest):
                todo.extend(self.read_tree(digest).values())
        return seen

    def _is_tree(self, digest: str) -> bool:
        if not self.has_object(digest):
            return False
        with self._faults("read", self.object_path(digest)), self.fs.open(self.object_path(digest), "rb") as fh:
            return fh.read(len(_TREE_PREFIX)) == _TREE_PREFIX

def _protocols(fs: Any) -> tuple[str, ...]:
    protocol = getattr(fs, "protocol", ())
    return (protocol,) if isinstance(protocol, str) else tuple(protocol)


def _with_retries(url: str, options: dict[str, Any]) -> dict[str, Any]:
    """`options` with botocore's standard retry mode (`S3_MAX_ATTEMPTS` tries) for an S3 URL, unless
    the options choose their own retries."""
    if not url.startswith(("s3://", "s3a://")):
        return options
    config = dict(options.get("config_kwargs") or {})
    config.setdefault("retries", {"mode": "standard", "total_max_attempts": S3_MAX_ATTEMPTS})
    return {**options, "config_kwargs": config}


def _referenced(record: Any) -> list[str]:
    """Digests a record references through its `objects` dict (values: digest or list of digests), and
    through the `objects` of the state a record carries from `before` it (an RL run's resume record
    between writing a state and committing its iteration, `tasks.rl_run`)."""
    out: list[str] = []
    objects = record.get("objects") if isinstance(record, dict) else None
    if isinstance(objects, dict):
        for value in objects.values():
            values = value if isinstance(value, list) else [value]
            out.extend(check_digest(v) for v in values if v is not None)
    before = record.get("before") if isinstance(record, dict) else None
    if isinstance(before, dict):
        out.extend(_referenced(before))
    return out
