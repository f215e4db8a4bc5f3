"""Bad input costs one row, never the file (issue 15): each test writes the real fault into a real
file, runs the real ingest into a real store, and checks what the user gets, good rows included."""

from __future__ import annotations

import gzip
import hashlib
import json
import threading
import time
import tracemalloc

import pytest

from race_core import schema
from race_core.config import IngestConfig, NightlyConfig
from storage import ArtifactStore, read_dataset_from_store
from tasks import stages


def record(question: str, **extra) -> dict:
    return {"question": question, "environment": "bounded-calculator-v1", "source_revision": "r1",
            "split": "train", "successful": True,
            "turns": [{"reasoning": "add", "action": "calc[2 + 3]", "observation": "5"},
                      {"reasoning": "", "action": "finish[5]", "observation": ""}], **extra}


def line(question: str, **extra) -> bytes:
    return json.dumps(record(question, **extra)).encode()


def ingest(tmp_path, *files, **config):
    """The real ingest stage into a store under tmp_path: (manifest, good questions, rejects as (line, code))."""
    store = ArtifactStore(str(tmp_path / "store"))
    manifest = stages.ingest(store, [str(f) for f in files], IngestConfig(**config))
    good = read_dataset_from_store(store, manifest["objects"]["trajectories"], "trajectories")
    rejects = read_dataset_from_store(store, manifest["objects"]["rejects"], "rejects")
    return manifest, sorted(good["question"]), rejects


def question_of(raw: bytes) -> str | None:
    try:
        return json.loads(raw)["question"]
    except ValueError:  # blank, or the line being appended when the read ended
        return None


def codes(rejects) -> list[tuple[int, str]]:
    return list(zip(rejects["line"], rejects["code"], strict=True))


def test_a_line_nested_1000_deep_and_a_5000_digit_integer_each_cost_only_their_line(tmp_path):
    path = tmp_path / "in.jsonl"
    path.write_bytes(b"\n".join([
        line("q1"),
        b"[" * 1000 + b"]" * 1000,  # RecursionError in json.loads
        line("q2"),
        b'{"question": ' + b"7" * 5000 + b"}",  # ValueError: int over 4300 digits
        line("q3", tools=json.loads("[" * 900 + "]" * 900)),  # parses, but would break a deeper reader later
        line("q4"),
    ]) + b"\n")

    manifest, good, rejects = ingest(tmp_path, path)

    assert good == ["q1", "q2", "q4"]
    assert codes(rejects) == [(2, schema.UNREADABLE), (4, schema.UNREADABLE), (5, schema.TOO_DEEP)]
    assert "RecursionError" in rejects["message"][0] and "4300" in rejects["message"][1]
    assert manifest["metrics"]["ingested"] == 3 and manifest["metrics"]["rejected"] == 3


def test_a_20_mb_line_is_skipped_unheld_and_oversized_or_non_finite_extras_are_rejected(tmp_path):
    blob = b"x" * (20 << 20)
    path = tmp_path / "in.jsonl"
    with open(path, "wb") as fh:
        fh.write(line("q1", note="kept") + b"\n")
        fh.write(b'{"question": "' + blob + b'"}\n')  # a 20 MB line in the middle
        fh.write(line("q2") + b"\n")
        fh.write(line("big extra", blob="y" * 1_200_000) + b"\n")
        fh.write(b'{"score": NaN, ' + line("nan")[1:] + b"\n")
        fh.write(b'{"score": 1e999, ' + line("inf")[1:] + b"\n")  # parsed as Infinity
        fh.write(line("q3") + b"\n")
        fh.write(blob)  # and a file that ends in 20 MB without a newline

    tracemalloc.start()
    try:
        manifest, good, rejects = ingest(tmp_path, path, max_line_bytes=2 << 20, max_extra_bytes=1 << 20)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()

    assert good == ["q1", "q2", "q3"]
    assert codes(rejects) == [(2, schema.LINE_TOO_LONG), (4, schema.EXTRA_TOO_LARGE), (5, schema.NON_FINITE_NUMBER),
                              (6, schema.NON_FINITE_NUMBER), (8, schema.LINE_TOO_LONG)]
    assert f"{len(blob) + 16} bytes" in rejects["message"][0] and f"{len(blob)} bytes" in rejects["message"][4]
    assert list(rejects["field"])[1:4] == ["blob", "score", "score"]
    assert peak < 15 << 20, f"the reader held {peak} bytes: a 20 MiB line must not be held"
    store = ArtifactStore(str(tmp_path / "store"))
    kept = read_dataset_from_store(store, manifest["objects"]["trajectories"], "trajectories")
    assert json.loads(kept["extra"][list(kept["question"]).index("q1")]) == {"note": "kept"}


def test_a_utf8_bom_and_gzip_files_are_read_and_a_damaged_gzip_keeps_the_lines_before_the_damage(tmp_path):
    def text(name: str) -> bytes:
        return b"\n".join([line(f"{name}1"), b"{not json", line(f"{name}2")]) + b"\n"

    bom = tmp_path / "bom.jsonl"
    bom.write_bytes(b"\xef\xbb\xbf" + text("b"))
    gz = tmp_path / "in.jsonl.gz"
    gz.write_bytes(gzip.compress(text("g")))
    unnamed = tmp_path / "gzip-without-suffix.jsonl"  # recognised by its magic bytes
    unnamed.write_bytes(gzip.compress(text("u")))
    damaged = tmp_path / "damaged.jsonl.gz"
    many = b"".join(line(f"d{i}") + b"\n" for i in range(2000))
    damaged.write_bytes(gzip.compress(many)[:-200])  # cut: the stream ends before its end marker

    manifest, good, rejects = ingest(tmp_path, bom, gz, unnamed, damaged)

    kept_damaged = [q for q in good if q.startswith("d")]
    assert sorted(q for q in good if not q.startswith("d")) == ["b1", "b2", "g1", "g2", "u1", "u2"]
    assert len(kept_damaged) > 1000 and kept_damaged == sorted(f"d{i}" for i in range(len(kept_damaged)))
    by_file = {f: codes(rejects[rejects["file"] == f]) for f in set(rejects["file"])}
    assert by_file[str(bom)] == by_file[str(gz)] == by_file[str(unnamed)] == [(2, schema.NOT_JSON)]
    assert by_file[str(damaged)][-1] == (len(kept_damaged) + len(by_file[str(damaged)]), schema.UNREADABLE)
    # The damaged file's key covers all of it: the next run finds the ingest without parsing.
    files_read = {r["file"]: r for r in manifest["files_read"]}
    assert files_read[str(damaged)]["sha256"] == hashlib.sha256(damaged.read_bytes()).hexdigest()
    assert ingest(tmp_path, bom, gz, unnamed, damaged)[0]["cached"]


def test_an_empty_inbox_is_nothing_new_and_rejects_are_reported(prefect_harness, tiny_checkpoint, tmp_path):
    inbox = tmp_path / "inbox"
    inbox.mkdir()
    config = NightlyConfig(inbox=str(inbox / "*.jsonl"), checkpoint=str(tiny_checkpoint), store=str(tmp_path / "s"))
    from flows.nightly import race_nightly

    state = race_nightly(config, return_state=True)
    assert state.is_completed()
    assert state.result() == {"files": 0, "new": 0, "already_compressed": 0, "part": None, "rejected": 0,
                              "rejects": {}}

    (inbox / "a.jsonl").write_bytes(line("Compute 2 + 3.") + b"\n" + b"[" * 1000 + b"]" * 1000 + b"\n")
    summary = race_nightly(config)
    assert summary["new"] == 1 and summary["part"] is not None
    assert summary["rejected"] == 1 and list(summary["rejects"]) == [str(inbox / "a.jsonl")]
    rejects = read_dataset_from_store(ArtifactStore(config.store), summary["rejects"][str(inbox / "a.jsonl")],
                                      "rejects")
    assert codes(rejects) == [(2, schema.UNREADABLE)]


def test_an_inbox_folder_that_does_not_exist_is_an_error_not_an_empty_inbox(tmp_path):
    with pytest.raises(FileNotFoundError, match="does not exist"):
        stages.expand_inputs([str(tmp_path / "typo" / "*.jsonl")], allow_empty=True)
    assert stages.expand_inputs([str(tmp_path / "*.jsonl")], allow_empty=True) == []


def test_a_file_appended_while_it_is_ingested_is_keyed_by_the_bytes_its_rows_came_from(tmp_path, monkeypatch):
    path = tmp_path / "growing.jsonl"
    path.write_bytes(b"".join(line(f"first {i}") + b"\n" for i in range(3000)))

    def append(prefix: str, count: int, pause_s: float = 0.0) -> None:
        for i in range(count):
            with open(path, "ab") as fh:
                fh.write(line(f"{prefix} {i}") + b"\n")  # one write per whole line
            time.sleep(pause_s)

    real_digest = stages.file_digest

    def digest_then_append(url: str) -> str:
        digest = real_digest(url)  # the cache probe saw the file as it was ...
        between = threading.Thread(target=append, args=("between", 50))
        between.start()
        between.join()  # ... and it grew before the parse: deterministic
        during.start()  # and it keeps growing while it is parsed
        return digest

    during = threading.Thread(target=append, args=("during", 500, 0.001))
    monkeypatch.setattr(stages, "file_digest", digest_then_append)
    try:
        manifest, good, rejects = ingest(tmp_path, path)
    finally:
        during.join()
    monkeypatch.setattr(stages, "file_digest", real_digest)

    [read] = manifest["files_read"]
    prefix = path.read_bytes()[:read["bytes"]]
    assert read["sha256"] == hashlib.sha256(prefix).hexdigest()
    assert manifest["inputs"]["files"] == stages._canonical_inputs({str(path): read["sha256"]})
    expected = [q for x in prefix.split(b"\n") if (q := question_of(x))]
    assert good == sorted(expected) and len(good) >= 3050  # every row read is kept: the between lines too
    assert len(rejects) <= 1  # at most the line the appender was writing when the read ended

    # The next run sees the grown file: a new key with all rows; a third run finds it by one hash-only read.
    again, good_again, _ = ingest(tmp_path, path)
    assert not again["cached"] and len(good_again) == path.read_bytes().count(b"\n")
    parsed = []
    monkeypatch.setattr(stages, "_read_items", lambda *a: parsed.append(a) or iter(()))
    third, _, _ = ingest(tmp_path, path)
    assert third["cached"] and parsed == [] and third["inputs"] == again["inputs"]
