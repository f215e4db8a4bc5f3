"""The GPU check a bare CUDA machine can run (issue 37): only torch, transformers and `race_core`
(no vLLM, no Prefect, no hub, nothing to download; the repository and a tokenizer folder are all it
brings). For each model shape and dtype, on models built from a config with seeded random weights:

- the hf scorer's LoGiC cover of a synthetic workload (`bench.workload`), timed against that run's
  work bound (the tokens the exact cover must compute, `bench.baselines.bound_work`, at the raw
  forward's throughput measured in the same run) and against the device's bfloat16 matrix roofline
  (the cover's matmul FLOPs, counted from the scorer's work counters, at the peak bf16 matmul rate
  measured in the same run);
- one SFT step (`race_core.train.sft.train_sft`) on one sequence of `--train-tokens` tokens and one
  cover-aware RL update (`race_core.train.rl.update_from_rollouts`) on rollouts the model samples,
  both with gradient checkpointing, with the device's peak memory (`torch.cuda.max_memory_allocated`).

Random weights make near-uniform distributions: the timings, the work and the memory are the real
model's, the decisions are not (they are listed, not judged). A step that does not fit the device is
recorded as out of memory and the run goes on.

    python -m bench.gpu_bare --device cuda --tokenizer DIR --json gpu-bare.json          # on the GPU
    python -m bench.gpu_bare --device cpu --shapes toy --dtypes float32 bfloat16 --n 4    # CPU smoke run

DIR is a folder holding a tokenizer only (tokenizer.json, tokenizer_config.json, ...), e.g. the
tokenizer files of `race model smollm2`; the model's vocabulary is the tokenizer's (SmolLM2's 49,152
for every shape, so the 1.5B and 7B shapes' heads are smaller than Qwen2.5's 151,936 rows). Without
one the tiny tokenizer of `race_core.tiny` is built (512 tokens: for the smoke run).
`scripts/gpu_check.sh` runs this first, and its vLLM and pipeline parts only where those import.
"""

from __future__ import annotations

import argparse
import gc
import json
import logging
import platform
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from bench.baselines import bound_work, forward_throughput
from bench.workload import Workload, synthetic_trajectories

logger = logging.getLogger(__name__)


@dataclass(frozen=True)
class Shape:
    """A decoder's shape; `family` picks the transformers config class (llama or qwen2)."""

    name: str
    family: str
    hidden: int
    layers: int
    heads: int
    kv_heads: int
    mlp: int
    tied: bool
    of: str  # the model whose shape this is


SHAPES = {s.name: s for s in (
    Shape("toy", "llama", 64, 2, 2, 1, 128, True, "a toy (CPU smoke run)"),
    Shape("135m", "llama", 576, 30, 9, 3, 1536, True, "SmolLM2-135M"),
    Shape("1.5b", "qwen2", 1536, 28, 12, 2, 8960, True, "Qwen2.5-1.5B"),
    Shape("7b", "qwen2", 3584, 28, 28, 4, 18944, False, "Qwen2.5-7B"),
)}
GiB = 2**30


def build_model(shape: Shape, tokenizer, device: str, dtype: str, context: int = 4096):
    """A causal LM of `shape` with the tokenizer's vocabulary, seeded random weights, on `device`."""
    import torch
    from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config

    from race_core.policy import pad_token_id

    config_class = {"llama": LlamaConfig, "qwen2": Qwen2Config}[shape.family]
    config = config_class(vocab_size=len(tokenizer), hidden_size=shape.hidden, num_hidden_layers=shape.layers,
                          num_attention_heads=shape.heads, num_key_value_heads=shape.kv_heads,
                          intermediate_size=shape.mlp, tie_word_embeddings=shape.tied,
                          max_position_embeddings=context, pad_token_id=pad_token_id(tokenizer),
                          bos_token_id=tokenizer.bos_token_id, eos_token_id=tokenizer.eos_token_id)
    torch.manual_seed(0)
    with torch.device(device):  # built where it runs: a 7B model is not initialized on the host
        model = AutoModelForCausalLM.from_config(config, dtype=getattr(torch, dtype))
    return model.eval()


def load_tokenizer(folder: str | None):
    """The tokenizer in `folder`, or the tiny one built in memory."""
    if folder:
        from transformers import AutoTokenizer

        return AutoTokenizer.from_pretrained(folder, local_files_only=True)
    from race_core.tiny import TINY, build_tokenizer

    return build_tokenizer(TINY)


def _sync(device: str) -> None:
    import torch

    if device.startswith("cuda"):
        torch.cuda.synchronize()


def matmul_peak(device: str, size: int, repeats: int = 10) -> float:
    """bfloat16 matmul FLOP/s of `size` x `size` squares on `device`: the best of `repeats` timed
    rounds after a warm-up (the roofline the cover is set against)."""
    import torch

    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    a @ b
    _sync(device)
    best = float("inf")
    for _ in range(repeats):
        started = time.perf_counter()
        a @ b
        _sync(device)
        best = min(best, time.perf_counter() - started)
    return 2 * size**3 / best


def linear_parameters(model) -> int:
    """Weights one decoder position multiplies: every Linear of the decoder layers (no embeddings, no head)."""
    import torch

    return sum(m.weight.numel() for m in model.get_decoder().layers.modules() if isinstance(m, torch.nn.Linear))


def cover_flops(model, work, head_tokens: int) -> int:
    """Matmul FLOPs of a cover's forwards from its work counters: the decoder's linears per token fed,
    QK^T and AV per attention pair per layer, the head per scored token."""
    text = model.config.get_text_config()
    head_dim = getattr(text, "head_dim", None) or text.hidden_size // text.num_attention_heads
    attention = 4 * text.num_attention_heads * head_dim * work.attention_pairs * text.num_hidden_layers
    head = 2 * text.hidden_size * text.vocab_size * head_tokens
    return 2 * linear_parameters(model) * work.tokens_processed + attention + head


def peak_memory(device: str) -> int | None:
    import torch

    return int(torch.cuda.max_memory_allocated()) if device.startswith("cuda") else None


def _reset_peak(device: str) -> None:
    import torch

    gc.collect()
    if device.startswith("cuda"):
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def _guarded(device: str, run, *args) -> dict[str, Any]:
    """`run(*args)`'s figures with the device's peak memory, or {"error": "out of memory"} where it did not fit."""
    import torch

    _reset_peak(device)
    started = time.perf_counter()
    try:
        figures = run(*args)
    except torch.OutOfMemoryError:
        _reset_peak(device)
        return {"error": "out of memory", "peak_bytes": None}
    _sync(device)
    return {**figures, "seconds": time.perf_counter() - started, "peak_bytes": peak_memory(device)}


def check_cover(model, tokenizer, device: str, workload: Workload, batch_size: int, epsilon: float,
                peak_flops: float) -> dict[str, Any]:
    from race_core.cover import logic_cover
    from race_core.render import Renderer
    from race_core.scoring.hf import HFScorer

    renderer = Renderer(tokenizer)
    trajectories = synthetic_trajectories(renderer, workload)
    scorer = HFScorer(model, tokenizer, renderer=renderer, batch_size=batch_size)
    logic_cover(trajectories[:1], scorer, epsilon)  # warm-up: first calls pay one-off costs
    scorer.release()
    before = scorer.stats.work()
    _sync(device)
    started = time.perf_counter()
    results = logic_cover(trajectories, scorer, epsilon)
    _sync(device)
    seconds = time.perf_counter() - started
    work = scorer.stats.work() - before
    scorer.close()
    throughput, _ = forward_throughput(model, renderer, trajectories, batch_size)
    bound, head_tokens = bound_work(renderer, results)
    bound_s = bound / throughput
    flops = cover_flops(model, work, head_tokens)
    return {"trajectories": len(trajectories), "turns": workload.turns, "cover_s": seconds,
            "bound_tokens": bound, "forward_tokens_per_s": throughput, "bound_s": bound_s,
            "time_vs_bound": seconds / bound_s, "cover_tflops": flops / seconds / 1e12,
            "roofline_s": flops / peak_flops, "time_vs_roofline": seconds * peak_flops / flops,
            "in_place": scorer.in_place, "work": work.counts(),
            "decisions": [[bool(a["accepted"]) for a in r.audit] for r in results]}


def check_sft(model, tokenizer, tokens: int) -> dict[str, Any]:
    from bench.train_memory import long_trajectory
    from race_core.config import SFTConfig
    from race_core.render import Renderer
    from race_core.train.distributed import TrainOptions
    from race_core.train.sft import train_sft

    trajectory = long_trajectory(tokens, Renderer(tokenizer))
    report = train_sft(model, tokenizer, [trajectory], SFTConfig(steps=1, batch_size=1, max_length=tokens, lr=1e-6),
                       options=TrainOptions(gradient_checkpointing=True))
    return {"tokens": tokens, "loss": report.losses[-1]}


def check_rl(model, tokenizer, rollouts: int, max_new_tokens: int) -> dict[str, Any]:
    from race_core.config import RLConfig
    from race_core.rollout import sample_rollouts
    from race_core.train.distributed import TrainOptions
    from race_core.train.rl import update_from_rollouts

    config = RLConfig(tasks_per_iteration=max(rollouts // 2, 1), group_size=2, max_new_tokens=max_new_tokens,
                      max_turns=2, lr=1e-6)
    started = time.perf_counter()
    played = sample_rollouts(model, tokenizer, config, iteration=0)
    sample_s = time.perf_counter() - started
    # Random weights win nothing: rewards set by hand (alternating within each group) so that the
    # advantages, and with them the policy loss's backward, are not all zero.
    for i, rollout in enumerate(played):
        rollout.reward = float(i % 2)
    model.train()
    report = update_from_rollouts(model, tokenizer, played, config, options=TrainOptions(gradient_checkpointing=True))
    model.eval()
    return {"rollouts": len(played), "rollout_tokens": sum(len(r.token_ids) for r in played), "sample_s": sample_s,
            "loss": report.loss}


def run(args: argparse.Namespace) -> dict[str, Any]:
    import torch
    import transformers

    from race_core.cpu import cpu_facts

    tokenizer = load_tokenizer(args.tokenizer)
    device = args.device
    peak = matmul_peak(device, args.matmul_size)
    facts = {"torch": torch.__version__, "transformers": transformers.__version__, "python": platform.python_version(),
             "device": torch.cuda.get_device_name(0) if device.startswith("cuda") else "cpu",
             "cpu": cpu_facts(), "bf16_matmul_tflops": peak / 1e12, "vocab": len(tokenizer)}
    logger.info(f"{facts['device']}: bf16 matmul {peak / 1e12:,.1f} TFLOP/s at {args.matmul_size}^3")
    workload = Workload(n=args.n, turns=args.turns)
    rows = []
    for name in args.shapes:
        shape = SHAPES[name]
        for dtype in args.dtypes:
            model = build_model(shape, tokenizer, device, dtype)
            row: dict[str, Any] = {"shape": name, "of": shape.of, "dtype": dtype,
                                   "parameters": sum(p.numel() for p in model.parameters())}
            row["cover"] = _guarded(device, check_cover, model, tokenizer, device, workload, args.batch_size,
                                    args.epsilon, peak)
            if not args.no_train:
                row["sft"] = _guarded(device, check_sft, model, tokenizer, args.train_tokens)
                row["rl"] = _guarded(device, check_rl, model, tokenizer, args.rl_rollouts, args.rl_new_tokens)
            logger.info(_line(row))
            rows.append(row)
            del model
            _reset_peak(device)
    return {"facts": facts, "workload": {"n": args.n, "turns": args.turns, "batch_size": args.batch_size,
                                         "epsilon": args.epsilon}, "rows": rows}


def _gib(value: int | None) -> str:
    return "-" if value is None else f"{value / GiB:.1f} GiB"


def _line(row: dict[str, Any]) -> str:
    cover = row["cover"]
    text = f"{row['shape']} {row['dtype']}: "
    if "error" in cover:
        text += f"cover {cover['error']}"
    else:
        text += (f"cover {cover['cover_s']:.2f}s = {cover['time_vs_bound']:.2f}x bound, "
                 f"{cover['time_vs_roofline']:.2f}x bf16 roofline ({cover['cover_tflops']:.1f} TFLOP/s)")
    for part in ("sft", "rl"):
        if part in row:
            text += f"; {part} " + (row[part]["error"] if "error" in row[part] else f"peak {_gib(row[part]['peak_bytes'])}")
    return text


def format_table(report: dict[str, Any]) -> str:
    facts, load = report["facts"], report["workload"]
    lines = [f"{facts['device']} (bf16 matmul {facts['bf16_matmul_tflops']:,.1f} TFLOP/s), torch {facts['torch']}, "
             f"transformers {facts['transformers']}; workload N={load['n']} T={load['turns']}, batch "
             f"{load['batch_size']}, ε {load['epsilon']:g}; random weights, vocabulary {facts['vocab']:,}", "",
             "| shape | dtype | cover s | vs bound | vs bf16 roofline | SFT step peak | RL update peak |",
             "|---|---|---|---|---|---|---|"]
    for row in report["rows"]:
        cover = row["cover"]
        cells = ([cover["error"], "-", "-"] if "error" in cover else
                 [f"{cover['cover_s']:.2f}", f"{cover['time_vs_bound']:.2f}x", f"{cover['time_vs_roofline']:.2f}x"])
        memory = [row[p].get("error") or _gib(row[p]["peak_bytes"]) if p in row else "-" for p in ("sft", "rl")]
        lines.append(f"| {row['of']} | {row['dtype']} | " + " | ".join(cells + memory) + " |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.gpu_bare", description=__doc__.split("\n\n")[0])
    parser.add_argument("--device", default="cuda")
    parser.add_argument("--tokenizer", default=None, help="a local folder holding a tokenizer (default: the tiny one)")
    parser.add_argument("--shapes", nargs="+", default=["135m", "1.5b", "7b"], choices=sorted(SHAPES))
    parser.add_argument("--dtypes", nargs="+", default=["bfloat16", "float32"])
    parser.add_argument("--n", type=int, default=16, help="trajectories of the cover's workload")
    parser.add_argument("--turns", type=int, default=8, help="turns per trajectory")
    parser.add_argument("--batch-size", type=int, default=16)
    parser.add_argument("--epsilon", type=float, default=0.3)
    parser.add_argument("--matmul-size", type=int, default=8192, help="side of the bf16 matmul timed as the roofline")
    parser.add_argument("--train-tokens", type=int, default=2048, help="length of the SFT step's sequence")
    parser.add_argument("--rl-rollouts", type=int, default=4)
    parser.add_argument("--rl-new-tokens", type=int, default=256, help="tokens per sampled turn of the RL rollouts")
    parser.add_argument("--no-train", action="store_true", help="the cover only")
    parser.add_argument("--json", default=None, help="write the report here")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(message)s", stream=sys.stdout)  # its lines, as they come
    report = run(args)
    print(format_table(report))
    if args.json:
        Path(args.json).write_text(json.dumps(report, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
