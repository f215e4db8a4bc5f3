"""What our scorers are measured against: the prototype's naive scorer, the tokens the exact cover
must compute (the work bound), and the model's raw forward throughput that turns it into seconds.

The other baseline, `full-forward`, is our own scorer with batching and prefix reuse off
(`HFScorer(batch_size=1, prefix_reuse=False)`); `bench.scoring` builds it."""

from __future__ import annotations

import time
from collections.abc import Hashable, Sequence

import numpy as np

from race_core.cover import CoverResult
from race_core.render import Renderer
from race_core.schema import Trajectory
from race_core.scoring import ScoreRequest

# torch and the scorers are imported where used, so that adding the bench parser to `race` stays cheap.


class NaiveScorer:
    """The prototype: for every request, every turn 0..last_turn is scored with its own forward
    pass over the whole prefix up to the end of that turn's action (no batching, no cache); only
    the turns asked for are returned."""

    name = "naive"

    def __init__(self, model, renderer: Renderer):
        from race_core.scoring import ScorerStats

        self.model = model.eval()
        self.renderer = renderer
        self.stats = ScorerStats()

    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        import torch

        decoder, head = self.model.get_decoder(), self.model.get_output_embeddings()
        device = next(self.model.parameters()).device
        out = []
        with torch.inference_mode():
            for r in requests:
                x = self.renderer.render(r.trajectory)
                scores = []
                for j in range(r.last_turn + 1):
                    start, end = x.action_spans[j]
                    ids = torch.from_numpy(x.input_ids[:end])[None].to(device)
                    hidden = decoder(input_ids=ids, use_cache=False).last_hidden_state[0, start - 1:end - 1]
                    logprobs = torch.log_softmax(head(hidden).float(), dim=-1)
                    targets = torch.from_numpy(x.input_ids[start:end])[:, None].to(device)
                    scores.append(float(logprobs.gather(1, targets).double().mean()))
                    self.stats.forward_calls += 1
                    self.stats.decoder_calls += 1
                    self.stats.rows += 1
                    self.stats.tokens_processed += end
                    self.stats.padded_positions += end
                    self.stats.attention_pairs += end * (end + 1) // 2
                out.append(scores[r.from_turn:])
        self.stats.requests += len(requests)
        return out

    def release(self, keys: Sequence[Hashable] | None = None) -> None:
        return None


def bound_tokens(renderer: Renderer, results: Sequence[CoverResult]) -> int:
    """Tokens the exact cover must compute: each trajectory once up to its last action, then for each
    candidate the suffix after the prefix it shares with the trajectory as held at that point."""
    total = 0
    for result in results:
        current = result.original
        held = renderer.render(current)
        total += held.action_spans[-1][1]
        accepted = set(result.skipped_turns)
        for t in range(1, len(current.turns)):
            if not current.turns[t].reasoning:
                continue
            candidate = current.without_reasoning(t)
            x = renderer.render(candidate)
            end = x.action_spans[-1][1]
            n = min(len(held), end)
            mismatch = np.flatnonzero(held.input_ids[:n] != x.input_ids[:n])
            total += end - (int(mismatch[0]) if mismatch.size else n)
            if t in accepted:
                current, held = candidate, x
    return total


def forward_throughput(model, renderer: Renderer, trajectories: Sequence[Trajectory], batch_size: int,
                       repeats: int = 3) -> tuple[float, float]:
    """Raw tokens per wall second and per CPU second of one batched forward (decoder only, no
    cache) over full-length trajectories, cut to the shortest; the best of `repeats` after one warm-up.
    On a GPU the clock stops when the device has finished (`synchronize`)."""
    import torch

    rows = [renderer.render(t) for t in trajectories[:batch_size]]
    length = min(x.action_spans[-1][1] for x in rows)
    device = next(model.parameters()).device
    ids = torch.from_numpy(np.stack([x.input_ids[:length] for x in rows])).to(device)
    decoder = model.get_decoder()
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best_wall = best_cpu = float("inf")
    with torch.inference_mode():
        decoder(input_ids=ids, use_cache=False)  # warm-up (first calls pay one-off setup costs)
        for _ in range(repeats):
            sync()
            wall, cpu = time.perf_counter(), time.process_time()
            decoder(input_ids=ids, use_cache=False)
            sync()
            best_wall = min(best_wall, time.perf_counter() - wall)
            best_cpu = min(best_cpu, time.process_time() - cpu)
    return ids.numel() / best_wall, ids.numel() / best_cpu
