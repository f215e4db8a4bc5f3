"""Supervised fine-tuning on (compressed) trajectories (DESIGN §5): a plain torch loop.

Each trajectory is rendered by `race_core.render` (one place for how a turn looks); the targets are
the assistant tokens (roles in `ASSISTANT_ROLES`: markers, reasoning, action prefix, action, end),
never the context or the observations. The loss is `race_core.loss.sft_loss`, a token mean over
the (accumulated) batch: with gradient accumulation each micro-batch's mean is weighted by its
share of the batch's target tokens, so accumulating k micro-batches equals one batch k times larger.

Full fine-tuning by default; with `lora=True` the model is wrapped with peft LoRA adapters,
trained, then merged, so the saved folder is a plain `save_pretrained` checkpoint either way.
Deterministic on CPU given `seed` (shuffling, dropout, LoRA init all come from it).
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import torch

from race_core.config import SFTConfig
from race_core.loss import sft_loss
from race_core.render import ASSISTANT_ROLES, Renderer
from race_core.schema import Trajectory

Progress = Callable[[int, int, float], None]  # (optimizer step, total steps, loss)


@dataclass
class SFTReport:
    losses: list[float]  # one per optimizer step (token mean over the step's batch)
    steps: int
    target_tokens: int  # assistant tokens seen (all steps)
    checkpoint: Path | None
    wall_seconds: float
    lora: bool = False
    model: object = None  # the trained model (LoRA merged), in eval mode
    extra: dict = field(default_factory=dict)

    @property
    def first_loss(self) -> float:
        return self.losses[0] if self.losses else float("nan")

    @property
    def last_loss(self) -> float:
        return self.losses[-1] if self.losses else float("nan")


@dataclass(frozen=True)
class _Example:
    input_ids: np.ndarray
    target_mask: np.ndarray


def encode_examples(renderer: Renderer, trajectories: Sequence[Trajectory], max_length: int) -> list[_Example]:
    """Rendered ids and assistant-target masks, cut to `max_length` tokens."""
    out = []
    for trajectory in trajectories:
        rendered = renderer.render(trajectory)
        mask = rendered.mask(*ASSISTANT_ROLES)
        out.append(_Example(rendered.input_ids[:max_length], mask[:max_length]))
    return out


def collate(examples: Sequence[_Example], pad_id: int) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Right-padded (input_ids, attention_mask, target_mask)."""
    width = max(len(e.input_ids) for e in examples)
    input_ids = torch.full((len(examples), width), pad_id, dtype=torch.long)
    attention = torch.zeros((len(examples), width), dtype=torch.long)
    targets = torch.zeros((len(examples), width), dtype=torch.bool)
    for row, e in enumerate(examples):
        n = len(e.input_ids)
        input_ids[row, :n] = torch.from_numpy(e.input_ids)
        attention[row, :n] = 1
        targets[row, :n] = torch.from_numpy(e.target_mask)
    return input_ids, attention, targets


def lr_factor(step: int, total: int, warmup: int, min_ratio: float) -> float:
    """Linear warmup, then cosine decay from 1 to `min_ratio` at the last step."""
    if warmup and step < warmup:
        return (step + 1) / warmup
    span = max(total - warmup, 1)
    progress = min(max(step - warmup, 0) / span, 1.0)
    return min_ratio + (1.0 - min_ratio) * 0.5 * (1.0 + math.cos(math.pi * progress))


def _micro_batches(lengths: Sequence[int], config: SFTConfig, generator: torch.Generator) -> list[list[int]]:
    """Micro-batches of example indices for the whole run (reshuffled every pass).

    With `length_grouping`, each window of 16 optimizer steps' worth of shuffled examples is sorted
    by length before it is cut into steps (and the steps of the window shuffled again): less padding,
    same examples per step. Steps are cut before micro-batches, so accumulating k micro-batches
    sees the same examples as one k times larger batch."""
    n = len(lengths)
    per_step = config.batch_size * config.grad_accumulation
    total_steps = config.steps or max(1, math.ceil(n * config.epochs / per_step))
    order: list[int] = []
    while len(order) < total_steps * per_step:
        order.extend(torch.randperm(n, generator=generator).tolist())
    order = order[: total_steps * per_step]
    steps = [order[i * per_step:(i + 1) * per_step] for i in range(total_steps)]
    if config.length_grouping:
        window = 16
        grouped: list[list[int]] = []
        for w in range(0, total_steps, window):
            chunk = sorted((i for step in steps[w:w + window] for i in step), key=lambda i: lengths[i])
            cut = [chunk[k * per_step:(k + 1) * per_step] for k in range(len(chunk) // per_step)]
            grouped.extend(cut[j] for j in torch.randperm(len(cut), generator=generator).tolist())
        steps = grouped
    return [step[k * config.batch_size:(k + 1) * config.batch_size]
            for step in steps for k in range(config.grad_accumulation)]


def _apply_lora(model, config: SFTConfig):
    try:
        from peft import LoraConfig, get_peft_model
    except ImportError as exc:  # pragma: no cover - depends on the install
        raise ImportError("LoRA needs peft: pip install 'race-pipeline[lora]'") from exc
    lora = LoraConfig(r=config.lora_r, lora_alpha=config.lora_alpha, lora_dropout=config.lora_dropout,
                      target_modules=list(config.lora_target_modules), task_type="CAUSAL_LM")
    return get_peft_model(model, lora)


def train_sft(
    model_or_checkpoint,
    tokenizer,
    trajectories: Sequence[Trajectory],
    config: SFTConfig | None = None,
    out_dir: str | Path | None = None,
    progress: Progress | None = None,
) -> SFTReport:
    """Fine-tune on `trajectories` (assistant tokens only) and save to `out_dir` when given.

    `model_or_checkpoint` is a model (trained in place) or a local checkpoint folder; `tokenizer`
    may be None with a folder (it is loaded from it). Returns the per-step losses.
    """
    from race_core.policy import load_policy, pad_token_id, save_policy

    config = config or SFTConfig()
    if not trajectories:
        raise ValueError("train_sft needs at least one trajectory")
    started = time.perf_counter()
    if isinstance(model_or_checkpoint, str | Path):
        model, loaded_tokenizer = load_policy(model_or_checkpoint)
        tokenizer = tokenizer or loaded_tokenizer
    else:
        model = model_or_checkpoint
    torch.manual_seed(config.seed)
    generator = torch.Generator().manual_seed(config.seed)
    renderer = Renderer(tokenizer)
    examples = encode_examples(renderer, trajectories, config.max_length)
    pad_id = pad_token_id(tokenizer)

    trained = _apply_lora(model, config) if config.lora else model
    params = [p for p in trained.parameters() if p.requires_grad]
    optimizer = torch.optim.AdamW(params, lr=config.lr, betas=(0.9, config.adam_beta2),
                                  weight_decay=config.weight_decay)
    micro = _micro_batches([len(e.input_ids) for e in examples], config, generator)
    total_steps = len(micro) // config.grad_accumulation
    device = next(trained.parameters()).device
    trained.train()
    losses: list[float] = []
    target_tokens = 0
    for step in range(total_steps):
        for group in optimizer.param_groups:
            group["lr"] = config.lr * lr_factor(step, total_steps, config.warmup_steps, config.min_lr_ratio)
        batches = [collate([examples[i] for i in idx], pad_id)
                   for idx in micro[step * config.grad_accumulation:(step + 1) * config.grad_accumulation]]
        # token mean over the whole accumulated batch: weight each micro-batch by its target share
        counts = [int(t[:, 1:].sum()) for _, _, t in batches]
        step_tokens = max(sum(counts), 1)
        step_loss = 0.0
        for (input_ids, attention, targets), count in zip(batches, counts, strict=True):
            logits = trained(input_ids=input_ids.to(device), attention_mask=attention.to(device)).logits
            loss = sft_loss(logits, input_ids.to(device), targets.to(device)) * (count / step_tokens)
            loss.backward()
            step_loss += float(loss.detach())
        if config.max_grad_norm:
            torch.nn.utils.clip_grad_norm_(params, config.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        losses.append(step_loss)
        target_tokens += step_tokens
        if progress is not None:
            progress(step + 1, total_steps, step_loss)
    trained.eval()
    if config.lora:
        model = trained.merge_and_unload()
    checkpoint = save_policy(model, tokenizer, out_dir) if out_dir is not None else None
    return SFTReport(losses=losses, steps=total_steps, target_tokens=target_tokens, checkpoint=checkpoint,
                     wall_seconds=time.perf_counter() - started, lora=config.lora, model=model,
                     extra={"trajectories": len(examples)})
