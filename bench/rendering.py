"""`race bench rendering`: what token-in/token-out rendering changes on a real checkpoint.

For the same trajectories, in one process: the renderer in `canonical` mode (the tokenizer's own
ids of the rendered text) against `segments` mode (every segment tokenized alone, the renderer
before docs/architecture.md §3's rule). It reports the share of trajectories whose segment-wise ids equal the
tokenizer's own, the log-prob of each action's first token and the shift of each action's mean
log-prob between the two, and how many of the cover's decisions at ε differ.

Without `--input` it uses `react_trajectories`: small ReAct-style agent trajectories (Thought /
Search[...] / Lookup[...] / Finish[...]) written here, so the bench runs offline.
"""

from __future__ import annotations

import argparse
import json
import statistics
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from race_core.config import DEFAULT_EPSILON
from race_core.schema import Trajectory, Turn

FACTS = [
    ("Marie Curie", "the University of Paris", "1906", "physics and chemistry"),
    ("Alan Turing", "King's College, Cambridge", "1936", "computability"),
    ("Ada Lovelace", "home, tutored privately", "1843", "the Analytical Engine"),
    ("Niels Bohr", "the University of Copenhagen", "1913", "atomic structure"),
    ("Grace Hopper", "Yale University", "1952", "compilers"),
    ("Emmy Noether", "the University of Erlangen", "1915", "symmetry and conservation laws"),
]


def react_trajectories(n: int = 12) -> list[Trajectory]:
    """`n` (at most 30) distinct three-to-four-turn ReAct trajectories over a small fact table."""
    out = []
    for i in range(n):
        name, school, year, field = FACTS[i % len(FACTS)]
        other_facts = FACTS[(i + 1 + i // len(FACTS)) % len(FACTS)]
        other = other_facts[0]
        turns = [
            Turn(f"I need to find where {name} worked in {year} and what on. Let me search {name} first.",
                 f"Search[{name}]",
                 f"{name} was a scientist known for work on {field}. In {year} {name.split()[-1]} was at {school}."),
            Turn(f"The page says {school}. The question also asks how this compares with {other}; "
                 f"I should look that up too.", f"Search[{other}]",
                 f"{other} is known for {other_facts[3]}."),
            Turn("", f"Lookup[{year}]", f"(Result 1 / 1) In {year} {name.split()[-1]} published on {field}."),
            Turn(f"So {name} was at {school} in {year}, working on {field}.", f"Finish[{school}]", ""),
        ][: 3 + (i // len(FACTS)) % 2]
        out.append(Trajectory(question=f"Where did {name} work in {year}, and on what, compared with {other}?",
                              environment="react-wiki", source_revision="bench-1", turns=turns))
    return out


def _first_token_logprobs(scorer, trajectories: Sequence[Trajectory]) -> list[float]:
    import torch

    out = []
    model = scorer.model
    for trajectory in trajectories:
        rendered = scorer.renderer.render(trajectory)
        ids = torch.as_tensor(rendered.input_ids)[None]
        with torch.no_grad():
            logprobs = torch.log_softmax(model(input_ids=ids).logits[0].float(), dim=-1)
        for start, _ in rendered.action_spans:
            out.append(float(logprobs[start - 1, rendered.input_ids[start]]))
    return out


def run(checkpoint: str, trajectories: Sequence[Trajectory], epsilon: float) -> dict[str, Any]:
    from race_core.cover import logic_cover
    from race_core.policy import load_policy
    from race_core.render import CANONICAL, SEGMENTS, Renderer
    from race_core.scoring import ScoreRequest
    from race_core.scoring.hf import HFScorer

    model, tokenizer = load_policy(checkpoint)
    renderers = {mode: Renderer(tokenizer, tokenization=mode) for mode in (CANONICAL, SEGMENTS)}
    same = sum(renderers[CANONICAL].render(t).input_ids.tolist() == renderers[SEGMENTS].render(t).input_ids.tolist()
               for t in trajectories)
    scorers = {mode: HFScorer(model, tokenizer, renderer=r, batch_size=4) for mode, r in renderers.items()}
    requests = [ScoreRequest(i, t) for i, t in enumerate(trajectories)]
    scores = {mode: scorer.score(requests) for mode, scorer in scorers.items()}
    shifts = [abs(a - b) for xs, ys in zip(scores[CANONICAL], scores[SEGMENTS], strict=True)
              for a, b in zip(xs, ys, strict=True)]
    first = {mode: _first_token_logprobs(scorer, trajectories) for mode, scorer in scorers.items()}
    covers = {mode: logic_cover(trajectories, scorer, epsilon) for mode, scorer in scorers.items()}
    decisions = {mode: [(i, e["turn"], e["accepted"]) for i, c in enumerate(cs) for e in c.audit
                        if not e["skipped_empty"]] for mode, cs in covers.items()}
    differing = sum(a != b for a, b in zip(decisions[CANONICAL], decisions[SEGMENTS], strict=True))
    return {
        "checkpoint": str(checkpoint), "trajectories": len(trajectories), "epsilon": epsilon,
        "render_mode": renderers[CANONICAL].render_mode,
        "segments_equal_own_ids": same,
        "action_logprob_shift": {"median": statistics.median(shifts), "max": max(shifts), "actions": len(shifts)},
        "first_action_token_logprob_median": {mode: statistics.median(v) for mode, v in first.items()},
        "decisions": {"candidates": len(decisions[CANONICAL]), "differing": differing,
                      "accepted": {mode: sum(a for *_, a in d) for mode, d in decisions.items()}},
    }


def format_report(report: dict[str, Any]) -> str:
    shift, first, d = report["action_logprob_shift"], report["first_action_token_logprob_median"], report["decisions"]
    return "\n".join([
        f"rendering on {report['checkpoint']} ({report['render_mode']}), {report['trajectories']} trajectories",
        f"  segment-wise ids equal to the tokenizer's own: {report['segments_equal_own_ids']} of "
        f"{report['trajectories']}",
        f"  action mean log-prob, canonical vs segments: median |shift| {shift['median']:.3f}, "
        f"max {shift['max']:.3f} nats over {shift['actions']} actions",
        f"  first action token log-prob, median: canonical {first['canonical']:.3f}, segments "
        f"{first['segments']:.3f}",
        f"  cover at epsilon {report['epsilon']:g}: {d['differing']} of {d['candidates']} decisions differ "
        f"(accepted: canonical {d['accepted']['canonical']}, segments {d['accepted']['segments']})",
    ])


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--checkpoint", required=True, help="local save_pretrained folder (e.g. `race model smollm2`)")
    p.add_argument("--input", help="JSONL trajectories (default: built-in ReAct-style trajectories)")
    p.add_argument("--n", type=int, default=12, help="trajectories (of --input, or built in)")
    p.add_argument("--epsilon", type=float, default=DEFAULT_EPSILON)
    p.add_argument("--json", help="write the report here")


def cmd_bench_rendering(args) -> int:
    if args.input:
        from race_core.schema import read_jsonl

        trajectories, _ = read_jsonl([args.input])
        trajectories = trajectories[: args.n]
    else:
        trajectories = react_trajectories(args.n)
    report = run(args.checkpoint, trajectories, args.epsilon)
    print(format_report(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=2) + "\n")
    return 0
