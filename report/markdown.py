"""The run report: `summary.json`, `report.md`, PNG plots and `report.html`, written into one folder.

Plots: reasoning tokens per episode and success rate by stage (before / after SFT / after RL),
deletion rate by turn index, and the distribution of the cover's likelihood drops against ε.
`report.html` (`report.page`) is the same report as one self-contained page, with the
decisions explorer over the run's trajectories; `store_report` puts it in the artifact store.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pandas as pd

from race_core.decisions import cross_turn_text
from report.page import write_run_page
from storage.store import ArtifactStore, sha256_bytes

EVAL_STAGES = ("before", "after_sft_none", "after_sft", "after_rl")
STAGE_NAMES = {"before": "before", "after_sft_none": "after SFT, no removal", "after_sft": "after SFT, RACE",
               "after_rl": "after RL"}


def _pyplot():
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt


def plot_eval_by_stage(evals: dict[str, dict[str, float]], path: Path) -> Path | None:
    stages = [s for s in EVAL_STAGES if s in evals]
    if not stages:
        return None
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    names = [STAGE_NAMES[s].replace(", ", ",\n") for s in stages]
    tokens = [evals[s]["reasoning_tokens_per_episode"] for s in stages]
    success = [100 * evals[s]["success_rate"] for s in stages]
    left.bar(names, tokens, color="#4C72B0")
    left.set_title("reasoning tokens per episode")
    right.bar(names, success, color="#55A868")
    right.set_ylim(0, 100)
    right.set_title("success rate (%)")
    for ax, values, fmt in ((left, tokens, "{:.1f}"), (right, success, "{:.0f}%")):
        for x, v in enumerate(values):
            ax.annotate(fmt.format(v), (x, v), ha="center", va="bottom")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_deletion_rate_by_turn(decisions: pd.DataFrame, path: Path) -> Path | None:
    scored = decisions[~decisions["skipped_empty"]]
    if scored.empty:
        return None
    rate = scored.groupby("turn")["accepted"].agg(["mean", "size"])
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.bar(rate.index.astype(int), 100 * rate["mean"], color="#C44E52")
    for turn, row in rate.iterrows():
        ax.annotate(f"n={int(row['size'])}", (turn, 100 * row["mean"]), ha="center", va="bottom", fontsize=8)
    ax.set_xticks(rate.index.astype(int))
    ax.set_xlabel("turn index")
    ax.set_ylabel("reasoning removed (%)")
    ax.set_ylim(0, 105)
    ax.set_title("deletion rate by turn")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def plot_likelihood_drops(decisions: pd.DataFrame, epsilon: float, path: Path) -> Path | None:
    drops = decisions["max_drop"].dropna()
    if drops.empty:
        return None
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6, 3.5))
    ax.hist(drops, bins=40, color="#8172B2")
    ax.axvline(epsilon, color="black", linestyle="--", label=f"ε = {epsilon:g}")
    ax.set_xlabel("max drop of a later action's mean log-likelihood (d)")
    ax.set_ylabel("candidates")
    ax.set_title("likelihood drops of candidate removals")
    ax.legend()
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(out_dir: str | Path, summary: dict[str, Any], decisions: pd.DataFrame | None = None,
                 epsilon: float | None = None, store: ArtifactStore | None = None) -> dict[str, Path]:
    """Write summary.json, report.md, the plots and report.html; return the paths written. `store`:
    where the page reads the trajectories' text and the rejects that the summary's objects name."""
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    written: dict[str, Path] = {}
    (out / "summary.json").write_text(json.dumps(summary, indent=2, sort_keys=True) + "\n")
    written["summary"] = out / "summary.json"
    plots = {
        "eval_by_stage": plot_eval_by_stage(summary.get("eval", {}), out / "eval_by_stage.png"),
    }
    if decisions is not None and len(decisions):
        eps = epsilon if epsilon is not None else float(decisions["epsilon"].iloc[0])
        plots["deletion_rate_by_turn"] = plot_deletion_rate_by_turn(decisions, out / "deletion_rate_by_turn.png")
        plots["likelihood_drops"] = plot_likelihood_drops(decisions, eps, out / "likelihood_drops.png")
    written.update({k: v for k, v in plots.items() if v is not None})
    markdown = render_markdown(summary, {k: v.name for k, v in written.items() if k != "summary"})
    (out / "report.md").write_text(markdown)
    written["report"] = out / "report.md"
    written["html"] = write_run_page(out / "report.html", summary, markdown, decisions, epsilon, store)
    return written


def store_report(store: ArtifactStore, html: Path) -> str:
    """Put `report.html` in the store at `reports/<its sha256>/report.html` (a name a browser opens
    as a page, which an extension-less object is not); return that path as a URL."""
    data = html.read_bytes()
    path = store._path("reports", sha256_bytes(data), "report.html")
    store._write_bytes_atomic(path, data)  # whole or not at all, as the store writes its records
    return store.fs.unstrip_protocol(path)


RL_COLUMNS = (  # (metric, heading, format): the card's diagnostics of a cover-aware update
    ("success_rate", "rollouts succeeded", "{:.1%}"), ("loss", "loss", "{:.5f}"), ("actor_loss", "actor loss", "{:.5f}"),
    ("closure_loss", "closure term", "{:.5f}"), ("closure_terms", "closure terms", "{}"),
    ("policy_tokens", "policy tokens (denominator)", "{}"), ("masked_tokens", "masked reasoning tokens", "{}"),
    ("total_turns", "turns", "{}"), ("skip_ratio", "turns without reasoning", "{:.1%}"),
    ("skipped_rows", "rollouts of advantage 0 (no backward)", "{}"), ("seconds", "seconds", "{:.0f}"))


def rl_table(iterations: list[dict[str, Any]]) -> list[str]:
    """One row per RL iteration: its rollouts' success, the loss and its actor and closure parts, the
    closure terms, the policy-token denominator N_policy, the masked reasoning tokens, the share of
    turns written without reasoning, the rollouts left out of the backward and the iteration's time."""
    lines = ["| iteration | " + " | ".join(h for _, h, _ in RL_COLUMNS) + " |", "|---" * (len(RL_COLUMNS) + 1) + "|"]
    for k, metrics in enumerate(iterations):
        cells = [fmt.format(metrics[key]) if metrics.get(key) is not None else "-" for key, _, fmt in RL_COLUMNS]
        lines.append(f"| {metrics.get('iteration', k + 1)} | " + " | ".join(cells) + " |")
    return lines


def render_markdown(summary: dict[str, Any], images: dict[str, str]) -> str:
    lines = ["# RACE run report", ""]
    run = summary.get("run", {})
    if run:
        lines += ["| run | |", "|---|---|"] + [f"| {k} | `{v}` |" for k, v in run.items()] + [""]
    cover = summary.get("cover")
    if cover:
        before, after = cover.get("reasoning_tokens_before", 0), cover.get("reasoning_tokens_after", 0)
        cut = 100 * (1 - after / before) if before else 0.0
        lines += ["## Cover (LoGiC)", "",
                  f"- trajectories ingested: {summary.get('trajectories', {}).get('ingested')}, "
                  f"rejected lines: {summary.get('trajectories', {}).get('rejected')}",
                  f"- candidate turns scored: {cover.get('candidates')}, reasoning removed in: {cover.get('removed')}",
                  f"- reasoning tokens: {before} -> {after} ({cut:.1f}% fewer)"]
        if cover.get("cross_turn"):
            lines.append(f"- cross-turn check: {cross_turn_text(cover['cross_turn'])} (their own action's drop was "
                         "within ε: a local-only cover would have removed them)")
        if cover.get("render_mode"):
            noise = cover.get("scorer_noise")
            lines.append(f"- render mode: `{cover['render_mode']}`; scorer noise: "
                         + (f"{noise:.1e}" if noise is not None else "not measured (scores came from the store)"))
        lines.append("")
    evals = summary.get("eval", {})
    if evals:
        lines += ["## Held-out evaluation", "", "| stage | success rate | reasoning tokens / episode | turns without "
                  "reasoning | reasoning tokens / thinking turn |", "|---|---|---|---|---|"]
        lines += [f"| {STAGE_NAMES[s]} | {100 * evals[s]['success_rate']:.1f}%"
                  + (f" ± {100 * evals[s]['success_stderr']:.1f}" if "success_stderr" in evals[s] else "")
                  + f" | {evals[s]['reasoning_tokens_per_episode']:.1f} | "
                  + (f"{100 * evals[s]['skip_ratio']:.1f}%" if "skip_ratio" in evals[s] else "-") + " | "
                  + (f"{evals[s]['reasoning_tokens_per_thinking_turn']:.1f}"
                     if "reasoning_tokens_per_thinking_turn" in evals[s] else "-") + " |"
                  for s in EVAL_STAGES if s in evals]
        lines.append("")
    if summary.get("rl"):
        lines += ["## RL iterations", "", *rl_table(summary["rl"]), ""]
    if summary.get("rl_evaluations"):
        lines += ["## Held-out evaluation during RL", "", "| iteration | success rate | reasoning tokens / episode | "
                  "turns without reasoning |", "|---|---|---|---|"]
        lines += [f"| {p['iteration']} | {100 * p['success_rate']:.1f}% | {p['reasoning_tokens_per_episode']:.1f} | "
                  f"{100 * p['skip_ratio']:.1f}% |" for p in summary["rl_evaluations"]]
        lines.append("")
    stages = summary.get("stages", {})
    if stages:
        lines += ["## Stages", "", "| stage | cached | wall s |", "|---|---|---|"]
        lines += [f"| {name} | {'yes' if s['cached'] else 'no'} | {s['wall_s']:.1f} |" for name, s in stages.items()]
        lines.append("")
    titles = {"eval_by_stage": "Reasoning and success by stage", "deletion_rate_by_turn": "Deletion rate by turn",
              "likelihood_drops": "Likelihood drops"}
    for key, name in images.items():
        lines += [f"## {titles.get(key, key)}", "", f"![{key}]({name})", ""]
    return "\n".join(lines)
