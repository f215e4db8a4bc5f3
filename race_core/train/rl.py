"""Cover-aware RL on on-policy rollouts (docs/architecture.md §5; the paper's eqs. 13-15).

One update, `update_from_rollouts`, on one iteration's rollouts (sampled by `race_core.rollout`; they
may travel between stages as JSON):
  1. reward = the env's private judge, less `config.length_penalty` × the rollout's generated
     reasoning tokens (GRPO with a reasoning-length penalty), plus `config.skip_bonus` × the share of
     its turns written without reasoning when it succeeded (an AdaptThink-style reward); GRPO
     advantage per group (`grpo_advantages`).
  2. LoGiC cover (`logic_cover`, HFScorer over the pre-update policy, ε = `config.epsilon` or the
     run's) on the successful, well-formed rollouts, each as a Trajectory of its parsed turns. The
     cover decides on the canonical rendering of those turns; its skipped turns then mask the
     rollout's OWN generated reasoning tokens of those turns (`skipped_mask`; not with
     `mask_reasoning` off, the closure-only ablation). Failed rollouts (and successful ones with a
     malformed turn, which have no faithful Trajectory) keep ordinary policy masks.
  3. Closure terms: for each skipped turn t, log p(close marker | compressed context up to and
     including turn t's open marker) under the NEW policy, with gradient: in
     `renderer.render(cover.trajectory)` (the tokenizer's own ids), the sum of the log-probs of
     turn t's close-marker tokens given everything before them. A rollout's skipped turns share one
     forward over its compressed rendering (causal: a marker's log-prob reads only what precedes it).
  4. `config.epochs` passes over the rollouts in mini-batches of `config.mini_batch` (a seeded
     order; 0: all of them), one optimizer step each, the optimizer's state carried from the
     iteration before (`RLTrainer`). Each step's loss is `cover_aware_loss` over its mini-batch, with
     that mini-batch's N_policy and T_total. logp_old is the trainer's own forward before the first
     step (`config.old_logprobs = "trainer"`, the numerics of logp_new; with a single step that is
     logp_new itself, detached) or the sampler's.
  5. A row whose advantage is zero adds nothing to the actor loss and its gradient (ρ·0): in one
     process it is left out of the forward and backward passes (its tokens stay in N_policy), and
     its closure terms are computed from their own contexts as usual. Several launched processes
     all run every row, as their collectives need.

Under several processes (`race_core.train.distributed`) each covers and trains on its share of the
rollouts; N_policy and T_total are counted over all of them, so the loss is the one-process loss
(one optimizer step per epoch there: `mini_batch` needs one process).

`build_rl_batch` holds every tensor the loss reads, so a test can recompute the loss by hand.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import torch

from race_core.config import DEFAULT_EPSILON, RLConfig
from race_core.cover import CoverResult, logic_cover
from race_core.evaluate import episode_metrics
from race_core.loss import cover_aware_loss, grpo_advantages
from race_core.render import Renderer, Role
from race_core.rollout import Rollout
from race_core.train.distributed import TrainOptions


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


@dataclass
class RLReport:
    success_rate: float
    reasoning_tokens_per_turn: float  # generated reasoning tokens / turns, over the batch
    masked_tokens: int  # skipped reasoning tokens (no policy gradient, still in N_policy)
    closure_terms: int
    policy_tokens: int  # N_policy
    total_turns: int
    loss: float  # of the first optimizer step (before any update of this iteration)
    losses: list[float]
    batch: RLBatch
    logp_new: torch.Tensor  # detached [R, L]: each row's log-probs the first time it was forwarded (0: never)
    closure_logprobs: torch.Tensor  # detached [S]: each closure term the first time it was computed
    rollouts: list[Rollout]
    covers: dict[int, CoverResult]  # rollout index -> cover result (successful, well-formed ones)
    wall_seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)  # one per optimizer step, before clipping
    closure_loss: float | None = None  # the closure term −Σ log p(close) / T_total of the first step (loss = actor + λ·it)
    actor_loss: float | None = None  # that step's loss less λ·closure_loss
    forwarded: torch.Tensor | None = None  # bool [R]: rows that ran a forward pass (the others had advantage 0)
    phases: dict[str, float] = field(default_factory=dict)  # seconds of each part of the update
    counts: dict[str, float] = field(default_factory=dict)  # rows and tokens trained and skipped, logp_old's gap

    def summary(self) -> dict:
        return {"success_rate": self.success_rate, "reasoning_tokens_per_turn": self.reasoning_tokens_per_turn,
                "masked_tokens": self.masked_tokens, "closure_terms": self.closure_terms,
                "policy_tokens": self.policy_tokens, "total_turns": self.total_turns, "loss": self.loss,
                "actor_loss": self.actor_loss, "closure_loss": self.closure_loss,
                "rollouts": len(self.rollouts), "wall_seconds": round(self.wall_seconds, 2),
                "step_losses": self.losses, "grad_norms": self.grad_norms, "processes": self.extra.get("processes", 1),
                **episode_metrics(self.rollouts), "phases": {k: round(v, 3) for k, v in self.phases.items()},
                **self.counts}


def cover_rollouts(rollouts: Sequence[Rollout], scorer, epsilon: float) -> dict[int, CoverResult]:
    """LoGiC cover of the successful, well-formed rollouts: rollout index -> CoverResult."""
    indexed = [(i, t) for i, r in enumerate(rollouts) if (t := r.to_trajectory()) is not None]
    if not indexed:
        return {}
    results = logic_cover([t for _, t in indexed], scorer, epsilon)
    return {i: result for (i, _), result in zip(indexed, results, strict=True)}


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


def make_optimizer(model, config: RLConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                             weight_decay=config.weight_decay)


def shaped_reward(rollout: Rollout, config: RLConfig) -> float:
    """The judge's reward less the reasoning-length penalty (r − λ · generated reasoning tokens), plus
    the AdaptThink-style bonus of a successful rollout (δ · its share of turns without reasoning)."""
    reward = rollout.reward - config.length_penalty * rollout.reasoning_token_count()
    if config.skip_bonus and rollout.success and rollout.turns:
        reward += config.skip_bonus * sum(not t.reasoning.strip() for t in rollout.turns) / len(rollout.turns)
    return reward


def mini_batches(rows: int, config: RLConfig, iteration: int) -> list[list[int]]:
    """The optimizer steps of one update: for each epoch, the rows in `config.mini_batch`-sized parts,
    in an order drawn from (seed, iteration, epoch) (in order when one part takes them all)."""
    size = config.mini_batch or rows
    steps = []
    for epoch in range(config.epochs):
        order = list(range(rows))
        if size < rows:
            generator = torch.Generator().manual_seed(config.seed * 1_000_003 + iteration * 1_009 + epoch)
            order = torch.randperm(rows, generator=generator).tolist()
        steps += [order[start:start + size] for start in range(0, rows, size)]
    return steps


class _Timer:
    """Seconds per named part of the update."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}

    def add(self, name: str, started: float) -> float:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - started
        return now


def update_from_rollouts(
    model,
    tokenizer,
    rollouts: Sequence[Rollout],
    config: RLConfig,
    *,
    optimizer: torch.optim.Optimizer | None = None,
    renderer: Renderer | None = None,
    epsilon: float = DEFAULT_EPSILON,
    options: TrainOptions | None = None,
    out_dir: str | Path | None = None,
    base_checkpoint: str | Path | None = None,
    iteration: int = 0,
    skip_idle_rows: bool = True,
) -> RLReport:
    """Update `model` in place from its own `rollouts` (the module docstring's steps): shaped rewards ->
    GRPO advantages -> LoGiC cover (tolerance `config.epsilon`, else `epsilon`) of the successful
    rollouts with the pre-update policy -> the cover-aware loss -> `config.epochs` passes of optimizer
    steps over mini-batches. `optimizer`: the run's optimizer, its state carried from the update before
    (default: a fresh AdamW). Seeds torch with (`config.seed`, `iteration`) first, so an update is
    reproducible wherever its rollouts were sampled.

    `options`: mixed precision, gradient checkpointing, resumable state (`race_core.train.distributed`).
    In a launched process each process covers and trains on its share of the rollouts; N_policy and
    T_total are counted over all of them, so the loss is the one-process loss. The report's counts
    are the whole batch's; its `batch`, `logp_new` and `closure_logprobs` are this process's rows.
    `out_dir`: rank 0 saves the updated policy there (`base_checkpoint`: the folder the model was
    loaded from, needed to save a sharded run). `skip_idle_rows` off: rows of advantage 0 run their
    forward and backward passes too (the same update, slower; `race bench rl --compare`)."""
    from race_core.policy import pad_token_id, save_policy
    from race_core.scoring.hf import HFScorer
    from race_core.train.distributed import TrainRun, process_rank, world_size

    started = time.perf_counter()
    timer = _Timer()
    torch.manual_seed(config.seed + iteration)
    options = options or TrainOptions()
    processes = world_size()
    if len(rollouts) < processes:
        raise ValueError(f"{len(rollouts)} rollouts cannot be shared among {processes} training processes")
    if processes > 1 and config.mini_batch:
        raise ValueError("parameter 'rl.mini_batch': mini-batches need one training process (several take one "
                         "optimizer step per epoch): set it to 0 or train in one process")
    renderer = renderer or Renderer(tokenizer)
    optimizer = optimizer or make_optimizer(model, config)
    pad_id = pad_token_id(tokenizer)
    advantages = grpo_advantages([shaped_reward(r, config) for r in rollouts], [r.group for r in rollouts])
    rows = list(range(len(rollouts)))[process_rank()::processes]  # this process's rollouts
    covers: dict = {}  # plain GRPO: every generated token in the loss, no closure
    at = time.perf_counter()
    if config.cover_aware:
        scorer = HFScorer(model, tokenizer, renderer=renderer)
        try:
            covers = cover_rollouts([rollouts[i] for i in rows], scorer,
                                    epsilon if config.epsilon is None else config.epsilon)
        finally:
            scorer.close()  # its kept prefixes (up to half the free memory) are gone before the update's forward
    at = timer.add("cover", at)
    run = TrainRun(model, optimizer, options, micro_batch=len(rows))
    all_covers = dict(run.gather_objects([(rows[i], c) for i, c in covers.items()])) if run.world_size > 1 else covers
    batch = build_rl_batch(renderer, [rollouts[i] for i in rows], covers, advantages[rows], pad_id,
                           mask_reasoning=config.mask_reasoning)
    at = timer.add("batch", at)
    policy_tokens, total_turns, masked, closure_terms = (int(x) for x in run.all_reduce_sum(
        batch.policy_token_count, batch.total_turns, batch.masked_token_count, len(batch.closure_turns)))

    run.model.train()
    step = _Steps(run, batch, config, timer, skip_idle_rows=skip_idle_rows and run.world_size == 1, pad_id=pad_id,
                  closure_terms=closure_terms)
    plan = mini_batches(len(rows), config, iteration)
    whole = len(plan) == 1  # one optimizer step on every row: the batch's own (global) denominators
    if config.old_logprobs == "trainer":
        step.old_logprobs_from_trainer(before_first_step=not whole)
    losses: list[float] = list(run.history.get("losses", []))  # a resumed launched run: its steps so far
    grad_norms: list[float] = list(run.history.get("grad_norms", []))
    first = None
    for number, part in enumerate(plan):
        if number < run.start_step:
            continue
        denominators = (policy_tokens, total_turns) if whole else None
        loss, closure_term = step.take(part, denominators)
        grad_norms.append(step.clip_and_step(config.max_grad_norm))
        losses.append(loss)
        if first is None:
            first = (loss, closure_term)
        run.after_step(number + 1, len(plan), {"losses": losses, "grad_norms": grad_norms})
    updated = run.trained_model(lambda m: m, base_checkpoint)
    if out_dir is not None and run.is_main:
        at = time.perf_counter()
        save_policy(updated, tokenizer, out_dir)
        timer.add("checkpoint_write", at)

    reasoning = sum(r.reasoning_token_count() for r in rollouts)
    turns = sum(len(r.turns) for r in rollouts)
    loss0, closure0 = first if first is not None else (losses[0], 0.0)
    return RLReport(
        success_rate=sum(r.success for r in rollouts) / len(rollouts),
        reasoning_tokens_per_turn=reasoning / max(turns, 1),
        masked_tokens=masked, closure_terms=closure_terms,
        policy_tokens=policy_tokens, total_turns=total_turns, loss=losses[0], losses=losses,
        closure_loss=closure0, actor_loss=loss0 - config.closure_weight * closure0,
        batch=batch, logp_new=step.logged_logp, closure_logprobs=step.logged_closure, rollouts=list(rollouts),
        covers=all_covers, wall_seconds=time.perf_counter() - started, extra=run.facts(), grad_norms=grad_norms,
        forwarded=step.forwarded, phases=timer.seconds, counts=step.counts(),
    )


class _Steps:
    """The optimizer steps of one update over `batch` (the loop of `update_from_rollouts`): which rows
    run, their log-probs logged the first time, and the counts of what ran and what was left out."""

    def __init__(self, run, batch: RLBatch, config: RLConfig, timer: _Timer, *, skip_idle_rows: bool, pad_id: int,
                 closure_terms: int):
        self.run, self.batch, self.config, self.timer = run, batch, config, timer
        self.skip_idle_rows, self.pad_id, self.closure_terms = skip_idle_rows, pad_id, closure_terms
        rows, width = batch.input_ids.shape
        self.logged_logp = torch.zeros((rows, width), dtype=torch.float32)
        self.logged_closure = torch.zeros(len(batch.closure_turns), dtype=torch.float32)
        self.forwarded = torch.zeros(rows, dtype=torch.bool)
        self._closure_seen = torch.zeros(len(batch.closure_turns), dtype=torch.bool)
        self.trainer_old = False  # logp_old from the trainer at the step (one step: logp_new detached)
        self.trained_tokens = self.skipped_tokens = self.skipped_rows = 0
        self.gap: tuple[float, float] | None = None  # |sampler − trainer| over policy tokens: max, mean

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
        self.skipped_rows += len(idle)
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
        counts: dict[str, float] = {"trained_tokens": self.trained_tokens, "skipped_rows": self.skipped_rows,
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
