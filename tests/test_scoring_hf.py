"""The HF scorer equals a plain, cache-free forward pass over the whole rendered trajectory."""

import numpy as np
import pytest
import torch

from race_core.render import Renderer
from race_core.scoring import ScoreRequest
from race_core.scoring.hf import HFScorer
from race_core.tiny import TINY


def plain_action_means(model, renderer, trajectory):
    rendered = renderer.render(trajectory)
    with torch.no_grad():
        logits = model(torch.as_tensor(rendered.input_ids)[None]).logits[0].double()
    logprobs = torch.log_softmax(logits, -1)
    return [float(np.mean([logprobs[p - 1, rendered.input_ids[p]].item() for p in range(a, b)]))
            for a, b in rendered.action_spans]


# chunk_tokens 5: many chunks, padding inside chunks (copied prefixes); prefixes read in place feed a
# batch in one call, so chunk_tokens does not apply to them and they run once per batch size
_PATHS = [(reuse, False, chunk) for reuse in (True, False) for chunk in (0, 5, 128)] + [(True, True, 128)]


@pytest.mark.parametrize(("prefix_reuse", "in_place", "chunk_tokens"), _PATHS,
                         ids=[f"{'in-place' if i else 'copied' if r else 'no-reuse'}-chunk{c}" for r, i, c in _PATHS])
@pytest.mark.parametrize("batch_size", [1, 7])
def test_scorer_equals_plain_forward_over_cover_like_rounds(tiny_policy, expert_trajectories, prefix_reuse, in_place,
                                                           batch_size, chunk_tokens):
    model, tokenizer = tiny_policy
    renderer = Renderer(tokenizer)
    scorer = HFScorer(model, tokenizer, batch_size=batch_size, prefix_reuse=prefix_reuse,
                      chunk_tokens=chunk_tokens, prefix_in_place=in_place)
    assert scorer.in_place == in_place
    trajectories = list(expert_trajectories[:9])
    current = {i: t for i, t in enumerate(trajectories)}
    requests = [ScoreRequest(i, t) for i, t in current.items()]
    for t in range(0, 4):
        if t > 0:  # a cover-like round: remove reasoning t, keep every other removal
            requests = [ScoreRequest(i, c.without_reasoning(t), from_turn=t)
                        for i, c in current.items() if len(c.turns) > t]
        got = scorer.score(requests)
        for request, scores in zip(requests, got, strict=True):
            expected = plain_action_means(model, renderer, request.trajectory)[request.from_turn:]
            assert len(scores) == len(expected)
            assert np.max(np.abs(np.array(scores) - expected)) < 1e-5
            if t % 2 == 1:
                current[request.key] = request.trajectory
    if prefix_reuse:
        assert scorer.stats.tokens_reused > 0
    else:
        assert scorer.stats.tokens_reused == 0


@pytest.mark.parametrize("in_place", [True, False], ids=["prefix-in-place", "prefix-copied"])
def test_a_cover_leaves_no_tensor_to_the_cyclic_collector(tiny_policy, expert_trajectories, in_place):
    """Every batch's cache goes when the batch ends, by reference counting: a tensor in a reference
    cycle waits for Python's cyclic collector, which runs by counts of Python objects, not bytes. The
    in-place cache's layers once pointed back at their cache (measured on the 20M model, N=64, T=8:
    RSS 4.7, 10.4, 13.1 GiB after three covers in one process, the second 30% slower; 4.3-5.1 GiB
    with no cycle)."""
    import gc

    from race_core.cover import logic_cover

    model, tokenizer = tiny_policy
    gc.collect()
    flags = gc.get_debug()
    gc.disable()
    try:
        scorer = HFScorer(model, tokenizer, batch_size=4, prefix_in_place=in_place)
        assert scorer.in_place == in_place
        logic_cover(list(expert_trajectories[:6]), scorer, 0.5)
        assert scorer.stats.tokens_reused > 0
        del scorer
        gc.set_debug(gc.DEBUG_SAVEALL)  # what the collector finds stays in gc.garbage to be looked at
        gc.collect()
        cyclic = [o for o in gc.garbage if isinstance(o, torch.Tensor)]
        kinds = sorted({type(o).__name__ for o in gc.garbage})
    finally:
        gc.set_debug(flags)
        gc.garbage.clear()
        gc.enable()
    assert not cyclic, f"{len(cyclic)} tensors left in reference cycles among {kinds}"


def test_prefix_reuse_feeds_only_the_suffix(tiny_policy, expert_trajectories):
    model, tokenizer = tiny_policy
    with_reuse, without = (HFScorer(model, tokenizer, prefix_reuse=flag) for flag in (True, False))
    trajectory = max(expert_trajectories, key=lambda t: len(t.turns))
    for scorer in (with_reuse, without):
        scorer.score([ScoreRequest("k", trajectory)])
        scorer.score([ScoreRequest("k", trajectory.without_reasoning(2), from_turn=2)])
    rendered = Renderer(tokenizer).render(trajectory)
    suffix_start = rendered.turn_starts[2] + 1  # after the `<think>` token they share
    fed_second = with_reuse.stats.tokens_processed - (rendered.action_spans[-1][1])
    assert fed_second == Renderer(tokenizer).render(trajectory.without_reasoning(2)).action_spans[-1][1] - suffix_start
    assert with_reuse.stats.tokens_processed < without.stats.tokens_processed


def test_to_turn_scores_only_up_to_that_action(tiny_policy, expert_trajectories):
    model, tokenizer = tiny_policy
    trajectory = max(expert_trajectories, key=lambda t: len(t.turns))
    scorer = HFScorer(model, tokenizer)
    full = scorer.score([ScoreRequest("a", trajectory, from_turn=1)])[0]
    part = scorer.score([ScoreRequest("b", trajectory, from_turn=1, to_turn=2)])[0]
    assert part == pytest.approx(full[:2], abs=1e-6)


def test_scorer_reports_its_noise_far_below_epsilon(tiny_policy, expert_trajectories):
    model, tokenizer = tiny_policy
    scorer = HFScorer(model, tokenizer)
    noise = scorer.measure_noise([ScoreRequest(i, t) for i, t in enumerate(expert_trajectories[:5])])
    assert scorer.noise == noise
    assert 0.0 <= noise < 1e-5


def test_from_pretrained_loads_a_local_folder_only(tiny_checkpoint, tmp_path):
    scorer = HFScorer.from_pretrained(str(tiny_checkpoint))
    assert scorer.name == "hf"
    assert scorer.max_length == TINY.max_positions
    with pytest.raises(FileNotFoundError, match="not a local folder"):
        HFScorer.from_pretrained("some-org/some-model")
    (tmp_path / "config.json").write_text("{}")
    (tmp_path / "pytorch_model.bin").write_bytes(b"")
    with pytest.raises(FileNotFoundError, match="safetensors"):
        HFScorer.from_pretrained(str(tmp_path))


def mixed_rows(scorer, trajectories):
    """A cover round's rows of mixed lengths: each trajectory scored in full (its KV prefix cached),
    then a candidate of each without the reasoning of a different turn, so rows differ both in the
    tokens they feed and in the prefix they reuse."""
    scorer.score([ScoreRequest(i, t) for i, t in enumerate(trajectories)])
    requests = [ScoreRequest(i, t.without_reasoning(k), from_turn=k)
                for i, t in enumerate(trajectories) for k in [1 + i % (len(t.turns) - 1)] if len(t.turns) > 1]
    rows = []
    for request in requests:
        rendered = scorer.renderer.render(request.trajectory)
        rows.append(scorer._row(request.key, rendered,
                                rendered.action_spans[request.from_turn: request.last_turn + 1]))
    return requests, rows


def padding(rows, batch):
    """(fed positions the batch computes: rows x its longest fed length, tokens its rows really feed)."""
    feds = [rows[i].fed for i in batch]
    return len(feds) * max(feds), sum(feds)


def forward_cost(rows, batch, overhead, attention, chunk, in_place=False):
    """The cost of one forward, counted here position by position and chunk by chunk (not with the
    scorer's formula): padded positions, attention pairs (the causal triangle without a cached
    prefix, else every chunk's queries over the prefix and the tokens up to the chunk's end; prefixes
    read in place: the triangle and each row's padded queries over its own prefix, in one call), and
    `overhead` per call of the model."""
    new = max(rows[i].fed for i in batch)
    past = max(rows[i].reused for i in batch)
    if in_place:
        triangle = sum(q + 1 for q in range(new))
        pairs = sum(rows[i].reused * new + triangle for i in batch)
        return len(batch) * new + attention * pairs + overhead
    if past == 0:
        pairs, calls = sum(q + 1 for q in range(new)), 1
    else:
        ends = list(range(chunk, new, chunk)) + [new]
        pairs = sum((end - start) * (past + end) for start, end in zip([0, *ends[:-1]], ends, strict=True))
        calls = len(ends)
    return len(batch) * new + attention * len(batch) * pairs + overhead * calls


def contiguous_plans(order, batch_size):
    """Every cut of `order` into consecutive batches of at most `batch_size`."""
    if not order:
        yield []
        return
    for k in range(1, min(batch_size, len(order)) + 1):
        for rest in contiguous_plans(order[k:], batch_size):
            yield [order[:k], *rest]


@pytest.mark.parametrize("in_place", [True, False], ids=["prefix-in-place", "prefix-copied"])
@pytest.mark.parametrize("overhead", [0.0, 16.0, 1e9])
def test_the_batch_plan_is_the_cheapest_cut_of_the_rows(tiny_policy, expert_trajectories, overhead, in_place):
    model, tokenizer = tiny_policy
    scorer = HFScorer(model, tokenizer, batch_size=4, chunk_tokens=16, forward_overhead=overhead,
                      prefix_in_place=in_place)
    _, rows = mixed_rows(scorer, list(expert_trajectories[:10]))
    assert len({row.fed for row in rows}) > 5 and len({row.reused for row in rows}) > 5  # really mixed
    attention = scorer.cost.attention
    assert 0 < attention < 0.1  # a pair of one layer costs a small share of a position through its weights

    plan = scorer._plan_batches(rows)
    assert sorted(i for batch in plan for i in batch) == list(range(len(rows)))  # every row, once
    assert all(1 <= len(batch) <= 4 for batch in plan)
    order = sorted(range(len(rows)), key=lambda i: (rows[i].fed, len(rows[i].ids)))
    cheapest = min(sum(forward_cost(rows, b, overhead, attention, 16, in_place) for b in cut)
                   for cut in contiguous_plans(order, 4))
    assert sum(forward_cost(rows, b, overhead, attention, 16, in_place) for b in plan) == pytest.approx(cheapest)
    if overhead == 0:  # padding costs, calls are free: no batch pads
        assert sum(padding(rows, b)[0] for b in plan) == sum(row.fed for row in rows)
    if overhead == 1e9:  # calls cost everything: the fewest batches
        assert len(plan) == -(-len(rows) // 4)


def test_the_plan_changes_batches_not_scores(tiny_policy, expert_trajectories):
    model, tokenizer = tiny_policy
    trajectories = list(expert_trajectories)
    scores, calls, padded = [], [], []
    for overhead in (0.0, 1e9):
        scorer = HFScorer(model, tokenizer, batch_size=8, forward_overhead=overhead)
        requests, _ = mixed_rows(scorer, trajectories)
        before = scorer.stats.work()
        scores.append(scorer.score(requests))
        done = scorer.stats.work() - before
        calls.append(done.forward_calls)
        padded.append(done.padded_positions / done.tokens_processed)
    assert calls[0] > calls[1] and padded[0] == 1.0 < padded[1]
    for cheap_calls, few_calls in zip(*scores, strict=True):
        assert np.max(np.abs(np.array(cheap_calls) - few_calls)) < 1e-5


def test_a_negative_forward_overhead_is_refused(tiny_policy):
    model, tokenizer = tiny_policy
    with pytest.raises(ValueError, match="forward_overhead must be >= 0"):
        HFScorer(model, tokenizer, forward_overhead=-1)


def test_the_overhead_is_measured_once_per_model_as_a_power_of_two(tiny_policy, monkeypatch):
    from race_core.scoring.plan import measure_overhead
    from race_core.scoring.prices import cpu_overhead

    model, tokenizer = tiny_policy
    default = HFScorer(model, tokenizer)  # the pipeline's: the table's price for this CPU's class
    assert (default.cost.overhead, default.stats.extra["overhead_source"]) == cpu_overhead(model)
    assert default.stats.extra["overhead_measured"] is False
    scorer = HFScorer(model, tokenizer, forward_overhead="measure")
    overhead = scorer.stats.extra["forward_overhead"]
    assert scorer.stats.extra["overhead_measured"] is True and scorer.cost.overhead == overhead
    assert overhead >= 1 and float(overhead).is_integer() and int(overhead) & (int(overhead) - 1) == 0
    monkeypatch.setattr(model, "get_decoder", lambda: pytest.fail("the overhead was measured again"))
    assert measure_overhead(model) == overhead
    pinned = HFScorer(model, tokenizer, forward_overhead=3)
    assert pinned.cost.overhead == 3 and pinned.stats.extra["overhead_measured"] is False
