"""Supervised fine-tuning on (compressed) trajectories (docs/architecture.md §5): a torch loop under accelerate.

Each trajectory is rendered by `race_core.render` (one place for how a turn looks); the targets are
the assistant tokens (roles in `ASSISTANT_ROLES`: markers, reasoning, action prefix, action, end),
never the context or the observations. The loss is `race_core.loss.sft_loss`, a token mean over
the (accumulated) batch: with gradient accumulation each micro-batch's mean is weighted by its
share of the batch's target tokens, so accumulating k micro-batches equals one batch k times larger.
Several processes (`race_core.train.distributed`) share each optimizer step's examples and count the
step's target tokens together, so N processes equal one with the same batch.

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
from race_core.train.distributed import TrainOptions

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
    grad_norms: list[float] = field(default_factory=list)  # one per optimizer step, before clipping

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
    """Linear warmup, then cosine decay from 1 to `min_ratio` at the last step: after the warmup,
    transformers' `get_cosine_with_min_lr_schedule_with_warmup` to the last bit (tests/test_sft.py);
    its warmup starts at 1/warmup where transformers' starts at 0, a first step that would not move
    the weights. Kept rather than that scheduler: the trained policies' bytes depend on it."""
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


def _step_shares(micro: list[list[int]], config: SFTConfig, step: int, world_size: int, rank: int
                 ) -> list[list[int]]:
    """This process's micro-batches of optimizer step `step`: its share (every `world_size`-th example
    of the step's, from its rank) cut into micro-batches of at most `batch_size`, padded with empty
    ones to the count every process runs. With one process: the step's own micro-batches."""
    examples = [i for idx in micro[step * config.grad_accumulation:(step + 1) * config.grad_accumulation] for i in idx]
    share = examples[rank::world_size]
    count = micro_batches_per_process(config, world_size)
    return [share[k * config.batch_size:(k + 1) * config.batch_size] for k in range(count)]


def micro_batches_per_process(config: SFTConfig, world_size: int) -> int:
    """Forward/backward passes every process runs per optimizer step."""
    per_process = math.ceil(config.batch_size * config.grad_accumulation / world_size)
    return max(1, math.ceil(per_process / config.batch_size))


def train_sft(
    model_or_checkpoint,
    tokenizer,
    trajectories: Sequence[Trajectory],
    config: SFTConfig | None = None,
    out_dir: str | Path | None = None,
    progress: Progress | None = None,
    *,
    options: TrainOptions | None = None,
    base_checkpoint: str | Path | None = None,
) -> SFTReport:
    """Fine-tune on `trajectories` (assistant tokens only) and save to `out_dir` when given.

    `model_or_checkpoint` is a model (trained in place) or a local checkpoint folder; `tokenizer`
    may be None with a folder (it is loaded from it). Returns the per-step losses (of the whole
    batch, whatever the process count). `options` sets mixed precision, gradient checkpointing and
    the resumable training state (`race_core.train.distributed`); in a launched process the step's
    examples are shared among the processes and only rank 0 saves. `base_checkpoint`: the folder the
    model was loaded from, needed to save a sharded (FSDP, DeepSpeed) run.
    """
    from race_core.policy import load_policy, pad_token_id, save_policy
    from race_core.train.distributed import TrainRun, world_size

    config = config or SFTConfig()
    options = options or TrainOptions()
    if not trajectories:
        raise ValueError("train_sft needs at least one trajectory")
    started = time.perf_counter()
    if isinstance(model_or_checkpoint, str | Path):
        model, loaded_tokenizer = load_policy(model_or_checkpoint)
        tokenizer = tokenizer or loaded_tokenizer
        base_checkpoint = base_checkpoint or model_or_checkpoint
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
    processes = world_size()
    run = TrainRun(trained, optimizer, options, micro_batches_per_process(config, processes), config.batch_size)
    device = run.device
    run.model.train()
    losses: list[float] = list(run.history.get("losses", []))
    grad_norms: list[float] = list(run.history.get("grad_norms", []))
    target_tokens = int(run.history.get("target_tokens", 0))
    for step in range(run.start_step, total_steps):
        for group in run.optimizer.param_groups:
            group["lr"] = config.lr * lr_factor(step, total_steps, config.warmup_steps, config.min_lr_ratio)
        shares = _step_shares(micro, config, step, run.world_size, run.rank)
        batches = [collate([examples[i] for i in idx], pad_id) if idx else None for idx in shares]
        # token mean over the whole accumulated batch, on every process: weight each micro-batch by
        # its share of the step's target tokens, counted over all processes
        counts = [int(b[2][:, 1:].sum()) if b is not None else 0 for b in batches]
        step_tokens = max(int(run.all_reduce_sum(sum(counts))[0]), 1)
        share_loss = 0.0
        for batch, count in zip(batches, counts, strict=True):
            with run.accumulate():
                if batch is None:  # nothing of this micro-batch here: an idle pass keeps the processes in step
                    loss = run.idle_loss(pad_id)
                else:
                    input_ids, attention, targets = (t.to(device) for t in batch)
                    logits = run.model(input_ids=input_ids, attention_mask=attention).logits
                    loss = sft_loss(logits, input_ids, targets) * (count / step_tokens)
                run.backward(loss * run.world_size)  # the processes' gradients are averaged
                share_loss += float(loss.detach())
        grad_norms.append(run.clip_and_step(config.max_grad_norm))
        step_loss = run.all_reduce_sum(share_loss)[0]
        losses.append(step_loss)
        target_tokens += step_tokens
        run.after_step(step + 1, total_steps, {"losses": losses, "grad_norms": grad_norms,
                                               "target_tokens": target_tokens})
        if progress is not None and run.is_main:
            progress(step + 1, total_steps, step_loss)
    model = run.trained_model(lambda m: m.merge_and_unload() if config.lora else m, base_checkpoint,
                              wrap=(lambda m: _apply_lora(m, config)) if config.lora else None)
    checkpoint = save_policy(model, tokenizer, out_dir) if out_dir is not None and run.is_main else None
    return SFTReport(losses=losses, steps=total_steps, target_tokens=target_tokens, checkpoint=checkpoint,
                     wall_seconds=time.perf_counter() - started, lora=config.lora, model=model,
                     extra={"trajectories": len(examples), **run.facts()}, grad_norms=grad_norms)
