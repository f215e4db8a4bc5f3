"""Transformers scorer (DESIGN §9): float32 on CPU by default, requests batched by padding, and the
KV cache of each trajectory's unchanged prefix reused across the cover's rounds.

For each trajectory key the scorer keeps the keys/values of two fed sequences: the one the cover
currently holds (its base) and the last candidate scored. A new request reuses the one sharing the
longest prefix of token ids with it (compared, never assumed), so after an accepted removal the
candidate becomes the base and after a rejected one the base stays; either way only the suffix from
the removed reasoning on is fed. Keys must be unique within one `score` call.

In a batch, cached prefixes are left-padded to a common length and new tokens right-padded; the
attention mask hides both paddings and position ids are given explicitly, so each row computes what
it would alone (up to float summation order, which `measure_noise` reports).

New tokens are fed in chunks of `chunk_tokens` (chunked prefill). With a cache and padding the
attention runs under an explicit mask, which cannot skip the causal upper triangle: one long chunk
computes (and materializes a mask for) the whole new × new square, chunks only their own small
triangles. On the 20M benchmark model (N = 16, T = 16, batch 16) the cover took 101.7 s unchunked,
87.3 s with chunks of 512, 84.3 s with 256, 81.2 s with 128 and 91.1 s with 64 (per-call overhead).
"""

from __future__ import annotations

from collections.abc import Hashable, Sequence
from dataclasses import dataclass

import numpy as np
import torch

from race_core.policy import pad_token_id
from race_core.render import Rendered, Renderer
from race_core.scoring import ScoreRequest, ScorerStats, batch_noise

MAX_SEQUENCES_PER_KEY = 3


@dataclass
class _Prefix:
    ids: np.ndarray  # the token ids the cached keys/values belong to
    kv: list[tuple[torch.Tensor, torch.Tensor]]  # per layer, [heads, len, dim]


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    mismatch = np.flatnonzero(a[:n] != b[:n])
    return int(mismatch[0]) if mismatch.size else n


def _cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a transformers cache, across cache API versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


class HFScorer:
    """Scores action likelihoods with a transformers causal LM."""

    name = "hf"

    def __init__(self, model, tokenizer, *, batch_size: int = 8, prefix_reuse: bool = True,
                 renderer: Renderer | None = None, max_batch_tokens: int = 65536, chunk_tokens: int = 128):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.renderer = renderer or Renderer(tokenizer)
        self.batch_size = batch_size
        self.prefix_reuse = prefix_reuse
        self.max_batch_tokens = max_batch_tokens
        if chunk_tokens < 0:
            raise ValueError(f"chunk_tokens must be >= 0 (0 = feed all new tokens at once), got {chunk_tokens}")
        self.chunk_tokens = chunk_tokens
        self.device = next(model.parameters()).device
        self.pad_id = pad_token_id(tokenizer)
        self.stats = ScorerStats()
        self.noise: float | None = None
        # Per trajectory key: the base sequence (the trajectory as currently held) and the last
        # scored candidate, each with its keys/values; see `_reusable_length`.
        self._prefixes: dict[Hashable, list[_Prefix]] = {}

    @classmethod
    def from_pretrained(cls, checkpoint: str, *, device: str = "cpu", dtype: str = "float32", **options) -> HFScorer:
        from race_core.policy import load_policy

        model, tokenizer = load_policy(checkpoint, device=device, dtype=dtype)
        return cls(model, tokenizer, **options)

    # -- public -------------------------------------------------------------------------------
    def release(self, keys: Sequence[Hashable] | None = None) -> None:
        if keys is None:
            self._prefixes.clear()
        else:
            for key in keys:
                self._prefixes.pop(key, None)

    @torch.inference_mode()
    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        rendered = [self.renderer.render(r.trajectory) for r in requests]
        reusable = [self._reusable(r, x) for r, x in zip(requests, rendered, strict=True)]
        reuse = [n for _, n in reusable]
        feed = [x.action_spans[r.last_turn][1] - c for r, x, c in zip(requests, rendered, reuse, strict=True)]
        results: list[list[float] | None] = [None] * len(requests)
        order = sorted(range(len(requests)), key=lambda i: feed[i] + reuse[i])
        for batch in self._batches(order, feed, reuse):
            for i, scores in zip(batch, self._score_batch([requests[i] for i in batch],
                                                          [rendered[i] for i in batch],
                                                          [reusable[i] for i in batch]), strict=True):
                results[i] = scores
        self.stats.requests += len(requests)
        return results  # type: ignore[return-value]

    def measure_noise(self, requests: Sequence[ScoreRequest]) -> float:
        """Max |difference| between scoring each request alone (no cache) and all in one batch
        (`batch_noise`); the prefix cache is set aside meanwhile and restored after."""
        saved = (self.batch_size, self.prefix_reuse, self._prefixes)
        try:
            self._prefixes, self.prefix_reuse = {}, False
            self.batch_size = max(len(requests), 1)
            self.noise = batch_noise(self, requests)
        finally:
            self.batch_size, self.prefix_reuse, self._prefixes = saved
        return self.noise

    def close(self) -> None:
        """Drop the prefix cache (the model stays with whoever loaded it)."""
        self.release()

    # -- internals ----------------------------------------------------------------------------
    def _reusable(self, request: ScoreRequest, rendered: Rendered) -> tuple[_Prefix | None, int]:
        """Pick the cached sequence sharing the longest prefix with this request; return how many
        of its leading tokens can be reused (at most up to the token before the first action
        scored, whose hidden state must be computed)."""
        if not self.prefix_reuse:
            return None, 0
        entries = self._prefixes.get(request.key, [])
        best, best_common = None, 0
        for entry in entries:
            common = _common_prefix(entry.ids, rendered.input_ids)
            if common > best_common:
                best, best_common = entry, common
        if best is not None and best_common < len(best.ids):
            # The request diverges from every cached sequence: the best one is the trajectory as
            # the cover holds it now, the others are outdated candidates.
            self._prefixes[request.key] = [best]
        # else it continues `best` (a later part of the same candidate): keep the base as well.
        limit = rendered.action_spans[request.from_turn][0] - 1
        return best, min(best_common, limit)

    def _batches(self, order: list[int], feed: list[int], reuse: list[int]):
        batch: list[int] = []
        for i in order:
            width = max([feed[j] + reuse[j] for j in batch] + [feed[i] + reuse[i]])
            if batch and (len(batch) >= self.batch_size or width * (len(batch) + 1) > self.max_batch_tokens):
                yield batch
                batch = []
            batch.append(i)
        if batch:
            yield batch

    def _score_batch(self, requests: list[ScoreRequest], rendered: list[Rendered],
                     reusable: list[tuple[_Prefix | None, int]]) -> list[list[float]]:
        rows = len(requests)
        reuse = [n for _, n in reusable]
        ends = [x.action_spans[r.last_turn][1] for r, x in zip(requests, rendered, strict=True)]
        past_len = max(reuse)
        new_len = max(e - c for e, c in zip(ends, reuse, strict=True))
        input_ids = torch.full((rows, new_len), self.pad_id, dtype=torch.long)
        attention = torch.zeros((rows, past_len + new_len), dtype=torch.long)
        positions = torch.zeros((rows, new_len), dtype=torch.long)
        for b, (x, c, e) in enumerate(zip(rendered, reuse, ends, strict=True)):
            input_ids[b, : e - c] = torch.from_numpy(x.input_ids[c:e])
            attention[b, past_len - c: past_len + e - c] = 1
            positions[b] = torch.arange(c, c + new_len)
        cache = self._batched_cache(reusable, past_len)
        decoder = self.model.get_decoder()
        # Nothing cached (always so without prefix reuse): only right padding, which no real token
        # attends to under the causal mask, so one call without a padding mask takes SDPA's causal
        # kernel (it skips the upper triangle). Otherwise chunks, which the cache links.
        causal_only = past_len == 0
        step = self.chunk_tokens if self.chunk_tokens and not causal_only else new_len
        hidden_chunks = []
        for s in range(0, new_len, step):
            e = min(s + step, new_len)
            mask = None if causal_only else attention[:, : past_len + e].to(self.device)
            out = decoder(
                input_ids=input_ids[:, s:e].to(self.device), attention_mask=mask,
                position_ids=positions[:, s:e].to(self.device), past_key_values=cache, use_cache=self.prefix_reuse,
            )
            cache = out.past_key_values
            hidden_chunks.append(out.last_hidden_state)
        hidden = hidden_chunks[0] if len(hidden_chunks) == 1 else torch.cat(hidden_chunks, dim=1)

        # Gather the hidden states that predict action tokens, then one lm_head over only those.
        rows_idx, cols_idx, targets, owners = [], [], [], []
        for b, (r, x, c) in enumerate(zip(requests, rendered, reuse, strict=True)):
            for j in range(r.from_turn, r.last_turn + 1):
                start, end = x.action_spans[j]
                rows_idx.extend([b] * (end - start))
                cols_idx.extend(range(start - 1 - c, end - 1 - c))
                targets.extend(x.input_ids[start:end].tolist())
                owners.extend([(b, j)] * (end - start))
        states = hidden[torch.tensor(rows_idx), torch.tensor(cols_idx)]
        logits = self.model.get_output_embeddings()(states).float()
        token_logprobs = torch.log_softmax(logits, dim=-1).gather(
            1, torch.tensor(targets, device=logits.device)[:, None])[:, 0].double().cpu().numpy()
        sums: dict[tuple[int, int], list[float]] = {}
        for owner, lp in zip(owners, token_logprobs, strict=True):
            sums.setdefault(owner, []).append(lp)
        scores = [[float(np.mean(sums[(b, j)])) for j in range(r.from_turn, r.last_turn + 1)]
                  for b, r in enumerate(requests)]

        self.stats.forward_calls += 1
        self.stats.tokens_processed += sum(e - c for e, c in zip(ends, reuse, strict=True))
        self.stats.tokens_reused += sum(reuse)
        if self.prefix_reuse:
            self._keep_prefixes(requests, rendered, reuse, past_len, cache)
        return scores

    def _batched_cache(self, reusable: list[tuple[_Prefix | None, int]], past_len: int):
        """Left-pad each row's reused keys/values to `past_len` and stack them into one cache."""
        from transformers import DynamicCache

        if past_len == 0:
            return DynamicCache() if self.prefix_reuse else None
        template = next(entry for entry, n in reusable if n)
        cache = DynamicCache()
        for layer, (k0, _) in enumerate(template.kv):
            empty = k0.new_zeros((k0.shape[0], 0, k0.shape[2]))
            keys, values = [], []
            for entry, n in reusable:
                k, v = entry.kv[layer] if n else (empty, empty)
                keys.append(torch.nn.functional.pad(k[:, :n], (0, 0, past_len - n, 0)))
                values.append(torch.nn.functional.pad(v[:, :n], (0, 0, past_len - n, 0)))
            cache.update(torch.stack(keys), torch.stack(values), layer)
        return cache

    def _keep_prefixes(self, requests, rendered, reuse, past_len, cache) -> None:
        """Store each row's whole fed sequence (its reused prefix and the new tokens)."""
        layers = _cache_layers(cache)
        for b, (r, x, c) in enumerate(zip(requests, rendered, reuse, strict=True)):
            end = x.action_spans[r.last_turn][1]
            kv = [(k[b, :, past_len - c: past_len + end - c].clone(), v[b, :, past_len - c: past_len + end - c].clone())
                  for k, v in layers]
            ids = x.input_ids[:end].copy()
            kept = [e for e in self._prefixes.get(r.key, []) if _common_prefix(e.ids, ids) < len(e.ids)]
            self._prefixes[r.key] = [*kept[-(MAX_SEQUENCES_PER_KEY - 1):], _Prefix(ids=ids, kv=kv)]
