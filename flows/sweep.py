"""What each ε would do on the user's data (`race cover --epsilon E1 E2 ...`), before any training.

For every ε the cover stages run exactly as `race cover --epsilon E` runs them (`flows.cover.run_cover`:
the same stage keys, so each ε's decisions are stored under its own key and a rerun computes
nothing), in this one process, with one scorer whose scores are shared across ε by request content
(`race_core.scoring.cache`): the baseline of every trajectory and every candidate that an earlier ε
already scored is not scored again.

Out folder: `eps-<ε>/` per ε with the files `race cover` writes (decisions, compressed, rejects),
and `epsilon_sweep.json`, `epsilon_sweep.md` (one row per ε: candidates, removed, removal share,
reasoning tokens before / kept, the quantiles of the candidates' largest drop max_j d_j),
`epsilon_sweep.png` (removal share and reasoning kept against ε; the drops' distribution) and
`report.html` (the table and plot, and an explorer that shows each ε's decisions on the same
trajectories).
"""

from __future__ import annotations

import json
import logging
import math
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import pandas as pd

from flows.cover import run_cover, with_defaults
from race_core.config import PipelineConfig, replace
from race_core.scoring import Scorer, ScorerStats
from race_core.scoring.cache import CachingScorer, ScoreMemory
from report.markdown import _pyplot
from report.page import write_sweep_page
from storage.parquet import read_dataset
from tasks.stages import cover_scorer

logger = logging.getLogger(__name__)

DROP_QUANTILES = (0.1, 0.5, 0.9)


def epsilon_folder(epsilon: float) -> str:
    """`eps-0.001`, `eps-1.0`, `eps-1e-05`: Python's shortest exact form of the float."""
    return f"eps-{epsilon!r}"


def check_epsilons(epsilons: Sequence[float]) -> list[float]:
    """The distinct values, ascending; a value not a finite number in [0, 10) is an error naming it."""
    for value in epsilons:
        if not (math.isfinite(value) and 0 <= value < 10):
            raise ValueError(f"option --epsilon: {value} is outside [0, 10)")
    if not epsilons:
        raise ValueError("option --epsilon: give at least one value")
    return sorted(set(epsilons))


class SharedScorer:
    """One scorer for every ε of a sweep, built on first use (a sweep whose covers are all stored
    loads no model); each cover stage gets its own `CachingScorer` view over the shared memory."""

    def __init__(self, build: Callable[[], Scorer]):
        self.build = build
        self.inner: Scorer | None = None
        self.memory = ScoreMemory()

    def view(self) -> CachingScorer:
        if self.inner is None:
            self.inner = self.build()
        return CachingScorer(self.inner, self.memory)

    def counts(self) -> dict[str, int]:
        """What the sweep asked and computed; the wrapped scorer's forwards and tokens fed."""
        stats = self.inner.stats if self.inner is not None else ScorerStats()
        return {**self.memory.counts(), "forward_calls": stats.forward_calls,
                "tokens_processed": stats.tokens_processed}

    def close(self) -> None:
        if self.inner is not None:
            self.inner.close()


def run_sweep(config: PipelineConfig, epsilons: Sequence[float], out_dir: Path, home: Path) -> dict[str, Any]:
    """The cover stages of `config` for every ε in `epsilons`, sharing scores; writes the per-ε
    Parquet files and the sweep's table, JSON and plot into `out_dir`; returns the sweep's summary."""
    values = check_epsilons(epsilons)
    config = with_defaults(config, home)
    shared = SharedScorer(lambda: cover_scorer(config.cover, config.checkpoint, config.resources))
    rows, summaries = [], {}
    try:
        for epsilon in values:
            logger.info(f"sweep: epsilon {epsilon:g}")
            folder = out_dir / epsilon_folder(epsilon)
            summary = run_cover(replace(config, **{"cover.epsilon": epsilon}), folder, home,
                                scorer_factory=shared.view)
            summaries[repr(epsilon)] = summary
            rows.append(sweep_row(epsilon, summary, pd.read_parquet(folder / "decisions.parquet")))
    finally:
        shared.close()
    result = {"epsilons": values, "model_digest": next(iter(summaries.values()))["model_digest"],
              "inputs": list(config.inputs), "rows": rows, "sharing": shared.counts(), "runs": summaries,
              "out": str(out_dir)}
    write_sweep(out_dir, result)
    logger.info(sweep_markdown(result))
    return result


def sweep_row(epsilon: float, summary: dict[str, Any], decisions: pd.DataFrame) -> dict[str, Any]:
    """One ε's line of the table, from its run summary and its decisions."""
    counts = summary["cover"]
    scored = decisions[~decisions["skipped_empty"]]
    drops = scored["max_drop"].astype(float).dropna()  # NaN: a non-finite score, rejected
    before, kept = counts["reasoning_tokens_before"], counts["reasoning_tokens_after"]
    row = {"epsilon": epsilon, "candidates": counts["candidates"], "removed": counts["removed"],
           "removal_share": counts["removed"] / counts["candidates"] if counts["candidates"] else 0.0,
           "reasoning_tokens_before": before, "reasoning_tokens_kept": kept,
           "kept_share": kept / before if before else 1.0,
           "cover_cached": summary["stages"]["cover"]["cached"]}
    for q in DROP_QUANTILES:
        row[f"drop_p{round(100 * q)}"] = float(drops.quantile(q)) if len(drops) else None
    row["drop_max"] = float(drops.max()) if len(drops) else None
    row["max_drops"] = [float(d) for d in drops]
    return row


def write_sweep(out_dir: Path, result: dict[str, Any]) -> dict[str, Path]:
    """The sweep's JSON, table, plot and `report.html` (the table, and each ε's decisions on the same
    trajectories, one ε at a time: `report.page`) in `out_dir`, beside the `eps-<ε>/` folders."""
    out_dir.mkdir(parents=True, exist_ok=True)
    paths = {"json": out_dir / "epsilon_sweep.json", "markdown": out_dir / "epsilon_sweep.md",
             "plot": out_dir / "epsilon_sweep.png"}
    paths["json"].write_text(json.dumps(result, indent=2) + "\n")
    markdown = sweep_markdown(result) + f"\n\n![epsilon sweep]({paths['plot'].name})\n"
    paths["markdown"].write_text(markdown)
    plot_sweep(result["rows"], paths["plot"])
    decisions = {repr(e): read_dataset("decisions", out_dir / epsilon_folder(e) / "decisions.parquet")
                 for e in result["epsilons"]}
    paths["html"] = write_sweep_page(out_dir / "report.html", markdown, decisions, result["runs"])
    return paths


def _number(x: float | None) -> str:
    return "-" if x is None else f"{x:.3g}"


def sweep_markdown(result: dict[str, Any]) -> str:
    s = result["sharing"]
    inputs = ", ".join(f"`{i}`" for i in result["inputs"])
    lines = ["# ε sweep", "", f"model `{result['model_digest'][:16]}`, inputs: {inputs}", "",
             "| ε | candidates | removed | removal share | reasoning tokens before | kept | kept share "
             "| drop p10 | p50 | p90 | max |",
             "|---|---|---|---|---|---|---|---|---|---|---|"]
    for r in result["rows"]:
        cells = [f"{r['epsilon']:g}", r["candidates"], r["removed"], f"{100 * r['removal_share']:.1f}%",
                 r["reasoning_tokens_before"], r["reasoning_tokens_kept"], f"{100 * r['kept_share']:.1f}%",
                 *(_number(r[k]) for k in ("drop_p10", "drop_p50", "drop_p90", "drop_max"))]
        lines.append("| " + " | ".join(map(str, cells)) + " |")
    lines += ["", "Drops are each candidate's largest drop max_j d_j of a later action's mean log-likelihood "
              "(nats); a candidate is removed when it is at most ε.", "",
              f"Scoring shared across ε: {s['requests_computed']} requests computed, "
              f"{s['requests_asked']} in separate runs; {s['actions_computed']} action likelihoods computed, "
              f"{s['actions_asked']} in separate runs; {s['forward_calls']} forwards, "
              f"{s['tokens_processed']} tokens fed (ε whose cover was stored ask nothing)."]
    return "\n".join(lines)


def plot_sweep(rows: list[dict[str, Any]], path: Path) -> Path:
    """Left: removal share and reasoning kept (%) against ε. Right: each ε's distribution of the
    candidates' largest drop, with ε marked. Log x axes (symmetric log where 0 or negative drops occur)."""
    plt = _pyplot()
    fig, (left, right) = plt.subplots(1, 2, figsize=(10, 3.8))
    eps = [r["epsilon"] for r in rows]
    left.plot(eps, [100 * r["removal_share"] for r in rows], marker="o", color="#C44E52",
              label="candidates removed")
    left.plot(eps, [100 * r["kept_share"] for r in rows], marker="s", color="#4C72B0",
              label="reasoning tokens kept")
    linear_below = min((e for e in eps if e > 0), default=1e-3)  # symlog's linear range: the smallest ε
    _log_axis(left, eps, linear_below)
    left.set_ylim(-2, 102)
    left.set_xlabel("ε")
    left.set_ylabel("%")
    left.set_title("what each ε removes")
    left.legend()
    colors = plt.get_cmap("viridis")
    for k, r in enumerate(rows):
        drops = sorted(r["max_drops"])
        if not drops:
            continue
        color = colors(k / max(len(rows) - 1, 1))
        right.step(drops, [(i + 1) / len(drops) for i in range(len(drops))], where="post", color=color,
                   label=f"ε = {r['epsilon']:g}")
        right.axvline(r["epsilon"], color=color, linestyle="--", linewidth=0.8)
    _log_axis(right, [*eps, *(d for r in rows for d in r["max_drops"])], linear_below)
    right.set_xlabel("largest drop max_j d_j (nats)")
    right.set_ylabel("share of candidates ≤ x")
    right.set_title("drops of candidate removals")
    if right.has_data():
        right.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def _log_axis(ax, values: list[float], linear_below: float) -> None:
    """A log x axis; symmetric log (linear within ±`linear_below`) when some value is 0 or negative."""
    if all(v > 0 for v in values):
        ax.set_xscale("log")
    else:
        ax.set_xscale("symlog", linthresh=linear_below)


def choose_epsilon(rows: Sequence[dict[str, Any]]) -> tuple[float, str]:
    """The ε a run takes from a sweep, and why (the half-removal rule): the smallest ε of the sweep
    whose removal share reaches half of the largest share any ε of it removes. It needs no plateau in
    the removal share against ε (real models' likelihood drops have none: each larger ε removes a
    little more): it sits where removals have clearly begun but the larger ε, which buy the rest with
    bigger drops of some action, have not been taken. One ε: that one; nothing removed at any ε: the
    largest."""
    rows = sorted(rows, key=lambda r: r["epsilon"])
    if len(rows) == 1:
        return rows[0]["epsilon"], "the only ε of the sweep"
    most = max(r["removal_share"] for r in rows)
    if most <= 0:
        return rows[-1]["epsilon"], "no ε of the sweep removed any reasoning"
    chosen = next(r for r in rows if r["removal_share"] >= most / 2)
    top = max(rows, key=lambda r: (r["removal_share"], -r["epsilon"]))
    return chosen["epsilon"], (
        f"ε {chosen['epsilon']:g} is the smallest ε of the sweep that removes at least half of the most any ε "
        f"removes ({100 * chosen['removal_share']:.1f}% of the candidate turns' reasoning, against "
        f"{100 * most:.1f}% at ε {top['epsilon']:g}): removals have begun in earnest, and the larger ε, which "
        f"remove the rest at larger drops of some action, are left out")
