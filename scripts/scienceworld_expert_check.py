"""ScienceWorld's expert on many variations: does it win every variation of every chosen task type?
(issue 61's target on the test variations; too slow for the test suite: a variation's gold path, its
cleaning and the episode take several seconds of the simulator.)

    .venv/bin/python scripts/scienceworld_expert_check.py --per-type 10 --json docs/results/smollm2-scienceworld/expert.json

For each task type of the shape (`random`: the short ones) and each split, the first N variations of the
package's list (0: all of them): the task's record, the expert's commands (the gold path without its
noise, replayed), then the expert's episode through the environment within the task's budget (the paper's
30 turns); a variation it loses (a path longer than the budget loses) or that raises
is listed. Records go to the cache (`$RACE_SCIENCEWORLD_CACHE`), so a second run replays only.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from race_core.cpu import cpu_facts
from race_core.envs.scienceworld.world import (
    SCIENCEWORLD,
    SHAPE_TYPES,
    SPLITS,
    ScienceWorldExpert,
    task_of,
    variations,
    version,
)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--per-type", type=int, default=10, help="variations per task type and split (0: all)")
    parser.add_argument("--shape", default="random", choices=sorted(SHAPE_TYPES), help="the task types")
    parser.add_argument("--splits", nargs="+", default=["heldout", "train"], choices=sorted(SPLITS))
    parser.add_argument("--json", default=None, help="write the record here")
    args = parser.parse_args(argv)
    started = time.time()
    record: dict = {"cpu": cpu_facts(), "scienceworld": version(), "shape": args.shape, "per_type": args.per_type,
                    "task_types": {}, "failures": []}
    lists = variations()
    for task_type in SHAPE_TYPES[args.shape]:
        for split in args.splits:
            chosen = lists[task_type][SPLITS[split]]
            chosen = chosen[:args.per_type] if args.per_type else chosen
            won, turns, gold = 0, [], []
            for variation in chosen:
                try:
                    task = task_of(task_type, variation, SPLITS[split])
                    expert = ScienceWorldExpert.for_task(task, random.Random(variation))
                    episode = SCIENCEWORLD.run_episode(task, expert, task.turn_budget)  # within the paper's 30 turns
                except Exception as exc:  # a variation that breaks the expert is a finding, not a crash
                    record["failures"].append({"task_type": task_type, "split": split, "variation": variation,
                                               "error": repr(exc)})
                    continue
                if episode.success:
                    won += 1
                    turns.append(len(episode.turns))
                    gold.append(len(task.gold))
                else:
                    record["failures"].append({"task_type": task_type, "split": split, "variation": variation})
            record["task_types"][f"{task_type}/{split}"] = {
                "variations": len(chosen), "won": won, "expert_turns": [min(turns, default=0), max(turns, default=0)],
                "mean_expert_turns": round(sum(turns) / max(len(turns), 1), 2),
                "mean_gold_steps": round(sum(gold) / max(len(gold), 1), 2)}
            print(f"{task_type}, {split}: expert won {won}/{len(chosen)} "
                  f"({round(time.time() - started)} s so far)", flush=True)
    record["seconds"] = round(time.time() - started, 1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 1 if record["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
