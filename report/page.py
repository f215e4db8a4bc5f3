"""`report.html`: a report as one self-contained page, beside its `report.md`.

The page holds everything it shows: CSS and JavaScript inline, plots as data URIs, the data as JSON
in a `<script type="application/json">` element, and a Content-Security-Policy that lets it load
nothing else, so it opens from disk, from the store or as an e-mail attachment, with no server.

It has two parts. The summary is the report's own Markdown (`report.md`, `epsilon_sweep.md` or the
ablation's `report.md`) as HTML, so each fact is written in one place. The decisions explorer
(`explorer_data`) lists the run's trajectories, searchable by id or question text and filtered by
what the cover did to them (any removal, none, too_long, rejected lines), and shows one trajectory
turn by turn: its reasoning kept or struck through, its action and observation, and for every
candidate turn the drops d_j of the actions it was checked against, drawn against ε, with the
action that blocked a removal named. A sweep's page carries each ε's decisions and an ε selector.

A large run embeds a bounded sample (`SampleLimits`: the first trajectories in input order, those
with the largest drop, the too_long ones, each text field cut to a length, a budget of text in all)
and says how many it leaves out; the full data stays in the Parquet files.
"""

from __future__ import annotations

import base64
import html
import json
import math
import re
from collections.abc import Iterable, Mapping
from dataclasses import dataclass
from importlib import resources
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

# Nothing but the page itself: inline scripts and styles, images from data: URIs.
CSP = "default-src 'none'; img-src data:; style-src 'unsafe-inline'; script-src 'unsafe-inline'"


@dataclass(frozen=True)
class SampleLimits:
    """How much of a run the page embeds."""

    first: int = 200  # trajectories in input order
    largest: int = 50  # and those whose largest drop d_j is largest (over every ε of a sweep)
    too_long: int = 50  # and trajectories refused as too_long
    rejected: int = 200  # rejected input lines listed
    text_chars: int = 4000  # longest text field shown; longer ones are cut and say by how much
    budget_chars: int = 8_000_000  # text of all embedded trajectories; past it, the rest is left out


# -- the summary: the report's Markdown as HTML ----------------------------------------------------
def markdown_html(text: str, folder: Path) -> str:
    """`text` (Markdown: headings, lists, tables, code, images) as HTML; PNG images found in
    `folder` inlined as data URIs. Raw HTML in the text is shown as text, never interpreted."""
    import markdown
    from markdown.extensions import Extension

    class _HtmlAsText(Extension):
        def extendMarkdown(self, md):  # noqa: N802 - Python-Markdown's name
            md.preprocessors.deregister("html_block")
            md.inlinePatterns.deregister("html")

    def inline(match: re.Match[str]) -> str:
        path = folder / match.group(2)
        if not path.is_file():
            return match.group(0)
        return f"![{match.group(1)}]({png_data_uri(path)})"

    text = re.sub(r"!\[([^\]]*)\]\(([\w.\-]+\.png)\)", inline, text)
    return markdown.Markdown(extensions=["tables", _HtmlAsText()]).convert(text)


def png_data_uri(path: Path) -> str:
    return "data:image/png;base64," + base64.b64encode(path.read_bytes()).decode("ascii")


# -- the explorer's data -----------------------------------------------------------------------------
def _finite(x: Any) -> float | None:
    """JSON has no NaN or infinity: a non-finite drop is null (the page says "not finite")."""
    return float(x) if x is not None and math.isfinite(float(x)) else None


def _text(x: Any) -> str | None:
    """A string cell as str, a missing one (None, or NaN in pandas' string columns) as None."""
    return None if x is None or (isinstance(x, float) and math.isnan(x)) else str(x)


def _cut(text: str | None, limit: int) -> str:
    text = _text(text) or ""
    return text if len(text) <= limit else f"{text[:limit]}… [{len(text) - limit} more characters]"


def _facts(decisions: pd.DataFrame) -> dict[str, Any]:
    """The run facts a decisions table records: model, ε, backend, render mode(s), counts."""
    scored = decisions[~decisions["skipped_empty"].astype(bool)]
    first = decisions.iloc[0] if len(decisions) else None
    return {"model_digest": None if first is None else _text(first["model_digest"]),
            "backend": None if first is None else _text(first["backend"]),
            "render_modes": sorted(set(decisions["render_mode"].dropna())),
            "candidates": len(scored), "removed": int(decisions["accepted"].sum()),
            "trajectories": int(decisions["trajectory_id"].nunique())}


def _largest_drops(decisions: Iterable[pd.DataFrame]) -> pd.Series:
    """trajectory id -> its largest finite candidate drop, over every table given."""
    frames = [d[["trajectory_id", "max_drop"]] for d in decisions if len(d)]
    if not frames:
        return pd.Series(dtype=float)
    both = pd.concat(frames, ignore_index=True)
    finite = both[np.isfinite(both["max_drop"].astype(float).to_numpy())]  # None (not scored) is NaN
    return finite.groupby("trajectory_id")["max_drop"].max()


def _trajectory(row: Mapping[str, Any], limits: SampleLimits) -> dict[str, Any]:
    return {"id": row["id"], "question": _cut(row.get("question"), limits.text_chars),
            "environment": row.get("environment") or "",
            "turns": [[_cut(t.get("reasoning"), limits.text_chars), _cut(t.get("action"), limits.text_chars),
                       _cut(t.get("observation"), limits.text_chars)] for t in row["turns"]]}


def _size(entry: dict[str, Any]) -> int:
    return len(entry["question"]) + sum(len(a) + len(b) + len(c) for a, b, c in entry["turns"])


def explorer_data(decisions: Mapping[str, pd.DataFrame], trajectories: Iterable[Mapping[str, Any]] | None = None,
                  rejects: pd.DataFrame | None = None, selected: str | None = None,
                  limits: SampleLimits = SampleLimits()) -> dict[str, Any]:
    """The JSON the page's explorer reads.

    `decisions`: ε label -> that ε's decisions table (one entry for a run, one per ε for a sweep);
    `trajectories`: the run's `trajectories` rows in input order (None: the page shows the decisions
    without the text); `rejects`: the run's rejects (ingest's lines and the cover's too_long)."""
    if rejects is None:
        rejects = pd.DataFrame(columns=["file", "line", "code", "field", "message", "trajectory_id"])
    refused_ids = rejects["trajectory_id"].notna() & (rejects["trajectory_id"].astype(str) != "")
    too_long = {r.trajectory_id: _cut(r.message, limits.text_chars) or "too_long"
                for r in rejects[refused_ids].itertuples()}
    lines = rejects[~refused_ids]
    largest = _largest_drops(decisions.values()).sort_values(ascending=False, kind="stable")
    by_drop = list(largest.index[: limits.largest])
    refused_first = list(too_long)[: limits.too_long]
    if trajectories is None:  # no text: the decided trajectories (and the refused ones) by id
        trajectories = ({"id": tid, "question": "", "turns": []}
                        for tid in dict.fromkeys([*_decided_ids(decisions), *too_long]))
    wanted = set(by_drop) | set(refused_first)
    order: dict[str, int] = {}  # of the trajectories kept as candidates for the page only
    kept: dict[str, dict[str, Any]] = {}
    first: list[str] = []
    total = 0
    for index, row in enumerate(trajectories):
        total += 1
        if index < limits.first or row["id"] in wanted:
            order[row["id"]] = index
            kept[row["id"]] = _trajectory(row, limits)
            if index < limits.first:
                first.append(row["id"])
    chosen: dict[str, None] = {}
    used = 0
    for tid in [*first, *by_drop, *refused_first]:  # by priority, until the text budget is spent
        if tid in kept and tid not in chosen and used + _size(kept[tid]) <= limits.budget_chars:
            chosen[tid] = None
            used += _size(kept[tid])
    shown = sorted(chosen, key=order.__getitem__)
    entries = [{**kept[tid], "too_long": too_long.get(tid)} for tid in shown]
    ids = set(shown)
    return {
        "epsilons": list(decisions),
        "selected": selected if selected is not None else next(iter(decisions), None),
        "runs": {label: _facts(d) for label, d in decisions.items()},
        "trajectories": entries,
        "decisions": {label: _decision_entries(d, ids) for label, d in decisions.items()},
        "rejected": [{"file": _text(r.file), "line": int(r.line), "code": _text(r.code), "field": _text(r.field),
                      "message": _cut(r.message, limits.text_chars)}
                     for r in lines.head(limits.rejected).itertuples()],
        "counts": {"trajectories": total, "shown": len(entries), "left_out": total - len(entries),
                   "largest": len([t for t in by_drop if t in ids]), "too_long": len(too_long),
                   "rejected": len(lines), "rejected_shown": min(len(lines), limits.rejected),
                   "with_text": any(entry["turns"] for entry in entries)},
        "limits": {"first": limits.first, "largest": limits.largest, "too_long": limits.too_long,
                   "text_chars": limits.text_chars},
    }


def _decided_ids(decisions: Mapping[str, pd.DataFrame]) -> list[str]:
    return list(dict.fromkeys(tid for d in decisions.values() for tid in d["trajectory_id"]))


def _decision_entries(decisions: pd.DataFrame, ids: set[str]) -> dict[str, list[list[Any]]]:
    """trajectory id -> its candidates as [turn, accepted, reason, drops, reasoning tokens], for `ids`."""
    out: dict[str, list[list[Any]]] = {}
    for r in decisions[decisions["trajectory_id"].isin(ids)].itertuples():
        drops = [] if r.drops is None else [_finite(d) for d in r.drops]
        out.setdefault(r.trajectory_id, []).append(
            [int(r.turn), bool(r.accepted), _text(r.reason), drops, int(r.reasoning_tokens)])
    return out


# -- the page --------------------------------------------------------------------------------------
def _asset(name: str) -> str:
    return resources.files("report").joinpath("assets", name).read_text(encoding="utf-8")


def script_json(data: Any) -> str:
    """`data` as JSON that is safe inside a <script> element: no `<`, `>` or `&` appear literally, so
    no text in it (a question holding `</script>`, say) can end the element or open a comment."""
    text = json.dumps(data, ensure_ascii=False, allow_nan=False, separators=(",", ":"))
    return (text.replace("<", "\\u003c").replace(">", "\\u003e").replace("&", "\\u0026")
            .replace("\u2028", "\\u2028").replace("\u2029", "\\u2029"))


def render_page(title: str, summary_html: str, data: dict[str, Any] | None = None) -> str:
    """The whole page: `summary_html`, then the explorer over `data` (`explorer_data`) if given."""
    explorer = ""
    if data is not None:
        explorer = (f'<section id="explorer" aria-label="decisions explorer">{_asset("explorer.html")}</section>\n'
                    f'<script type="application/json" id="race-data">{script_json(data)}</script>\n'
                    f"<script>{_asset('explorer.js')}</script>\n")
    nav = '<nav><a href="#summary">Summary</a> <a href="#explorer">Trajectories</a></nav>' if data else ""
    return (f'<!DOCTYPE html>\n<html lang="en">\n<head>\n<meta charset="utf-8">\n'
            f'<meta http-equiv="Content-Security-Policy" content="{CSP}">\n'
            f'<meta name="viewport" content="width=device-width, initial-scale=1">\n'
            f"<title>{html.escape(title)}</title>\n<style>{_asset('report.css')}</style>\n</head>\n<body>\n"
            f"<header><h1>{html.escape(title)}</h1>{nav}</header>\n"
            f'<main>\n<section id="summary">{summary_html}</section>\n{explorer}</main>\n</body>\n</html>\n')


def write_page(path: Path, title: str, markdown_text: str, data: dict[str, Any] | None = None) -> Path:
    """Write the page to `path`, its summary from `markdown_text` (images beside `path` inlined)."""
    page = render_page(title, markdown_html(markdown_text, path.parent), data)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text(page, encoding="utf-8")
    tmp.replace(path)
    return path


# -- where a run's data comes from -------------------------------------------------------------------
def stored_inputs(store, objects: Mapping[str, str]) -> tuple[Iterable[dict[str, Any]] | None, pd.DataFrame | None]:
    """A run's trajectory rows (streamed) and its rejects, from the store objects its summary names
    (`trajectories`, `rejects`, `too_long`); None for what the summary does not name or the store
    no longer holds."""
    from storage.parquet import iter_rows_from_store, read_dataset_from_store

    def there(name: str) -> bool:  # named, and not collected since (the page is then built without it)
        return bool(objects.get(name)) and store.has_object(objects[name])

    rows = iter_rows_from_store(store, objects["trajectories"], "trajectories") if there("trajectories") else None
    parts = [read_dataset_from_store(store, objects[name], "rejects") for name in ("rejects", "too_long")
             if there(name)]
    return rows, (pd.concat(parts, ignore_index=True) if parts else None)


def write_run_page(path: Path, summary: dict[str, Any], markdown_text: str, decisions: pd.DataFrame | None,
                   epsilon: float | None = None, store=None) -> Path:
    """A run's page (`race run`, `race demo`, `race cover`, `race report`): its report.md, and the
    explorer over its decisions (texts and rejects from `store` where its summary names them)."""
    data = None
    if decisions is not None:
        eps = epsilon if epsilon is not None else (float(decisions["epsilon"].iloc[0]) if len(decisions)
                                                   else summary.get("epsilon"))
        rows, rejects = stored_inputs(store, summary.get("objects", {})) if store is not None else (None, None)
        data = explorer_data({repr(float(eps)) if eps is not None else "": decisions}, rows, rejects)
    return write_page(path, "RACE run report", markdown_text, data)


def write_sweep_page(path: Path, markdown_text: str, decisions: Mapping[str, pd.DataFrame],
                     runs: Mapping[str, dict[str, Any]]) -> Path:
    """An ε sweep's page: its table, and the explorer with an ε selector over `decisions` (ε label ->
    that ε's decisions). The texts and rejects are the same for every ε: read once, from the store
    that the first ε's run summary (`runs`) names."""
    from storage import ArtifactStore

    first = next(iter(runs.values()), {})
    url = first.get("run", {}).get("store")
    rows, rejects = stored_inputs(ArtifactStore(url), first.get("objects", {})) if url else (None, None)
    return write_page(path, "RACE ε sweep", markdown_text, explorer_data(decisions, rows, rejects))
