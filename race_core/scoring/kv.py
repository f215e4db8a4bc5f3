"""The HF scorer's keys/values: the copies it keeps per trajectory key, and the cache a batch reads.

A kept copy (`KVCopy`) holds the keys/values of one fed sequence as a chain of segments: the part it
reused from another copy is that copy's segments (shared, never copied again), the part it fed is a
segment of its own. So keeping a candidate copies only the tokens it fed, and the trajectory it was
cut from keeps serving the prefix they share. Segments are immutable once made, which is what makes
sharing them safe. A reused prefix made of several segments that hold more than `MAX_WASTE` x the
positions it uses (each accepted removal adds a segment of which only a start stays in use) is
compacted: copied into one segment. A prefix of one segment is not: in the cover that segment is
the trajectory's as held, used in full by the copy kept for it.

`KeptCopies` keeps the copies within a byte budget: a segment is counted once, while any kept copy
uses it; to make room the least recently used copy is dropped first, whichever key it has.

Rows fed with their prefixes read in place (`race_core.scoring.attention`) write their new tokens'
keys/values once, each row into a segment of its own (`attention.NewTokensCache`), which is what
is kept: nothing is copied from one cache into another.

`BatchCache` is the cache a batched forward reads on the copying path: every row's reused prefix is copied once,
left-padded, into a buffer as wide as the batch's prefix and new tokens together, and each chunk's
new keys/values are written into it in place (`BatchLayer`; a `DynamicCache` would concatenate the
whole cache again at every chunk). Left-padding positions are zeros: masked, but finite, since a
masked key's value still meets a zero weight in the product. When every layer's keys and values
have one shape (`Packing`, learnt from the model's first forward), the buffer is one tensor for all
layers and a segment one tensor too, so filling a row or keeping its tokens is one copy, not two per
layer: on a CPU shared with other work each copy is a parallel region whose threads wait for each
other, and their number, more than their bytes, is what copying costs.
"""

from __future__ import annotations

from collections import OrderedDict
from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch
from torch.profiler import record_function
from transformers.cache_utils import DynamicCache, DynamicLayer

MAX_WASTE = 2.0  # a reused prefix's segments may hold at most this many times its positions

KV = list[tuple[torch.Tensor, torch.Tensor]]  # per layer (keys, values), each [heads, positions, dim]


@dataclass(frozen=True)
class Packing:
    """Every layer's keys and values are [rows, heads, positions, dim] of this dtype: one tensor
    [layers, 2, rows, heads, positions, dim] can hold them all."""

    layers: int
    heads: int
    dim: int
    dtype: torch.dtype

    @classmethod
    def of(cls, layers: KV) -> Packing | None:
        """The packing of a cache's (keys, values) per layer, or None when their shapes differ."""
        shapes = {(t.shape[1], t.shape[3], t.dtype) for pair in layers for t in pair}
        if len(shapes) != 1:
            return None
        (heads, dim, dtype), = shapes
        return cls(len(layers), heads, dim, dtype)


@dataclass(eq=False)  # compared and hashed by identity: counted once however many copies use it
class Segment:
    """The keys/values of `length` positions: one tensor [layers, 2, heads, positions, dim] when
    packed, else per layer (keys, values)."""

    data: torch.Tensor | KV
    length: int  # positions
    nbytes: int  # of all its tensors

    def layer(self, index: int) -> tuple[torch.Tensor, torch.Tensor]:
        if isinstance(self.data, torch.Tensor):
            return self.data[index, 0], self.data[index, 1]
        return self.data[index]


@dataclass(eq=False)
class KVCopy:
    """The keys/values of the token ids `ids`: `parts` (segment, positions used from its start) in order."""

    ids: np.ndarray
    parts: tuple[tuple[Segment, int], ...]

    def prefix_parts(self, positions: int) -> tuple[tuple[Segment, int], ...]:
        """The parts that hold this copy's first `positions` positions."""
        out, left = [], positions
        for segment, used in self.parts:
            if left <= 0:
                break
            out.append((segment, min(used, left)))
            left -= used
        return tuple(out)

    @property
    def nbytes(self) -> int:
        """Bytes of the segments it uses (shared ones included)."""
        return sum(segment.nbytes for segment in {s for s, _ in self.parts})


def compacted(parts: tuple[tuple[Segment, int], ...]) -> tuple[tuple[Segment, int], ...]:
    """`parts` (a reused prefix) copied into one segment when there are several and their segments
    hold over MAX_WASTE x the positions used."""
    used = sum(n for _, n in parts)
    if len(parts) < 2 or sum(s.length for s in {s for s, _ in parts}) <= MAX_WASTE * used:
        return parts
    if all(isinstance(s.data, torch.Tensor) for s, _ in parts):
        data: torch.Tensor | KV = torch.cat([s.data[:, :, :, :n] for s, n in parts], dim=3)
        nbytes = data.nbytes
    else:
        layers = len(parts[0][0].data)
        data = [tuple(torch.cat([s.layer(layer)[kind][:, :n] for s, n in parts], dim=1) for kind in (0, 1))
                for layer in range(layers)]
        nbytes = sum(t.nbytes for pair in data for t in pair)
    return ((Segment(data, used, nbytes), used),)


class KeptCopies:
    """The KV copies kept per trajectory key, within `budget` bytes (None: no bound). To make room,
    the copy least recently used (stored or reused) is dropped first, whichever key it has."""

    def __init__(self, budget: int | None):
        self.budget = budget
        self.held = 0  # bytes of the segments the kept copies use
        self._by_key: dict[Hashable, list[KVCopy]] = {}
        self._use_order: OrderedDict[KVCopy, Hashable] = OrderedDict()  # least recently used first
        self._users: dict[Segment, int] = {}  # kept copies using each segment

    def get(self, key: Hashable) -> list[KVCopy]:
        return list(self._by_key.get(key, ()))

    def used(self, copy: KVCopy) -> None:
        self._use_order.move_to_end(copy)

    def put(self, key: Hashable, copies: list[KVCopy]) -> None:
        """Make `copies` the ones kept for `key`: the others of `key` are dropped, new ones counted."""
        for copy in self._by_key.pop(key, ()):
            if copy not in copies:
                self._forget(copy)
        for copy in copies:
            if copy not in self._use_order:
                self._use_order[copy] = key
                for segment in {s for s, _ in copy.parts}:
                    self._users[segment] = self._users.get(segment, 0) + 1
                    self.held += segment.nbytes if self._users[segment] == 1 else 0
        if copies:
            self._by_key[key] = list(copies)

    def new_bytes(self, copy: KVCopy) -> int:
        """Bytes keeping `copy` would add: its segments no kept copy uses yet."""
        return sum(s.nbytes for s in {s for s, _ in copy.parts} if s not in self._users)

    def make_room(self, copy: KVCopy) -> tuple[bool, int]:
        """Drop least recently used copies until `copy` fits the budget: (whether it fits, how many
        copies were dropped). A copy larger than the whole budget drops nothing and does not fit."""
        if self.budget is None:
            return True, 0
        if copy.nbytes > self.budget:
            return False, 0
        dropped = 0
        while self.held + self.new_bytes(copy) > self.budget:
            oldest, key = next(iter(self._use_order.items()))
            self._by_key[key].remove(oldest)
            if not self._by_key[key]:
                del self._by_key[key]
            self._forget(oldest)
            dropped += 1
        return True, dropped

    def release(self, keys: Sequence[Hashable] | None) -> None:
        for key in list(self._by_key) if keys is None else keys:
            self.put(key, [])

    def segments(self) -> set[Segment]:
        """The segments the kept copies use (each once)."""
        return set(self._users)

    def _forget(self, copy: KVCopy) -> None:
        del self._use_order[copy]
        for segment in {s for s, _ in copy.parts}:
            self._users[segment] -= 1
            if not self._users[segment]:
                del self._users[segment]
                self.held -= segment.nbytes


class BatchLayer(DynamicLayer):
    """One layer of a `BatchCache`: `past` positions of left-padded reused prefixes, then room for
    `width - past` fed positions. Packed, its buffers are views of the cache's one buffer, filled
    already; else they are made at the first `update`, when the layer's shapes are known, and
    filled from `prefixes` (row b's parts)."""

    def __init__(self, layer: int, prefixes: Sequence[tuple[tuple[Segment, int], ...]], past: int, width: int,
                 keys: torch.Tensor | None = None, values: torch.Tensor | None = None):
        super().__init__()
        self.layer, self.prefixes, self.past, self.width = layer, prefixes, past, width
        self.length = past
        self.copied = 0  # bytes copied into the buffers from the segments
        if keys is not None:
            self.keys, self.values = keys, values
            self.dtype, self.device = keys.dtype, keys.device
            self.is_initialized = True

    def lazy_initialization(self, key_states: torch.Tensor, value_states: torch.Tensor) -> None:
        with record_function("hf.kv_fill"):
            self.dtype, self.device = key_states.dtype, key_states.device
            rows = key_states.shape[0]
            self.keys = key_states.new_empty((rows, key_states.shape[1], self.width, key_states.shape[3]))
            self.values = value_states.new_empty((rows, value_states.shape[1], self.width, value_states.shape[3]))
            for b, parts in enumerate(self.prefixes):
                at = self.past - sum(n for _, n in parts)
                self.keys[b, :, :at].zero_()
                self.values[b, :, :at].zero_()
                for segment, n in parts:
                    k, v = segment.layer(self.layer)
                    self.keys[b, :, at:at + n].copy_(k[:, :n])
                    self.values[b, :, at:at + n].copy_(v[:, :n])
                    self.copied += k[:, :n].nbytes + v[:, :n].nbytes
                    at += n
            self.is_initialized = True

    def update(self, key_states: torch.Tensor, value_states: torch.Tensor, *args, **kwargs
               ) -> tuple[torch.Tensor, torch.Tensor]:
        if not self.is_initialized:
            self.lazy_initialization(key_states, value_states)
        end = self.length + key_states.shape[-2]
        self.keys[:, :, self.length:end].copy_(key_states)
        self.values[:, :, self.length:end].copy_(value_states)
        self.length = end
        return self.keys[:, :, :end], self.values[:, :, :end]

    def get_seq_length(self) -> int:
        return self.length

    def get_max_length(self) -> int:
        return self.width


class BatchCache(DynamicCache):
    """The cache a batch reads (see the module docstring): `layers` `BatchLayer`s over the rows'
    reused `prefixes` (row b's parts), left-padded to `past` positions, with room up to `width`.
    With a `packing`, one buffer [layers, 2, rows, heads, width, dim] (`buffer`), filled here."""

    def __init__(self, layers: int, prefixes: Sequence[tuple[tuple[Segment, int], ...]], past: int, width: int,
                 packing: Packing | None, device: torch.device):
        super().__init__()
        self.buffer: torch.Tensor | None = None
        if packing is None or packing.layers != layers:
            self.layers = [BatchLayer(layer, prefixes, past, width) for layer in range(layers)]
            return
        with record_function("hf.kv_fill"):
            buffer = torch.empty((layers, 2, len(prefixes), packing.heads, width, packing.dim), dtype=packing.dtype,
                                 device=device)
            copied = 0
            for b, parts in enumerate(prefixes):
                at = past - sum(n for _, n in parts)
                if at:
                    buffer[:, :, b, :, :at].zero_()
                for segment, n in parts:
                    if isinstance(segment.data, torch.Tensor):
                        buffer[:, :, b, :, at:at + n].copy_(segment.data[:, :, :, :n])
                    else:
                        for layer in range(layers):
                            for kind, t in enumerate(segment.layer(layer)):
                                buffer[layer, kind, b, :, at:at + n].copy_(t[:, :n])
                    copied += n * segment.nbytes // segment.length
                    at += n
        self.buffer = buffer
        self.layers = [BatchLayer(layer, prefixes, past, width, buffer[layer, 0], buffer[layer, 1])
                       for layer in range(layers)]
        self.layers[0].copied = copied

    @property
    def copied(self) -> int:
        """Bytes copied into the buffers from the segments."""
        return sum(layer.copied for layer in self.layers)
