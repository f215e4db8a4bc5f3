"""How the HF scorer cuts the rows of a `score` call into forwards: by what each forward costs.

A forward computes every row over the batch's longest fed length (padded positions), attends each
of those queries over the batch's longest cached prefix plus the tokens fed so far (attention
pairs), and pays a fixed price per call of the model whatever its size (launching the layers'
kernels, small matrix products running below the device's peak). `ForwardCost` prices a batch in
token-equivalents (the cost of one more position through the layers' matrix products):

    cost = positions + attention x attention pairs + overhead x model calls

With prefixes read in place (`ForwardCost.in_place`, `race_core.scoring.attention`) a forward is one
call and each row's padded queries attend to its own prefix, not the batch's longest: the pairs are
the causal triangle of every row plus each row's prefix x the batch's fed length.

`attention` (one (query, key) pair of one layer against one position through one layer's weights)
comes from the model's config. `overhead` is measured (`measure_overhead`: a call on one token, all
fixed cost, against one on many) per CPU class and model shape by `race bench price`, and the
pipeline reads it from a table (`race_core.scoring.prices`; `CPU_OVERHEAD` for a class nobody
measured), never measuring on its own: the plan decides which rows share a forward, and so the last
bits of the scores a cover stores, and a price that moved with the machine's load or a worker's
threads would make a resumed or spread-out cover store other bytes than one clean process. On an
accelerator it is one figure (`ACCELERATOR_OVERHEAD`: a GPU call's fixed part is thousands of
positions, so the planner fills batches and padding is nearly free).

`plan_batches` orders the rows by fed length, then total length, and cuts that order into the
batches of least total cost (dynamic programming over the cut points), each at most `batch_size`
rows and `max_batch_tokens` padded positions (rows x (prefix + fed)). The plan depends on the rows
and these figures only, so with `overhead` given (`HFScorer(forward_overhead=...)`) it is the same
on every machine.
"""

from __future__ import annotations

import math
import time
import weakref
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np
import torch

MAX_OVERHEAD = 2**16  # positions: a call costs about as much as a full batch (fill batches as allowed)
ACCELERATOR_OVERHEAD = 4096.0  # positions: a GPU call's fixed cost is thousands of positions
CPU_OVERHEAD = 32.0  # positions: a CPU class nobody measured (SmolLM2-135M and the tiny models measured 32 on one)
_measured: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> overhead (token-equivalents)


@dataclass(frozen=True)
class ForwardCost:
    overhead: float  # token-equivalents per call of the model
    attention: float  # token-equivalents per (query, key) pair of one layer
    chunk_tokens: int  # fed tokens per call when a prefix is cached (0: all at once)
    in_place: bool = False  # prefixes read where they are kept (`attention.prefix_attention`): one call, no padding

    def calls(self, past: np.ndarray | int, new: np.ndarray | int):
        """Model calls of a batch: one without a cached prefix (or with prefixes read in place), else
        one per chunk."""
        if not self.chunk_tokens or self.in_place:
            return np.ones_like(new) if isinstance(new, np.ndarray) else 1
        chunks = -(-np.asarray(new) // self.chunk_tokens)
        out = np.where(np.asarray(past) > 0, chunks, 1)
        return out if isinstance(new, np.ndarray) else int(out)

    def pairs(self, rows, past, new, past_total=None):
        """(query, key) pairs one attention layer computes: without a cached prefix, the causal
        triangle of the padded rows (the kernel skips the rest); with one, each chunk's queries over
        the prefix and the tokens fed up to the chunk's end, masked pairs included. Prefixes read in
        place: the causal triangle, and each row's padded queries over its own prefix (`past_total`:
        the rows' prefixes summed; default rows x `past`)."""
        rows, past, new = np.asarray(rows), np.asarray(past), np.asarray(new)
        if self.in_place:
            total = rows * past if past_total is None else np.asarray(past_total)
            out = total * new + rows * new * (new + 1) // 2
            return out if out.ndim else int(out)
        step = self.chunk_tokens or np.maximum(new, 1)
        full = new // step
        within = step * step * full * (full + 1) // 2 + (new - full * step) * new  # sum of len_s x end_s
        out = np.where(past > 0, rows * (past * new + within), rows * new * (new + 1) // 2)
        return out if out.ndim else int(out)

    def cost(self, rows, past, new, past_total=None):
        return (rows * new + self.attention * self.pairs(rows, past, new, past_total)
                + self.overhead * self.calls(past, new))


def attention_weight(config) -> float:
    """Token-equivalents of one (query, key) pair of one layer: its multiply-adds (query.key and
    weight x value over the heads) over those of one position through one layer's weights."""
    config = config.get_text_config()
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // heads
    return 2 * heads * head_dim / _layer_weights(config)


def _layer_weights(config) -> int:
    """Multiply-adds of one position through one decoder layer's projections (dense estimate)."""
    hidden = config.hidden_size
    heads = config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or hidden // heads
    kv_heads = getattr(config, "num_key_value_heads", None) or heads
    intermediate = getattr(config, "intermediate_size", None) or 4 * hidden
    return hidden * head_dim * (2 * heads + 2 * kv_heads) + 3 * hidden * intermediate


@torch.inference_mode()
def fastest_forward(model, rows: int, length: int, repeats: int, generator: torch.Generator) -> float:
    """Seconds of the fastest of `repeats` decoder forwards (no cache) over `rows` x `length` random
    tokens drawn with `generator`, after one warm-up; on a GPU the clock stops when the device is done."""
    device = next(model.parameters()).device
    sync = torch.cuda.synchronize if device.type == "cuda" else (lambda: None)
    ids = torch.randint(0, model.get_input_embeddings().weight.shape[0], (rows, length), generator=generator)
    ids, decoder = ids.to(device), model.get_decoder()
    decoder(input_ids=ids, use_cache=False)  # warm-up
    best = math.inf
    for _ in range(repeats):
        sync()
        start = time.perf_counter()
        decoder(input_ids=ids, use_cache=False)
        sync()
        best = min(best, time.perf_counter() - start)
    return best


@torch.inference_mode()
def measure_overhead(model, repeats: int = 7) -> float:
    """The fixed cost of one model call, in positions: a call on one token (all fixed cost) over the
    cost per position of a call on 4 x 64, each the fastest of `repeats` (the fastest is the one
    other work on the machine disturbed least); rounded to a power of two between 1 and
    MAX_OVERHEAD so that small differences between measurements leave the plans alone. Measured
    once per model object."""
    if model in _measured:
        return _measured[model]
    generator = torch.Generator().manual_seed(0)
    fixed, large = (fastest_forward(model, rows, length, repeats, generator) for rows, length in ((1, 1), (4, 64)))
    overhead = fixed / (large - fixed) * 255 if large > fixed else math.inf
    _measured[model] = float(2 ** round(math.log2(min(max(overhead, 1.0), MAX_OVERHEAD))))
    return _measured[model]


def plan_batches(fed: Sequence[int], reused: Sequence[int], cost: ForwardCost, batch_size: int,
                 max_batch_tokens: int) -> list[list[int]]:
    """The batches (row indices) of least total `cost`: rows ordered by fed length, then total
    length, cut into consecutive batches of at most `batch_size` rows and, but for a row alone,
    `max_batch_tokens` positions (rows x (longest prefix + longest fed length))."""
    n = len(fed)
    order = sorted(range(n), key=lambda i: (fed[i], fed[i] + reused[i]))
    f = np.array([fed[i] for i in order], dtype=np.int64)
    r = np.array([reused[i] for i in order], dtype=np.int64)
    best = np.zeros(n + 1)
    cut = np.zeros(n + 1, dtype=np.int64)
    for end in range(1, n + 1):
        start = max(0, end - batch_size)
        # batches [j, end) for j = end-1 down to start: their longest fed length and prefix
        new = np.maximum.accumulate(f[start:end][::-1])
        past = np.maximum.accumulate(r[start:end][::-1])
        past_total = np.cumsum(r[start:end][::-1])
        rows = np.arange(1, end - start + 1)
        total = best[end - rows] + cost.cost(rows, past, new, past_total)
        total[(rows > 1) & (rows * (past + new) > max_batch_tokens)] = np.inf
        k = int(np.argmin(total[::-1]))  # on a tie, the larger batch
        cut[end] = start + k
        best[end] = total[::-1][k]
    batches, end = [], n
    while end > 0:
        batches.append(order[cut[end]:end])
        end = cut[end]
    return batches[::-1]
