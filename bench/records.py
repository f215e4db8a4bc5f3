"""Benchmark records: what a run measured, where, at which commit, kept as JSON under `bench/results/`.

`race bench scoring --record` writes its report as one new file there (a run never rewrites an older
one), with the commit (and whether the tree had uncommitted changes), the facts of the machine
(processor, cores, memory, accelerator, library versions, torch threads) and its load before and
after. `race bench compare A B` prints two records side by side; `race bench table RECORD...` prints
the README's performance tables from records, each saying which machine and commit it came from.

Timings move with the machine and its load; the work counters (`race_core.scoring.WorkCounters`) do
not, so two records of the same workload show at a glance whether the scorer did other work.
"""

from __future__ import annotations

import json
import os
import platform
import subprocess
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parents[1]
RESULTS = REPO_ROOT / "bench" / "results"
# The counters a table or a comparison shows, in this order (all are kept in the record).
TABLE_START, TABLE_END = "<!-- race bench table -->", "<!-- end race bench table -->"  # where --readme writes
SHOWN_WORK = ("forward_calls", "rows", "tokens_processed", "padded_positions", "attention_pairs", "kv_bytes_copied",
              "evictions")


def commit() -> dict[str, Any]:
    """The repository's commit and whether its tracked files differ from it (None outside a checkout)."""
    def git(*args: str) -> str | None:
        try:
            return subprocess.run(["git", *args], cwd=REPO_ROOT, capture_output=True, text=True,
                                  check=True).stdout.strip()
        except (OSError, subprocess.CalledProcessError):
            return None

    head = git("rev-parse", "HEAD")
    changed = git("status", "--porcelain", "--untracked-files=no")
    return {"commit": head, "dirty": bool(changed) if changed is not None else None}


def machine() -> dict[str, Any]:
    """The facts that make timings comparable or not: processor, cores, memory, accelerator, versions."""
    import torch
    import transformers

    from race_core.cpu import cpu_facts

    cpu = cpu_facts()
    facts: dict[str, Any] = {"processor": _cpu_model(), "cpu_vendor": cpu["vendor"],
                             "matrix_extensions": cpu["matrix_extensions"], "logical_cores": os.cpu_count(),
                             "memory_bytes": _memory_total(), "platform": platform.platform(),
                             "python": platform.python_version(), "torch": torch.__version__,
                             "transformers": transformers.__version__, "torch_threads": torch.get_num_threads(),
                             "omp_num_threads": os.environ.get("OMP_NUM_THREADS")}
    if torch.cuda.is_available():
        facts["accelerator"] = torch.cuda.get_device_name(0)
    return facts


def _proc_value(path: str, key: str) -> str | None:
    """The value after `key:` on its line of a /proc file (None where there is none)."""
    try:
        with open(path) as fh:
            return next((line.split(":", 1)[1].strip() for line in fh if line.startswith(key)), None)
    except OSError:
        return None


def _cpu_model() -> str:
    return _proc_value("/proc/cpuinfo", "model name") or platform.processor() or platform.machine()


def _memory_total() -> int | None:
    total = _proc_value("/proc/meminfo", "MemTotal")  # "24571236 kB"
    return int(total.split()[0]) * 1024 if total else None


def load() -> list[float] | None:
    """The 1, 5 and 15 minute load averages (None where the system has none)."""
    try:
        return [round(x, 2) for x in os.getloadavg()]
    except OSError:
        return None


def record(report: dict[str, Any], directory: Path | str = RESULTS, label: str = "") -> Path:
    """Write `report` as a new JSON file in `directory`, with the machine's facts and, unless the
    report has them (taken when its run started), the commit and whether the tree differed from it."""
    directory = Path(directory)
    directory.mkdir(parents=True, exist_ok=True)
    stamp = datetime.now(timezone.utc)
    report = {"recorded_at": stamp.isoformat(timespec="seconds"), **commit(), "machine": machine(), **report}
    # (a report that says which commit ran, taken when it started, keeps it)
    name = f"{stamp:%Y%m%dT%H%M%SZ}-{(report.get('commit') or 'nocommit')[:8]}{'-' + label if label else ''}.json"
    path = directory / name
    with open(path, "x") as fh:  # a record is never overwritten
        fh.write(json.dumps(report, indent=1) + "\n")
    return path


def read(path: Path | str) -> dict[str, Any]:
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"benchmark record {str(path)!r}: no such file")
    try:
        data = json.loads(path.read_text())
    except json.JSONDecodeError as exc:
        raise ValueError(f"benchmark record {str(path)!r} is not JSON: {exc}") from exc
    if not isinstance(data, dict) or not isinstance(data.get("runs"), list):
        raise ValueError(f"benchmark record {str(path)!r} has no 'runs' list: not a `race bench scoring` report")
    for run in data["runs"]:
        methods = run.get("methods", [])
        if methods and not any("forward_tokens_per_s_before" in m for m in methods):  # each method its own bound
            strict_bound(run)
    return data


def strict_bound(run: dict[str, Any]) -> None:
    """A record written when each method's ratios used the raw forward timed just before it, read with
    today's rule (`bench.scoring`): the bound is the fastest of those measurements, for every method.
    The record's file is not changed; each method keeps its own measurement as `..._before`."""
    bound, methods = run["bound"], [m for m in run["methods"] if m.get("bound_wall_s")]
    if not methods:
        return
    wall = min(m["bound_wall_s"] for m in methods)
    cpu = min((m["bound_cpu_s"] for m in methods if m.get("bound_cpu_s")), default=None)
    for m in methods:
        m["forward_tokens_per_s_before"] = bound["tokens"] / m["bound_wall_s"]
        m["bound_wall_s"], m["time_vs_bound"] = wall, m["wall_s"] / wall
        if cpu and m.get("cpu_s") is not None:
            m["bound_cpu_s"], m["cpu_vs_bound"] = cpu, m["cpu_s"] / cpu
    bound.update(wall_s=wall, forward_tokens_per_s=bound["tokens"] / wall, measured=(
        "the fastest of the raw forwards timed just before each method (recomputed on reading a record that "
        "used each method's own)"))
    if cpu:
        bound.update(cpu_s=cpu, forward_tokens_per_cpu_s=bound["tokens"] / cpu)


def where(data: dict[str, Any]) -> str:
    """One line: which machine, commit and load a record comes from."""
    m = data.get("machine", {})
    threads = f", {m['torch_threads']} torch threads" if m.get("torch_threads") else ""
    memory = f", {m['memory_bytes'] / 2**30:.0f} GiB" if m.get("memory_bytes") else ""
    device = f", {m['accelerator']}" if m.get("accelerator") else ""
    commit_ = (data.get("commit") or "?")[:8] + (" (uncommitted changes)" if data.get("dirty") else "")
    loads = data.get("load", {})
    load_text = (f"; load {loads['before'][0]:g} before, {loads['after'][0]:g} after"
                 if loads.get("before") and loads.get("after") else "")
    return (f"{m.get('processor', '?')} ({m.get('logical_cores', '?')} logical cores{memory}{device}{threads}), "
            f"commit {commit_}, {data.get('recorded_at', '?')}{load_text}")


def run_label(run: dict[str, Any]) -> str:
    return f"{run['model']} N={run['N']} T={run['T']}"


def _figures(method: dict[str, Any]) -> dict[str, Any]:
    work = method.get("work") or {}
    fed = work.get("tokens_processed")
    return {"wall s": method.get("wall_s"), "CPU s": method.get("cpu_s"), "time vs bound": method.get("time_vs_bound"),
            "time vs bound + head": method.get("time_vs_bound_with_head"),  # records before it: None
            "time vs attention bound": method.get("time_vs_attention_bound"),  # records before it: None
            "CPU vs bound": method.get("cpu_vs_bound"), "tokens vs bound": method.get("tokens_vs_bound"),
            "padded / fed": work["padded_positions"] / fed if fed and "padded_positions" in work else None,
            **{name: work.get(name) for name in SHOWN_WORK}}


def _cell(value: Any) -> str:
    if value is None:
        return "n/a"
    if isinstance(value, float):
        return f"{value:,.2f}"
    return f"{value:,}" if isinstance(value, int) else str(value)


def compare(a: dict[str, Any], b: dict[str, Any], names: tuple[str, str] = ("A", "B")) -> str:
    """Two records side by side: each run (model, N, T) they share, each method, each figure, and
    B / A where both have it."""
    lines = [f"{names[0]}: {where(a)}", f"{names[1]}: {where(b)}", ""]
    runs_b = {run_label(r): r for r in b["runs"]}
    for run_a in a["runs"]:
        run_b = runs_b.get(run_label(run_a))
        if run_b is None:
            lines.append(f"### {run_label(run_a)}: only in {names[0]}\n")
            continue
        lines += [f"### {run_label(run_a)}", "", f"| method | figure | {names[0]} | {names[1]} | {names[1]} / {names[0]} |",
                  "| --- | --- | ---: | ---: | ---: |"]
        methods_b = {m["name"]: m for m in run_b["methods"]}
        for method_a in run_a["methods"]:
            method_b = methods_b.get(method_a["name"])
            fig_a = _figures(method_a)
            fig_b = _figures(method_b) if method_b else {}
            for figure, x in fig_a.items():
                y = fig_b.get(figure)
                ratio = f"{y / x:.2f}" if isinstance(x, int | float) and isinstance(y, int | float) and x else ""
                lines.append(f"| {method_a['name']} | {figure} | {_cell(x)} | {_cell(y)} | {ratio} |")
        lines.append("")
    lines += [f"### {label}: only in {names[1]}\n" for label in runs_b
              if label not in {run_label(r) for r in a["runs"]}]
    return "\n".join(lines).rstrip() + "\n"


def machine_label(data: dict[str, Any]) -> str:
    """The CPU a record ran on: its model and the matrix extensions it listed (records written
    before the extensions were recorded say so)."""
    m = data.get("machine", {})
    extensions = m.get("matrix_extensions")
    if extensions is None:
        ext = "matrix extensions not recorded"
    else:
        ext = ", ".join(extensions) if extensions else "no matrix extensions"
    device = f", {m['accelerator']}" if m.get("accelerator") else ""
    return f"{m.get('processor', '?')} ({ext}{device})"


def table(records: list[tuple[str, dict[str, Any]]]) -> str:
    """The README's performance table from records: one row per (run, method), with the work
    counters beside the ratios (to the bound, to the bound plus the head's time and to the bound with
    attention, `bench.scoring.attention_bound`, where the record measured them), grouped by the machine each record ran on (`machine_label`: the CPU model and its
    matrix extensions; M1, M2... in order of first appearance), and under it which machine, commit
    and load each record comes from."""
    machines: dict[str, list[tuple[str, dict[str, Any]]]] = {}
    for name, data in records:
        machines.setdefault(machine_label(data), []).append((name, data))
    lines = ["| record | machine | model | N | T | method | wall s | time vs bound | vs bound + head "
             "| vs bound + attention | CPU vs bound | tokens vs bound | padded / fed | forwards |",
             "| --- | --- | --- | ---: | ---: | --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    notes, k = [], 0
    for j, (label, group) in enumerate(machines.items(), 1):
        notes.append(f"M{j}: {label}")
        for name, data in group:
            k += 1
            notes.append(f"[{k}] `{name}`: {where(data)}")
            for run in data["runs"]:
                row = f"| [{k}] | M{j} | {run['model']} | {run['N']} | {run['T']} |"
                for method in run["methods"]:
                    f = _figures(method)
                    lines.append(f"{row} {method['name']} | "
                                 f"{_cell(f['wall s'])} | {_ratio(f['time vs bound'])} | "
                                 f"{_ratio(f['time vs bound + head'])} | {_ratio(f['time vs attention bound'])} | "
                                 f"{_ratio(f['CPU vs bound'])} | "
                                 f"{_ratio(f['tokens vs bound'])} | {_ratio(f['padded / fed'])} | "
                                 f"{_cell(f['forward_calls'])} |")
                bound = run["bound"]
                head = bound.get("head_wall_s")
                with_head = "" if head is None else f"{bound['wall_s'] / (bound['wall_s'] + head):.2f}x"
                attention = bound.get("attention", {}).get("wall_s")
                with_attention = "" if attention is None else f"{bound['wall_s'] / attention:.2f}x"
                lines.append(f"{row} work bound | {bound['wall_s']:,.2f} | 1.00x | {with_head} | {with_attention} "
                             "| 1.00x | 1.00x | | |")
    return "\n".join(lines) + "\n\n" + "\n".join(notes) + "\n"


def latest(records: list[tuple[str, dict[str, Any]]]) -> list[tuple[str, dict[str, Any]]]:
    """Of `records`, each run only in the newest record (`recorded_at`) with a run of the same workload
    (model, N, T, workload) on the same machine (`machine_label`); a record left with no run is dropped.
    The README shows where each workload stands on each machine; the whole history is the docs' table."""
    def key(data: dict[str, Any], run: dict[str, Any]) -> tuple:
        return (machine_label(data), run["model"], run["N"], str(run["T"]),
                json.dumps(run.get("workload"), sort_keys=True))

    newest: dict[tuple, str] = {}
    for name, data in sorted(records, key=lambda item: item[1].get("recorded_at", "")):
        for run in data["runs"]:
            newest[key(data, run)] = name
    kept = []
    for name, data in records:
        runs = [run for run in data["runs"] if newest[key(data, run)] == name]
        if runs:
            kept.append((name, {**data, "runs": runs}))
    return kept


def _ratio(value: float | None) -> str:
    return "" if value is None else f"{value:.2f}x"


def main_compare(a: str, b: str) -> str:
    return compare(read(a), read(b), (Path(a).name, Path(b).name))


def main_table(paths: list[str], newest_only: bool = False) -> str:
    loaded = [(Path(p).name, read(p)) for p in paths]
    return table(latest(loaded) if newest_only else loaded)


def replace_table(path: Path | str, text: str) -> None:
    """Put `text` between the lines TABLE_START and TABLE_END of the file at `path` (both must be there)."""
    path = Path(path)
    lines = path.read_text().splitlines(keepends=True)
    marks = [i for i, line in enumerate(lines) if line.strip() in (TABLE_START, TABLE_END)]
    if len(marks) != 2 or lines[marks[0]].strip() != TABLE_START:
        raise ValueError(f"{str(path)!r} needs one line {TABLE_START!r} and, after it, one line {TABLE_END!r}")
    path.write_text("".join(lines[:marks[0] + 1]) + text.rstrip("\n") + "\n" + "".join(lines[marks[1]:]))
