"""`race bench price`: this machine class's per-call price for the hf scorer's batch plans
(`race_core.scoring.prices`), measured here, for a table the pipeline reads.

Each model (a `race_core.tiny` preset or a checkpoint folder) is measured `--repeats` times, each
time afresh (`plan.measure_overhead`: a call on one token against one on 4 x 64, rounded to a power of
two); the entry takes their median (the lower middle one of an even count) and lists every figure,
so a reader sees whether the class's price is stable (measure on a quiet machine: a loaded one
slows the one-token call most), with the torch thread count it was measured at. `--out FILE` adds
the entries to a table of your own (point `RACE_FORWARD_PRICES` at it, on every host of a pool);
`--write` adds them to `race_core/scoring/prices.json`, the table the project ships.

    race bench price --models tiny 20m --checkpoint .race/models/smollm2-135m-instruct [--out FILE | --write]
"""

from __future__ import annotations

import argparse
import json
from typing import Any


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--models", nargs="*", default=["tiny"], help="race_core.tiny presets to measure (default: tiny)")
    p.add_argument("--checkpoint", nargs="*", default=[], metavar="DIR", help="save_pretrained folders to measure")
    p.add_argument("--repeats", type=int, default=5, help="fresh measurements per model (default 5)")
    p.add_argument("--cache-dir", default=".race/checkpoints", help="where the tiny presets are built")
    p.add_argument("--out", metavar="FILE", help="add the entries to this table (for RACE_FORWARD_PRICES)")
    p.add_argument("--write", action="store_true", help="add the entries to race_core/scoring/prices.json")


def measure_entry(model, repeats: int) -> dict[str, Any]:
    """The (machine class, model shape) entry of `model`, its price the median of `repeats` measurements."""
    import torch

    from race_core.scoring import plan
    from race_core.scoring.prices import machine_class, model_shape

    figures = []
    for _ in range(repeats):
        plan._measured.pop(model, None)  # afresh: measure_overhead keeps one figure per model object
        figures.append(plan.measure_overhead(model))
    price = sorted(figures)[(len(figures) - 1) // 2]
    return {"machine": machine_class(), "shape": model_shape(model), "forward_overhead": price,
            "measured": figures, "torch_threads": torch.get_num_threads()}


def cmd_bench_price(args: argparse.Namespace) -> int:
    from pathlib import Path

    from bench.workload import checkpoint_for
    from race_core.policy import load_policy
    from race_core.scoring.prices import TABLE, entry_key

    folders = [(name, checkpoint_for(name, args.cache_dir)) for name in args.models]
    folders += [(folder, folder) for folder in args.checkpoint]
    entries = {}
    for name, folder in folders:
        model, _ = load_policy(folder)
        entry = measure_entry(model, args.repeats)
        key = entry_key(entry["machine"], entry["shape"])
        entries[key] = entry
        print(f"{name}: {entry['forward_overhead']:g} positions per call (measured {entry['measured']}) on "
              f"{entry['machine']['cpu']} ({', '.join(entry['machine']['matrix_extensions']) or 'no matrix extensions'}"
              f", {entry['torch_threads']} torch threads): entry {key}")
    print(json.dumps(entries, indent=1, sort_keys=True))
    for path in ([Path(args.out)] if args.out else []) + ([TABLE] if args.write else []):
        old = json.loads(path.read_text()) if path.exists() else {}
        path.write_text(json.dumps({**old, **entries}, indent=1, sort_keys=True) + "\n")
        print(f"written to {path}")
    return 0
