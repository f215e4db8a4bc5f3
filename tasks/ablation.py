"""The ablation's stages and report (`race ablate`, issue 17), as plain functions.

`derived_arm` writes the `none`, `random` and `all` arms' trajectories as a `compressed` dataset
(the same kind the SFT stage reads), cached under its stage key like every stage. `write_ablation`
turns the arms' evaluations into `ablation.json`, `report.md`, `report.html` and `ablation.png`.
"""

from __future__ import annotations

import json
import logging
import statistics
from pathlib import Path
from typing import Any

from race_core.ablation import ARMS, derived_removal, phases_of, removed_by_kind
from race_core.config import CoverConfig
from race_core.decisions import cross_turn_text
from report.markdown import rl_table
from report.page import write_page
from storage import ArtifactStore
from storage.parquet import iter_rows_from_store
from tasks.policy_ref import PolicyRef
from tasks.stages import iter_trajectories, run_stage, write_compressed

logger = logging.getLogger(__name__)

METRICS = ("success_rate", "reasoning_tokens_per_episode")


def removals(store: ArtifactStore, compressed_digest: str) -> dict[str, list[int]]:
    """trajectory id -> the turns whose reasoning a `compressed` dataset removed."""
    return {row["id"]: [int(t) for t in row["skipped_turns"]]
            for row in iter_rows_from_store(store, compressed_digest, "compressed")}


def derived_arm(store: ArtifactStore, trajectories_digest: str, race_compressed: str, arm: str, checkpoint: str,
                model_digest: str, epsilon: float, seed: int = 0, only_cached: bool = False,
                force: bool = False) -> dict[str, Any]:
    """The `arm` version (none, random or all) of the trajectories the race arm holds (random: matched
    to its removed reasoning tokens, counted by the checkpoint's tokenizer)."""

    def compute() -> dict[str, Any]:
        from race_core.policy import load_tokenizer

        race = removals(store, race_compressed)
        tokenizer = load_tokenizer(checkpoint)
        count = (lambda text: len(tokenizer.encode(text, add_special_tokens=False))) if arm == "random" else len
        pairs = ((t, derived_removal(arm, t, race[t.id], seed, count))
                 for t in iter_trajectories(store, trajectories_digest) if t.id in race)
        manifest = write_compressed(store, pairs, checkpoint, model_digest, epsilon)
        m = manifest["metrics"]
        logger.info(f"arm {arm}: removed reasoning in {m['removed']} turns; reasoning tokens "
                    f"{m['reasoning_tokens_before']} -> {m['reasoning_tokens_after']}")
        return manifest

    return run_stage(store, "arm", {"arm": arm, "seed": seed, "epsilon": epsilon},
                     {"trajectories": trajectories_digest, "race": race_compressed}, model_digest, compute,
                     only_cached, force)


def arm_stage(store: ArtifactStore, *, trajectories: dict[str, Any], race: dict[str, Any], arm: str,
              policy: PolicyRef | dict[str, Any], config: CoverConfig, only_cached: bool = False,
              force: bool = False) -> dict[str, Any]:
    """The arm stage's entry (`tasks.declarations`): the `arm` version of a race compress manifest."""
    policy = PolicyRef.of(policy)
    return derived_arm(store, trajectories["objects"]["trajectories"], race["objects"]["compressed"], arm,
                       policy.local_path(store), policy.digest, config.epsilon, only_cached=only_cached, force=force)


def kind_shares(store: ArtifactStore, trajectories_digest: str, compressed: dict[str, str]) -> dict[str, Any]:
    """arm -> removed_by_kind, for each arm's `compressed` digest."""
    originals = list(iter_trajectories(store, trajectories_digest))
    return {arm: removed_by_kind(originals, removals(store, digest)) for arm, digest in compressed.items()}


def spread(values: list[float]) -> dict[str, float]:
    return {"mean": statistics.fmean(values), "min": min(values), "max": max(values),
            "std": statistics.stdev(values) if len(values) > 1 else 0.0}


def summarize(arms: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """(arm, phase) -> mean / min / max / std over seeds of each metric."""
    out: dict[str, dict[str, Any]] = {}
    for entry in arms:
        phases = {entry["arm"]: entry} | {f"{entry['arm']}+{p}": entry[p] for p in phases_of(entry)}
        for key, values in phases.items():
            for m in METRICS:
                out.setdefault(key, {}).setdefault(m, []).append(values[m])
    return {key: {m: spread(v) for m, v in metrics.items()} | {"seeds": len(metrics[METRICS[0]])}
            for key, metrics in out.items()}


def write_ablation(out_dir: str | Path, result: dict[str, Any]) -> dict[str, Path]:
    """`ablation.json`, `ablation.png` (success vs reasoning tokens, one point per arm and seed, and the
    trade-off curve of RACE and local-only over ε where the run has one),
    `report.md` and `report.html` (the same as one self-contained page) in `out_dir`."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    result = {**result, "summary": summarize(result["arms"])}
    (out / "ablation.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    plot = plot_ablation(result, out / "ablation.png")
    markdown = render_markdown(result, plot.name if plot else None)
    (out / "report.md").write_text(markdown)
    written = {"json": out / "ablation.json", "report": out / "report.md",
               "html": write_page(out / "report.html", "RACE ablation", markdown)}
    if plot:
        written["plot"] = plot
    return written


_COLORS = {"none": "#4C72B0", "race": "#C44E52", "local": "#DD8452", "random": "#8172B2", "all": "#55A868"}
_PHASE_NAMES = {"rl": "cover-aware RL", "grpo": "GRPO"}  # grpo+lp<λ>: GRPO with a reasoning-length penalty λ


def plot_ablation(result: dict[str, Any], path: Path) -> Path | None:
    from report.markdown import _pyplot

    if not result["arms"]:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(7, 4.5))
    labelled = set()
    for entry in result["arms"]:
        for phase in ("sft", *phases_of(entry)):
            values = entry if phase == "sft" else entry[phase]
            marker = {"sft": "o", "rl": "^", "grpo": "v"}.get(phase, "s")
            label = entry["arm"] + ("" if phase == "sft" else f" + {_PHASE_NAMES.get(phase, phase)}")
            ax.scatter(values["reasoning_tokens_per_episode"], 100 * values["success_rate"], marker=marker, s=50,
                       color=_COLORS.get(entry["arm"], "black"), label=None if label in labelled else label,
                       alpha=0.85, edgecolors="black" if phase != "sft" else "none")
            labelled.add(label)
    for arm, points in _curves(result).items():  # RACE and local-only at each ε of the curve (first seed)
        xs = [p["reasoning_tokens_per_episode"] for p in points]
        ys = [100 * p["success_rate"] for p in points]
        ax.plot(xs, ys, color=_COLORS.get(arm, "black"), linewidth=1, alpha=0.7, label=f"{arm}: ε curve")
        for p, x, y in zip(points, xs, ys, strict=True):
            ax.annotate(f"ε {p['epsilon']:g}", (x, y), textcoords="offset points", xytext=(4, 4), fontsize=7,
                        color=_COLORS.get(arm, "black"))
    before = result.get("before")
    if before:
        ax.scatter(before["reasoning_tokens_per_episode"], 100 * before["success_rate"], marker="x", s=70,
                   color="black", label="before SFT")
    ax.set_xlabel("reasoning tokens per episode (held-out, greedy)")
    ax.set_ylabel("success rate (%)")
    ax.set_title("ablation: one point per arm and SFT seed" + ("; lines: each cover over ε" if _curves(result) else ""))
    ax.legend(fontsize=8, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _curves(result: dict[str, Any]) -> dict[str, list[dict[str, Any]]]:
    """The trade-off curve's points by arm, by ε (arms with a single point make no curve)."""
    by_arm: dict[str, list[dict[str, Any]]] = {}
    for point in result.get("curve") or []:
        by_arm.setdefault(point["arm"], []).append(point)
    return {arm: sorted(points, key=lambda p: p["epsilon"]) for arm, points in by_arm.items() if len(points) > 1}


def _cell(s: dict[str, float], pct: bool) -> str:
    k = 100 if pct else 1
    return f"{k * s['mean']:.1f} [{k * s['min']:.1f}, {k * s['max']:.1f}]"


def render_markdown(result: dict[str, Any], plot: str | None) -> str:
    lines = ["# RACE ablation", "", "| run | |", "|---|---|"]
    lines += [f"| {k} | `{v}` |" for k, v in result.get("run", {}).items()]
    boot = result.get("bootstrap")
    if boot:
        check = boot["check"]
        lines += ["", "## The policy", "",
                  f"`{boot['source']}` made a calculator policy by `{boot['recipe']}` (actions as {boot['actions']}): "
                  f"{check['succeeded']} of {check['episodes']} fresh on-policy episodes (temperature 1, training "
                  f"tasks no round drew) succeeded; {check['well_formed_turns']} of {check['turns']} turns "
                  "well-formed."]
        lines += [f"- SFT on {r['trajectories']} {r['data']} trajectories"
                  + (f" (round {r['round']}: {r['sampled']['succeeded']} of {r['sampled']['episodes']} sampled "
                     "episodes succeeded)" if "round" in r else "")
                  + (f": {r['steps']} steps, loss {r['first_loss']:.3f} -> {r['last_loss']:.3f}" if "steps" in r
                     else ": nothing to train on") for r in boot["rounds"]]
    choice = result.get("epsilon_choice")
    if choice:
        lines += ["", "## ε", "", f"ε = {choice['epsilon']:g}: {choice['why']}."]
        if choice.get("rows"):
            lines += ["", "| ε | removal share | reasoning kept |", "|---|---|---|"]
            lines += [f"| {r['epsilon']:g} | {100 * r['removal_share']:.1f}% | {100 * r['kept_share']:.1f}% |"
                      for r in choice["rows"]]
    summary = result["summary"]
    base = summary.get("none")
    lines += ["", "Held-out greedy evaluation; mean [min, max] over SFT seeds.", "",
              "| arm | seeds | success rate (%) | reasoning tokens / episode | tokens vs none |",
              "|---|---|---|---|---|"]
    before = result.get("before")
    if before:
        lines.append(f"| before SFT | - | {100 * before['success_rate']:.1f} | "
                     f"{before['reasoning_tokens_per_episode']:.1f} | |")
    order = [a for a in ARMS if a in summary] + sorted(k for k in summary if k not in ARMS)
    for arm in order:
        s = summary[arm]
        vs = ""
        if base and base["reasoning_tokens_per_episode"]["mean"]:
            ratio = s["reasoning_tokens_per_episode"]["mean"] / base["reasoning_tokens_per_episode"]["mean"]
            vs = f"{100 * (ratio - 1):+.0f}%"
        lines.append(f"| {arm} | {s['seeds']} | {_cell(s['success_rate'], True)} | "
                     f"{_cell(s['reasoning_tokens_per_episode'], False)} | {vs} |")
    cross = result.get("cross_turn") or {}
    if cross.get("race") or cross.get("local_vs_race"):
        lines += ["", "## The cross-turn check", ""]
        if cross.get("race"):
            lines.append(f"- RACE at ε {result['run']['epsilon']:g}: {cross_turn_text(cross['race'])} (their own "
                         "action's drop was within ε)")
        gap = cross.get("local_vs_race")
        if gap:
            share = "" if gap["share"] is None else f" ({100 * gap['share']:.1f}%)"
            lines.append(f"- of the local-only arm's {gap['local_accepted']} accepted removals, RACE rejected "
                         f"{gap['race_rejected']}{share} on the same trajectories")
    kinds = result.get("removed_by_kind", {})
    if kinds:
        names = [k for k in next(iter(kinds.values()))]
        lines += ["", "## Removed reasoning by kind (training trajectories)", "",
                  "Share of the candidate turns of each kind whose reasoning the arm removed "
                  "(`race_core/envs/expert.py` says which kind is which).", "",
                  "| arm | " + " | ".join(names) + " |", "|---|" + "---|" * len(names)]
        for arm in (a for a in ARMS if a in kinds):
            cells = [("-" if kinds[arm][k]["share"] is None else f"{100 * kinds[arm][k]['share']:.0f}% "
                      f"({kinds[arm][k]['removed']}/{kinds[arm][k]['candidates']})") for k in names]
            lines.append(f"| {arm} | " + " | ".join(cells) + " |")
    curves = _curves(result)
    if curves:
        lines += ["", "## The trade-off curve: RACE and local-only at several ε", "",
                  "The same SFT (first seed) and held-out evaluation on each cover's compressed trajectories, at the "
                  "chosen ε and the sweep's ε on each side of it.", "",
                  "| arm | ε | success rate (%) | reasoning tokens / episode |", "|---|---|---|---|"]
        lines += [f"| {arm} | {p['epsilon']:g} | {100 * p['success_rate']:.1f} | {p['reasoning_tokens_per_episode']:.1f} |"
                  for arm, points in curves.items() for p in points]
    lines += ["", "## Per seed", "", "| arm | seed | policy | success rate (%) | reasoning tokens / episode |",
              "|---|---|---|---|---|"]
    for entry in result["arms"]:
        for phase in ("sft", *phases_of(entry)):
            values = entry if phase == "sft" else entry[phase]
            name = entry["arm"] + ("" if phase == "sft" else f"+{phase}")
            lines.append(f"| {name} | {entry['seed']} | `{values['policy_digest'][:12]}` | "
                         f"{100 * values['success_rate']:.1f} | {values['reasoning_tokens_per_episode']:.1f} |")
    curves = [(e["seed"], phase, e[phase]) for e in result["arms"] for phase in phases_of(e)]
    if curves:
        lines += ["", "## RL from each seed's RACE policy: cover-aware RL (rl), plain GRPO (grpo), GRPO with a "
                  "reasoning-length penalty λ (grpo+lp<λ>: reward − λ · reasoning tokens)", "",
                  "Greedy held-out figures after each evaluated iteration, on the same rollout budget; `moved "
                  "after`: the first evaluated iteration whose figures differ from the SFT policy's.", "",
                  "| seed | RL | moved after | iteration: success % / reasoning tokens |", "|---|---|---|---|"]
        for seed, phase, values in curves:
            points = ", ".join(f"{c['iteration']}: {100 * c['success_rate']:.1f} / {c['reasoning_tokens_per_episode']:.1f}"
                               for c in values.get("curve", []))
            lines.append(f"| {seed} | {phase} | {values.get('moved_after') or 'never'} | {points} |")
    for run, iterations in result.get("rl_diagnostics", {}).items():
        lines += ["", f"### RL diagnostics: {run}", "", *rl_table(iterations)]
    if plot:
        lines += ["", f"![success vs reasoning tokens]({plot})"]
    return "\n".join(lines) + "\n"
