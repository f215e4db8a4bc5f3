"""report.html, opened from disk in a real browser (Debian's chromium driven by Playwright): search a
trajectory, open it, check which turns show as removed against decisions.parquet, switch ε, check
the change; no console errors. The pages come from a real `race cover --epsilon ...` sweep on the
tiny checkpoint (ε 2e-4 and 1e-2 remove different turns of the 8 generated trajectories: see
tests/test_sweep.py), with a trajectory whose text is hostile HTML, one too long to score and one
rejected line added.
"""

from __future__ import annotations

import contextlib
import io
import json
import os
import re
from pathlib import Path

import pandas as pd
import pytest

from flows.cli import main
from flows.cover import demo_inputs
from flows.sweep import epsilon_folder
from report.page import SampleLimits, explorer_data, script_json, stored_inputs, write_page
from storage import ArtifactStore
from storage.parquet import iter_rows_from_store

CHROMIUM = os.environ.get("RACE_CHROMIUM", "/usr/bin/chromium")
CHROMIUM_ARGS = ["--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
                 "--disable-component-update", "--disable-sync", "--no-first-run"]
LOW, HIGH = 0.0002, 0.01
HOSTILE = "What is 2 + 2? </script><script>window.pwned = 1</script><!-- <b>not bold</b> &amp;"
CALC = {"environment": "calc", "source_revision": "r1", "split": "train", "successful": True}


@pytest.fixture(scope="module")
def sweep(tiny_checkpoint, tmp_path_factory):
    """`race cover --epsilon LOW 1e-3 HIGH --max-tokens 400` on 8 generated trajectories, a hostile
    one, one over 400 tokens and a line of the wrong split."""
    root = tmp_path_factory.mktemp("report-html")
    extra = root / "extra.jsonl"
    lines = [{**CALC, "question": HOSTILE, "turns": [
                 {"reasoning": "<img src=x onerror=\"window.pwned = 2\"> I add.", "action": "calc[2+2]",
                  "observation": "4"},
                 {"reasoning": "The sum is 4 & I finish.", "action": "finish[4]", "observation": ""}]},
             {**CALC, "question": "A long one", "turns": [
                 {"reasoning": "x " * 300, "action": "calc[1+1]", "observation": "2"},
                 {"reasoning": "y " * 300, "action": "finish[2]", "observation": ""}]},
             {**CALC, "split": "test", "question": "held out", "turns": [
                 {"reasoning": "r", "action": "finish[1]", "observation": ""}]}]
    extra.write_text("".join(json.dumps(line) + "\n" for line in lines))
    inputs = [*demo_inputs(root / "home", n=8, seed=11), str(extra)]
    out, store = root / "out", root / "store"
    args = ["cover", "--input", *inputs, "--checkpoint", str(tiny_checkpoint), "--out", str(out),
            "--store", str(store), "--max-tokens", "400", "--epsilon", str(LOW), "0.001", str(HIGH)]
    with contextlib.redirect_stdout(io.StringIO()), contextlib.redirect_stderr(io.StringIO()):
        assert main(args) == 0
    return out, store


def decisions_at(out: Path, epsilon: float) -> pd.DataFrame:
    return pd.read_parquet(out / epsilon_folder(epsilon) / "decisions.parquet")


def removed_turns(decisions: pd.DataFrame, trajectory_id: str) -> set[int]:
    mine = decisions[(decisions["trajectory_id"] == trajectory_id) & decisions["accepted"]]
    return {int(t) for t in mine["turn"]}


def embedded(page: Path) -> dict:
    """The explorer's JSON as the page holds it."""
    text = page.read_text(encoding="utf-8")
    return json.loads(re.search(r'<script type="application/json" id="race-data">(.*?)</script>', text, re.S)[1])


@pytest.fixture(scope="module")
def browser():
    if not Path(CHROMIUM).exists():
        pytest.skip(f"no chromium at {CHROMIUM} (scripts/test.sh installs Debian's)")
    from playwright.sync_api import sync_playwright

    with sync_playwright() as playwright:
        browser = playwright.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        yield browser
        browser.close()


@pytest.fixture
def page(browser):
    """A fresh page; `page.errors` collects console errors and uncaught exceptions."""
    context = browser.new_context(viewport={"width": 1400, "height": 1000})
    page = context.new_page()
    page.errors = []
    page.on("console", lambda message: page.errors.append(message.text) if message.type == "error" else None)
    page.on("pageerror", lambda error: page.errors.append(str(error)))
    yield page
    context.close()


def shown_removed(page) -> set[int]:
    return {int(t) for t in page.locator("#trajectory-view .turn.removed").evaluate_all(
        "nodes => nodes.map(n => n.dataset.turn)")}


def listed_ids(page) -> list[str]:
    return page.locator("#trajectory-list li.item[data-id]").evaluate_all("nodes => nodes.map(n => n.dataset.id)")


def test_search_open_and_switch_epsilon_show_the_removals_decisions_parquet_holds(sweep, page):
    out, _ = sweep
    low, high = decisions_at(out, LOW), decisions_at(out, HIGH)
    changed = [t for t in dict.fromkeys(low["trajectory_id"]) if removed_turns(low, t) != removed_turns(high, t)]
    assert changed, "the two ε decide alike on every trajectory: the test shows nothing"
    target = changed[0]

    page.goto((out / "report.html").as_uri())
    page.fill("#search", target[:10])
    assert listed_ids(page) == [target]
    page.click(f"#trajectory-list li[data-id='{target}'] button")
    assert page.locator("#trajectory-view .trajectory-id").inner_text() == target
    assert shown_removed(page) == removed_turns(low, target)
    removed_text = page.locator("#trajectory-view .turn.removed .reasoning del").all_inner_texts()
    assert len(removed_text) == len(removed_turns(low, target))  # removed reasoning is struck through

    page.select_option("#epsilon", repr(HIGH))
    assert shown_removed(page) == removed_turns(high, target) != removed_turns(low, target)
    assert page.errors == []


def test_filters_count_what_the_cover_did_at_the_chosen_epsilon(sweep, page):
    out, _ = sweep
    page.goto((out / "report.html").as_uri())
    for epsilon in (LOW, HIGH):
        page.select_option("#epsilon", repr(epsilon))
        decisions = decisions_at(out, epsilon)
        with_removal = set(decisions.loc[decisions["accepted"], "trajectory_id"])
        page.click("#filters button[data-filter='removed']")
        assert set(listed_ids(page)) == with_removal
        page.click("#filters button[data-filter='none']")
        assert set(listed_ids(page)) == set(decisions["trajectory_id"]) - with_removal
    rejects = pd.read_parquet(out / epsilon_folder(LOW) / "rejects.parquet")
    (too_long,) = rejects.loc[rejects["code"] == "too_long", "trajectory_id"]
    page.click("#filters button[data-filter='too_long']")
    assert listed_ids(page) == [too_long]
    page.click(f"#trajectory-list li[data-id='{too_long}'] button")
    assert "too_long" in page.locator("#trajectory-view .outcome").inner_text()
    page.click("#filters button[data-filter='rejected']")
    page.click("#trajectory-list li.item.rejected button")
    assert "bad_split" in page.locator("#trajectory-view").inner_text()
    assert page.errors == []


def test_hostile_text_is_shown_as_text_and_never_run(sweep, page):
    out, _ = sweep
    page.goto((out / "report.html").as_uri())
    page.fill("#search", "</script>")
    (target,) = listed_ids(page)
    page.click(f"#trajectory-list li[data-id='{target}'] button")
    assert page.locator("#trajectory-view h3.question").inner_text() == HOSTILE
    assert "<img src=x" in page.locator("#trajectory-view .turn[data-turn='0'] .reasoning").inner_text()
    assert page.evaluate("window.pwned") is None
    assert page.errors == []


def test_a_single_run_page_and_its_store_copy_open_from_disk(sweep, page, tmp_path):
    from report.markdown import store_report

    out, store = sweep
    folder = out / epsilon_folder(LOW)
    data = embedded(folder / "report.html")
    assert data["epsilons"] == [repr(LOW)]
    stored = store_report(ArtifactStore(str(store)), folder / "report.html")
    assert stored.startswith("file://") and stored.endswith("/report.html")
    decisions = decisions_at(out, LOW)
    target = decisions.loc[decisions["accepted"], "trajectory_id"].iloc[0]
    page.goto(stored + f"#trajectory={target}")  # a link to one trajectory opens it
    assert page.locator("#epsilon").is_disabled()
    assert shown_removed(page) == removed_turns(decisions, target)
    assert page.errors == []


def test_a_large_run_embeds_a_bounded_sample_and_says_how_many_it_left_out(sweep, page):
    out, store = sweep
    summary = json.loads((out / epsilon_folder(LOW) / "summary.json").read_text())
    store = ArtifactStore(str(store))
    decisions = {repr(e): decisions_at(out, e) for e in (LOW, HIGH)}
    order = [row["id"] for row in iter_rows_from_store(store, summary["objects"]["trajectories"], "trajectories")]
    both = pd.concat(decisions.values())
    largest = both.groupby("trajectory_id")["max_drop"].max().nlargest(2).index
    rows, rejects = stored_inputs(store, summary["objects"])
    data = explorer_data(decisions, rows, rejects, limits=SampleLimits(first=3, largest=2, too_long=0))
    shown = [t["id"] for t in data["trajectories"]]
    assert set(shown) == set(order[:3]) | set(largest)
    assert shown == [t for t in order if t in shown]  # in input order
    assert data["counts"]["trajectories"] == len(order) == 10
    assert data["counts"]["left_out"] == len(order) - len(shown) > 0
    assert set(data["decisions"][repr(LOW)]) == set(shown) & set(decisions[repr(LOW)]["trajectory_id"])

    rows, rejects = stored_inputs(store, summary["objects"])
    budget = explorer_data(decisions, rows, rejects, limits=SampleLimits(first=3, largest=0, budget_chars=200))
    assert budget["counts"]["shown"] < 3 and budget["counts"]["left_out"] == len(order) - budget["counts"]["shown"]

    path = write_page(out / "sample.html", "sample", "# sample", data)
    page.goto(path.as_uri())
    note = page.locator("#sample-note").inner_text()
    assert f"holds {len(shown)} of the run's {len(order)} trajectories" in note
    assert f"{len(order) - len(shown)} are left out" in note
    assert len(listed_ids(page)) == len(shown)
    assert page.errors == []


def test_race_report_rebuilds_the_page_from_a_summary_and_its_store(sweep, tmp_path):
    out, _ = sweep
    folder = out / epsilon_folder(HIGH)
    with contextlib.redirect_stdout(io.StringIO()) as printed:
        assert main(["report", "--summary", str(folder / "summary.json"), "--out", str(tmp_path)]) == 0
    assert f"page: {tmp_path / 'report.html'}" in printed.getvalue()
    data = embedded(tmp_path / "report.html")
    decisions = decisions_at(out, HIGH)
    for entry in data["trajectories"]:
        candidates = data["decisions"][repr(HIGH)].get(entry["id"], [])
        assert {c[0] for c in candidates if c[1]} == removed_turns(decisions, entry["id"])
    assert "data:image/png;base64," in (tmp_path / "report.html").read_text()  # the plots inlined


def test_embedded_json_cannot_end_its_script_element():
    data = {"question": "</script><script>alert(1)</script><!-- & \u2028"}
    text = script_json(data)
    assert "<" not in text and ">" not in text and "&" not in text and "\u2028" not in text
    assert json.loads(text) == data


def test_the_ablation_page_holds_the_arms_table_and_plot(browser, tmp_path):
    from tasks.ablation import write_ablation

    def arm(name, seed, success, tokens):
        return {"arm": name, "seed": seed, "success_rate": success, "reasoning_tokens_per_episode": tokens,
                "turns_per_episode": 2.0, "policy_digest": "ab" * 32}

    result = {"arms": [arm("none", 0, 0.9, 40.0), arm("race", 0, 0.92, 22.0), arm("all", 0, 0.3, 10.0)],
              "before": arm("before", 0, 0.88, 41.0), "run": {"command": "race ablate <b>x</b>"}}
    written = write_ablation(tmp_path, result)
    page = browser.new_page()
    errors = []
    page.on("console", lambda message: errors.append(message.text) if message.type == "error" else None)
    page.goto(written["html"].as_uri())
    rows = page.locator("#summary table tr").all_inner_texts()
    assert any(row.startswith("race") and "-45%" in row for row in rows)  # 22 vs none's 40 tokens
    assert page.locator("#summary img[src^='data:image/png']").count() == 1
    assert "race ablate <b>x</b>" in page.locator("#summary").inner_text()  # markup in values is text
    assert errors == []
    page.close()


def test_the_pipeline_report_links_its_page_in_the_store(prefect_harness, sweep, tmp_path):
    from urllib.parse import urlparse

    from prefect import flow
    from prefect.artifacts import Artifact

    from race_core.config import CoverConfig
    from tasks.pipeline_tasks import report_task

    out, store = sweep
    summary = json.loads((out / epsilon_folder(LOW) / "summary.json").read_text())

    @flow
    def report_flow():
        return report_task(str(store), summary, str(tmp_path / "report"), CoverConfig(epsilon=LOW))

    written = report_flow()
    link = Artifact.get("race-report-html", _sync=True)  # the browser tests' Playwright loop may be running
    assert link.type == "markdown" and f"]({written['stored_html']})" in link.data
    stored = Path(urlparse(written["stored_html"]).path)
    assert stored.is_relative_to(store / "reports") and stored.name == "report.html"
    assert stored.read_bytes() == (tmp_path / "report" / "report.html").read_bytes()
