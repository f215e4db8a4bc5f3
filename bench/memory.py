"""Peak RSS of the real cover stage (`tasks.stages.cover`, sharded) does not grow with N.

Each N runs in a fresh process (peak RSS is a high-water mark): the synthetic trajectories are
written to a temporary store as a `trajectories` dataset beforehand, the process loads the model,
then the cover stage covers them shard by shard and writes its `decisions` dataset, as in the
pipeline. Each row also gives the hf scorer's KV budget, the most bytes of KV-prefix copies it held
at once and how many copies it dropped to stay within the budget.

    python -m bench.memory --sizes 64 1024 --shard-size 64 [--kv-budget 4MiB]
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

from bench.workload import MODELS, Workload, checkpoint_for, iter_synthetic
from race_core.memory import format_size, parse_size
from race_core.render import Renderer

if TYPE_CHECKING:
    from storage import ArtifactStore

REPO_ROOT = Path(__file__).resolve().parents[1]


def cover_stage(store: ArtifactStore, trajectories_digest: str, checkpoint: Path, scorer_factory: Callable[[], Any],
                shard_size: int, batch_size: int) -> dict[str, Any]:
    """The one call of the real cover stage (`tasks.stages.cover`, default `CoverConfig`); its manifest."""
    from race_core.config import CoverConfig, Resources
    from race_core.policy import checkpoint_digest
    from tasks.stages import cover

    return cover(store, trajectories_digest, str(checkpoint), checkpoint_digest(checkpoint), CoverConfig(),
                 Resources(batch_size=batch_size, shard_size=shard_size), scorer_factory=scorer_factory)


def _peak_rss_mb() -> float:
    """This process's peak RSS: Linux's VmHWM, which starts afresh at exec (ru_maxrss keeps the
    high-water mark of the process before exec: here the parent that made the trajectories)."""
    try:
        with open("/proc/self/status") as fh:
            for line in fh:
                if line.startswith("VmHWM:"):
                    return int(line.split()[1]) / 1024
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def memory_child(model_name: str, cache_dir: str, store_root: str, trajectories_digest: str, shard_size: int,
                 turns: int, batch_size: int, kv_budget: int = 0) -> dict:
    """Run in a fresh process: load the model, then cover the stored trajectories with the cover stage."""
    from race_core.policy import load_policy
    from race_core.scoring.hf import HFScorer
    from storage import ArtifactStore
    from storage.parquet import iter_rows_from_store

    checkpoint = checkpoint_for(model_name, cache_dir)
    store = ArtifactStore(store_root)
    model, tokenizer = load_policy(checkpoint)
    loaded = _peak_rss_mb()
    scorers: list[HFScorer] = []

    def scorer() -> HFScorer:
        scorers.append(HFScorer(model, tokenizer, batch_size=batch_size, kv_budget=kv_budget))
        return scorers[-1]

    manifest = cover_stage(store, trajectories_digest, checkpoint, scorer, shard_size, batch_size)
    peak = _peak_rss_mb()
    accepted = sum(row["accepted"] for row in iter_rows_from_store(store, manifest["objects"]["decisions"],
                                                                   "decisions"))
    metrics = manifest["metrics"]
    return {"N": metrics["trajectories"], "shard_size": shard_size, "T": turns, "model": model_name,
            "accepted_removals": accepted, "rss_after_load_mb": loaded, "peak_rss_mb": peak,
            "kv_budget": scorers[0].kv_budget, "kv_bytes_peak": metrics["kv_bytes_peak"],
            "kv_evictions": metrics["kv_evictions"], "tokens_processed": metrics["tokens_processed"]}


def memory_bench(model_name: str, cache_dir: str, sizes: Sequence[int], shard_size: int, turns: int,
                 batch_size: int, kv_budget: int = 0) -> list[dict]:
    """`memory_child` once per N, each in its own process; the synthetic trajectories are written to a
    temporary store here first, so that making them does not count in the child's peak RSS."""
    from race_core.policy import load_tokenizer
    from storage import ArtifactStore
    from storage.parquet import write_dataset_to_store

    checkpoint = checkpoint_for(model_name, cache_dir)  # build once, outside the measured processes
    renderer = Renderer(load_tokenizer(checkpoint))
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO_ROOT), os.environ.get("PYTHONPATH")]))}
    out = []
    for n in sizes:
        with tempfile.TemporaryDirectory(prefix="race-bench-memory-") as root:
            digest, _ = write_dataset_to_store(ArtifactStore(root), "trajectories",
                                               iter_synthetic(renderer, Workload(n=n, turns=turns)))
            code = ("import json; from bench.memory import memory_child; "
                    f"print(json.dumps(memory_child({model_name!r}, {cache_dir!r}, {root!r}, {digest!r}, "
                    f"{shard_size}, {turns}, {batch_size}, {kv_budget})))")
            proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True, env=env)
        out.append(json.loads(proc.stdout.strip().splitlines()[-1]))
    return out


def format_rows(rows: Sequence[dict]) -> str:
    lines = ["### peak RSS of the cover stage, sharded (one process per N)", "",
             "| model | N | shard size | T | RSS after model load MB | peak RSS MB | KV budget | KV held at peak "
             "| KV copies dropped | tokens fed |",
             "| --- | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: | ---: |"]
    lines += [f"| {r['model']} | {r['N']} | {r['shard_size']} | {r['T']} | {r['rss_after_load_mb']:.0f} | "
              f"{r['peak_rss_mb']:.0f} | {format_size(r['kv_budget'])} | {format_size(r['kv_bytes_peak'])} "
              f"({r['kv_bytes_peak']:,} B) | {r['kv_evictions']:,} | {r['tokens_processed']:,} |" for r in rows]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m bench.memory", description=__doc__.splitlines()[0])
    p.add_argument("--model", choices=MODELS, default="tiny")
    p.add_argument("--sizes", type=int, nargs="+", default=[64, 1024], help="N: trajectories, one process each")
    p.add_argument("--shard-size", type=int, default=64)
    p.add_argument("--turns", type=int, default=Workload.turns)
    p.add_argument("--batch-size", type=int, default=16)
    p.add_argument("--kv-budget", type=parse_size, default=0, help="e.g. 4MiB (default 0: automatic)")
    p.add_argument("--cache-dir", default=".race/checkpoints", help="where the checkpoints are built")
    p.add_argument("--json", help="write the rows here")
    args = p.parse_args(argv)
    rows = memory_bench(args.model, args.cache_dir, args.sizes, args.shard_size, args.turns, args.batch_size,
                        args.kv_budget)
    print(format_rows(rows))
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(rows, indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
