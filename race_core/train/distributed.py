"""SFT and the RL update under accelerate: one code path for one process, N processes on one host
(DDP; gloo on CPU) and N hosts, with FSDP or DeepSpeed ZeRO chosen by an accelerate config file
(docs/architecture.md §8). The loops (`race_core.train.sft`, `race_core.train.rl`) open a `TrainRun` and do
their arithmetic through it; this module knows nothing of what they compute.

Exact losses across processes. Every process holds the whole batch's description (the examples'
order, the rollouts) and works on its own share: every `world_size`-th example of a step, or
rollout, from its rank. The denominators are global:
each process counts its share (target tokens; policy tokens; turns) and the counts are summed over
the processes (`TrainRun.all_reduce_sum`). A process's loss is its share's sum over the global
count, times the process count, because DDP, FSDP and DeepSpeed all average the gradients over
the processes: the gradient that reaches the optimizer is then the gradient of the global token
mean, as in one process. The loss reported for a step is the sum of the shares' losses.
Every process runs the same number of forward and backward passes in a step (a process with no
share of a micro-batch runs an idle pass that adds zero; FSDP gathers weights in every forward).

Mixed precision is accelerate's autocast (`--mixed-precision bf16|fp16`: the weights and the optimizer
stay in the model's dtype); gradient checkpointing is transformers' (non-reentrant). The model and
its optimizer are prepared together, as FSDP2 requires (FSDP1 configs need accelerate's default
`fsdp_use_orig_params: true`, so the optimizer's parameters stay the model's).

Training state (`TrainOptions.state_dir`): every `save_every` optimizer steps the model, optimizer
and RNG states are saved with `Accelerator.save_state` under `step-<n>/` (on every host), then
`latest.json` names it (the commit point) with the loop's history (losses and gradient norms so
far). A run given the same folder resumes after the step it names; the processes check they all
resume from the same step. The folder is scratch on the hosts that train (accelerate writes RNG
and optimizer states with pickle), never a store artifact.

What a launched process runs (`python -m race_core.train.worker SPEC.json`, started by
`race_core.train.launch`) is `race_core.train.worker`, which calls the loops; this module, which the
loops import, imports neither of them.
"""

from __future__ import annotations

import json
import logging
import os
import shutil
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch

from race_core.memory import freed_memory_kept, release_freed_memory

logger = logging.getLogger(__name__)

LATEST = "latest.json"
PROGRESS_PREFIX = "RACE_PROGRESS "  # a launched rank 0's progress lines (parsed by race_core.train.launch)
FAULT_ENV = "RACE_TRAIN_FAULT"  # tests only: "RANK:STEP" kills that rank right after that optimizer step


@dataclass(frozen=True)
class TrainOptions:
    """How a training loop runs, besides its stage config: precision, memory, resumable state."""

    mixed_precision: str = "no"  # bf16, fp16 or no (accelerate's names)
    gradient_checkpointing: bool = False
    state_dir: str | None = None  # where the training state is saved and resumed from (None: nowhere)
    save_every: int = 0  # optimizer steps between saved states (0: none)

    @classmethod
    def of(cls, resources, state_dir: str | Path | None = None) -> TrainOptions:
        """The options a `race_core.config.Resources` asks for."""
        return cls(mixed_precision=resources.mixed_precision, gradient_checkpointing=resources.gradient_checkpointing,
                   state_dir=str(state_dir) if state_dir is not None else None,
                   save_every=resources.train_save_every if state_dir is not None else 0)


def launched() -> bool:
    """True in a process started by torchrun / accelerate launch (the process group is theirs)."""
    return "LOCAL_RANK" in os.environ or int(os.environ.get("WORLD_SIZE", "1")) > 1


def world_size() -> int:
    """The training processes of this run: the launcher's WORLD_SIZE, else 1."""
    return int(os.environ.get("WORLD_SIZE", "1")) if launched() else 1


def process_rank() -> int:
    """This process's rank among the training processes (0 when not launched)."""
    return int(os.environ.get("RANK", "0")) if launched() else 0


def _accelerator(cpu: bool, mixed_precision: str, grad_accumulation: int):
    from accelerate import Accelerator
    from accelerate.state import AcceleratorState, GradientState
    from accelerate.utils import ProjectConfiguration

    if mixed_precision == "fp16" and cpu:
        raise ValueError("mixed precision fp16 needs a GPU: use bf16 or no on the CPU")
    if not launched():
        # One process: each run brings its own precision (accelerate keeps one per process otherwise;
        # transformers' TrainingArguments resets it the same way).
        AcceleratorState._reset_state(reset_partial_state=True)
        GradientState._reset_state()
    # every host saves the training state it needs to resume on its own disk
    accelerator = Accelerator(cpu=cpu, mixed_precision=mixed_precision, device_placement=False,
                              gradient_accumulation_steps=grad_accumulation,
                              project_config=ProjectConfiguration(save_on_each_node=True))
    accelerator.register_save_state_pre_hook(_untie_for_saving(accelerator))
    return accelerator


def _untie_for_saving(accelerator):
    """A `save_state` pre-hook: each model's weights without the aliases of tied weights, removed as
    `save_pretrained` removes them (transformers' `remove_tied_weights_from_state_dict`: the tied key,
    e.g. `lm_head.weight`, goes and the weight it is tied to stays). safetensors holds no aliases, and
    accelerate would otherwise drop the same key itself with a warning at every save; the tie comes
    back when the state is loaded into the model, whose weights are tied."""
    from transformers.modeling_utils import PreTrainedModel, remove_tied_weights_from_state_dict

    def hook(models, weights, output_dir) -> None:
        for k, (model, state) in enumerate(zip(models, weights, strict=False)):
            unwrapped = accelerator.unwrap_model(model)
            base = unwrapped.get_base_model() if hasattr(unwrapped, "get_base_model") else unwrapped  # LoRA's own
            if isinstance(base, PreTrainedModel):
                weights[k] = remove_tied_weights_from_state_dict(dict(state), unwrapped)

    return hook


class TrainRun:
    """One training loop's model and optimizer under an accelerate `Accelerator`.

    `model` is the prepared model (call it; wrapped by DDP / FSDP / DeepSpeed when several processes
    train), `optimizer` the prepared optimizer. `start_step` and `history` come from a resumed state
    (0 and {} on a fresh run)."""

    def __init__(self, model, optimizer, options: TrainOptions, grad_accumulation: int = 1, micro_batch: int = 1):
        device = next(model.parameters()).device
        self.options = options
        self.accelerator = _accelerator(device.type == "cpu", options.mixed_precision, grad_accumulation)
        if self.distributed_type == "DEEPSPEED":  # without a dataloader DeepSpeed cannot infer its batch size
            ds_config = self.accelerator.state.deepspeed_plugin.deepspeed_config
            if ds_config.get("train_micro_batch_size_per_gpu", "auto") == "auto":
                ds_config["train_micro_batch_size_per_gpu"] = micro_batch
        requested, effective = options.mixed_precision, self.accelerator.mixed_precision
        if requested != effective:  # a DeepSpeed config file brings its own precision
            raise ValueError(f"the accelerate config trains in {effective!r} but mixed_precision is {requested!r}: "
                             "set them alike (the precision is part of the training stages' keys)")
        self._enabled_checkpointing = options.gradient_checkpointing and not model.is_gradient_checkpointing
        if self._enabled_checkpointing:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        self._use_cache = getattr(model.config, "use_cache", None)
        if self._use_cache:
            model.config.use_cache = False  # no KV cache while training (and none with checkpointing)
        self.model, self.optimizer = self.accelerator.prepare(model, optimizer)
        self.device = device
        self.start_step, self.history = self._resume()

    # -- who am I ---------------------------------------------------------------------------------
    @property
    def world_size(self) -> int:
        return self.accelerator.num_processes

    @property
    def rank(self) -> int:
        return self.accelerator.process_index

    @property
    def is_main(self) -> bool:
        return self.accelerator.is_main_process

    @property
    def distributed_type(self) -> str:
        return str(self.accelerator.distributed_type).rsplit(".", 1)[-1]

    def facts(self) -> dict[str, Any]:
        """What a report records of how the run trained."""
        return {"processes": self.world_size, "rank": self.rank, "distributed_type": self.distributed_type,
                "mixed_precision": self.options.mixed_precision,
                "gradient_checkpointing": self.options.gradient_checkpointing, "resumed_from_step": self.start_step}

    def all_reduce_sum(self, *values: float) -> list[float]:
        """Each value summed over the processes (float64; the values themselves with one process)."""
        if self.world_size == 1:
            return [float(v) for v in values]
        tensor = torch.tensor(values, dtype=torch.float64, device=self.accelerator.device)
        return self.accelerator.reduce(tensor, reduction="sum").tolist()

    def gather_objects(self, items: list) -> list:
        """Every process's `items`, concatenated in rank order (picklable objects)."""
        if self.world_size == 1:
            return list(items)
        from accelerate.utils import gather_object

        return gather_object(items)

    # -- the step -----------------------------------------------------------------------------------
    def accumulate(self):
        """The context of one micro-batch: gradients are synchronized on the step's last one."""
        return self.accelerator.accumulate(self.model)

    def backward(self, loss: torch.Tensor) -> None:
        """Backward of a share's loss already scaled for the global mean (see the module docstring);
        accelerate divides by the micro-batches per step, so this multiplies by them first."""
        self.accelerator.backward(loss * self.accelerator.gradient_accumulation_steps)

    def clip_and_step(self, max_grad_norm: float, clear: bool = True) -> float:
        """Clip the gradients to `max_grad_norm` (0: no clipping), step the optimizer and (`clear`) drop
        the gradients; returns the gradient norm before clipping (NaN where DeepSpeed clips on its own)."""
        norm = float("nan")
        if self.accelerator.sync_gradients:
            total = self.accelerator.clip_grad_norm_(self.model.parameters(), max_grad_norm or float("inf"))
            norm = float(total) if total is not None else norm
        self.optimizer.step()
        if clear:
            self.optimizer.zero_grad(set_to_none=True)
        return norm

    def idle_loss(self, pad_id: int) -> torch.Tensor:
        """Zero, from a forward pass over two pad tokens: keeps a process without work in step."""
        ids = torch.full((1, 2), pad_id, dtype=torch.long, device=self.device)
        return self.model(input_ids=ids, attention_mask=torch.ones_like(ids)).logits.float().sum() * 0.0

    # -- state --------------------------------------------------------------------------------------
    def _resume(self) -> tuple[int, dict[str, Any]]:
        folder = self.options.state_dir
        saved = Path(folder) / LATEST if folder else None
        latest = json.loads(saved.read_text()) if saved is not None and saved.exists() else None
        step = int(latest["step"]) if latest else 0
        if self.world_size > 1:  # every host resumes from its own disk: they must hold the same step
            steps = self.accelerator.gather(torch.tensor([step], device=self.accelerator.device)).tolist()
            if len(set(steps)) > 1:
                raise RuntimeError(f"the hosts' saved training states are at different steps ({sorted(set(steps))}, "
                                   f"under {folder}): remove that folder on every host to start over")
        if latest is None:
            return 0, {}
        self.accelerator.load_state(str(Path(folder) / latest["folder"]))
        if self.is_main:
            logger.info("resuming from step %d (%s)", step, folder)
        return step, latest["history"]

    def after_step(self, step: int, total: int, history: dict[str, Any]) -> None:
        """Called by every process after optimizer step `step` (1-based): saves the state on schedule.
        On a CPU whose process keeps freed memory (`race_core.memory`), the step's freed activations
        go back to the kernel: batches of changing lengths fragment a heap that is never trimmed, and
        the bootstrap's SFT on SmolLM2 (micro-batches of 4 episodes of 300-1,024 tokens, bf16
        autocast) grew to 24 GB and was OOM-killed at step 61 of 64. Trimmed after each step, its
        micro-steps peaked at 10.5 GB where kept they had reached 14.6 GB after 16 and kept growing,
        for 14% more time (41% more without keeping freed memory at all)."""
        if self.device.type == "cpu" and freed_memory_kept():
            release_freed_memory(collect=False)
        every, folder = self.options.save_every, self.options.state_dir
        if folder and every and step % every == 0 and step < total:
            name = f"step-{step:08d}"
            self.accelerator.save_state(str(Path(folder) / name))
            self.accelerator.wait_for_everyone()
            if self.accelerator.is_local_main_process:  # one commit per host: each resumes from its own disk
                latest = Path(folder) / LATEST
                previous = json.loads(latest.read_text())["folder"] if latest.exists() else None
                tmp = latest.with_suffix(".tmp")
                tmp.write_text(json.dumps({"step": step, "folder": name, "history": history}))
                os.replace(tmp, latest)
                if previous and previous != name:
                    shutil.rmtree(Path(folder) / previous, ignore_errors=True)
            self.accelerator.wait_for_everyone()
        _maybe_fault(self.rank, step)

    def finish(self):
        """The trained model, unwrapped (no DDP wrapper, no autocast), in eval mode, with gradient
        checkpointing and the KV cache as they were before the run."""
        self.accelerator.wait_for_everyone()
        model = self.accelerator.unwrap_model(self.model, keep_fp32_wrapper=False)
        if self._enabled_checkpointing:
            model.gradient_checkpointing_disable()
        if self._use_cache:
            model.config.use_cache = self._use_cache
        return model.eval()

    def trained_model(self, merge, base_checkpoint: str | Path | None = None, wrap=None):
        """The trained model to save, on every process (`finish` first, then `merge`: LoRA adapters
        merged into the weights, or as is). Where the weights are sharded (FSDP, DeepSpeed) they are
        gathered (a collective: every process calls this) and the main process loads them into a fresh
        copy of `base_checkpoint` on the CPU, wrapped by `wrap` as the trained one was (LoRA); the
        other processes get None."""
        if self.distributed_type not in ("FSDP", "DEEPSPEED"):
            return merge(self.finish())
        state = self.accelerator.get_state_dict(self.model)
        self.finish()
        if not self.is_main:
            return None
        if base_checkpoint is None:
            raise ValueError(f"saving a {self.distributed_type} run needs the checkpoint it started from")
        from race_core.policy import load_policy

        dtype = next(v.dtype for v in state.values() if v.is_floating_point())
        fresh, _ = load_policy(base_checkpoint, dtype=str(dtype).removeprefix("torch."))
        fresh = wrap(fresh) if wrap is not None else fresh
        fresh.load_state_dict(state)
        return merge(fresh.eval())


def _maybe_fault(rank: int, step: int) -> None:
    """Fault injection for the kill-and-resume test: `RACE_TRAIN_FAULT=RANK:STEP` SIGKILLs that rank."""
    fault = os.environ.get(FAULT_ENV)
    if fault and fault == f"{rank}:{step}":
        import signal

        sys.stdout.flush()
        os.kill(os.getpid(), signal.SIGKILL)


def clear_state(state_dir: str | Path | None) -> None:
    """Drop a finished run's saved training state."""
    if state_dir:
        shutil.rmtree(state_dir, ignore_errors=True)
