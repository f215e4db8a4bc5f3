"""Cover-aware RL on on-policy calculator rollouts (docs/architecture.md §5; the paper's eqs. 13-15).

One iteration:
  1. G rollouts for each of K tasks from the current policy (`race_core.rollout.sample_rollouts`,
     HFSampler over the in-memory model); the sampler's log-probs are logp_old. The rollouts may
     travel between stages as JSON (`race_core.rollout.rollouts_to_json`); steps 2-5 are
     `update_from_rollouts`.
  2. reward = the env's private judge, less `config.length_penalty` × the rollout's generated
     reasoning tokens (GRPO with a reasoning-length penalty, the usual alternative; 0 by default);
     GRPO advantage per group (`grpo_advantages`).
  3. LoGiC cover (`logic_cover`, HFScorer over the pre-update policy) on the successful,
     well-formed rollouts, each as a Trajectory of its parsed turns. The cover decides on the
     canonical rendering of those turns; its skipped turns then mask the rollout's OWN generated
     reasoning tokens of those turns (`skipped_mask`). Failed rollouts (and successful ones with a
     malformed turn, which have no faithful Trajectory) keep ordinary policy masks.
  4. Closure terms: for each skipped turn t, log p(close marker | compressed context up to and
     including turn t's open marker) under the NEW policy, with gradient: in
     `renderer.render(cover.trajectory)` (the tokenizer's own ids), the sum of the log-probs of
     turn t's close-marker tokens (role CLOSE: one token where `</think>` is one, and a token that
     joins the end of `<think>` to the start of `</think>` counts as the marker's) given everything
     before them.
  5. logp_new recomputed with gradient (one forward over all rollout sequences, right padded) →
     `cover_aware_loss` → optimizer step(s), torch seeded with `config.seed` first.

Under several processes (`race_core.train.distributed`) each covers and trains on its share of the
rollouts; N_policy and T_total are counted over all of them, so the loss is the one-process loss.

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
from race_core.loss import cover_aware_loss, grpo_advantages
from race_core.render import Renderer, Role
from race_core.rollout import Rollout
from race_core.train.distributed import TrainOptions


@dataclass
class RLBatch:
    """Everything `cover_aware_loss` reads for one batch of rollouts. Token tensors are [rows, L]
    and aligned with `input_ids`: entry i belongs to token i (predicted from tokens < i)."""

    input_ids: torch.Tensor  # long [R, L], right padded
    attention_mask: torch.Tensor  # long [R, L]
    policy_mask: torch.Tensor  # bool [R, L]: generated tokens
    skipped_mask: torch.Tensor  # bool [R, L]: generated reasoning tokens of skipped turns
    logp_old: torch.Tensor  # float [R, L]: sampler log-probs (0 off the policy mask)
    advantages: torch.Tensor  # float [R]
    rewards: torch.Tensor  # float [R]
    closure_input_ids: torch.Tensor  # long [S, Lc]: compressed context + close marker, right padded
    closure_attention_mask: torch.Tensor  # long [S, Lc]
    closure_target_mask: torch.Tensor  # bool [S, Lc]: the close marker's tokens
    closure_turns: list[tuple[int, int]]  # (row, turn) of each closure term
    total_turns: int  # every turn of every rollout in the batch

    @property
    def policy_token_count(self) -> int:
        return int(self.policy_mask.sum())

    @property
    def masked_token_count(self) -> int:
        return int((self.skipped_mask & self.policy_mask).sum())


@dataclass
class RLReport:
    success_rate: float
    reasoning_tokens_per_turn: float  # generated reasoning tokens / turns, over the batch
    masked_tokens: int  # skipped reasoning tokens (no policy gradient, still in N_policy)
    closure_terms: int
    policy_tokens: int  # N_policy
    total_turns: int
    loss: float  # of the first inner step (before any update of this iteration)
    losses: list[float]
    batch: RLBatch
    logp_new: torch.Tensor  # detached, first inner step
    closure_logprobs: torch.Tensor  # detached, first inner step
    rollouts: list[Rollout]
    covers: dict[int, CoverResult]  # rollout index -> cover result (successful, well-formed ones)
    wall_seconds: float = 0.0
    extra: dict = field(default_factory=dict)
    grad_norms: list[float] = field(default_factory=list)  # one per inner step, before clipping
    closure_loss: float | None = None  # the closure term −Σ log p(close) / T_total of the first step run (loss = actor + λ·it)
    actor_loss: float | None = None  # that step's loss less λ·closure_loss

    def summary(self) -> dict:
        return {"success_rate": self.success_rate, "reasoning_tokens_per_turn": self.reasoning_tokens_per_turn,
                "masked_tokens": self.masked_tokens, "closure_terms": self.closure_terms,
                "policy_tokens": self.policy_tokens, "total_turns": self.total_turns, "loss": self.loss,
                "actor_loss": self.actor_loss, "closure_loss": self.closure_loss,
                "rollouts": len(self.rollouts), "wall_seconds": round(self.wall_seconds, 2),
                "step_losses": self.losses, "grad_norms": self.grad_norms, "processes": self.extra.get("processes", 1)}


def cover_rollouts(rollouts: Sequence[Rollout], scorer, epsilon: float) -> dict[int, CoverResult]:
    """LoGiC cover of the successful, well-formed rollouts: rollout index -> CoverResult."""
    indexed = [(i, t) for i, r in enumerate(rollouts) if (t := r.to_trajectory()) is not None]
    if not indexed:
        return {}
    results = logic_cover([t for _, t in indexed], scorer, epsilon)
    return {i: result for (i, _), result in zip(indexed, results, strict=True)}


def build_rl_batch(renderer: Renderer, rollouts: Sequence[Rollout], covers: dict[int, CoverResult],
                   advantages: torch.Tensor, pad_id: int) -> RLBatch:
    """Pad the rollouts into one batch, mark skipped reasoning, and lay out the closure contexts."""
    rows = len(rollouts)
    width = max(len(r.token_ids) for r in rollouts)
    input_ids = torch.full((rows, width), pad_id, dtype=torch.long)
    attention = torch.zeros((rows, width), dtype=torch.long)
    policy = torch.zeros((rows, width), dtype=torch.bool)
    skipped = torch.zeros((rows, width), dtype=torch.bool)
    logp_old = torch.zeros((rows, width), dtype=torch.float32)
    closure_sequences: list[tuple[list[int], int]] = []  # (ids up to the close marker's end, its token count)
    closure_turns: list[tuple[int, int]] = []
    for row, rollout in enumerate(rollouts):
        a = rollout.arrays()
        n = len(a["token_ids"])
        input_ids[row, :n] = torch.from_numpy(a["token_ids"])
        attention[row, :n] = 1
        policy[row, :n] = torch.from_numpy(a["policy_mask"])
        logp_old[row, :n] = torch.from_numpy(a["old_logprobs"])
        cover = covers.get(row)
        if cover is None:
            continue
        compressed = renderer.render(cover.trajectory)
        for t in cover.skipped_turns:
            own_reasoning = (a["turns"] == t) & (a["roles"] == int(Role.REASONING)) & a["policy_mask"]
            skipped[row, :n] |= torch.from_numpy(own_reasoning)
            close = np.flatnonzero(compressed.mask(Role.CLOSE, turn=t))
            closure_sequences.append((compressed.input_ids[: close[-1] + 1].tolist(), len(close)))
            closure_turns.append((row, t))
    c_width = max((len(s) for s, _ in closure_sequences), default=0)
    closure_ids = torch.full((len(closure_sequences), c_width), pad_id, dtype=torch.long)
    closure_attention = torch.zeros((len(closure_sequences), c_width), dtype=torch.long)
    closure_targets = torch.zeros((len(closure_sequences), c_width), dtype=torch.bool)
    for k, (sequence, marker_tokens) in enumerate(closure_sequences):
        closure_ids[k, :len(sequence)] = torch.as_tensor(sequence)
        closure_attention[k, :len(sequence)] = 1
        closure_targets[k, len(sequence) - marker_tokens:len(sequence)] = True
    return RLBatch(
        input_ids=input_ids, attention_mask=attention, policy_mask=policy, skipped_mask=skipped,
        logp_old=logp_old, advantages=advantages.float(),
        rewards=torch.tensor([r.reward for r in rollouts], dtype=torch.float32),
        closure_input_ids=closure_ids, closure_attention_mask=closure_attention,
        closure_target_mask=closure_targets, closure_turns=closure_turns,
        total_turns=sum(len(r.turns) for r in rollouts),
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
    """One log p(close marker | compressed context, open marker) per skipped turn, with gradient."""
    if not batch.closure_turns:
        return torch.zeros(0, device=next(model.parameters()).device)
    logp = token_logprobs(model, batch.closure_input_ids, batch.closure_attention_mask)
    return (logp * batch.closure_target_mask.to(logp.device)).sum(dim=1)


def batch_loss(batch: RLBatch, logp_new: torch.Tensor, closure: torch.Tensor, config: RLConfig,
               policy_token_count: int | None = None, total_turns: int | None = None) -> torch.Tensor:
    """The cover-aware loss of `batch`; `policy_token_count` and `total_turns` are the whole batch's
    when `batch` holds one process's rows (default: `batch`'s own)."""
    device = logp_new.device
    return cover_aware_loss(
        logp_new, batch.logp_old.to(device), batch.advantages.to(device), batch.policy_mask.to(device),
        batch.skipped_mask.to(device), closure, batch.total_turns if total_turns is None else total_turns,
        clip=config.clip, closure_weight=config.closure_weight, policy_token_count=policy_token_count,
    )


def _rows(batch: RLBatch, start: int, stop: int) -> RLBatch:
    """Rows start..stop of `batch`, cut to their longest sequence, without closure contexts."""
    width = int(batch.attention_mask[start:stop].sum(dim=1).max())
    cut = (slice(start, stop), slice(0, width))
    return replace(batch, input_ids=batch.input_ids[cut], attention_mask=batch.attention_mask[cut],
                   policy_mask=batch.policy_mask[cut], skipped_mask=batch.skipped_mask[cut],
                   logp_old=batch.logp_old[cut], advantages=batch.advantages[start:stop],
                   rewards=batch.rewards[start:stop], closure_turns=[])


def accumulated_backward(run, batch: RLBatch, config: RLConfig, micro: int, policy_tokens: int, total_turns: int
                         ) -> tuple[float, torch.Tensor, torch.Tensor]:
    """The batch's loss, forward and backward `micro` rollouts (then `micro` closure contexts) at a
    time, gradients accumulated: the loss is a sum over rows and over closure terms with the whole
    batch's denominators (N_policy, T_total), so the parts add up to the one-forward loss and
    gradient. Memory is one micro-batch's activations. Returns (loss, logp_new [R, L], closure [S])."""
    device = next(run.model.parameters()).device
    no_closure = torch.zeros(0, device=device)
    rows, width = batch.input_ids.shape
    total, logps, closures = 0.0, [], []
    for start in range(0, rows, micro):
        part = _rows(batch, start, start + micro)
        logp = policy_logprobs(run.model, part)
        loss = batch_loss(part, logp, no_closure, config, policy_tokens, total_turns)
        run.backward(loss)
        total += float(loss.detach())
        logps.append(torch.nn.functional.pad(logp.detach().cpu(), (0, width - logp.shape[1])))
    for start in range(0, len(batch.closure_turns), micro):
        cut = slice(start, start + micro)
        closure = closure_logprobs(run.model, replace(
            batch, closure_input_ids=batch.closure_input_ids[cut], closure_attention_mask=batch.closure_attention_mask[cut],
            closure_target_mask=batch.closure_target_mask[cut], closure_turns=batch.closure_turns[cut]))
        loss = config.closure_weight * (-closure.sum() / max(int(total_turns), 1))
        run.backward(loss)
        total += float(loss.detach())
        closures.append(closure.detach().cpu())
    return total, torch.cat(logps), torch.cat(closures) if closures else no_closure.cpu()


def make_optimizer(model, config: RLConfig) -> torch.optim.Optimizer:
    return torch.optim.AdamW([p for p in model.parameters() if p.requires_grad], lr=config.lr,
                             weight_decay=config.weight_decay)


def shaped_reward(rollout: Rollout, config: RLConfig) -> float:
    """The judge's reward less the reasoning-length penalty: r − λ · generated reasoning tokens."""
    return rollout.reward - config.length_penalty * rollout.reasoning_token_count()


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
) -> RLReport:
    """Update `model` in place from its own `rollouts` (steps 2-5 of the module docstring): judge-given
    rewards -> GRPO advantages -> LoGiC cover (tolerance `epsilon`) of the successful rollouts with the
    pre-update policy -> cover-aware loss -> `config.inner_steps` optimizer step(s). Seeds torch with
    `config.seed` first, so an update is reproducible wherever its rollouts were sampled.

    `options`: mixed precision, gradient checkpointing, resumable state (`race_core.train.distributed`).
    In a launched process each process covers and trains on its share of the rollouts; N_policy and
    T_total are counted over all of them, so the loss is the one-process loss. The report's counts
    are the whole batch's; its `batch`, `logp_new` and `closure_logprobs` are this process's rows.
    `out_dir`: rank 0 saves the updated policy there (`base_checkpoint`: the folder the model was
    loaded from, needed to save a sharded run)."""
    from race_core.policy import pad_token_id, save_policy
    from race_core.scoring.hf import HFScorer
    from race_core.train.distributed import TrainRun, process_rank, world_size

    started = time.perf_counter()
    torch.manual_seed(config.seed)
    options = options or TrainOptions()
    processes = world_size()
    if len(rollouts) < processes:
        raise ValueError(f"{len(rollouts)} rollouts cannot be shared among {processes} training processes")
    renderer = renderer or Renderer(tokenizer)
    optimizer = optimizer or make_optimizer(model, config)
    pad_id = pad_token_id(tokenizer)
    advantages = grpo_advantages([shaped_reward(r, config) for r in rollouts], [r.group for r in rollouts])
    rows = list(range(len(rollouts)))[process_rank()::processes]  # this process's rollouts
    covers: dict = {}  # plain GRPO: every generated token in the loss, no closure
    if config.cover_aware:
        scorer = HFScorer(model, tokenizer, renderer=renderer)
        try:
            covers = cover_rollouts([rollouts[i] for i in rows], scorer, epsilon)
        finally:
            scorer.close()  # its kept prefixes (up to half the free memory) are gone before the update's forward
    run = TrainRun(model, optimizer, options, micro_batch=len(rows))
    if run.world_size > 1:  # every process learns every cover decision (the report counts them all)
        gathered = run.gather_objects([(rows[i], cover) for i, cover in covers.items()])
        all_covers = dict(gathered)
    else:
        all_covers = covers
    batch = build_rl_batch(renderer, [rollouts[i] for i in rows], covers, advantages[rows], pad_id)
    policy_tokens, total_turns, masked, closure_terms = (int(x) for x in run.all_reduce_sum(
        batch.policy_token_count, batch.total_turns, batch.masked_token_count, len(batch.closure_turns)))

    run.model.train()
    losses: list[float] = list(run.history.get("losses", []))
    grad_norms: list[float] = list(run.history.get("grad_norms", []))
    logged_logp, logged_closure = None, None
    closure_term = first_loss = None  # of the first step this call runs
    micro = config.micro_batch if run.world_size == 1 else 0  # launched processes: their share in one forward
    for step in range(run.start_step, config.inner_steps):
        run.optimizer.zero_grad(set_to_none=True)
        if micro and max(len(rows), len(batch.closure_turns)) > micro:
            step_loss, logp_new, closure = accumulated_backward(run, batch, config, micro, policy_tokens, total_turns)
            loss = torch.tensor(step_loss)
        else:
            logp_new = policy_logprobs(run.model, batch)
            closure = closure_logprobs(run.model, batch)
            loss = batch_loss(batch, logp_new, closure, config, policy_tokens, total_turns)
            if closure_terms and not batch.closure_turns:  # the others run a closure forward: keep in step
                loss = loss + run.idle_loss(pad_id)
            run.backward(loss * run.world_size)  # the processes' gradients are averaged
        if logged_logp is None:
            logged_logp, logged_closure = logp_new.detach().cpu(), closure.detach().cpu()
            closure_term = -run.all_reduce_sum(float(closure.detach().sum()))[0] / max(total_turns, 1)
            first_loss = run.all_reduce_sum(float(loss.detach()))[0]
        grad_norms.append(run.clip_and_step(config.max_grad_norm, clear=False))  # the update's gradients stay readable
        losses.append(run.all_reduce_sum(float(loss.detach()))[0])
        run.after_step(step + 1, config.inner_steps, {"losses": losses, "grad_norms": grad_norms})
    updated = run.trained_model(lambda m: m, base_checkpoint)
    if out_dir is not None and run.is_main:
        save_policy(updated, tokenizer, out_dir)

    reasoning = sum(r.reasoning_token_count() for r in rollouts)
    turns = sum(len(r.turns) for r in rollouts)
    return RLReport(
        success_rate=sum(r.success for r in rollouts) / len(rollouts),
        reasoning_tokens_per_turn=reasoning / max(turns, 1),
        masked_tokens=masked, closure_terms=closure_terms,
        policy_tokens=policy_tokens, total_turns=total_turns, loss=losses[0], losses=losses,
        closure_loss=closure_term, actor_loss=None if first_loss is None else first_loss - config.closure_weight * closure_term,
        batch=batch, logp_new=logged_logp, closure_logprobs=logged_closure, rollouts=list(rollouts),
        covers=all_covers, wall_seconds=time.perf_counter() - started, extra=run.facts(), grad_norms=grad_norms,
    )
