"""Fault campaign for the artifact store: kill `race run` (or `race cover`) at random moments while
`race gc --delete --grace-hours 0` runs beside it, then check that the store survived. On a local
store or on S3 (moto's server on 127.0.0.1, started here).

Usage:

    .venv/bin/python scripts/fault_campaign.py [--kills 20] [--seed 0] [--work DIR] [--store local|s3]
                                               [--command run|cover] [--trajectories 24]

`--command cover` kills `race cover` (ingest, cover, compress; no Prefect, no SFT): seconds per run,
the size CI runs (tests/test_fault_campaign.py: `--kills 1 --command cover --trajectories 8` on
the local store and on S3).

What it does (all randomness from --seed):
1. builds the tiny checkpoint and the demo inputs under WORK/home, and runs the command once,
   undisturbed, into a separate store (clean-store): the reference results and the run time T;
2. `--kills` times: starts the command (most rounds with `--force` on random stages, so that a
   cached store still gives the kill work and writes to interrupt) (the real CLI, `python -m flows.cli`, in its own process
   group) on the store, starts `race gc --delete --grace-hours 0` (a real subprocess too) after a
   random delay, and SIGKILLs the run's process group after another random delay (both up to ~T);
   a run that ends before its kill is "completed" (or "failed", e.g. when gc took an object it had
   written but not committed yet: the fault the store must survive). A run or gc that hangs past
   its timeout is a stuck store: a mismatch;
3. checks every committed manifest under stages/: each object it records (`object_sizes`, else its
   `objects`) must exist and `verify_object`. A corrupt object or unreadable manifest is a mismatch;
   a missing object is "damaged by a gc race" (gc read the references before the manifest landed),
   which the next run must repair by recomputing that stage;
4. a final undisturbed run: it must succeed, report cached exactly the stages whose manifest was
   present and intact before it, leave every manifest intact and verified, and its summary's objects
   (rejects, decisions, compressed, and for `run` sft_checkpoint) must equal the clean run's.
Exit status: 1 on any mismatch or a failed final run, else 0.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

STAGES = {"run": ["ingest", "validate", "cover", "compress", "sft"], "cover": ["ingest", "cover", "compress"]}
RESULT_KEYS = {"run": ["rejects", "decisions", "compressed", "sft_checkpoint"],
               "cover": ["rejects", "decisions", "compressed"]}
SFT_STEPS = "20"
BUCKET = "race-campaign"
S3_ENV = {"AWS_ACCESS_KEY_ID": "x", "AWS_SECRET_ACCESS_KEY": "x", "AWS_SESSION_TOKEN": "x",
          "AWS_DEFAULT_REGION": "us-east-1"}


def _env(prefect_home: Path) -> dict[str, str]:
    env = dict(os.environ)
    env.pop("PREFECT_API_URL", None)
    env.update(PREFECT_HOME=str(prefect_home), PREFECT_SERVER_ANALYTICS_ENABLED="false",
               TOKENIZERS_PARALLELISM="false", HF_HUB_OFFLINE="1", PYTHONPATH=str(ROOT))
    return env


def _start_moto() -> tuple[object, str]:
    """moto's S3 server on 127.0.0.1 (a thread of this process) with the campaign's bucket; its
    endpoint goes to this process's and the children's environment."""
    import boto3
    from moto.server import ThreadedMotoServer

    os.environ.update(S3_ENV)
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=0, verbose=False)
    server.start()
    host, port = server.get_host_and_port()
    endpoint = f"http://{host}:{port}"
    os.environ.update(AWS_ENDPOINT_URL=endpoint, FSSPEC_S3_ENDPOINT_URL=endpoint)
    boto3.client("s3", endpoint_url=endpoint, region_name="us-east-1").create_bucket(Bucket=BUCKET)
    return server, endpoint


def _race_cmd(command: str, inputs: list[str], checkpoint: Path, store: str, summary: Path, out: Path,
              force: list[str] = ()) -> list[str]:
    common = ["--input", *inputs, "--checkpoint", str(checkpoint), "--store", store,
              *(["--force", *force] if force else [])]
    if command == "cover":
        return [sys.executable, "-m", "flows.cli", "cover", *common, "--out", str(out)]
    return [sys.executable, "-m", "flows.cli", "run", *common, "--stages", *STAGES["run"], "--sft-steps", SFT_STEPS,
            "--summary", str(summary)]


def _gc_cmd(store: str) -> list[str]:
    return [sys.executable, "-m", "flows.cli", "gc", "--store", store, "--delete", "--grace-hours", "0"]


def _start(cmd: list[str], env: dict[str, str], log: Path, stdout: Path | None = None) -> subprocess.Popen:
    """`cmd` in its own process group, its output to `log` (stdout to `stdout` when given)."""
    fh = open(log, "wb")  # noqa: SIM115 - closed with the process in _finish
    out = open(stdout, "wb") if stdout else None  # noqa: SIM115
    proc = subprocess.Popen(cmd, cwd=ROOT, env=env, stdout=out or fh, stderr=fh if out else subprocess.STDOUT,
                            start_new_session=True)
    proc._log = [f for f in (fh, out) if f]  # type: ignore[attr-defined]
    return proc


def _kill_group(proc: subprocess.Popen) -> None:
    try:
        os.killpg(proc.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def _finish(proc: subprocess.Popen, timeout: float) -> int | None:
    """Wait for `proc`; None if it hung past `timeout` (then its group is killed)."""
    try:
        rc = proc.wait(timeout=timeout)
    except subprocess.TimeoutExpired:
        _kill_group(proc)
        proc.wait()
        rc = None
    _kill_group(proc)  # leftovers of the group (a Prefect server child)
    for fh in proc._log:  # type: ignore[attr-defined]
        fh.close()
    return rc


def _tail(log: Path, lines: int = 3) -> str:
    text = log.read_text(errors="replace").strip().splitlines()
    return " | ".join(text[-lines:])


def check_store(store_url: str) -> dict:
    """Every committed manifest: intact (all objects there and verified), damaged (an object
    missing) or corrupt (bytes not matching the digest, a manifest unreadable)."""
    from storage.store import ArtifactStore, _referenced

    store = ArtifactStore(store_url)
    out = {"manifests": 0, "objects": 0, "intact": set(), "damaged": [], "corrupt": []}
    for stage in store.list_stages():
        for key in store.list_manifests(stage):
            out["manifests"] += 1
            try:
                manifest = store.read_manifest(stage, key)
                digests = list((manifest.get("object_sizes") or {}) or _referenced(manifest))
            except Exception as exc:  # a torn or unparsable manifest: the commit point is broken
                out["corrupt"].append(f"{stage}/{key}: unreadable manifest: {exc}")
                continue
            missing = []
            for digest in digests:
                if not store.has_object(digest):
                    missing.append(digest)
                elif store.verify_object(digest):
                    out["objects"] += 1
                else:
                    out["corrupt"].append(f"{stage}/{key}: object {digest} does not hash to its name")
            if missing:
                out["damaged"].append(f"{stage}/{key}: {len(missing)} object(s) missing, e.g. {missing[0]}")
            else:
                out["intact"].add((stage, key))
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--kills", type=int, default=20, help="killed runs to attempt (default 20)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--work", help="work folder (default: a new temp folder)")
    ap.add_argument("--store", choices=("local", "s3"), default="local",
                    help="a folder under WORK, or a bucket of moto's S3 server on 127.0.0.1 (default: local)")
    ap.add_argument("--command", choices=("run", "cover"), default="run",
                    help="kill `race run` (Prefect, up to SFT) or `race cover` (no Prefect; seconds a run)")
    ap.add_argument("--trajectories", type=int, default=24, help="demo trajectories in the input (default 24)")
    args = ap.parse_args(argv)
    rng = random.Random(args.seed)
    work = Path(args.work or tempfile.mkdtemp(prefix="race-faults-")).resolve()
    work.mkdir(parents=True, exist_ok=True)
    logs = work / "logs"
    logs.mkdir(exist_ok=True)
    server = None
    if args.store == "s3":
        server, endpoint = _start_moto()
        base = f"s3://{BUCKET}"
    else:
        endpoint, base = None, str(work)
    try:
        return _campaign(args, rng, work, logs, base, endpoint)
    finally:
        if server is not None:
            server.stop()


def _campaign(args, rng: random.Random, work: Path, logs: Path, base: str, endpoint: str | None) -> int:
    env = _env(work / "prefect")
    (work / "prefect").mkdir(exist_ok=True)
    print(f"work: {work} (seed {args.seed}, kills {args.kills}, store {base}{f' at {endpoint}' if endpoint else ''}, "
          f"race {args.command})", flush=True)

    from flows.cover import demo_inputs
    from race_core.tiny import TINY, ensure_checkpoint

    home = work / "home"
    checkpoint = ensure_checkpoint(home / "checkpoints", TINY)
    inputs = demo_inputs(home, n=args.trajectories)
    store = f"{base}/store"
    stages, result_keys = STAGES[args.command], RESULT_KEYS[args.command]
    mismatches: list[str] = []
    counts = dict(started=0, killed=0, completed=0, failed=0, gc=0, gc_failed=0)

    def start_race(store_url: str, tag: str, force: list[str] = ()) -> tuple[subprocess.Popen, Path]:
        summary = work / f"summary-{tag}.json"
        cmd = _race_cmd(args.command, inputs, checkpoint, store_url, summary, work / f"out-{tag}", force)
        counts["started"] += 1
        return _start(cmd, env, logs / f"{tag}.log", summary if args.command == "cover" else None), summary

    # 1. the clean run (separate store), which also measures T
    t0 = time.monotonic()
    proc, clean_summary = start_race(f"{base}/clean-store", "clean")
    rc = _finish(proc, 1800)
    clean_s = time.monotonic() - t0
    if rc != 0:
        print(f"clean run failed (rc {rc}): {_tail(logs / 'clean.log')}")
        return 1
    clean = json.loads(clean_summary.read_text())["objects"]
    clean_stages = list(json.loads(clean_summary.read_text())["stages"])
    print(f"clean run: {clean_s:.1f} s", flush=True)
    timeout = max(120.0, 6 * clean_s)

    # 2. runs killed at random moments, gc at random moments beside them
    for i in range(args.kills):
        # a cached run is mostly Prefect's start-up: kill early enough to land in one, most of the time
        kill_at = rng.uniform(0.05, 0.7) * clean_s
        gc_at = rng.uniform(0.0, 0.7) * clean_s if rng.random() < 0.8 else None
        # every round forces some stages, so that there is work (and writes) to interrupt
        force = sorted(rng.sample(stages, rng.randint(1, len(stages))))
        log = logs / f"run-{i:03d}.log"
        start = time.monotonic()
        proc, _ = start_race(store, f"run-{i:03d}", force)
        gc_proc = None
        killed = False
        while proc.poll() is None:
            now = time.monotonic() - start
            if gc_at is not None and gc_proc is None and now >= gc_at:
                gc_proc = _start(_gc_cmd(store), env, logs / f"gc-{i:03d}.log")
            if now >= kill_at:
                _kill_group(proc)
                killed = True
                break
            time.sleep(0.05)
        rc = _finish(proc, timeout)
        if gc_proc is not None:
            counts["gc"] += 1
            gc_rc = _finish(gc_proc, timeout)
            if gc_rc is None:
                mismatches.append(f"round {i}: gc hung past {timeout:.0f} s (stuck store)")
            elif gc_rc != 0:
                counts["gc_failed"] += 1
                print(f"  round {i}: gc rc {gc_rc}: {_tail(logs / f'gc-{i:03d}.log')}", flush=True)
        if killed:
            counts["killed"] += 1
            what = f"killed at {kill_at:.1f} s"
        elif rc == 0:
            counts["completed"] += 1
            what = "completed before its kill"
        else:
            counts["failed"] += 1
            what = f"failed (rc {rc}): {_tail(log, 2)}"
        gc_note = f", gc at {gc_at:.1f} s" if gc_at is not None else ""
        print(f"round {i}: force {force or '-'}: {what}{gc_note}", flush=True)
        if rng.random() < 0.3:  # sometimes a gc between runs too (nothing running)
            gc_proc = _start(_gc_cmd(store), env, logs / f"gc-{i:03d}-idle.log")
            counts["gc"] += 1
            if _finish(gc_proc, timeout) != 0:
                counts["gc_failed"] += 1

    # 3. the store after the campaign
    before = check_store(store)
    mismatches += [f"before final run: {c}" for c in before["corrupt"]]
    for d in before["damaged"]:
        print(f"  damaged by a gc race (to be recomputed): {d}")

    # 4. the final undisturbed rerun
    proc, final_summary = start_race(store, "final")
    rc = _finish(proc, timeout)
    final_ok = rc == 0
    if not final_ok:
        mismatches.append(f"final run failed (rc {rc}): {_tail(logs / 'final.log')}")
    else:
        summary = json.loads(final_summary.read_text())
        intact_stages = {stage for stage, _ in before["intact"]}  # one key per stage: one config
        for stage in clean_stages:  # the stages with a manifest (validate has none)
            cached = summary["stages"].get(stage, {}).get("cached")
            expected = stage in intact_stages
            if cached is None:
                mismatches.append(f"final run: stage {stage} missing from the summary")
            elif cached != expected:
                mismatches.append(f"final run: stage {stage} cached={cached}, expected {expected}")
        for name in result_keys:
            if summary["objects"].get(name) != clean.get(name):
                mismatches.append(f"final run: {name} {summary['objects'].get(name)} != clean {clean.get(name)}")
    after = check_store(store)
    mismatches += [f"after final run: {c}" for c in after["corrupt"]]
    mismatches += [f"after final run: {d}" for d in after["damaged"]]

    print(f"runs started: {counts['started']} (fault rounds: killed {counts['killed']}, completed "
          f"{counts['completed']}, failed {counts['failed']}; and the clean and final runs)")
    print(f"kills survived: {counts['killed'] if final_ok else 0}")
    print(f"gc runs: {counts['gc']} (failed {counts['gc_failed']})")
    print(f"manifests checked: {before['manifests'] + after['manifests']} "
          f"(damaged by gc races before the final run: {len(before['damaged'])})")
    print(f"objects verified: {before['objects'] + after['objects']}")
    print(f"mismatches: {len(mismatches)}")
    for m in mismatches:
        print(f"  {m}")
    return 1 if mismatches or not final_ok else 0


if __name__ == "__main__":
    raise SystemExit(main())
