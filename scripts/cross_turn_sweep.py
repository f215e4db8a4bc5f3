"""How often the cross-turn check binds on a policy's own successful episodes, at every ε of a sweep.

    python scripts/cross_turn_sweep.py --checkpoint POLICY --env lookup --tasks 64 --samples 2 \\
        --epsilon 0.01 0.03 0.1 0.3 1.0 --out runs/cross-turn

Plays the policy on `--tasks` training tasks of the environment (`--samples` episodes each,
temperature 1), keeps its successful episodes (RACE's input, as `race ablate` makes it), runs the
cover at every ε twice, as RACE and local-only (`race cover --epsilon ... [--local-only]`: stored,
so a rerun computes nothing), and writes `cross_turn.json` and `cross_turn.md`: per ε, the removal
share of each, RACE's candidates rejected only by a later action, the share of local-only's
accepted removals RACE rejected on the same trajectories, the removals by reasoning kind, and the ε
that `race ablate`'s rule (`flows.sweep.choose_epsilon`) takes from the sweep.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", required=True)
    parser.add_argument("--env", default="lookup")
    parser.add_argument("--tasks", type=int, default=64)
    parser.add_argument("--samples", type=int, default=2)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--epsilon", type=float, nargs="+", default=[0.01, 0.03, 0.1, 0.3, 1.0])
    parser.add_argument("--out", default="runs/cross-turn")
    parser.add_argument("--store", default="")
    args = parser.parse_args(argv)
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    store = args.store or str(out / "store")
    inputs = out / "inputs.jsonl"
    started = time.perf_counter()
    if not inputs.exists():
        from race_core.policy import load_policy
        from race_core.rollout import sample_successful_trajectories

        model, tokenizer = load_policy(args.checkpoint)
        trajectories, played = sample_successful_trajectories(model, tokenizer, args.tasks, args.samples, args.seed,
                                                              1.0, env=args.env)
        inputs.write_text("".join(json.dumps(t.to_dict()) + "\n" for t in trajectories))
        (out / "inputs.json").write_text(json.dumps({"played": played, "successful": len(trajectories),
                                                     "sampling_s": round(time.perf_counter() - started, 1)}))
        print(f"inputs: {len(trajectories)} successful of {played} episodes", file=sys.stderr)
    played = json.loads((out / "inputs.json").read_text())
    for arm, extra in (("race", []), ("local", ["--local-only"])):
        if not (out / arm / "epsilon_sweep.json").exists():
            subprocess.run([sys.executable, "-m", "flows.cli", "cover", "--input", str(inputs), "--checkpoint",
                            args.checkpoint, "--store", store, "--out", str(out / arm), "--epsilon",
                            *map(str, args.epsilon), *extra], check=True, stdout=subprocess.DEVNULL)
    from flows.sweep import choose_epsilon

    rows = [_row(out, epsilon) for epsilon in sorted(args.epsilon)]
    chosen, why = choose_epsilon([{"epsilon": r["epsilon"], "removal_share": r["removal_share"]["race"]} for r in rows])
    result = {"checkpoint": args.checkpoint, "env": args.env, "inputs": played, "rows": rows,
              "chosen_epsilon": chosen, "chosen_because": why,
              "wall_s": round(time.perf_counter() - started, 1)}
    (out / "cross_turn.json").write_text(json.dumps(result, indent=1) + "\n")
    (out / "cross_turn.md").write_text(_table(result))
    print(_table(result))
    return 0


def _row(out: Path, epsilon: float) -> dict:
    import pandas as pd

    from flows.sweep import epsilon_folder
    from race_core.ablation import removed_by_kind
    from race_core.decisions import cross_turn_figure, local_accepted_race_rejected
    from race_core.schema import read_jsonl

    originals, _ = read_jsonl([str(out / "inputs.jsonl")])
    arms = {}
    for arm in ("race", "local"):
        folder = out / arm / epsilon_folder(epsilon)
        decisions = pd.read_parquet(folder / "decisions.parquet")
        compressed = pd.read_parquet(folder / "compressed.parquet")
        arms[arm] = {"decisions": decisions.to_dict("records"),
                     "removed": {row["id"]: [int(t) for t in row["skipped_turns"]] for row in compressed.to_dict("records")}}
    scored = [r for r in arms["race"]["decisions"] if not r["skipped_empty"]]
    removal = {arm: sum(map(len, arms[arm]["removed"].values())) / max(len(scored), 1) for arm in arms}
    return {"epsilon": epsilon, "candidates": len(scored), "removal_share": removal,
            "race_cross_turn": cross_turn_figure(arms["race"]["decisions"]),
            "local_vs_race": local_accepted_race_rejected(arms["race"]["removed"], arms["local"]["removed"]),
            "removed_by_kind": {arm: removed_by_kind(originals, arms[arm]["removed"]) for arm in arms}}


def _table(result: dict) -> str:
    lines = [f"# The cross-turn check on {result['checkpoint']}'s own {result['env']} episodes", "",
             f"{result['inputs']['successful']} successful of {result['inputs']['played']} episodes (temperature 1).",
             "", "| ε | candidates | RACE removes | local removes | RACE: rejected only by a later action | "
                 "local's removals RACE rejects | RACE removes later / redundant | local removes later / redundant |",
             "|---|---|---|---|---|---|---|---|"]
    def kinds(shares: dict, arm: str) -> str:
        return " / ".join("-" if shares[arm][kind]["share"] is None else f"{100 * shares[arm][kind]['share']:.0f}%"
                          for kind in ("later", "redundant"))

    for r in result["rows"]:
        c, g, k = r["race_cross_turn"], r["local_vs_race"], r["removed_by_kind"]
        gap = "-" if g["share"] is None else f"{g['race_rejected']}/{g['local_accepted']} ({100 * g['share']:.0f}%)"
        lines.append(f"| {r['epsilon']:g} | {r['candidates']} | {100 * r['removal_share']['race']:.1f}% | "
                     f"{100 * r['removal_share']['local']:.1f}% | {c['rejected_by_later']} "
                     f"({100 * (c['share'] or 0):.1f}%) | {gap} | {kinds(k, 'race')} | {kinds(k, 'local')} |")
    lines += ["", f"The ε `race ablate` takes from this sweep: {result['chosen_epsilon']:g} ({result['chosen_because']})."]
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    sys.exit(main())
