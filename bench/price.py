"""`race bench price`: this machine class's per-call price for the hf scorer's batch plans
(`race_core.scoring.prices`), measured here, for the table the project ships.

Each model (a `race_core.tiny` preset or a checkpoint folder) is measured `--repeats` times, each
time afresh (`plan.measure_overhead`: a call on one token against one on 4 x 64, rounded to a power of
two); the entry takes their median (the lower middle one of an even count) and lists every figure,
so a reader sees whether the class's price is stable (measure on a quiet machine: a loaded one
slows the one-token call most). `--write` adds the entries to
`race_core/scoring/prices.json`, where every machine of this class then finds them.

    race bench price --models tiny 20m --checkpoint .race/models/smollm2-135m-instruct [--write]
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
    p.add_argument("--write", action="store_true", help="add the entries to race_core/scoring/prices.json")


def measure_entry(model, repeats: int) -> dict[str, Any]:
    """The (machine class, model shape) entry of `model`, its price the median of `repeats` measurements."""
    from race_core.scoring import plan
    from race_core.scoring.prices import machine_class, model_shape

    figures = []
    for _ in range(repeats):
        plan._measured.pop(model, None)  # afresh: measure_overhead keeps one figure per model object
        figures.append(plan.measure_overhead(model))
    price = sorted(figures)[(len(figures) - 1) // 2]
    return {"machine": machine_class(), "shape": model_shape(model), "forward_overhead": price,
            "measured": figures}


def cmd_bench_price(args: argparse.Namespace) -> int:
    from bench.workload import checkpoint_for
    from race_core.policy import load_policy
    from race_core.scoring.prices import TABLE, entry_key, table

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
              f", {entry['machine']['torch_threads']} torch threads): entry {key}")
    print(json.dumps(entries, indent=1, sort_keys=True))
    if args.write:
        TABLE.write_text(json.dumps({**table(), **entries}, indent=1, sort_keys=True) + "\n")
        print(f"written to {TABLE}")
    return 0
