"""What the cover's exact algorithm must feed, counted here from the renderings (independently of
`bench.baselines` and `race_core.progress`), for tests that check the scorers' counts against it."""

from __future__ import annotations

import numpy as np

from race_core.render import Renderer


def common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    differ = np.flatnonzero(a[:n] != b[:n])
    return int(differ[0]) if differ.size else n


def held_and_candidates(results):
    """For each cover result: (the trajectory as first held, [(candidate, the trajectory held when it
    was scored)] in turn order), replaying the accepted removals."""
    for result in results:
        held, pairs = result.original, []
        for turn in range(1, len(held.turns)):
            if not held.turns[turn].reasoning:
                continue
            candidate = held.without_reasoning(turn)
            pairs.append((candidate, held))
            if turn in result.skipped_turns:
                held = candidate
        yield result.original, pairs


def bound_tokens(renderer: Renderer, results) -> int:
    """Each trajectory up to its last action, then each candidate from where it leaves the trajectory
    as held at that point to its last action."""
    total = 0
    for original, pairs in held_and_candidates(results):
        total += renderer.render(original).action_spans[-1][1]
        for candidate, held in pairs:
            rendered = renderer.render(candidate)
            end = rendered.action_spans[-1][1]
            total += end - common_prefix(renderer.render(held).input_ids[:end], rendered.input_ids[:end])
    return total


def bound_pairs(renderer: Renderer, results) -> int:
    """(query, key) pairs of one attention layer over the bound's tokens: a token fed at position p
    (counted from 0) attends over the p + 1 positions up to it."""
    total = 0
    for original, pairs in held_and_candidates(results):
        end = renderer.render(original).action_spans[-1][1]
        total += sum(p + 1 for p in range(end))
        for candidate, held in pairs:
            rendered = renderer.render(candidate)
            end = rendered.action_spans[-1][1]
            start = common_prefix(renderer.render(held).input_ids[:end], rendered.input_ids[:end])
            total += sum(p + 1 for p in range(start, end))
    return total


def full_forward_tokens(renderer: Renderer, results) -> int:
    """No cache: each trajectory, then each candidate, fed whole up to its last action."""
    return sum(renderer.render(x).action_spans[-1][1]
               for original, pairs in held_and_candidates(results) for x in (original, *(c for c, _ in pairs)))


def naive_tokens(renderer: Renderer, results) -> int:
    """The prototype: for each trajectory and candidate, one forward per turn over the prefix up to
    the end of that turn's action."""
    return sum(end for original, pairs in held_and_candidates(results)
               for x in (original, *(c for c, _ in pairs)) for _, end in renderer.render(x).action_spans)


def head_targets(renderer: Renderer, results) -> int:
    """Action tokens scored through the head: every action of each trajectory, then each candidate's
    actions from the turn whose reasoning it removed."""
    total = 0
    for original, pairs in held_and_candidates(results):
        total += sum(end - start for start, end in renderer.render(original).action_spans)
        for candidate, held in pairs:
            turn = next(t for t, (a, b) in enumerate(zip(candidate.turns, held.turns, strict=True)) if a != b)
            total += sum(end - start for start, end in renderer.render(candidate).action_spans[turn:])
    return total
