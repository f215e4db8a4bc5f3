"""The faults an S3 store produces, injected on the wire by a proxy in front of moto's server on
127.0.0.1 (tests/s3_proxy.py): throttling and 5xx answers on puts and gets (retried with bounded
backoff, then one line naming the URL), two writers creating the same key at once, a multipart
upload cut off by a killed writer, and a store whose clock is behind or ahead of the host's.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from pathlib import Path
from types import SimpleNamespace

import pytest
from components import require_s3
from faults import assert_one_line_error

import storage.gc
from flows.cli import main
from storage.catalog import Catalog, Scope
from storage.gc import HOUR_S, collect_garbage
from storage.store import S3_MAX_ATTEMPTS, ArtifactStore, StoreIOError

BUCKET = "race-test"
# botocore's standard retry mode waits rand(0, 1) * min(2 ** k, 20) s before try k + 2: at most
# 1 + 2 + 4 + 8 s over S3_MAX_ATTEMPTS = 5 tries; the rest is slack for a loaded machine.
GIVE_UP_WITHIN_S = sum(min(2 ** k, 20) for k in range(S3_MAX_ATTEMPTS - 1)) + 30
EPSILON = "0.002"


@pytest.fixture(scope="module")
def moto():
    require_s3()
    from s3_proxy import moto_server

    with moto_server(BUCKET) as endpoint:
        yield endpoint


@pytest.fixture
def proxy(moto):
    from s3_proxy import FaultProxy

    with FaultProxy(moto) as proxy:
        yield proxy


def s3_store(endpoint: str, prefix: str | None = None) -> ArtifactStore:
    from s3_proxy import storage_options

    return ArtifactStore(f"s3://{BUCKET}/{prefix or uuid.uuid4().hex}", storage_options=storage_options(endpoint))


# -- throttling and 5xx ------------------------------------------------------------------------
@pytest.mark.parametrize("status", [503, 500], ids=["throttled", "internal-error"])
def test_puts_and_gets_answered_with_an_error_twice_are_retried_and_succeed(proxy, status):
    store = s3_store(proxy.url)
    proxy.fail("PUT", "/objects/", status, times=2)
    digest = store.put_bytes(b"the decisions")
    assert proxy.count("PUT", "/objects/") == 3  # two errors, then the write
    proxy.fail("GET", "/objects/", status, times=2)
    assert store.get_bytes(digest) == b"the decisions"
    assert proxy.count("GET", "/objects/") == 3


@pytest.mark.parametrize(("method", "status", "what"), [("PUT", 503, "SlowDown"), ("GET", 500, "InternalError")])
def test_a_store_that_keeps_failing_is_given_up_after_bounded_tries_in_one_line(proxy, method, status, what):
    store = s3_store(proxy.url)
    digest = store.put_bytes(b"already there") if method == "GET" else None
    proxy.fail(method, "/objects/", status, times=None)
    started = time.monotonic()
    with pytest.raises(StoreIOError) as caught:
        store.put_bytes(b"never written") if method == "PUT" else store.get_bytes(digest)
    took = time.monotonic() - started
    message = str(caught.value)
    print(f"{method} {status}: gave up after {proxy.count(method, '/objects/')} tries in {took:.1f} s")
    assert proxy.count(method, "/objects/") == S3_MAX_ATTEMPTS and took < GIVE_UP_WITHIN_S
    assert message.startswith(f"cannot {'write' if method == 'PUT' else 'read'} s3://{BUCKET}/{store.root.split('/', 1)[1]}/objects/")
    assert f"HTTP {status} {what}" in message and f"({S3_MAX_ATTEMPTS} tries)" in message
    assert "\n" not in message and "run again" in message
    proxy.clear()
    if method == "PUT":
        assert list(store.iter_objects()) == []  # nothing under a final name


@pytest.fixture(scope="module")
def clean_cover(tmp_path_factory, tiny_checkpoint):
    """`race cover` into a local store: the results (content-addressed digests) an S3 run must equal."""
    from flows.cover import demo_inputs

    root = tmp_path_factory.mktemp("clean")
    inputs = demo_inputs(root, n=8, seed=11)
    stdout = io.StringIO()
    with contextlib.redirect_stdout(stdout), contextlib.redirect_stderr(io.StringIO()):
        assert main(["cover", "--input", *inputs, "--checkpoint", str(tiny_checkpoint), "--out", str(root / "out"),
                     "--store", str(root / "store"), "--epsilon", EPSILON]) == 0
    return inputs, json.loads(stdout.getvalue())


@pytest.fixture
def through_proxy(proxy, monkeypatch):
    """This process's S3 clients without storage options (what `race` builds from a URL) go to the
    proxy: the endpoint in the environment, s3fs's cached instances dropped before and after (one
    kept would hold an endpoint that is gone)."""
    import s3fs
    from s3_proxy import child_env

    for name, value in child_env(proxy.url).items():
        monkeypatch.setenv(name, value)
    s3fs.S3FileSystem.clear_instance_cache()
    yield proxy
    s3fs.S3FileSystem.clear_instance_cache()


def race_cover_on(store_url: str, inputs, checkpoint, out: Path, capsys) -> tuple[int, str, str]:
    capsys.readouterr()
    rc = main(["cover", "--input", *inputs, "--checkpoint", str(checkpoint), "--out", str(out), "--store",
               store_url, "--epsilon", EPSILON])
    captured = capsys.readouterr()
    return rc, captured.out, captured.err


def test_race_cover_on_a_throttling_store_completes_and_on_a_failing_one_stops_in_one_line_then_resumes(
        through_proxy, clean_cover, tiny_checkpoint, tmp_path, capsys):
    proxy = through_proxy
    inputs, clean = clean_cover
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    proxy.fail("PUT", "/objects/", 503, times=3)
    proxy.fail("GET", "/objects/", 503, times=3)
    proxy.fail("HEAD", "/stages/", 500, times=2)
    rc, out, err = race_cover_on(url, inputs, tiny_checkpoint, tmp_path / "a", capsys)
    assert rc == 0, err[-3000:]
    assert json.loads(out)["objects"] == clean["objects"]  # the same bytes as on a local disk
    assert all(rule.hits == rule.times for rule in proxy.rules)  # every injected error was met, and retried

    proxy.clear()
    url = f"s3://{BUCKET}/{uuid.uuid4().hex}"
    proxy.fail("PUT", "/stages/cover/", 503, times=None)  # the cover's commit point never gets through
    rc, out, err = race_cover_on(url, inputs, tiny_checkpoint, tmp_path / "b", capsys)
    assert rc == 2
    assert_one_line_error(err, "cover", f"cannot write {url}/stages/cover/", "HTTP 503 SlowDown",
                          f"({S3_MAX_ATTEMPTS} tries)")
    store = s3_store(proxy.url, url.rsplit("/", 1)[1])
    assert store.list_manifests("cover") == [] and len(store.list_manifests("ingest")) == 1  # not half committed

    proxy.clear()
    rc, out, err = race_cover_on(url, inputs, tiny_checkpoint, tmp_path / "c", capsys)
    assert rc == 0, err[-3000:]
    summary = json.loads(out)
    assert summary["objects"] == clean["objects"]
    assert {k: v["cached"] for k, v in summary["stages"].items()} == {"ingest": True, "cover": False,
                                                                      "compress": False}


# -- two writers of one key --------------------------------------------------------------------
def test_two_writers_creating_the_same_record_at_the_same_moment_one_wins_and_the_other_is_told(proxy):
    """Both conditional PUTs are held at the proxy until both have arrived, then let go together."""
    import threading

    prefix = uuid.uuid4().hex
    for trial in range(3):
        record = f"catalog/scope/{trial:08d}.json"
        held = proxy.hold("PUT", f"/{record}$", times=2)
        results: dict[str, str] = {}

        def write(writer: str, record=record, results=results) -> None:
            try:
                s3_store(proxy.url, prefix).write_record(record, {"writer": writer}, overwrite=False)
                results[writer] = "created"
            except FileExistsError:
                results[writer] = "exists"

        threads = [threading.Thread(target=write, args=(w,)) for w in "ab"]
        for thread in threads:
            thread.start()
        held.wait_arrived(2)
        held.released.set()
        for thread in threads:
            thread.join(60)
        assert sorted(results.values()) == ["created", "exists"], results
        winner = next(w for w, r in results.items() if r == "created")
        assert s3_store(proxy.url, prefix).read_record(record) == {"writer": winner}


SCOPE = Scope("b" * 64, 1e-3, {"backend": "hf"})


def _append(endpoint: str, prefix: str, writer: str, start, count: int) -> None:
    from s3_proxy import CREDENTIALS

    os.environ.update(CREDENTIALS)
    store = s3_store(endpoint, prefix)
    start.wait()
    for i in range(count):
        part = store.put_bytes(f"{writer}-{i}".encode())
        Catalog(store).append_part(SCOPE, part, [f"{writer}-{i}"])


def test_two_processes_appending_to_an_s3_catalog_never_share_a_number_or_lose_a_part(moto):
    import multiprocessing

    prefix, count = uuid.uuid4().hex, 8
    ctx = multiprocessing.get_context("spawn")
    start = ctx.Event()
    writers = [ctx.Process(target=_append, args=(moto, prefix, w, start, count)) for w in "ab"]
    for process in writers:
        process.start()
    start.set()
    for process in writers:
        process.join(300)
        assert process.exitcode == 0
    store = s3_store(moto, prefix)
    assert store.list_records(f"catalog/{SCOPE.key}") == [f"{n:08d}.json" for n in range(1, 2 * count + 1)]
    parts = Catalog(store).parts(SCOPE)
    assert {p["part"] for p in parts} == {store.put_bytes(f"{w}-{i}".encode()) for w in "ab" for i in range(count)}


# -- a multipart upload cut off ----------------------------------------------------------------
UPLOAD = """
import sys
from storage.store import ArtifactStore
sys.path.insert(0, {tests!r})
from s3_proxy import storage_options
store = ArtifactStore({url!r}, storage_options=storage_options({endpoint!r}))
print(store.put_file({path!r}), flush=True)
"""
PART = 5 << 20  # S3's smallest part


def _upload(proxy, url: str, path: Path) -> subprocess.Popen:
    from s3_proxy import CREDENTIALS

    code = UPLOAD.format(tests=str(Path(__file__).parent), url=url, endpoint=proxy.url, path=str(path))
    env = {**os.environ, **CREDENTIALS, "RACE_S3_PART_BYTES": str(PART)}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                            text=True)


def test_a_multipart_upload_whose_writer_is_killed_leaves_no_object_and_gc_aborts_it(through_proxy, tmp_path,
                                                                                    capsys):
    proxy = through_proxy
    big = tmp_path / "checkpoint.safetensors"
    big.write_bytes(os.urandom(3 * PART + 123))
    prefix = uuid.uuid4().hex
    url = f"s3://{BUCKET}/{prefix}"
    held = proxy.hold("PUT", r"partNumber=2\b", times=1)
    writer = _upload(proxy, url, big)
    held.wait_arrived()
    writer.send_signal(signal.SIGKILL)  # the writer dies between its parts
    writer.wait(30)
    held.released.set()

    store = s3_store(proxy.url, prefix)
    from storage.store import sha256_file

    digest = sha256_file(big)
    assert not store.has_object(digest)  # S3 shows an object only once its upload completes
    uploads = [u for u in store.fs.list_multipart_uploads(BUCKET) if u["Key"].startswith(f"{prefix}/")]
    assert [u["Key"] for u in uploads] == [f"{prefix}/objects/{digest[:2]}/{digest}"]

    capsys.readouterr()
    assert main(["gc", "--store", url, "--delete", "--grace-hours", "0"]) == 0
    assert "removed: 1 abandoned multipart upload(s) older than 0 h" in capsys.readouterr().out
    assert not [u for u in store.fs.list_multipart_uploads(BUCKET) if u["Key"].startswith(f"{prefix}/")]

    again = _upload(proxy, url, big)  # the rerun
    stdout, stderr = again.communicate(timeout=120)
    assert again.returncode == 0, stderr[-3000:]
    assert stdout.strip() == digest and store.verify_object(digest)


def test_a_multipart_upload_that_keeps_failing_is_aborted_by_its_writer_in_one_line(proxy, tmp_path):
    big = tmp_path / "checkpoint.safetensors"
    big.write_bytes(os.urandom(2 * PART + 7))
    prefix = uuid.uuid4().hex
    proxy.fail("PUT", r"partNumber=2\b", 500, times=None)
    writer = _upload(proxy, f"s3://{BUCKET}/{prefix}", big)
    _, stderr = writer.communicate(timeout=300)
    assert writer.returncode != 0
    last = stderr.strip().splitlines()[-1]
    assert last.startswith("storage.store.StoreIOError: cannot write s3://") and "HTTP 500 InternalError" in last
    store = s3_store(proxy.url, prefix)
    assert list(store.iter_objects()) == []
    assert not [u for u in store.fs.list_multipart_uploads(BUCKET) if u["Key"].startswith(f"{prefix}/")]


# -- clocks ------------------------------------------------------------------------------------
@pytest.mark.parametrize("skew_hours", [-7, 7], ids=["store-behind", "store-ahead"])
def test_gc_measures_ages_on_the_stores_clock(proxy, skew_hours):
    """A store 7 h behind this host: by this host's clock, what a running stage wrote a second ago
    is 7 h old and a 6 h grace would take it; on the store's clock it is young. (7 h ahead: the
    same, so that old litter is not kept 7 h longer.)"""
    proxy.skew_s = skew_hours * HOUR_S
    store = s3_store(proxy.url)
    uncommitted = store.put_bytes(b"written by a stage that has not committed yet")
    store.write_record("leases/child-run.json", {"beat": 1})
    report = collect_garbage(store, dry_run=False)
    assert report.objects == [] and report.young == [uncommitted] and report.leases == []
    assert store.has_object(uncommitted) and store.read_record("leases/child-run.json") == {"beat": 1}
    assert collect_garbage(store, dry_run=False, grace_hours=0).objects == [uncommitted]  # measured, not guessed: it goes at 0
    assert report.clock_offset_s == pytest.approx(skew_hours * HOUR_S, abs=5)


def test_gc_on_a_host_whose_clock_runs_ahead_keeps_fresh_objects_and_a_lease_dated_in_the_future(
        tmp_path, monkeypatch):
    """A local store, this host's clock 7 h ahead (time.time shifted: the fault is the clock), a
    lease whose time lies a day ahead (written by a host whose clock ran ahead)."""
    store = ArtifactStore(str(tmp_path / "store"))
    fresh = store.put_bytes(b"written a second ago")
    store.write_record("leases/ahead.json", {"beat": 9})
    future = time.time() + 24 * HOUR_S
    os.utime(f"{store.root}/leases/ahead.json", (future, future))
    real = time.time
    monkeypatch.setattr(storage.gc, "time", SimpleNamespace(time=lambda: real() + 7 * HOUR_S))
    report = collect_garbage(store, dry_run=False)
    assert report.young == [fresh] and report.objects == [] and report.leases == []
    assert collect_garbage(store, dry_run=False, grace_hours=0).leases == []  # dated ahead of the store's now: young
    assert store.read_record("leases/ahead.json") == {"beat": 9}
    assert report.clock_offset_s == pytest.approx(-7 * HOUR_S, abs=5)
