"""The optimizer steps of one RL update (`race_core.train.rl.update_from_rollouts`): for each step, the
forward and backward passes of its rows that carry a gradient (in micro-batches) and of their closure
contexts; logp_old from the trainer's own forward; each row's log-probs logged the first time it ran;
the counts of the rows and tokens that ran and of those left out (advantage 0), and the seconds of
each part (`PhaseTimer`)."""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import replace

import torch

from race_core.config import RLConfig
from race_core.train.rl_batch import RLBatch, batch_loss, closure_logprobs, policy_logprobs


class PhaseTimer:
    """Seconds per named part of the update."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, started: float) -> float:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - started
        return now



class UpdateSteps:
    """The optimizer steps of one update over `batch` (the loop of `update_from_rollouts`): which rows
    run, their log-probs logged the first time, and the counts of what ran and what was left out."""

    def __init__(self, run, batch: RLBatch, config: RLConfig, timer: PhaseTimer, *, skip_idle_rows: bool, pad_id: int,
                 closure_terms: int):
        self.run, self.batch, self.config, self.timer = run, batch, config, timer
        self.skip_idle_rows, self.pad_id, self.closure_terms = skip_idle_rows, pad_id, closure_terms
        rows, width = batch.input_ids.shape
        self.logged_logp = torch.zeros((rows, width), dtype=torch.float32)
        self.logged_closure = torch.zeros(len(batch.closure_turns), dtype=torch.float32)
        self.forwarded = torch.zeros(rows, dtype=torch.bool)
        self._closure_seen = torch.zeros(len(batch.closure_turns), dtype=torch.bool)
        self.trainer_old = False  # logp_old from the trainer at the step (one step: logp_new detached)
        self.trained_tokens = self.skipped_tokens = 0  # token passes (an epoch counts a row again)
        self.skipped: set[int] = set()  # the rows left out of the backward, each counted once
        self.gap: tuple[float, float, int] | None = None  # |sampler − trainer| over policy tokens: max, sum, count

    def _active(self, rows: Sequence[int]) -> list[int]:
        if not self.skip_idle_rows:
            return list(rows)
        return [r for r in rows if float(self.batch.advantages[r]) != 0.0]

    def old_logprobs_from_trainer(self, before_first_step: bool) -> None:
        """logp_old := the trainer's log-probs of the rows that train. Before several steps: a no-grad
        forward now; before one step: logp_new itself at that step (the same forward, detached)."""
        if not before_first_step:
            self.trainer_old = True
            return
        at = time.perf_counter()
        active = self._active(range(self.batch.input_ids.shape[0]))
        micro = self.config.micro_batch or max(len(active), 1)
        with torch.no_grad():
            for start in range(0, len(active), micro):
                rows = active[start:start + micro]
                part = self.batch.select(rows)
                logp = policy_logprobs(self.run.model, part).float().cpu()
                self._set_old(rows, logp)
        self.timer.add("old_logprobs", at)

    def _set_old(self, rows: Sequence[int], logp: torch.Tensor) -> None:
        width = logp.shape[1]
        index = torch.as_tensor(list(rows), dtype=torch.long)
        policy = self.batch.policy_mask[index, :width]
        self.batch.logp_old[index, :width] = torch.where(policy, logp, torch.zeros_like(logp))
        gap = (logp - self.batch.sampler_logprobs[index, :width]).abs()[policy]
        if gap.numel():
            worst, total, count = float(gap.max()), float(gap.sum()), gap.numel()
            if self.gap is not None:
                worst, total, count = max(worst, self.gap[0]), total + self.gap[1], count + self.gap[2]
            self.gap = (worst, total, count)

    def take(self, rows: Sequence[int], denominators: tuple[int, int] | None) -> tuple[float, float]:
        """Forward and backward of one optimizer step's rows; returns (its loss, its closure term)."""
        self.run.optimizer.zero_grad(set_to_none=True)
        part = self.batch.select(rows)
        policy_tokens, total_turns = denominators or (part.policy_token_count, part.total_turns)
        if self.run.world_size > 1:  # launched processes: their share in one forward, as their collectives need
            return self._launched_step(list(rows), part, policy_tokens, total_turns)
        active = [k for k, r in enumerate(rows) if not self.skip_idle_rows or float(self.batch.advantages[r]) != 0.0]
        idle = [k for k in range(len(rows)) if k not in set(active)]
        self.skipped.update(rows[k] for k in idle)
        self.skipped_tokens += int(part.attention_mask[idle].sum()) if idle else 0
        micro = self.config.micro_batch or max(len(active), 1)
        total, ran = 0.0, False
        at = time.perf_counter()
        for start in range(0, len(active), micro):
            chunk = active[start:start + micro]
            piece = part.select(chunk)
            logp = policy_logprobs(self.run.model, piece)
            original = [rows[k] for k in chunk]
            if self.trainer_old:
                piece.logp_old = torch.where(piece.policy_mask, logp.detach().float().cpu(), 0.0)
                self._set_old(original, logp.detach().float().cpu())
            loss = batch_loss(piece, logp, torch.zeros(0, device=logp.device), self.config, policy_tokens, total_turns)
            self.run.backward(loss)
            total += float(loss.detach())
            ran = True
            self.trained_tokens += int(piece.attention_mask.sum())
            self._log_rows(original, logp)
        at = self.timer.add("policy_forward_backward", at)
        closure_sum = 0.0
        contexts = list(range(len(part.closure_rows)))
        for start in range(0, len(contexts), micro):
            piece = _contexts(part, contexts[start:start + micro])
            closure = closure_logprobs(self.run.model, piece)
            loss = self.config.closure_weight * (-closure.sum() / max(int(total_turns), 1))
            self.run.backward(loss)
            total += float(loss.detach())
            closure_sum += float(closure.detach().sum())
            ran = True
            self._log_closure(rows, piece, closure)
        self.timer.add("closure", at)
        if not ran:  # nothing to learn from these rows: the step sees zero gradients, as a computed pass would give
            for p in self.run.model.parameters():
                if p.requires_grad:
                    p.grad = torch.zeros_like(p)
        return total, -closure_sum / max(int(total_turns), 1)

    def _launched_step(self, rows: list[int], part: RLBatch, policy_tokens: int, total_turns: int
                       ) -> tuple[float, float]:
        at = time.perf_counter()
        logp = policy_logprobs(self.run.model, part)
        if self.trainer_old:
            part.logp_old = torch.where(part.policy_mask, logp.detach().float().cpu(), 0.0)
            self._set_old(rows, logp.detach().float().cpu())
        closure = closure_logprobs(self.run.model, part)
        loss = batch_loss(part, logp, closure, self.config, policy_tokens, total_turns)
        if self.closure_terms and not part.closure_turns:  # the others run a closure forward: keep in step
            loss = loss + self.run.idle_loss(self.pad_id)
        self.run.backward(loss * self.run.world_size)  # the processes' gradients are averaged
        self.trained_tokens += int(part.attention_mask.sum())
        self._log_rows(rows, logp)
        self._log_closure(rows, part, closure)
        self.timer.add("policy_forward_backward", at)
        closure_sum = self.run.all_reduce_sum(float(closure.detach().sum()))[0]
        return self.run.all_reduce_sum(float(loss.detach()))[0], -closure_sum / max(int(total_turns), 1)

    def clip_and_step(self, max_grad_norm: float) -> float:
        at = time.perf_counter()
        norm = self.run.clip_and_step(max_grad_norm, clear=False)  # the update's gradients stay readable
        self.timer.add("optimizer", at)
        return norm

    def _log_rows(self, rows: Sequence[int], logp: torch.Tensor) -> None:
        for k, row in enumerate(rows):
            if not self.forwarded[row]:
                self.forwarded[row] = True
                self.logged_logp[row, :logp.shape[1]] = logp[k].detach().float().cpu()

    def _log_closure(self, rows: Sequence[int], part: RLBatch, closure: torch.Tensor) -> None:
        """`closure` [terms of `part`] back to this batch's term numbering (`part` holds `rows`)."""
        for k, (row, turn) in enumerate(part.closure_turns):
            term = self.batch.closure_turns.index((rows[row], turn))
            if not self._closure_seen[term]:
                self._closure_seen[term] = True
                self.logged_closure[term] = float(closure[k].detach())

    def counts(self) -> dict[str, float]:
        counts: dict[str, float] = {"trained_tokens": self.trained_tokens, "skipped_rows": len(self.skipped),
                                    "skipped_tokens": self.skipped_tokens}
        spent = self.timer.seconds.get("policy_forward_backward", 0.0)
        if self.trained_tokens:  # what the skipped rows would have cost at the rate the trained ones ran
            counts["skipped_seconds_estimate"] = round(spent * self.skipped_tokens / self.trained_tokens, 3)
        if self.gap is not None:
            counts["old_logprob_gap_max"] = self.gap[0]
            counts["old_logprob_gap_mean"] = self.gap[1] / max(self.gap[2], 1)
        return counts


def _contexts(batch: RLBatch, contexts: Sequence[int]) -> RLBatch:
    """The closure contexts `contexts` of `batch` alone (its rows left as they are)."""
    index = torch.as_tensor(list(contexts), dtype=torch.long)
    width = int(batch.closure_attention_mask[index].sum(dim=1).max())
    terms = sorted({int(t) for t in batch.closure_term_index[index].flatten() if t >= 0})
    renumber = torch.full((len(batch.closure_turns) + 1,), -1, dtype=torch.long)
    renumber[torch.as_tensor(terms, dtype=torch.long)] = torch.arange(len(terms))
    return replace(batch, closure_input_ids=batch.closure_input_ids[index, :width],
                   closure_attention_mask=batch.closure_attention_mask[index, :width],
                   closure_term_index=renumber[batch.closure_term_index[index, :width]],
                   closure_rows=[batch.closure_rows[c] for c in contexts],
                   closure_turns=[batch.closure_turns[t] for t in terms])
