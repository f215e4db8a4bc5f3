"""What our scorers are measured against: the prototype's naive scorer, the tokens the exact cover
must compute (the work bound), and the model's raw forward throughput that turns it into seconds;
beside it, the action tokens the cover scores and the head's throughput over them, which the raw
forward (decoder only) leaves out.

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


def _bound_feeds(renderer: Renderer, results: Sequence[CoverResult]):
    """The spans of positions the exact cover must feed, with the action tokens it scores there:
    (start, end, action tokens) for each trajectory once up to its last action, then for each
    candidate from the first position where it differs from the trajectory as held at that point
    (accepted removals replayed) to the end of its last action."""
    for result in results:
        current = result.original
        held = renderer.render(current)
        yield 0, held.action_spans[-1][1], sum(end - start for start, end in held.action_spans)
        for t in range(1, len(current.turns)):
            if not current.turns[t].reasoning:
                continue
            candidate = current.without_reasoning(t)
            x = renderer.render(candidate)
            end = x.action_spans[-1][1]
            n = min(len(held), end)
            mismatch = np.flatnonzero(held.input_ids[:n] != x.input_ids[:n])
            yield int(mismatch[0]) if mismatch.size else n, end, sum(b - a for a, b in x.action_spans[t:])
            if t in result.skipped_turns:
                current, held = candidate, x


def bound_work(renderer: Renderer, results: Sequence[CoverResult]) -> tuple[int, int]:
    """(tokens, action tokens) the exact cover must compute, rendering each trajectory once. Tokens:
    each trajectory once up to its last action, then for each candidate the suffix after the prefix
    it shares with the trajectory as held at that point. Action tokens, each through the model's
    head: every action of each trajectory, then for each candidate its actions from the turn it
    removed reasoning at."""
    tokens = targets = 0
    for start, end, actions in _bound_feeds(renderer, results):
        tokens, targets = tokens + end - start, targets + actions
    return tokens, targets


def bound_tokens(renderer: Renderer, results: Sequence[CoverResult]) -> int:
    """Tokens the exact cover must compute (`bound_work`)."""
    return bound_work(renderer, results)[0]


def bound_pairs(renderer: Renderer, results: Sequence[CoverResult]) -> int:
    """(query, key) pairs of one attention layer the exact cover must compute: each token it feeds
    (`bound_work`) at position p attends over the p + 1 positions up to it, its prefix included,
    whatever reuses that prefix's keys and values."""
    return sum((end * (end + 1) - start * (start + 1)) // 2 for start, end, _ in _bound_feeds(renderer, results))


def head_throughput(model, rows: int = 512, repeats: int = 3) -> float:
    """Scored tokens per wall second of the scorer's head step alone (`head_logits`, log-softmax,
    gather) over `rows` hidden states: the part of scoring the raw forward leaves out; the best of
    `repeats` after one warm-up."""
    import torch

    from race_core.scoring.hf import head_logits

    device = next(model.parameters()).device
    hidden_size = model.get_input_embeddings().weight.shape[1]
    vocab = model.get_output_embeddings().weight.shape[0]
    generator = torch.Generator().manual_seed(0)
    hidden = torch.randn(rows, hidden_size, generator=generator).to(device, next(model.parameters()).dtype)
    targets = torch.randint(0, vocab, (rows, 1), generator=generator).to(device)
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    best = float("inf")
    with torch.inference_mode():
        for i in range(repeats + 1):
            sync()
            start = time.perf_counter()
            torch.log_softmax(head_logits(model, hidden).float(), dim=-1).gather(1, targets)
            sync()
            if i:  # the first is the warm-up
                best = min(best, time.perf_counter() - start)
    return rows / best


def forward_prices(model, tokens: int = 4096, lengths: Sequence[int] = (64, 256, 1024, 4096), repeats: int = 2,
                   seed: int = 0) -> dict[str, float]:
    """The raw forward's price of a position through the layers and of an attention pair, measured:
    one batched forward (decoder only, no cache, causal) of about `tokens` random ids at each row
    length of `lengths` (rows = tokens // length; lengths over the model's context are dropped), the
    fastest of `repeats` after a warm-up, and wall seconds = per_token x positions + per_pair x
    causal pairs (L(L+1)/2 a row) fitted by least squares. A forward over short rows is nearly all
    matrix products; over long ones attention grows with the row, which is what a candidate pays
    over a long prefix and what `forward_throughput` at one length does not say."""
    import torch

    from race_core.scoring.plan import fastest_forward

    context = int(model.config.get_text_config().max_position_embeddings)
    generator = torch.Generator().manual_seed(seed)
    shapes = [(max(tokens // length, 1), length) for length in lengths if length <= context]
    if len(shapes) < 2:
        raise ValueError(f"forward_prices: need two row lengths within the model's context of {context}, got {lengths}")
    times = [fastest_forward(model, rows, length, repeats, generator) for rows, length in shapes]
    rows_of_fit = [(rows * length, rows * length * (length + 1) / 2) for rows, length in shapes]
    (per_token, per_pair), *_ = np.linalg.lstsq(np.array(rows_of_fit), np.array(times), rcond=None)
    return {"per_token_s": float(per_token), "per_pair_s": float(max(per_pair, 0.0)),
            "shapes": [list(shape) for shape in shapes], "wall_s": times}


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
