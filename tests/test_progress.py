"""The cover's progress as a person reads it (issue 16): bound tokens and candidates done of the
predicted totals, rate and ETA; a bar on a terminal, plain lines elsewhere, the same figures in the
Prefect progress artifact."""

import fcntl
import logging
import os
import struct
import termios

import pytest

from bench.baselines import bound_tokens
from race_core.cover import CoverResult, logic_cover
from race_core.progress import CoverProgress, ProgressFigures, bound_tokens_by_round
from race_core.render import Renderer
from race_core.scoring.hf import HFScorer

EPS = 1e-3


def logged(caplog) -> list[str]:
    """The lines the progress logged (its logger's records)."""
    return [r.getMessage() for r in caplog.records if r.name == "race_core.progress"]


def candidate_count(trajectories) -> int:
    return sum(t > 0 and bool(turn.reasoning) for x in trajectories for t, turn in enumerate(x.turns))


@pytest.fixture(scope="module")
def covered(tiny_policy, expert_trajectories):
    model, tokenizer = tiny_policy
    return logic_cover(expert_trajectories, HFScorer(model, tokenizer), EPS)


def test_the_bound_known_before_the_cover_is_the_work_bound_after_it(tiny_policy, expert_trajectories, covered):
    renderer = Renderer(tiny_policy[1])
    assert sum(len(r.skipped_turns) for r in covered) > 0  # accepted removals shorten later candidates
    all_rejected = [CoverResult(trajectory=t, skipped_turns=(), audit=[], original=t) for t in expert_trajectories]
    predicted = sum(sum(bound_tokens_by_round(t, renderer)) for t in expert_trajectories)
    assert predicted == bound_tokens(renderer, covered) == bound_tokens(renderer, all_rejected)


def run_shards(progress: CoverProgress, scorer: HFScorer, shards) -> None:
    """What the cover stage does with its shards (tasks.stages.cover)."""
    for shard in shards:
        logic_cover(shard, scorer, EPS, progress=progress.shard(shard, scorer.renderer))
    progress.close()


def test_done_reaches_the_predicted_total_exactly_and_plain_lines_say_where_the_cover_is(
        tiny_policy, expert_trajectories, caplog):
    caplog.set_level(logging.INFO, logger="race_core.progress")
    model, tokenizer = tiny_policy
    scorer = HFScorer(model, tokenizer)
    shards = [expert_trajectories[:12], expert_trajectories[12:]]
    published = []
    progress = CoverProgress(publish=published.append, bar=False, interval_s=0)
    run_shards(progress, scorer, shards)
    lines = logged(caplog)
    bound = sum(sum(bound_tokens_by_round(t, scorer.renderer)) for t in expert_trajectories)
    final = progress.figures
    assert (final.tokens_done, final.tokens_total) == (bound, bound)
    assert final.candidates_done == final.candidates_total == candidate_count(expert_trajectories) > 0
    assert final.fraction == 1.0 and final.eta_s == 0.0 and final.rate > 0
    rounds = sum(max(len(t.turns) for t in shard) for shard in shards)  # round 0 and every candidate round
    assert len(published) == len(lines) == rounds
    assert all(isinstance(f, ProgressFigures) for f in published)
    # without the trajectory count the totals grow with each shard begun, the work done never goes back
    assert [f.tokens_done for f in published] == sorted(f.tokens_done for f in published)
    assert lines[0].startswith("cover: trajectories 1-12: round 0/")
    assert "12 trajectories in full;" in lines[0] and "tokens/s" in lines[0] and "ETA" in lines[0]
    assert lines[-1].startswith("cover: trajectories 13-20: round ")
    assert f"{bound:,}/{bound:,} tokens (100%)" in lines[-1] and "ETA 0:00" in lines[-1]


def test_with_the_trajectory_count_the_total_is_extrapolated_and_lines_are_spaced(tiny_policy, expert_trajectories,
                                                                                  caplog):
    caplog.set_level(logging.INFO, logger="race_core.progress")
    model, tokenizer = tiny_policy
    scorer = HFScorer(model, tokenizer)
    shard = expert_trajectories[:6]
    published = []
    # 2 shards of the same 6 trajectories and 3 refused ones: the first shard predicts the total exactly
    progress = CoverProgress(15, publish=published.append, bar=False, interval_s=3600)
    progress.skip(3)
    run_shards(progress, scorer, [shard, shard])
    lines = logged(caplog)
    one_shard = sum(sum(bound_tokens_by_round(t, scorer.renderer)) for t in shard)
    assert {f.tokens_total for f in published} == {2 * one_shard}
    assert {f.candidates_total for f in published} == {2 * candidate_count(shard)}
    half = published[len(published) // 2 - 1]  # the first shard's last round
    assert half.fraction == 0.5 and half.trajectories_begun == 6 and half.trajectories_total == 15
    assert published[-1].fraction == 1.0
    # an hour between plain lines: the first round's line, then the last one, held back until close
    assert len(lines) == 2
    assert lines[0].startswith("cover: trajectories 4-9 of 15: round 0/")
    assert lines[1].startswith("cover: trajectories 10-15 of 15: round ") and "(100%)" in lines[1]


def test_a_terminal_gets_a_bar_redrawn_in_place_and_log_lines_above_it(tiny_policy, expert_trajectories, caplog):
    caplog.set_level(logging.INFO, logger="race_core.progress")
    model, tokenizer = tiny_policy
    scorer = HFScorer(model, tokenizer)
    controller, terminal = os.openpty()  # a real pseudo-terminal: `isatty` is what decides
    fcntl.ioctl(terminal, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 160, 0, 0))  # 160 columns
    os.set_blocking(controller, False)
    with os.fdopen(terminal, "w") as stream:
        on_terminal = logging.StreamHandler(stream)  # the log lines on the bar's terminal, as a console shows them
        logging.getLogger("race_core.progress").addHandler(on_terminal)
        try:
            progress = CoverProgress(stream=stream)
            shard = expert_trajectories[:4]
            callback = progress.shard(shard, scorer.renderer)
            logic_cover(shard, scorer, EPS, progress=callback)
            progress.log("cover: 4 trajectories scored")
            progress.close()
        finally:
            logging.getLogger("race_core.progress").removeHandler(on_terminal)
        stream.flush()
        shown = os.read(controller, 1 << 20).decode()
    os.close(controller)
    assert logged(caplog) == ["cover: 4 trajectories scored"]  # no plain progress lines on a terminal
    assert shown.count("\r") > max(len(t.turns) for t in shard)  # one redraw per round at least
    assert "cover |" in shown and "█" in shown and "tokens (100%)" in shown and "ETA 0:00" in shown
    assert "cover: 4 trajectories scored" in shown


def test_the_prefect_cover_task_publishes_the_same_figures(prefect_harness, tiny_checkpoint, demo_inputs, tmp_path):
    from prefect import flow
    from prefect.client.orchestration import get_client
    from prefect.client.schemas.filters import ArtifactFilter, ArtifactFilterKey

    from race_core.config import CoverConfig, Resources
    from race_core.policy import load_tokenizer
    from storage import ArtifactStore
    from tasks import stages
    from tasks.pipeline_tasks import stage_task
    from tasks.training_stages import PolicyRef

    store = str(tmp_path / "store")
    ingested = stages.ingest(ArtifactStore(store), demo_inputs)

    @flow
    def cover_only():
        return stage_task("cover")(store, trajectories=ingested, policy=PolicyRef.local(tiny_checkpoint),
                                   config=CoverConfig(), resources=Resources(shard_size=3))

    manifest = cover_only()
    assert manifest["metrics"]["trajectories"] == 8
    with get_client(sync_client=True) as client:
        artifacts = client.read_artifacts(
            artifact_filter=ArtifactFilter(key=ArtifactFilterKey(any_=["race-cover-progress"])))
    latest = max(artifacts, key=lambda a: a.updated)
    assert latest.type == "progress" and latest.data == 100.0
    trajectories = list(stages.iter_trajectories(ArtifactStore(store), ingested["objects"]["trajectories"]))
    bound = bound_tokens(Renderer(load_tokenizer(tiny_checkpoint)),
                         [CoverResult(trajectory=t, skipped_turns=(), audit=[], original=t) for t in trajectories])
    assert latest.description.startswith(f"LoGiC cover: {bound:,}/{bound:,} tokens (100%), ")
    assert "candidates" in latest.description and "ETA 0:00" in latest.description


def test_a_pool_adds_up_its_children_and_predicts_the_silent_ones():
    """`tasks.executors.pool` reads each child run's figures from its lease; a child not heard from yet is
    predicted at the mean work per trajectory of the others, a finished one counts as done."""
    from race_core.progress import combine_figures

    halfway = ProgressFigures(tokens_done=100, tokens_total=400, candidates_done=2, candidates_total=8,
                              trajectories_begun=4, trajectories_total=8, elapsed_s=10.0)
    finished = ProgressFigures(tokens_done=250, tokens_total=300, candidates_done=5, candidates_total=6,
                               trajectories_begun=4, trajectories_total=4, elapsed_s=9.0)
    assert combine_figures([(None, 8, False)], 1.0) is None  # nothing heard: nothing to say
    combined = combine_figures([(halfway, 8, False), (None, 6, False), (finished, 4, True)], 20.0)
    assert combined.tokens_total == 400 + round(6 * 700 / 12) + 300
    assert combined.tokens_done == 100 + 300  # a finished child's last beat may be older than its end
    assert combined.candidates_total == 8 + round(6 * 14 / 12) + 6 and combined.candidates_done == 2 + 6
    assert (combined.trajectories_begun, combined.trajectories_total) == (8, 18)
    assert combined.rate == 400 / 20.0 and 0 < combined.fraction < 1
    done = combine_figures([(halfway, 8, True), (None, 6, True)], 20.0)
    assert done.fraction == 1.0 and done.eta_s == 0.0
