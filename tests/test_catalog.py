"""Catalog of compressed ids: append-only parts per scope (model digest, epsilon, scorer)."""

from __future__ import annotations

import uuid
from pathlib import Path

import pytest

from storage.catalog import Catalog, Scope
from storage.gc import collect_garbage
from storage.store import ArtifactStore, MissingObjectError, sha256_bytes

MODEL = "a" * 64


@pytest.fixture(params=["local", "memory"])
def store(request, tmp_path) -> ArtifactStore:
    if request.param == "local":
        return ArtifactStore(str(tmp_path / "store"))
    return ArtifactStore(f"memory://catalog-{uuid.uuid4().hex}")


def _entry_bytes(store: ArtifactStore, scope: Scope) -> dict[str, bytes]:
    base = f"catalog/{scope.key}"
    return {name: store.fs.cat_file(f"{store.root}/{base}/{name}") for name in store.list_records(base)}


def test_ids_compressed_in_part_one_are_not_new_and_part_two_leaves_part_one_untouched(store):
    catalog = Catalog(store)
    scope = Scope(MODEL, 1e-3, {"backend": "hf", "batch_size": 8})
    assert catalog.new_ids(scope, ["t1", "t2", "t3"]) == ["t1", "t2", "t3"]

    part1 = store.put_bytes(b"compressed part 1")
    catalog.append_part(scope, part1, ["t1", "t2"], {"rows": 2})
    assert catalog.compressed_ids(scope) == {"t1", "t2"}
    assert catalog.new_ids(scope, ["t3", "t1", "t4", "t2", "t3"]) == ["t3", "t4"]
    before = _entry_bytes(store, scope)
    assert len(before) == 1

    part2 = store.put_bytes(b"compressed part 2")
    catalog.append_part(scope, part2, ["t3", "t4"], {"rows": 2})
    after = _entry_bytes(store, scope)
    assert len(after) == 2
    name1 = next(iter(before))
    assert after[name1] == before[name1]  # byte-identical
    assert [p["part"] for p in catalog.parts(scope)] == [part1, part2]
    assert catalog.new_ids(scope, ["t1", "t2", "t3", "t4", "t5"]) == ["t5"]


def test_appending_the_same_part_again_writes_nothing(store):
    catalog = Catalog(store)
    scope = Scope(MODEL, 1e-3)
    part = store.put_bytes(b"part")
    first = catalog.append_part(scope, part, ["t1"])
    again = catalog.append_part(scope, part, ["t1"])
    assert again == first
    assert len(_entry_bytes(store, scope)) == 1


def test_scopes_are_separate_and_their_keys_ignore_dict_order(store):
    catalog = Catalog(store)
    hf = Scope(MODEL, 1e-3, {"backend": "hf", "batch_size": 8})
    assert hf.key == Scope(MODEL, 0.001, {"batch_size": 8, "backend": "hf"}).key
    other_eps = Scope(MODEL, 1e-2, {"backend": "hf", "batch_size": 8})
    other_model = Scope("b" * 64, 1e-3, {"backend": "hf", "batch_size": 8})
    assert len({hf.key, other_eps.key, other_model.key}) == 3
    catalog.append_part(hf, store.put_bytes(b"p"), ["t1"])
    assert catalog.new_ids(other_eps, ["t1"]) == ["t1"]
    assert catalog.new_ids(other_model, ["t1"]) == ["t1"]
    assert catalog.new_ids(hf, ["t1"]) == []


def test_a_part_must_be_in_the_store_and_stays_reachable_for_gc(store):
    catalog = Catalog(store)
    scope = Scope(MODEL, 1e-3)
    ghost = sha256_bytes(b"never stored")
    with pytest.raises(MissingObjectError, match=ghost):
        catalog.append_part(scope, ghost, ["t1"])
    assert catalog.parts(scope) == []
    part = store.put_bytes(b"part")
    orphan = store.put_bytes(b"orphan")
    catalog.append_part(scope, part, ["t1"])
    assert collect_garbage(store, dry_run=True, grace_hours=0).objects == [orphan]


def test_catalog_survives_a_new_process_view(tmp_path):
    root = str(tmp_path / "store")
    scope = Scope(MODEL, 1e-3, {"backend": "hf"})
    store = ArtifactStore(root)
    Catalog(store).append_part(scope, store.put_bytes(b"part"), ["t1", "t2"])
    fresh = Catalog(ArtifactStore(root))
    assert fresh.compressed_ids(scope) == {"t1", "t2"}
    assert Path(root, "catalog", scope.key).is_dir()
