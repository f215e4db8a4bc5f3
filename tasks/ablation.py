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

METRICS = ("success_rate", "reasoning_tokens_per_episode", "skip_ratio", "reasoning_tokens_per_thinking_turn")


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
    """(arm, phase) -> mean / min / max / std over seeds of each metric (those an entry has: an
    ablation recorded before a figure existed lacks it)."""
    out: dict[str, dict[str, Any]] = {}
    for entry in arms:
        phases = {entry["arm"]: entry} | {f"{entry['arm']}+{p}": entry[p] for p in phases_of(entry)}
        for key, values in phases.items():
            for m in METRICS:
                if m in values:
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
    curves = plot_rl_curves(result, out / "ablation-rl.png")
    if curves:
        result["rl_plot"] = curves.name
    (out / "ablation.json").write_text(json.dumps(result, indent=2, sort_keys=True) + "\n")
    plot = plot_ablation(result, out / "ablation.png")
    markdown = render_markdown(result, plot.name if plot else None)
    (out / "report.md").write_text(markdown)
    written = {"json": out / "ablation.json", "report": out / "report.md",
               "html": write_page(out / "report.html", "RACE ablation", markdown, _episodes_explorer(result))}
    if plot:
        written["plot"] = plot
    if curves:
        written["rl_plot"] = curves
    return written


def _episodes_explorer(result: dict[str, Any]) -> dict[str, Any] | None:
    """The page's explorer over the held-out episodes of the method's last evaluation (race+rl, first
    seed: its `episodes` dataset in the run's store), turn by turn; None when the run has none."""
    import pandas as pd

    from report.page import explorer_data
    from storage.parquet import iter_rows_from_store, schema_for

    entry = next((e for e in result["arms"] if e["arm"] == "race" and "rl" in e), None)
    digest = entry["rl"].get("episodes_object") if entry else None
    store = result.get("run", {}).get("store")
    if not digest or not store:
        return None
    no_decisions = pd.DataFrame({f.name: pd.Series(dtype=object) for f in schema_for("decisions")})
    return explorer_data({"": no_decisions}, iter_rows_from_store(ArtifactStore(store), digest, "episodes"))


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


_RL_PANELS = (  # (where, metric, title): per RL iteration, the training rollouts' figures and the held-out ones
    ("train", "success_rate", "training rollouts: success"), ("train", "reasoning_tokens_per_episode",
                                                                "training rollouts: reasoning tokens / episode"),
    ("train", "skip_ratio", "training rollouts: turns without reasoning"),
    ("train", "masked_tokens", "masked reasoning tokens"), ("train", "closure_loss", "closure loss"),
    ("heldout", "success_rate", "held-out (greedy): success"),
    ("heldout", "reasoning_tokens_per_episode", "held-out: reasoning tokens / episode"),
    ("heldout", "skip_ratio", "held-out: turns without reasoning"))


def plot_rl_curves(result: dict[str, Any], path: Path) -> Path | None:
    """The RL runs' learning curves, one line per run and seed: the training rollouts' success,
    reasoning tokens, skip ratio, masked tokens and closure loss per iteration, and the held-out
    figures at each evaluated iteration (iteration 0: the SFT policy the run started from)."""
    from report.markdown import _pyplot

    diagnostics = result.get("rl_diagnostics") or {}
    if not diagnostics:
        return None
    starts = {(e["arm"], e["seed"]): e for e in result["arms"]}
    plt = _pyplot()
    fig, axes = plt.subplots(2, 4, figsize=(16, 7))
    colors = plt.rcParams["axes.prop_cycle"].by_key()["color"]
    names = sorted({run.rsplit(" seed ", 1)[0] for run in diagnostics})
    for run, iterations in diagnostics.items():
        name, seed = run.rsplit(" seed ", 1)
        arm, phase = name.split("+", 1)
        color = colors[names.index(name) % len(colors)]
        style = "-" if int(seed) == min(int(r.rsplit(" seed ", 1)[1]) for r in diagnostics) else "--"
        held = [starts[(arm, int(seed))], *starts[(arm, int(seed))].get(phase, {}).get("curve", [])] \
            if (arm, int(seed)) in starts else []
        for ax, (where, metric, title) in zip(axes.flat, _RL_PANELS, strict=True):
            if where == "train":
                points = [(m["iteration"], m.get(metric)) for m in iterations]
            else:
                points = [(p.get("iteration", 0), p.get(metric)) for p in held]
            points = [(x, y) for x, y in points if y is not None]
            if points:
                ax.plot(*zip(*points, strict=True), style, color=color, marker="." if where == "heldout" else None,
                        label=f"{name} (seed {seed})")
            ax.set_title(title, fontsize=9)
            ax.set_xlabel("RL iteration", fontsize=8)
    axes.flat[0].legend(fontsize=7, loc="best")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
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


def _vs(s: dict[str, Any], base: dict[str, Any] | None) -> str:
    """The arm's reasoning tokens per episode against `base`'s, in percent."""
    if not base or not base["reasoning_tokens_per_episode"]["mean"]:
        return ""
    return f"{100 * (s['reasoning_tokens_per_episode']['mean'] / base['reasoning_tokens_per_episode']['mean'] - 1):+.0f}%"


def arms_table(result: dict[str, Any]) -> list[str]:
    """The ablation's table: per arm (SFT arms, then RL runs), mean [min, max] over seeds of success
    with its standard error (of the pooled episodes), reasoning tokens per episode, the skip ratio,
    reasoning tokens per thinking turn, and reasoning tokens against `none` and against `none+grpo`."""
    summary = result["summary"]
    episodes = result.get("run", {}).get("eval_tasks") or 0
    rl = "none+grpo" in summary
    lines = ["Held-out greedy evaluation; mean [min, max] over seeds; ± the standard error of the success rate over "
             "the seeds' pooled episodes.", "",
             "| arm | seeds | success rate (%) | reasoning tokens / episode | skip ratio (%) | reasoning tokens / "
             "thinking turn | tokens vs none |" + (" tokens vs none+grpo |" if rl else ""),
             "|---|---|---|---|---|---|---|" + ("---|" if rl else "")]
    before = result.get("before")
    if before:
        skip = f"{100 * before['skip_ratio']:.1f}" if "skip_ratio" in before else "-"
        per_turn = f"{before['reasoning_tokens_per_thinking_turn']:.1f}" if "reasoning_tokens_per_thinking_turn" in before \
            else "-"
        lines.append(f"| before SFT | - | {100 * before['success_rate']:.1f}{_stderr(before['success_rate'], episodes)} | "
                     f"{before['reasoning_tokens_per_episode']:.1f} | {skip} | {per_turn} | |" + (" |" if rl else ""))
    order = [a for a in ARMS if a in summary] + sorted(k for k in summary if k not in ARMS)
    for arm in order:
        s = summary[arm]
        cells = [_cell(s["success_rate"], True) + _stderr(s["success_rate"]["mean"], episodes * s["seeds"]),
                 _cell(s["reasoning_tokens_per_episode"], False),
                 _cell(s["skip_ratio"], True) if "skip_ratio" in s else "-",
                 _cell(s["reasoning_tokens_per_thinking_turn"], False) if "reasoning_tokens_per_thinking_turn" in s
                 else "-", _vs(s, summary.get("none"))]
        if rl:
            cells.append(_vs(s, summary["none+grpo"]) if "+" in arm else "")
        lines.append(f"| {arm} | {s['seeds']} | " + " | ".join(cells) + " |")
    return lines


def _stderr(p: float, n: int) -> str:
    return f" ± {100 * (p * (1 - p) / n) ** 0.5:.1f}" if n else ""


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
    lines += ["", *arms_table(result)]
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
    curves = [(e["arm"], e["seed"], phase, e[phase]) for e in result["arms"] for phase in phases_of(e)]
    if curves:
        lines += ["", "## RL runs: SFT + GRPO (none+grpo), RACE-SFT + cover-aware RL (race+rl), + plain GRPO "
                  "(race+grpo), + the closure term alone (race+close), + GRPO with a reasoning-length penalty λ "
                  "(race+grpo+lp<λ>), + an AdaptThink-style reward δ (race+adapt<δ>)", "",
                  "Greedy held-out figures after each evaluated iteration, on the same rollout budget; `moved "
                  "after`: the first evaluated iteration whose figures differ from the SFT policy's; `cost`: the "
                  "run's seconds (iterations and evaluations).", "",
                  "| run | seed | moved after | cost | iteration: success % / reasoning tokens / skip ratio % |",
                  "|---|---|---|---|---|"]
        for arm, seed, phase, values in curves:
            points = ", ".join(f"{c['iteration']}: {100 * c['success_rate']:.1f} / {c['reasoning_tokens_per_episode']:.1f}"
                               + (f" / {100 * c['skip_ratio']:.0f}" if "skip_ratio" in c else "")
                               for c in values.get("curve", []))
            cost = f"{values['seconds'] / 60:.0f} min" if values.get("seconds") else "-"
            lines.append(f"| {arm}+{phase} | {seed} | {values.get('moved_after') or 'never'} | {cost} | {points} |")
        if result.get("rl_plot"):
            lines += ["", f"![the RL runs' learning curves]({result['rl_plot']})"]
    for run, iterations in result.get("rl_diagnostics", {}).items():
        lines += ["", f"### RL diagnostics: {run}", "", *rl_table(iterations)]
    if plot:
        lines += ["", f"![success vs reasoning tokens]({plot})"]
    return "\n".join(lines) + "\n"
