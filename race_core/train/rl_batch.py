"""One RL batch as the loss reads it (docs/architecture.md §5): the rollouts padded into token tensors
(`build_rl_batch`: policy and skipped-reasoning masks, logp_old, advantages, the closure contexts),
the log-probs a model gives them (`policy_logprobs`, `closure_logprobs`) and the cover-aware loss of a
batch or a part of one (`batch_loss`). `race_core.train.rl` runs the update over it."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field, replace

import numpy as np
import torch

from race_core.config import RLConfig
from race_core.cover import CoverResult
from race_core.loss import cover_aware_loss
from race_core.render import Renderer, Role
from race_core.rollout import Rollout


@dataclass
class RLBatch:
    """Everything `cover_aware_loss` reads for one batch of rollouts. Token tensors are [rows, L]
    and aligned with `input_ids`: entry i belongs to token i (predicted from tokens < i). Closure
    contexts are one per rollout with closure terms: its compressed rendering up to its last skipped
    turn's close marker, each term's marker tokens marked by the term's index."""

    input_ids: torch.Tensor  # long [R, L], right padded
    attention_mask: torch.Tensor  # long [R, L]
    policy_mask: torch.Tensor  # bool [R, L]: generated tokens
    skipped_mask: torch.Tensor  # bool [R, L]: generated reasoning tokens of skipped turns (masked out)
    logp_old: torch.Tensor  # float [R, L]: the ratio's denominator (0 off the policy mask)
    sampler_logprobs: torch.Tensor  # float [R, L]: the sampler's log-probs of its tokens
    advantages: torch.Tensor  # float [R]
    rewards: torch.Tensor  # float [R]
    closure_input_ids: torch.Tensor  # long [C, Lc]: compressed contexts, right padded
    closure_attention_mask: torch.Tensor  # long [C, Lc]
    closure_term_index: torch.Tensor  # long [C, Lc]: the closure term a close-marker token belongs to, else -1
    closure_rows: list[int]  # the row of each closure context
    closure_turns: list[tuple[int, int]]  # (row, turn) of each closure term
    total_turns: int  # every turn of every rollout in the batch
    turns_per_row: list[int] = field(default_factory=list)

    @property
    def policy_token_count(self) -> int:
        return int(self.policy_mask.sum())

    @property
    def masked_token_count(self) -> int:
        return int((self.skipped_mask & self.policy_mask).sum())

    @property
    def closure_target_mask(self) -> torch.Tensor:
        return self.closure_term_index >= 0

    def select(self, rows: Sequence[int]) -> RLBatch:
        """The batch of `rows` (in that order): their tensors cut to their longest sequence, their
        closure contexts and terms renumbered, their turns as T_total."""
        rows = list(rows)
        index = torch.as_tensor(rows, dtype=torch.long)
        width = int(self.attention_mask[index].sum(dim=1).max()) if rows else 0
        position = {row: k for k, row in enumerate(rows)}
        contexts = [c for c, row in enumerate(self.closure_rows) if row in position]
        terms = [k for k, (row, _) in enumerate(self.closure_turns) if row in position]
        renumber = torch.full((len(self.closure_turns) + 1,), -1, dtype=torch.long)
        renumber[torch.as_tensor(terms, dtype=torch.long)] = torch.arange(len(terms))
        c_index = torch.as_tensor(contexts, dtype=torch.long)
        c_width = int(self.closure_attention_mask[c_index].sum(dim=1).max()) if contexts else 0
        term_index = self.closure_term_index[c_index, :c_width]
        return replace(
            self, input_ids=self.input_ids[index, :width], attention_mask=self.attention_mask[index, :width],
            policy_mask=self.policy_mask[index, :width], skipped_mask=self.skipped_mask[index, :width],
            logp_old=self.logp_old[index, :width], sampler_logprobs=self.sampler_logprobs[index, :width],
            advantages=self.advantages[index], rewards=self.rewards[index],
            closure_input_ids=self.closure_input_ids[c_index, :c_width],
            closure_attention_mask=self.closure_attention_mask[c_index, :c_width],
            closure_term_index=renumber[term_index],  # -1 stays -1 (the last slot)
            closure_rows=[position[self.closure_rows[c]] for c in contexts],
            closure_turns=[(position[self.closure_turns[k][0]], self.closure_turns[k][1]) for k in terms],
            total_turns=sum(self.turns_per_row[r] for r in rows), turns_per_row=[self.turns_per_row[r] for r in rows])


def build_rl_batch(renderer: Renderer, rollouts: Sequence[Rollout], covers: dict[int, CoverResult],
                   advantages: torch.Tensor, pad_id: int, mask_reasoning: bool = True) -> RLBatch:
    """Pad the rollouts into one batch, mark skipped reasoning (unless `mask_reasoning` is off), and lay
    out the closure contexts."""
    rows = len(rollouts)
    width = max(len(r.token_ids) for r in rollouts)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    policy = torch.zeros((rows, width), dtype=torch.bool)
    skipped = torch.zeros((rows, width), dtype=torch.bool)
    logp_old = torch.zeros((rows, width), dtype=torch.float32)
    contexts: list[tuple[int, list[int], list[tuple[int, np.ndarray]]]] = []  # (row, ids, (term, marker positions))
    closure_turns: list[tuple[int, int]] = []
    for row, rollout in enumerate(rollouts):
        a = rollout.arrays()
        n = len(a["token_ids"])
        input_ids[row, :n] = torch.from_numpy(a["token_ids"])
        attention[row, :n] = 1
        policy[row, :n] = torch.from_numpy(a["policy_mask"])
        logp_old[row, :n] = torch.from_numpy(a["old_logprobs"])
        cover = covers.get(row)
        if cover is None or not cover.skipped_turns:
            continue
        compressed = renderer.render(cover.trajectory)
        markers = []
        for t in cover.skipped_turns:
            if mask_reasoning:
                own_reasoning = (a["turns"] == t) & (a["roles"] == int(Role.REASONING)) & a["policy_mask"]
                skipped[row, :n] |= torch.from_numpy(own_reasoning)
            markers.append((len(closure_turns), np.flatnonzero(compressed.mask(Role.CLOSE, turn=t))))
            closure_turns.append((row, t))
        end = max(int(positions[-1]) for _, positions in markers) + 1
        contexts.append((row, compressed.input_ids[:end].tolist(), markers))
    c_width = max((len(ids) for _, ids, _ in contexts), default=0)
    closure_ids = torch.full((len(contexts), c_width), pad_id, dtype=torch.long)
    closure_attention = torch.zeros((len(contexts), c_width), dtype=torch.long)
    term_index = torch.full((len(contexts), c_width), -1, dtype=torch.long)
    for c, (_, ids, markers) in enumerate(contexts):
        closure_ids[c, :len(ids)] = torch.as_tensor(ids)
        closure_attention[c, :len(ids)] = 1
        for term, positions in markers:
            term_index[c, torch.from_numpy(positions)] = term
    return RLBatch(
        input_ids=input_ids, attention_mask=attention, policy_mask=policy, skipped_mask=skipped,
        logp_old=logp_old, sampler_logprobs=logp_old.clone(), advantages=advantages.float(),
        rewards=torch.tensor([r.reward for r in rollouts], dtype=torch.float32),
        closure_input_ids=closure_ids, closure_attention_mask=closure_attention, closure_term_index=term_index,
        closure_rows=[row for row, _, _ in contexts], closure_turns=closure_turns,
        total_turns=sum(len(r.turns) for r in rollouts), turns_per_row=[len(r.turns) for r in rollouts],
    )


def token_logprobs(model, input_ids: torch.Tensor, attention_mask: torch.Tensor) -> torch.Tensor:
    """log p(token i | tokens < i) for every position (0 at position 0), [rows, L], with gradient."""
    device = next(model.parameters()).device
    logits = model(input_ids=input_ids.to(device), attention_mask=attention_mask.to(device)).logits[:, :-1].float()
    targets = input_ids[:, 1:].to(device)
    picked = logits.gather(-1, targets[..., None])[..., 0] - torch.logsumexp(logits, dim=-1)
    return torch.nn.functional.pad(picked, (1, 0))


def policy_logprobs(model, batch: RLBatch) -> torch.Tensor:
    """logp_new [R, L] under `model`, with gradient (one forward over the padded batch)."""
    return token_logprobs(model, batch.input_ids, batch.attention_mask)


def closure_logprobs(model, batch: RLBatch) -> torch.Tensor:
    """One log p(close marker | compressed context, open marker) per closure term, with gradient (one
    forward per closure context: a rollout's terms share it)."""
    device = next(model.parameters()).device
    terms = len(batch.closure_turns)
    if not terms:
        return torch.zeros(0, device=device)
    logp = token_logprobs(model, batch.closure_input_ids, batch.closure_attention_mask)
    index = batch.closure_term_index.to(device)
    on = index >= 0
    return torch.zeros(terms, dtype=logp.dtype, device=device).index_add(0, index[on], logp[on])


def batch_loss(batch: RLBatch, logp_new: torch.Tensor, closure: torch.Tensor, config: RLConfig,
               policy_token_count: int | None = None, total_turns: int | None = None) -> torch.Tensor:
    """The cover-aware loss of `batch`; `policy_token_count` and `total_turns` are the whole batch's
    when `batch` holds part of it (a micro-batch, one process's rows; default: `batch`'s own)."""
    device = logp_new.device
    return cover_aware_loss(
        logp_new, batch.logp_old.to(device), batch.advantages.to(device), batch.policy_mask.to(device),
        batch.skipped_mask.to(device), closure, batch.total_turns if total_turns is None else total_turns,
        clip=config.clip, closure_weight=config.closure_weight, policy_token_count=policy_token_count,
    )


