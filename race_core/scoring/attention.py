"""Attention that reads each row's cached prefix where it is kept, instead of a copy of it.

The HF scorer's batch otherwise copies every row's reused prefix, left-padded to the batch's longest,
into one buffer the model's attention reads (`kv.BatchCache`), and feeds the new tokens in chunks
under an explicit mask: on long agent episodes that copy is most of the KV bytes the scorer moves, the
mask grows with rows x chunk x (prefix + chunk), and a masked attention computes the whole rectangle
including the padding. Here a row's attention is split in two parts, exact by the log-sum-exp of each:

- the new tokens over themselves, for the whole batch in one call with the causal kernel (rows are
  right-padded: a real query never sees a padded key, and padded queries are never read);
- each row's queries over its prefix, one kernel call per kept segment the prefix is made of, reading
  the segment's keys and values in place (no padding, no mask: a query sees every prefix position).

`softmax([a, b]) V = (e^A out_a + e^B out_b) / (e^A + e^B)` with A, B the two parts' log-sum-exps, so
the merged output is the full attention's up to float summation order (the scorer's probe checks it
against the model's own forward, `HFScorer.verify_against_forward`). The kernel is torch's CPU flash
attention, which returns the log-sum-exp (`aten._scaled_dot_product_flash_attention_for_cpu`).

It takes the place of the model's attention only inside `reading_prefixes(model, prefixes)`: the
attention implementation registered here (`NAME`) runs SDPA unchanged outside it, and the mask
transformers would build is skipped (an implementation without a registered mask function gets
none). Grouped-query attention: the query heads that share a key/value head are stacked along the
query axis for the prefix part (a prefix query sees every key, so their order does not matter), so
the prefix is never expanded to all heads; the new part passes the key/value heads as they are (the CPU
flash kernel maps query head h to key/value head h // groups, as `repeat_interleave` would).

Used for models whose attention is plain softmax(QK^T s) V over all positions (`supported`): no
sliding window, no logit soft-capping, no attention sinks; on a CPU. Elsewhere the scorer keeps the
copying path.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from contextvars import ContextVar

import torch
from torch.profiler import record_function
from transformers import AttentionInterface
from transformers.cache_utils import DynamicCache, DynamicLayer
from transformers.integrations.sdpa_attention import sdpa_attention_forward

NAME = "race_prefix_in_place"
_flash = torch.ops.aten._scaled_dot_product_flash_attention_for_cpu
_rows: ContextVar[Sequence[tuple] | None] = ContextVar("race_prefix_rows", default=None)
# model types whose attention is plain scaled softmax over every position (as of transformers 5.19)
PLAIN = frozenset({"llama", "mistral", "qwen2", "qwen3", "smollm3", "olmo", "olmo2", "granite", "phi3",
                   "stablelm", "starcoder2", "helium", "glm", "internlm3"})


def supported(model) -> bool:
    """Whether the model's attention can be split in place: a CPU model of a `PLAIN` type (none of them
    has attention sinks) with no sliding window or logit soft-capping configured."""
    config = model.config.get_text_config()
    if next(model.parameters()).device.type != "cpu" or config.model_type not in PLAIN:
        return False
    if getattr(config, "sliding_window", None) and getattr(config, "use_sliding_window", True):
        return False
    return not getattr(config, "attn_logit_softcapping", None)


def _merge_into(out: torch.Tensor, lse: torch.Tensor, part: torch.Tensor, part_lse: torch.Tensor,
                update_lse: bool) -> None:
    """Merge `part`, the attention of the same queries over other keys, into `out` in place:
    out + (part - out) sigmoid(B - A), the part's share of the two softmax sums (computed from the float32
    log-sum-exps, then in the output's dtype); `lse` becomes the log-sum-exp of both (A + softplus(B - A))
    when another part follows, and is left as it was after the last part (nothing reads it)."""
    gap = part_lse - lse
    out.lerp_(part, torch.sigmoid(gap).unsqueeze(-1).to(out.dtype))
    if update_lse:
        lse.add_(torch.nn.functional.softplus(gap))


def prefix_attention(module, query: torch.Tensor, key: torch.Tensor, value: torch.Tensor,
                     attention_mask: torch.Tensor | None, dropout: float = 0.0, scaling: float | None = None,
                     **kwargs) -> tuple[torch.Tensor, None]:
    """The attention of `query` [rows, heads, new, dim] over the new tokens' `key`/`value` [rows,
    kv heads, new, dim] (causal) and each row's prefix parts (`reading_prefixes`); SDPA when no
    prefixes are being read."""
    prefixes = _rows.get()
    if prefixes is None:
        return sdpa_attention_forward(module, query, key, value, attention_mask, dropout=dropout, scaling=scaling,
                                      **kwargs)
    rows, heads, length, dim = query.shape
    groups = heads // key.shape[1]
    out, lse = _flash(query, key, value, 0.0, True, scale=scaling)
    layer = module.layer_idx
    with record_function("hf.prefix_attention"):  # profiled apart: it grows with each row's prefix
        for b, parts in enumerate(prefixes):
            if not parts:
                continue
            q = query[b].reshape(heads // groups, groups * length, dim)[None]
            for i, (segment, n) in enumerate(parts):
                k, v = segment.layer(layer)
                part, part_lse = _flash(q, k[None, :, :n], v[None, :, :n], 0.0, False, scale=scaling)
                _merge_into(out[b], lse[b], part[0].reshape(heads, length, dim), part_lse[0].reshape(heads, length),
                            update_lse=i + 1 < len(parts))
    return out.transpose(1, 2).contiguous(), None


AttentionInterface.register(NAME, prefix_attention)


class RowsWritten:
    """The rows' own tensors of a `NewTokensCache` (`rows`, or per-layer `pairs`), filled layer by
    layer. Its layers write here, not through the cache: a layer holding its cache would make a
    reference cycle, and every batch's cache, with its layers' whole-batch keys/values, would wait
    for Python's cyclic collector instead of going when the batch ends (gigabytes of dead caches
    on a long cover, and fresh pages for every batch after)."""

    def __init__(self, layers: int, fed: Sequence[int]):
        self.fed, self.count = list(fed), layers
        self.rows: list[torch.Tensor] | None = None
        self.pairs: list[list[tuple[torch.Tensor, torch.Tensor]]] = [[] for _ in fed]

    def write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        with record_function("hf.kv_write"):
            self._write(layer, keys, values)

    def _write(self, layer: int, keys: torch.Tensor, values: torch.Tensor) -> None:
        if layer == 0:
            packed = keys.shape == values.shape
            self.rows = [keys.new_empty((self.count, 2, keys.shape[1], n, keys.shape[3])) for n in self.fed] \
                if packed else None
        for b, n in enumerate(self.fed):
            if self.rows is not None:
                self.rows[b][layer, 0].copy_(keys[b, :, :n])
                self.rows[b][layer, 1].copy_(values[b, :, :n])
            else:
                self.pairs[b].append((keys[b, :, :n].clone(), values[b, :, :n].clone()))


class NewTokensLayer(DynamicLayer):
    """One layer of a `NewTokensCache`: returns the batch's new keys/values as computed (the new part
    of `prefix_attention` reads them), and writes each row's real positions into that row's own
    tensor (the cache write every path makes; nothing is copied again to keep them)."""

    def __init__(self, written: RowsWritten, past: int, layer: int):
        super().__init__()
        self.written, self.past, self.layer = written, past, layer

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if self.is_initialized:
            raise RuntimeError("the in-place prefix attention feeds a batch's new tokens in one call")
        self.written.write(self.layer, key_states, value_states)
        self.keys, self.values = key_states, value_states
        self.dtype, self.device, self.is_initialized = key_states.dtype, key_states.device, True
        return key_states, value_states

    def get_seq_length(self) -> int:
        return self.past + (self.keys.shape[-2] if self.is_initialized else 0)


class NewTokensCache(DynamicCache):
    """The cache of a batch whose prefixes are read in place: per row, a tensor [layers, 2, kv heads,
    fed, dim] of its fed positions' keys/values (`row(b)`, filled layer by layer), which the scorer keeps
    as that row's segment as is; a layer whose keys and values differ in shape (latent attention)
    keeps per-layer pairs instead. No part of it refers back to it (`RowsWritten`)."""

    copied = 0  # bytes copied into it from the kept segments: none

    def __init__(self, layers: int, past: int, fed: Sequence[int]):
        super().__init__()
        self.written = RowsWritten(layers, fed)
        self.layers = [NewTokensLayer(self.written, past, layer) for layer in range(layers)]

    def row(self, b: int) -> torch.Tensor | list[tuple[torch.Tensor, torch.Tensor]]:
        """Row b's keys/values of its fed positions, as a segment holds them."""
        return self.written.rows[b] if self.written.rows is not None else self.written.pairs[b]


@contextmanager
def reading_prefixes(model, prefixes: Sequence[tuple]) -> Iterator[None]:
    """Within: `model`'s attention is `prefix_attention` over `prefixes` (row b's (segment, positions)
    parts, empty for a row with none)."""
    configs = {id(m.config): m.config for m in model.modules() if hasattr(m, "config")}
    saved = {key: config._attn_implementation for key, config in configs.items()}
    token = _rows.set(prefixes)
    try:
        for config in configs.values():
            config._attn_implementation = NAME
        yield
    finally:
        _rows.reset(token)
        for key, config in configs.items():
            config._attn_implementation = saved[key]
