"""The cooking games' expert on many games: does it win every generated game of every size tier on
both splits? (issue 59's first target; too slow for the test suite: a game compiles in about 2 s.)

    .venv/bin/python scripts/textworld_expert_check.py --seeds 100 --json docs/results/smollm2-textworld/expert.json

For each seed, each tier (1-3 ingredients) and each split, one game: generate_tasks(1, seed) (held-out:
heldout_seed(seed)), the expert's commands (the walkthrough without its noise, replayed), then the
expert's episode through the environment; a game it loses or that raises is listed by its parameters.
"""

from __future__ import annotations

import argparse
import json
import random
import sys
import time
from pathlib import Path

from race_core.cpu import cpu_facts
from race_core.envs.base import heldout_seed
from race_core.envs.textworld.cooking import TEXTWORLD_COOKING, CookingExpert, generate_tasks


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seeds", type=int, default=100, help="games per tier and split (seeds 0..N-1)")
    parser.add_argument("--tiers", type=int, nargs="+", default=[1, 2, 3], help="ingredients per game")
    parser.add_argument("--splits", nargs="+", default=["train", "heldout"], choices=["train", "heldout"])
    parser.add_argument("--json", default=None, help="write the record here")
    args = parser.parse_args(argv)
    started = time.time()
    record: dict = {"cpu": cpu_facts(), "seeds": args.seeds, "tiers": {}, "failures": []}
    for tier in args.tiers:
        for split in args.splits:
            won, turns, walkthrough = 0, [], []
            for seed in range(args.seeds):
                drawn = heldout_seed(seed) if split == "heldout" else seed
                try:
                    task = generate_tasks(1, drawn, difficulty=tier, split=split)[0]
                    expert = CookingExpert.for_task(task, random.Random(seed))
                    episode = TEXTWORLD_COOKING.run_episode(task, expert, len(expert.commands))
                except Exception as exc:  # a game that breaks the expert is a finding, not a crash
                    record["failures"].append({"tier": tier, "split": split, "seed": drawn, "error": repr(exc)})
                    continue
                if episode.success:
                    won += 1
                    turns.append(len(episode.turns))
                    walkthrough.append(len(task.walkthrough))
                else:
                    record["failures"].append({"tier": tier, "split": split, "seed": drawn, "game": task.game.stem()})
            record["tiers"][f"{tier}/{split}"] = {
                "games": args.seeds, "won": won, "expert_turns": [min(turns, default=0), max(turns, default=0)],
                "mean_expert_turns": round(sum(turns) / max(len(turns), 1), 2),
                "mean_walkthrough_steps": round(sum(walkthrough) / max(len(walkthrough), 1), 2)}
            print(f"{tier} ingredient(s), {split}: expert won {won}/{args.seeds}", flush=True)
    record["seconds"] = round(time.time() - started, 1)
    if args.json:
        Path(args.json).parent.mkdir(parents=True, exist_ok=True)
        Path(args.json).write_text(json.dumps(record, indent=2) + "\n")
    print(json.dumps(record, indent=2))
    return 1 if record["failures"] else 0


if __name__ == "__main__":
    sys.exit(main())
