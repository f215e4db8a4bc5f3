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

`build_rl_batch` (`race_core.train.rl_batch`) holds every tensor the loss reads, so a test can
recompute the loss by hand; `race_core.train.rl_steps` takes the optimizer steps.
"""

from __future__ import annotations

import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch

from race_core.config import DEFAULT_EPSILON, RLConfig
from race_core.cover import CoverResult, logic_cover
from race_core.evaluate import episode_metrics
from race_core.loss import grpo_advantages
from race_core.render import Renderer
from race_core.rollout import Rollout
from race_core.train.distributed import TrainOptions
from race_core.train.rl_batch import (
    RLBatch,
    batch_loss,
    build_rl_batch,
    closure_logprobs,
    policy_logprobs,
    token_logprobs,
)
from race_core.train.rl_steps import PhaseTimer, UpdateSteps

__all__ = ["RLBatch", "RLReport", "batch_loss", "build_rl_batch", "closure_logprobs", "cover_rollouts", "make_optimizer",
           "mini_batches", "policy_logprobs", "shaped_reward", "token_logprobs", "update_from_rollouts"]


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
    timer = PhaseTimer()
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
    step = UpdateSteps(run, batch, config, timer, skip_idle_rows=skip_idle_rows and run.world_size == 1, pad_id=pad_id,
                  closure_terms=closure_terms)
    plan = mini_batches(len(rows), config, iteration)
    if config.old_logprobs == "trainer":
        step.old_logprobs_from_trainer(before_first_step=len(plan) > 1)
    losses: list[float] = list(run.history.get("losses", []))  # a resumed launched run: its steps so far
    grad_norms: list[float] = list(run.history.get("grad_norms", []))
    first = None
    for number, part in enumerate(plan):
        if number < run.start_step:
            continue
        # a step over every row: the batch's denominators, counted over every process; a mini-batch its own
        denominators = (policy_tokens, total_turns) if len(part) == len(rows) else None
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
