"""ArtifactStore: one suite run on a local folder, on memory://, and on S3 (moto server on loopback)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

import pytest
from components import require_s3

import storage.store as store_module
from storage.checkpoints import UnsafeCheckpointError, put_checkpoint, restore_checkpoint
from storage.gc import collect_garbage
from storage.keys import stage_key
from storage.store import ArtifactStore, CorruptObjectError, MissingObjectError, sha256_bytes

REPO = Path(__file__).resolve().parents[1]


# -- fixtures ------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def s3_server():
    """A real S3-compatible server (moto's server mode) on 127.0.0.1, one per module."""
    require_s3()
    from s3_proxy import moto_server, storage_options

    with moto_server("race-test") as endpoint:
        yield {"bucket": "race-test", "storage_options": storage_options(endpoint)}


@pytest.fixture(params=["local", "memory", "s3"])
def store(request, tmp_path) -> ArtifactStore:
    """A fresh, empty store on each backend (unique prefix: memory and the bucket are shared)."""
    prefix = uuid.uuid4().hex
    if request.param == "local":
        return ArtifactStore(str(tmp_path / "store"))
    if request.param == "memory":
        return ArtifactStore(f"memory://race-{prefix}")
    s3 = request.getfixturevalue("s3_server")
    return ArtifactStore(f"s3://{s3['bucket']}/{prefix}", storage_options=s3["storage_options"])


def _corrupt(store: ArtifactStore, digest: str, data: bytes) -> None:
    """Overwrite an object's bytes behind the store's back (bit rot, a bad disk, a stray write)."""
    store.fs.pipe_file(store.object_path(digest), data)
    store.fs.invalidate_cache()


def _make_folder(root: Path) -> Path:
    (root / "nested" / "deeper").mkdir(parents=True)
    (root / "config.json").write_text('{"hidden_size": 8}')
    (root / "model.safetensors").write_bytes(os.urandom(4096))
    (root / "nested" / "deeper" / "tokenizer.json").write_text('{"vocab": {"é": 1, "漢": 2}}', "utf-8")
    (root / "empty.txt").write_bytes(b"")
    return root


def _files(folder: Path) -> dict[str, bytes]:
    return {p.relative_to(folder).as_posix(): p.read_bytes() for p in folder.rglob("*") if p.is_file()}


# -- objects ------------------------------------------------------------------------------------
def test_same_content_twice_is_one_object(store):
    first = store.put_bytes(b"hello race")
    second = store.put_bytes(b"hello race")
    assert first == second == sha256_bytes(b"hello race")
    assert list(store.iter_objects()) == [first]
    assert store.get_bytes(first) == b"hello race"


def test_a_different_byte_is_a_different_digest(store):
    a = store.put_bytes(b"hello race")
    b = store.put_bytes(b"hello racf")
    assert a != b
    assert sorted(store.iter_objects()) == sorted([a, b])


def test_put_file_and_get_file_round_trip(store, tmp_path):
    source = tmp_path / "blob.bin"
    source.write_bytes(os.urandom(3 * (1 << 20) + 7))
    digest = store.put_file(source)
    assert digest == sha256_bytes(source.read_bytes())
    restored = store.get_file(digest, tmp_path / "out" / "blob.bin")
    assert restored.read_bytes() == source.read_bytes()


def test_corrupt_object_read_names_the_digest_is_quarantined_and_putting_again_repairs(store, tmp_path):
    digest = store.put_bytes(b"precious bytes")
    _corrupt(store, digest, b"rotten bytes")
    with pytest.raises(CorruptObjectError) as err:
        store.get_bytes(digest)
    assert digest in str(err.value)
    assert "quarantine" in str(err.value) and "next run recomputes" in str(err.value)
    # moved aside: it now reads as missing, so the next hit check recomputes the stage that made it
    assert not store.has_object(digest)
    assert store.fs.cat_file(f"{store.root}/quarantine/{digest}") == b"rotten bytes"
    assert store.put_bytes(b"precious bytes") == digest  # the repair
    assert store.get_bytes(digest) == b"precious bytes"
    _corrupt(store, digest, b"rotten again")
    with pytest.raises(CorruptObjectError):
        store.get_file(digest, tmp_path / "copy.bin")
    assert not (tmp_path / "copy.bin").exists()  # a corrupt copy never lands under its final name
    assert not store.has_object(digest)


def test_missing_object_is_a_clear_error(store):
    digest = sha256_bytes(b"never stored")
    assert not store.has_object(digest)
    with pytest.raises(MissingObjectError, match=digest):
        store.get_bytes(digest)


# -- manifests ----------------------------------------------------------------------------------
def test_manifest_is_the_commit_point(store):
    key = stage_key("ingest", 1, {"limit": 3}, [], None)
    assert not store.has("ingest", key)
    assert store.read_manifest("ingest", key) is None
    digest = store.put_bytes(b"rows")
    written = store.write_manifest("ingest", key, {"objects": {"trajectories": digest}, "rows": 1})
    assert store.has("ingest", key)
    manifest = store.read_manifest("ingest", key)
    assert manifest == written
    assert manifest["objects"] == {"trajectories": digest}
    assert manifest["created_at"] and manifest["code_version"]
    assert store.list_stages() == ["ingest"]
    assert store.list_manifests("ingest") == [key]


def test_failure_between_object_and_manifest_leaves_the_stage_undone(store, monkeypatch):
    key = stage_key("cover", 1, {"epsilon": 1e-3}, ["a" * 64], "b" * 64)

    def crash(*args, **kwargs):
        raise RuntimeError("injected fault: the process dies before the manifest")

    # The fault is injected on purpose: the object is written, then the manifest write fails.
    digest = store.put_bytes(b"decisions parquet")
    monkeypatch.setattr(store, "write_record", crash)
    with pytest.raises(RuntimeError, match="injected"):
        store.write_manifest("cover", key, {"objects": {"decisions": digest}})
    monkeypatch.undo()
    assert not store.has("cover", key)  # so the stage is redone
    assert store.read_manifest("cover", key) is None
    assert store.list_manifests("cover") == []
    # Redoing it commits; the object is the same one.
    assert store.put_bytes(b"decisions parquet") == digest
    store.write_manifest("cover", key, {"objects": {"decisions": digest}})
    assert store.has("cover", key)


def test_manifest_refuses_to_point_at_missing_objects(store):
    ghost = sha256_bytes(b"not there")
    with pytest.raises(MissingObjectError, match=ghost):
        store.write_manifest("sft", "k1", {"objects": {"checkpoint": ghost}})
    assert not store.has("sft", "k1")


# -- folders, checkpoints, gc -------------------------------------------------------------------
def test_checkpoint_folder_round_trip_is_byte_identical(store, tmp_path):
    folder = _make_folder(tmp_path / "ckpt")
    digest = put_checkpoint(store, folder)
    assert put_checkpoint(store, folder) == digest  # same folder, same digest
    dest = restore_checkpoint(store, digest, tmp_path / "restored")
    assert _files(dest) == _files(folder)
    # Idempotent, and a damaged local copy is repaired from verified objects.
    (dest / "config.json").write_text("tampered")
    restore_checkpoint(store, digest, dest)
    assert _files(dest) == _files(folder)


def test_checkpoint_with_pickle_is_refused(store, tmp_path):
    folder = _make_folder(tmp_path / "ckpt")
    (folder / "pytorch_model.bin").write_bytes(b"\x80\x04pickle")
    with pytest.raises(UnsafeCheckpointError, match="pytorch_model.bin"):
        put_checkpoint(store, folder)


def test_gc_lists_only_unreferenced_objects(store, tmp_path):
    folder = _make_folder(tmp_path / "ckpt")
    tree = store.put_folder(folder)
    kept = store.put_bytes(b"kept")
    orphan = store.put_bytes(b"orphan")
    store.write_manifest("sft", "k1", {"objects": {"checkpoint": tree, "log": kept}})
    assert collect_garbage(store, dry_run=True).young == [orphan]  # too fresh: it may belong to a running stage
    assert collect_garbage(store, dry_run=False).objects == []
    assert collect_garbage(store, dry_run=True, grace_hours=0).objects == [orphan]
    assert store.has_object(orphan)  # dry run deletes nothing
    assert collect_garbage(store, dry_run=False, grace_hours=0).objects == [orphan]
    assert not store.has_object(orphan)
    assert collect_garbage(store, dry_run=True, grace_hours=0).objects == []
    assert _files(store.restore_folder(tree, tmp_path / "again")) == _files(folder)


def test_a_record_written_create_if_absent_never_overwrites(store):
    """The catalog's append primitive: local os.link, S3 If-None-Match: * (moto honours it), memory xb."""
    store.write_record("catalog/s/00000001.json", {"part": "first"}, overwrite=False)
    with pytest.raises(FileExistsError, match="00000001.json"):
        store.write_record("catalog/s/00000001.json", {"part": "second"}, overwrite=False)
    assert store.read_record("catalog/s/00000001.json") == {"part": "first"}
    assert store.list_records("catalog/s") == ["00000001.json"]  # no temp litter either


def test_manifest_records_sizes_and_damage_names_a_missing_or_resized_object(store, tmp_path):
    folder = _make_folder(tmp_path / "ckpt")
    tree = store.put_folder(folder)
    log = store.put_bytes(b"log lines")
    manifest = store.write_manifest("sft", "k1", {"objects": {"checkpoint": tree, "log": log}})
    member = store.read_tree(tree)["config.json"]
    assert manifest["object_sizes"][log] == len(b"log lines")
    assert member in manifest["object_sizes"]  # trees are followed
    assert store.manifest_damage(manifest) is None
    _corrupt(store, log, b"log lines, longer")
    assert store.manifest_damage(manifest) == f"object {log} holds 17 bytes, not the 9 recorded"
    store.fs.rm_file(store.object_path(member))
    store.fs.invalidate_cache()
    assert store.manifest_damage({**manifest, "object_sizes": {member: 18}}) == f"object {member} is missing"
    old_style = {"objects": {"log": log}}  # written before sizes were recorded: existence only
    assert store.manifest_damage(old_style) is None


def test_gc_aborts_the_abandoned_multipart_uploads_of_its_own_root_only(s3_server):
    # (moto reports every upload as started in 2010, so the grace period itself is pinned on files)
    store = ArtifactStore(f"s3://{s3_server['bucket']}/{uuid.uuid4().hex}", storage_options=s3_server["storage_options"])
    bucket, prefix = store.root.split("/", 1)
    ours = store.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=f"{prefix}/objects/ab/killed-upload")
    theirs = store.fs.call_s3("create_multipart_upload", Bucket=bucket, Key=f"{prefix}-other/objects/ab/upload")
    report = collect_garbage(store, dry_run=False, grace_hours=1)
    assert report.uploads == [f"{prefix}/objects/ab/killed-upload (upload {ours['UploadId']})"]
    assert collect_garbage(store, grace_hours=1).uploads == []  # aborted
    assert theirs["UploadId"] in {u["UploadId"] for u in store.fs.list_multipart_uploads(bucket)}


# -- local atomicity (the temp + fsync + rename protocol) ---------------------------------------
def test_failed_rename_leaves_no_object_and_no_litter(tmp_path, monkeypatch):
    store = ArtifactStore(str(tmp_path / "store"))

    def broken_replace(src, dst):
        raise OSError("injected fault: rename fails")

    # The fault is injected on purpose: os.replace fails after the temp file was written.
    monkeypatch.setattr(store_module.os, "replace", broken_replace)
    with pytest.raises(OSError, match="injected"):
        store.put_bytes(b"payload")
    with pytest.raises(OSError, match="injected"):
        store.write_manifest("ingest", "k1", {"rows": 0})
    monkeypatch.undo()
    digest = sha256_bytes(b"payload")
    assert not os.path.exists(store.object_path(digest))
    assert not store.has("ingest", "k1")
    assert [p for p in (tmp_path / "store").rglob("*") if p.is_file()] == []


def test_crash_mid_write_never_shows_a_partial_file_under_its_final_name(tmp_path, monkeypatch):
    store = ArtifactStore(str(tmp_path / "store"))

    def die(fd):
        raise KeyboardInterrupt("injected fault: killed during fsync")

    # The fault is injected on purpose, and cleanup is disabled to mimic a hard kill (no finally).
    monkeypatch.setattr(store_module.os, "fsync", die)
    monkeypatch.setattr(store_module.os, "unlink", lambda path: None)
    with pytest.raises(KeyboardInterrupt):
        store.put_bytes(b"x" * 100_000)
    with pytest.raises(KeyboardInterrupt):
        store.write_manifest("ingest", "k1", {"rows": 0})
    monkeypatch.undo()
    digest = sha256_bytes(b"x" * 100_000)
    litter = [p for p in (tmp_path / "store").rglob("*") if p.is_file()]
    assert litter and all(p.name.startswith(".tmp-") for p in litter)  # only temp names exist
    assert not os.path.exists(store.object_path(digest))
    assert list(store.iter_objects()) == []  # temp litter is never an object
    report = collect_garbage(store, grace_hours=0)
    assert report.objects == [] and len(report.temp_files) == len(litter)  # litter is listed, not an object
    assert collect_garbage(store, grace_hours=1).temp_files == []  # ... once it is older than the grace period
    collect_garbage(store, dry_run=False, grace_hours=0)
    assert [p for p in (tmp_path / "store").rglob("*") if p.is_file()] == []
    assert not store.has("ingest", "k1") and store.list_manifests("ingest") == []
    assert store.put_bytes(b"x" * 100_000) == digest and store.verify_object(digest)


# -- stage key ----------------------------------------------------------------------------------
def test_stage_key_is_stable_across_dict_order_and_processes():
    config_a = {"epsilon": 0.001, "backend": "hf", "nested": {"b": 2, "a": [1, 2]}}
    config_b = {"nested": {"a": [1, 2], "b": 2}, "backend": "hf", "epsilon": 0.001}
    inputs_a = {"trajectories": "1" * 64, "model": "2" * 64}
    inputs_b = {"model": "2" * 64, "trajectories": "1" * 64}
    key = stage_key("cover", 2, config_a, inputs_a, "f" * 64)
    assert key == stage_key("cover", 2, config_b, inputs_b, "f" * 64)
    assert key == stage_key("cover", "2", config_b, inputs_b, "f" * 64)
    code = (
        "from storage.keys import stage_key; "
        "print(stage_key('cover', 2, {'nested': {'a': [1, 2], 'b': 2}, 'backend': 'hf', 'epsilon': 0.001}, "
        f"{{'model': '{'2' * 64}', 'trajectories': '{'1' * 64}'}}, '{'f' * 64}'))"
    )
    env = {**os.environ, "PYTHONHASHSEED": "12345"}
    out = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO, env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == key


@pytest.mark.parametrize(
    "change",
    [
        {"stage": "sft"},
        {"version": 3},
        {"config": {"epsilon": 0.01, "backend": "hf", "nested": {"b": 2, "a": [1, 2]}}},
        {"input_digests": {"trajectories": "3" * 64, "model": "2" * 64}},
        {"model_digest": None},
        {"code": {"source": "e" * 64, "libraries": {"torch": "2.0"}}},
    ],
)
def test_stage_key_changes_with_each_of_its_six_parts(change):
    base = {
        "stage": "cover",
        "version": 2,
        "config": {"epsilon": 0.001, "backend": "hf", "nested": {"b": 2, "a": [1, 2]}},
        "input_digests": {"trajectories": "1" * 64, "model": "2" * 64},
        "model_digest": "f" * 64,
        "code": {"source": "d" * 64, "libraries": {"torch": "2.0"}},
    }
    assert stage_key(**base) != stage_key(**{**base, **change})


def test_manifest_json_is_readable_text(tmp_path):
    store = ArtifactStore(str(tmp_path / "s"))
    store.write_manifest("ingest", "k1", {"rows": 3, "note": "é"})
    text = Path(store.manifest_path("ingest", "k1")).read_text("utf-8")
    assert json.loads(text)["note"] == "é"


def test_gc_takes_pool_leases_only_once_they_stopped_being_renewed(store):
    """A pool child's lease (`tasks.pool`) left by a child and a parent that both died is litter; a
    live one is rewritten every few seconds, so it is always younger than the grace period."""
    store.write_record("leases/run-1.json", {"beat": 3})
    assert collect_garbage(store, dry_run=False).leases == []  # young: maybe alive
    assert store.read_record("leases/run-1.json") == {"beat": 3}
    assert collect_garbage(store, dry_run=True, grace_hours=0).leases == ["leases/run-1.json"]
    assert store.read_record("leases/run-1.json") is not None  # dry run deletes nothing
    assert collect_garbage(store, dry_run=False, grace_hours=0).leases == ["leases/run-1.json"]
    assert store.read_record("leases/run-1.json") is None
