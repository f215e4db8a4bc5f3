"""Losses (docs/architecture.md §5; the paper's eqs. 13-15).

SFT: assistant-only next-token loss, token mean over the batch.

Cover-aware RL for a batch of on-policy rollouts:
    ρ = exp(logp_new − logp_old) per policy token
    actor   = −Σ_{policy tokens not in skipped reasoning} min(ρA, clip(ρ, 1−c, 1+c)A) / N_policy
    closure = −Σ_{t ∈ S} log p(close marker | compressed context, open marker) / T_total
    loss    = actor + λ · closure
N_policy counts ALL original policy tokens, the masked ones included; T_total counts every turn
of every rollout in the batch.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def sft_loss(logits: torch.Tensor, input_ids: torch.Tensor, target_mask: torch.Tensor) -> torch.Tensor:
    """Mean negative log-likelihood of the target tokens (token mean over the whole batch).

    `logits` [rows, tokens, vocab] predict the next token; `target_mask` [rows, tokens] marks the
    tokens to learn (assistant tokens: markers, reasoning, action); context never is a target.
    """
    predicted = logits[:, :-1].float()
    targets = input_ids[:, 1:]
    mask = target_mask[:, 1:].to(predicted.dtype)
    token_nll = torch.nn.functional.cross_entropy(
        predicted.reshape(-1, predicted.shape[-1]), targets.reshape(-1), reduction="none"
    ).view_as(mask)
    return (token_nll * mask).sum() / mask.sum().clamp_min(1.0)


def cover_aware_loss(
    logp_new: torch.Tensor,
    logp_old: torch.Tensor,
    advantages: torch.Tensor,
    policy_mask: torch.Tensor,
    skipped_mask: torch.Tensor,
    closure_logprobs: torch.Tensor,
    total_turns: int,
    *,
    clip: float = 0.2,
    closure_weight: float = 0.02,
    policy_token_count: int | None = None,
) -> torch.Tensor:
    """Cover-aware clipped actor loss plus the closure term; a scalar tensor.

    Token tensors are [rows, tokens]. `advantages` is one value per row (broadcast over its tokens)
    or one per token. `skipped_mask` marks the reasoning tokens the cover found removable; they stay
    in the denominator but carry no policy gradient. `closure_logprobs` holds one log p(close
    marker) per skipped turn (may be empty). `policy_token_count` is N_policy when the tensors hold
    only part of the batch (one process's rows; `total_turns` is then the whole batch's too);
    by default the policy tokens of `policy_mask`.
    """
    if advantages.dim() == 1:
        advantages = advantages[:, None]
    policy = policy_mask.bool()
    kept = (policy & ~skipped_mask.bool()).to(logp_new.dtype)
    ratio = torch.exp(logp_new - logp_old)
    surrogate = torch.minimum(ratio * advantages, torch.clamp(ratio, 1.0 - clip, 1.0 + clip) * advantages)
    if policy_token_count is None:
        policy_token_count = policy.sum().clamp_min(1)
    else:
        policy_token_count = max(int(policy_token_count), 1)
    actor = -(surrogate * kept).sum() / policy_token_count
    closure = -closure_logprobs.sum() / max(int(total_turns), 1)
    return actor + closure_weight * closure


def grpo_advantages(rewards: Sequence[float] | torch.Tensor, group_ids: Sequence) -> torch.Tensor:
    """(r − mean) / (std + 1e-6) within each group of rollouts of the same task.

    std is the sample standard deviation (as TRL's GRPO); a group of one rollout gets 0.
    """
    rewards = torch.as_tensor(rewards, dtype=torch.float64)
    out = torch.zeros_like(rewards)
    groups: dict = {}
    for index, group in enumerate(group_ids):
        groups.setdefault(group, []).append(index)
    for members in groups.values():
        idx = torch.tensor(members)
        values = rewards[idx]
        if len(members) < 2:
            continue
        out[idx] = (values - values.mean()) / (values.std() + 1e-6)
    return out.float()
