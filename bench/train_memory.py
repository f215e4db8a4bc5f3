"""Peak memory of one SFT training step (`race_core.train.sft.train_sft`, the pipeline's loop) on
SmolLM2-135M at 2k tokens: with and without gradient checkpointing, in float32, in bf16 autocast
(float32 weights and optimizer) and with bfloat16 weights; then what a 7-8B model needs, full and
LoRA, on one GPU and on 8, computed from the measured per-layer activation memory.

Each configuration runs in a fresh process. A thread samples the process's resident memory every
5 ms during the step; the step's peak is the highest sample less the memory held just before it
(the loaded model and tokenizer). The gradients and AdamW's two moments are counted from the
parameters (they are in that peak: the step ends with the optimizer's update); the rest is
activation memory. Running the same configuration on a 10-layer cut of the model (its first 10
layers) gives the activation memory per layer (the slope between 30 and 10 layers) and the rest
(embeddings, logits, the loss: the intercept).

The 7-8B estimate (Llama-3.1-8B's shape: 32 layers, hidden 4096, MLP 14336, vocabulary 128256, 8.03B
parameters) scales the per-layer activations by (hidden + MLP width) and the rest by the vocabulary,
and adds weights, gradients and AdamW states per parameter: float32 weights with bf16 autocast (as
`--mixed-precision bf16`) 4 + 4 + 8 bytes, bfloat16 weights 2 + 2 + 4 bytes; LoRA (r=8 on the
attention projections) keeps the frozen weights in bfloat16 (2 bytes) and trains a few million.
On 8 GPUs, FSDP / ZeRO-3 shards weights, gradients and optimizer states 8 ways; activations are per
GPU (batch of one 2k-token sequence each). Nothing here measures a GPU: CPU resident memory stands in
for device memory (the same tensors), so allocator overheads differ; treat the figures as estimates.

    RACE_MODELS_DIR=... python -m bench.train_memory [--tokens 2048] [--json FILE]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import threading
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

GiB = 2**30
CUT_LAYERS = 10  # the cut of the model whose difference from the whole gives the per-layer activations
PRECISIONS = ("float32", "bf16-autocast", "bf16-weights")


@dataclass(frozen=True)
class Case:
    precision: str  # one of PRECISIONS
    gradient_checkpointing: bool
    layers: int  # 0: all of the model's
    tokens: int = 2048


@dataclass(frozen=True)
class TargetModel:
    """The shape of the model the estimate is for."""

    name: str = "Llama-3.1-8B"
    parameters: float = 8.03e9
    layers: int = 32
    hidden: int = 4096
    mlp: int = 14336
    vocab: int = 128256
    lora_parameters: float = 6.8e6  # r=8 on q, k, v, o of 32 layers: 8 x (4096+4096, +4096, +1024, +1024...)


def _rss() -> int:
    with open("/proc/self/statm") as fh:
        return int(fh.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def long_trajectory(tokens: int, renderer):
    """One trajectory of expert calculator turns whose rendering is at least `tokens` long."""
    from race_core.envs.expert import expert_dataset
    from race_core.schema import Trajectory

    episodes = expert_dataset(400, seed=0, difficulty=3)
    turns = []
    for episode in episodes:
        turns.extend(episode.turns)
        trajectory = Trajectory(episodes[0].question, "calculator", "bench", tuple(turns))
        if len(renderer.render(trajectory)) >= tokens:
            return trajectory
    raise ValueError(f"400 expert episodes render to fewer than {tokens} tokens")


def run_case(checkpoint: str, case: Case) -> dict[str, Any]:
    """One configuration, in this process: the step's peak and its parts, in bytes."""
    import torch

    from race_core.config import SFTConfig
    from race_core.policy import load_policy
    from race_core.render import Renderer
    from race_core.train.distributed import TrainOptions
    from race_core.train.sft import train_sft

    torch.manual_seed(0)
    model, tokenizer = load_policy(checkpoint, dtype="bfloat16" if case.precision == "bf16-weights" else "float32")
    if case.layers:
        model.model.layers = model.model.layers[:case.layers]
        model.config.num_hidden_layers = case.layers
    trajectory = long_trajectory(case.tokens, Renderer(tokenizer))
    options = TrainOptions(mixed_precision="bf16" if case.precision == "bf16-autocast" else "no",
                           gradient_checkpointing=case.gradient_checkpointing)
    config = SFTConfig(steps=1, batch_size=1, max_length=case.tokens, lr=1e-5)
    parameters = sum(p.numel() for p in model.parameters())
    element = next(model.parameters()).element_size()
    before, peak, done = _rss(), [0], threading.Event()

    def sample() -> None:
        while not done.is_set():
            peak[0] = max(peak[0], _rss())
            time.sleep(0.005)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    started = time.perf_counter()
    train_sft(model, tokenizer, [trajectory], config, options=options)
    seconds = time.perf_counter() - started
    done.set()
    sampler.join()
    step = max(peak[0], _rss()) - before
    states = parameters * element * 3  # gradients and AdamW's two moments, in the weights' dtype
    shape = model.config
    return {**asdict(case), "layers": len(model.model.layers), "parameters": parameters,
            "hidden": shape.hidden_size,
            "mlp": shape.intermediate_size, "vocab": shape.vocab_size,
            "step_peak": step, "grads_and_optimizer": states, "activations": max(step - states, 0),
            "seconds": round(seconds, 1)}


def _in_fresh_process(checkpoint: str, case: Case) -> dict[str, Any]:
    command = [sys.executable, "-m", "bench.train_memory", "--worker", json.dumps(asdict(case)),
               "--checkpoint", checkpoint]
    done = subprocess.run(command, capture_output=True, text=True, cwd=Path(__file__).resolve().parents[1])
    if done.returncode != 0:
        raise RuntimeError(f"case {case} failed:\n{done.stderr[-3000:]}")
    return json.loads(done.stdout.strip().splitlines()[-1])


def estimate(rows: list[dict[str, Any]], target: TargetModel = TargetModel()) -> list[dict[str, Any]]:
    """GiB a `target` model needs per GPU at the measured token count (see the module docstring)."""
    by = {(r["precision"], r["gradient_checkpointing"], r["layers"]): r for r in rows}
    depth = max(r["layers"] for r in rows)
    out = []
    for precision in ("bf16-autocast", "bf16-weights"):
        for checkpointing in (False, True):
            full, cut = by.get((precision, checkpointing, depth)), by.get((precision, checkpointing, CUT_LAYERS))
            if full is None or cut is None or depth <= CUT_LAYERS:
                continue
            per_layer = max(full["activations"] - cut["activations"], 0) / (depth - CUT_LAYERS)
            rest = max(cut["activations"] - CUT_LAYERS * per_layer, 0)
            activations = (per_layer * target.layers * (target.hidden + target.mlp) / (full["hidden"] + full["mlp"])
                           + rest * target.vocab / full["vocab"])
            weight_bytes, state_bytes = (4, 12) if precision == "bf16-autocast" else (2, 6)
            full_ft = target.parameters * (weight_bytes + state_bytes)
            lora = target.parameters * 2 + target.lora_parameters * 16
            out.append({"precision": precision, "gradient_checkpointing": checkpointing,
                        "activations_gib": activations / GiB,
                        "full_1gpu_gib": (full_ft + activations) / GiB,
                        "full_8gpu_gib": (full_ft / 8 + activations) / GiB,
                        "lora_1gpu_gib": (lora + activations) / GiB,
                        "lora_8gpu_sharded_gib": (lora / 8 + activations) / GiB})
    return out


def format_report(rows: list[dict[str, Any]], estimates: list[dict[str, Any]], target: TargetModel) -> str:
    lines = ["| precision | gradient checkpointing | layers | step peak | grads + AdamW | activations | s |",
             "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for r in rows:
        lines.append(f"| {r['precision']} | {'on' if r['gradient_checkpointing'] else 'off'} | {r['layers']} | "
                     f"{r['step_peak'] / GiB:.2f} GiB | {r['grads_and_optimizer'] / GiB:.2f} GiB | "
                     f"{r['activations'] / GiB:.2f} GiB | {r['seconds']} |")
    by = {(r["precision"], r["gradient_checkpointing"], r["layers"]): r for r in rows}
    depth = max(r["layers"] for r in rows)
    ratios = []
    for precision in PRECISIONS:
        off, on = by.get((precision, False, depth)), by.get((precision, True, depth))
        if off and on:
            ratios.append(f"{precision}: gradient checkpointing leaves {on['step_peak'] / off['step_peak']:.2f} of "
                          f"the step peak and {on['activations'] / max(off['activations'], 1):.2f} of the "
                          f"activations; it takes {on['seconds'] / off['seconds']:.2f}x the time")
    for precision in PRECISIONS[1:]:
        for checkpointing in (False, True):
            fp32, other = by.get(("float32", checkpointing, depth)), by.get((precision, checkpointing, depth))
            if fp32 and other:
                ratios.append(f"{precision} vs float32 (checkpointing {'on' if checkpointing else 'off'}): "
                              f"{other['step_peak'] / fp32['step_peak']:.2f} of the step peak, "
                              f"{other['activations'] / max(fp32['activations'], 1):.2f} of the activations")
    lines += ["", *ratios, "", f"{target.name} at {rows[0]['tokens']} tokens per GPU (GiB, estimated):",
              "| precision | gradient checkpointing | activations | full, 1 GPU | full, 8 GPUs (FSDP) | LoRA, 1 GPU | "
              "LoRA, 8 GPUs (ZeRO-3) |", "| --- | --- | ---: | ---: | ---: | ---: | ---: |"]
    for e in estimates:
        lines.append(f"| {e['precision']} | {'on' if e['gradient_checkpointing'] else 'off'} | "
                     f"{e['activations_gib']:.1f} | {e['full_1gpu_gib']:.0f} | {e['full_8gpu_gib']:.0f} | "
                     f"{e['lora_1gpu_gib']:.0f} | {e['lora_8gpu_sharded_gib']:.0f} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.train_memory", description=__doc__.split("\n\n")[0])
    parser.add_argument("--checkpoint", help="the model (default: SmolLM2-135M-Instruct under RACE_MODELS_DIR)")
    parser.add_argument("--tokens", type=int, default=2048, help="tokens of the one training sequence")
    parser.add_argument("--precisions", nargs="+", choices=PRECISIONS, default=list(PRECISIONS))
    parser.add_argument("--json", help="write the rows and the estimate here")
    parser.add_argument("--worker", help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    checkpoint = args.checkpoint
    if checkpoint is None:
        from race_core.smollm2 import ensure_smollm2

        checkpoint = str(ensure_smollm2(Path(os.environ.get("RACE_MODELS_DIR", ".race/models"))))
    if args.worker:
        print(json.dumps(run_case(checkpoint, Case(**json.loads(args.worker)))))
        return 0
    rows = []
    for precision in args.precisions:
        for layers in (0, CUT_LAYERS):
            for checkpointing in (False, True):
                row = _in_fresh_process(checkpoint, Case(precision, checkpointing, layers, args.tokens))
                print(f"{precision}, checkpointing {'on' if checkpointing else 'off'}, {row['layers']} layers: "
                      f"step peak {row['step_peak'] / GiB:.2f} GiB ({row['seconds']} s)", file=sys.stderr)
                rows.append(row)
    target = TargetModel()
    estimates = estimate(rows, target)
    print(format_report(rows, estimates, target))
    if args.json:
        Path(args.json).write_text(json.dumps({"rows": rows, "estimates": estimates, "target": asdict(target)},
                                              indent=2))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
