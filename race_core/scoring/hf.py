"""Transformers scorer (docs/architecture.md §9): float32 on CPU by default, requests batched by padding, and the
KV cache of each trajectory's unchanged prefix reused across the cover's rounds.

For each trajectory key the scorer keeps the keys/values of two fed sequences: the one the cover
currently holds (its base) and the last candidate scored. A new request reuses the one sharing the
longest prefix of token ids with it (compared, never assumed), so after an accepted removal the
candidate becomes the base and after a rejected one the base stays; either way only the suffix from
the removed reasoning on is fed. Keys must be unique within one `score` call. A kept candidate
shares the segments of the prefix it reused and copies only the tokens it fed
(`race_core.scoring.kv`).

Those copies are the one part of the scorer's memory that grows with the work given to it, so they
are kept within a byte budget (`kv_budget`; 0: `race_core.memory.automatic_kv_budget`, half of
what the device has free once the model is loaded). A segment is counted at the bytes of its
tensors, once however many copies share it; `kv_bytes_per_token` is the same figure per token from
the model's config, for planning. When a new copy would pass the budget, the least recently used
copies are dropped first (`KeptCopies`); one larger than the whole budget is not kept. A dropped
copy costs time only: the next request of its key reuses a shorter prefix or none and feeds the
rest, so the scores differ by float noise alone and the decisions stay the same. Not counted: the
cache a batch builds from its copies and its activations while it runs (bounded by `batch_size` and
`max_batch_tokens`).

Where the model's attention is plain softmax attention on a CPU (`attention.supported`, and the
probe below agrees), each row's prefix is read where it is kept (`attention.prefix_attention`): a
batch's new tokens are fed in one call with the causal kernel and each row's queries attend to its
own prefix segments in place, the two parts merged by their log-sum-exps; no prefix is copied, no
mask built, and each row's fed keys/values are written once into a tensor of its own, which is what
is kept (`attention.NewTokensCache`). Elsewhere (`prefix_in_place=False`,
a GPU, sliding windows, soft-capping), the copying path below.

In a batch of the copying path, cached prefixes are left-padded to a common length and new tokens
right-padded; the attention mask hides both paddings and position ids are given explicitly, so each
row computes what it would alone (up to float summation order, which `measure_noise` reports). Padding shifts a row's
queries and keys by the same offset, so a sliding window, which the model's mask applies to index
distances, still spans the same tokens. The batch's cache (`kv.BatchCache`) keeps every
position of every layer: a `DynamicCache` built from the config keeps only the last
`sliding_window - 1` positions of sliding-window layers (Mistral, Qwen2, Gemma2/3, Cohere2), so a
reused prefix would lose its start; `_keep_prefixes` checks that no layer did.

The model's own forward computes logits from the decoder's last hidden states for every position;
the scorer runs the decoder alone and the head only on the states that predict action tokens, with
the post-decoder step of the architecture (`head_logits`: Gemma's soft-capping, Cohere's and
Granite's logit scales). Each model is checked once against its own forward
(`verify_against_forward`), so an architecture whose forward does something else is refused instead
of scored wrong.

On the copying path, new tokens are fed in chunks of `chunk_tokens` (chunked prefill) when a prefix is cached. With a
cache and padding the attention runs under an explicit mask, which cannot skip the causal upper
triangle: one long chunk computes (and materializes a mask for) the whole new x new square, chunks
only their own small squares, at one call of the model each. A batch with nothing cached is fed in
one call without a padding mask (its padding is all on the right), which takes the causal kernel.

A batch computes every row over its longest fed length and attends over its longest prefix, so the
rows of a `score` call are cut into batches by what each forward costs on the device: padded
positions, attention pairs and a fixed price per call of the model (`race_core.scoring.plan`; the
price on a CPU is its class's from a table of measured prices, `race_core.scoring.prices`; an
accelerator's is one figure; `forward_overhead="measure"` measures it now, once per model, and a
number gives it). The scorer counts its
work (`ScorerStats`, a `WorkCounters`): forwards, rows, fed and padded positions, attention pairs,
mask and KV bytes, evictions.
"""

from __future__ import annotations

import weakref
from collections.abc import Callable, Hashable, Sequence
from dataclasses import dataclass, replace

import numpy as np
import torch
from torch.profiler import record_function

from race_core.memory import automatic_kv_budget, keep_freed_memory
from race_core.policy import pad_token_id
from race_core.render import Rendered, Renderer
from race_core.scoring import ScoreRequest, ScorerStats, batch_noise
from race_core.scoring import attention as in_place
from race_core.scoring.kv import BatchCache, KeptCopies, KVCopy, Packing, Segment, compacted
from race_core.scoring.plan import (
    ACCELERATOR_OVERHEAD,
    ForwardCost,
    attention_weight,
    measure_overhead,
    plan_batches,
)
from race_core.scoring.prices import cpu_overhead

MAX_SEQUENCES_PER_KEY = 3


def _lm_head(model, hidden_states: torch.Tensor) -> torch.Tensor:
    return model.get_output_embeddings()(hidden_states)


def _softcapped(model, hidden_states: torch.Tensor) -> torch.Tensor:
    logits, cap = _lm_head(model, hidden_states), model.config.get_text_config().final_logit_softcapping
    return logits if cap is None else torch.tanh(logits / cap) * cap


# How `ForCausalLM.forward` turns the decoder's last hidden states into logits, by `config.model_type`,
# where it is more than the output embedding: as written in transformers 5.19's modeling files
# (Gemma3's multimodal model, "gemma3", applies no soft-capping there).
HEADS: dict[str, Callable[[torch.nn.Module, torch.Tensor], torch.Tensor]] = {
    **dict.fromkeys(("gemma2", "gemma3_text", "gemma3n", "gemma3n_text", "gemma4", "gemma4_text",
                     "vaultgemma", "nanochat"), _softcapped),
    **dict.fromkeys(("cohere", "cohere2", "cohere2_moe"), lambda model, h: _lm_head(model, h) * model.logit_scale),
    **dict.fromkeys(("granite", "granitemoe", "granitemoeshared", "granitemoehybrid", "granite_swa",
                     "granitemoe_swa"), lambda model, h: _lm_head(model, h) / model.config.logits_scaling),
    "hyperclovax": lambda model, h: _lm_head(model, h) * model.config.logits_scaling,
    "minicpm3": lambda model, h: _lm_head(model, h / model.config.logits_scaling),
}


def head_logits(model, hidden_states: torch.Tensor) -> torch.Tensor:
    """The logits `model.forward` computes from these last hidden states of its decoder (`HEADS`)."""
    return HEADS.get(model.config.model_type, _lm_head)(model, hidden_states)


# The probe (`HFScorer.verify_against_forward`) allows, per token log-prob: for `head_logits` against
# the forward's own head, which compute the same operations, PROBE_TOLERANCE; for the scorer's cached,
# padded and batched path, float noise, which grows with the rounding of the logits: measured
# 0.2-5 x eps x max|logit| (tiny model and SmolLM2-135M in float32, bfloat16, float16; SmolLM2 in
# float32: 2.0e-5, when its own float32 forward is 8e-5 from float64). So the bound is
# NOISE_FACTOR x eps x max|logit|, and never below PROBE_TOLERANCE.
PROBE_TOLERANCE = 1e-5
NOISE_FACTOR = 32
_verified: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # model -> {in place: what its probe measured}


def kv_bytes_per_token(model) -> int:
    """Bytes of keys and values one token takes in the model's cache, from its config: layers x 2 x
    key/value heads x head size x the bytes of its dtype (latent-attention models, whose keys and
    values differ in size, are only approximated; the budget itself counts the tensors)."""
    config = model.config.get_text_config()
    kv_heads = getattr(config, "num_key_value_heads", None) or config.num_attention_heads
    head_dim = getattr(config, "head_dim", None) or config.hidden_size // config.num_attention_heads
    return config.num_hidden_layers * 2 * kv_heads * head_dim * next(model.parameters()).element_size()


@dataclass
class _Row:
    """One sequence of a forward batch: `ids[:reused]` come from `prefix`'s cache, the rest is fed;
    the log-probs of the tokens at `targets` (positions > `reused`) are returned."""

    key: Hashable
    ids: np.ndarray
    prefix: KVCopy | None
    reused: int
    targets: np.ndarray

    @property
    def fed(self) -> int:
        """Tokens this row feeds: those after its reused prefix."""
        return len(self.ids) - self.reused


def _common_prefix(a: np.ndarray, b: np.ndarray) -> int:
    n = min(len(a), len(b))
    mismatch = np.flatnonzero(a[:n] != b[:n])
    return int(mismatch[0]) if mismatch.size else n


def _batch_cache(layers: int, rows: list[_Row], past: int, width: int, packing: Packing | None, device):
    """The cache a batch reads (`kv.BatchCache`): per layer, the rows' reused prefixes left-padded to
    `past` positions, then room for `width - past` fed ones; every layer keeps all positions."""
    prefixes = [row.prefix.prefix_parts(row.reused) if row.reused else () for row in rows]
    return BatchCache(layers, prefixes, past, width, packing, device)


def _cache_layers(cache) -> list[tuple[torch.Tensor, torch.Tensor]]:
    """(keys, values) per layer of a transformers cache, across cache API versions."""
    if hasattr(cache, "layers"):
        return [(layer.keys, layer.values) for layer in cache.layers]
    return list(zip(cache.key_cache, cache.value_cache, strict=True))


class HFScorer:
    """Scores action likelihoods with a transformers causal LM."""

    name = "hf"

    def __init__(self, model, tokenizer, *, batch_size: int = 8, prefix_reuse: bool = True,
                 renderer: Renderer | None = None, max_batch_tokens: int = 65536, chunk_tokens: int = 128,
                 kv_budget: int = 0, forward_overhead: float | str | None = None,
                 prefix_in_place: bool | None = None):
        self.model = model.eval()
        self.tokenizer = tokenizer
        self.renderer = renderer or Renderer(tokenizer)
        self.batch_size = batch_size
        self.prefix_reuse = prefix_reuse
        self.max_batch_tokens = max_batch_tokens
        if chunk_tokens < 0:
            raise ValueError(f"chunk_tokens must be >= 0 (0 = feed all new tokens at once), got {chunk_tokens}")
        self.chunk_tokens = chunk_tokens
        if forward_overhead is not None and forward_overhead != "measure" and not (
                isinstance(forward_overhead, int | float) and forward_overhead >= 0):
            raise ValueError(f"forward_overhead must be >= 0 positions, 'measure' or None (the device's default), "
                             f"got {forward_overhead!r}")
        self.device = next(model.parameters()).device
        # a model built by the caller, not load_policy, gets it too (memory.py); None: not a CPU
        freed_memory_kept = keep_freed_memory() if self.device.type == "cpu" else None
        self.pad_id = pad_token_id(tokenizer)
        # The Scorer's context limit: the positions the model was built for (None: not stated).
        self.max_length: int | None = getattr(model.config.get_text_config(), "max_position_embeddings", None)
        if kv_budget < 0:
            raise ValueError(f"kv_budget must be >= 0 bytes (0 = automatic), got {kv_budget}")
        self.kv_budget = kv_budget or automatic_kv_budget(str(self.device))
        self.kv_bytes_per_token = kv_bytes_per_token(model)
        self.stats = ScorerStats()
        self.noise: float | None = None
        # Per trajectory key: the base sequence (the trajectory as currently held) and the last
        # scored candidate, each with its keys/values; see `_reusable`.
        self._prefixes = KeptCopies(self.kv_budget)
        self._one_batch = False  # measure_noise: every row in one forward
        self._packing: Packing | None = None  # learnt from the first forward's cache (kv.Packing)
        # What a forward costs (plan.py): the price of a call of the model: given, measured now (once
        # per model object), or by default the table's price for this CPU's class (`prices`) and an
        # accelerator's one figure.
        measured = forward_overhead == "measure"
        if measured:
            overhead, source = measure_overhead(model), "measured"
        elif forward_overhead is not None:
            overhead, source = float(forward_overhead), "given"
        elif self.device.type == "cpu":
            overhead, source = cpu_overhead(model)
        else:
            overhead, source = ACCELERATOR_OVERHEAD, "device type"
        # Prefixes read where they are kept (`attention`), where the model's attention allows it and
        # its probe agrees; else copied into each batch's cache.
        self.in_place = bool(prefix_reuse and (in_place.supported(model) if prefix_in_place is None else prefix_in_place))
        self.cost = ForwardCost(overhead=overhead, attention=attention_weight(model.config), chunk_tokens=chunk_tokens,
                                in_place=self.in_place)
        probes = _verified.setdefault(model, {})  # in place or not -> what the probe measured
        if self.in_place not in probes:
            try:
                probes[self.in_place] = self.verify_against_forward()
            except ValueError:
                if not self.in_place or prefix_in_place:
                    raise
                self.in_place = False  # the copying path, probed on its own
                self.cost = replace(self.cost, in_place=False)
                probes[False] = probes.get(False) or self.verify_against_forward()
        self.stats.extra["probe"] = dict(probes[self.in_place])
        self.stats.extra["prefix_in_place"] = self.in_place
        self.stats.extra.update(freed_memory_kept=freed_memory_kept,
                                kv_budget=self.kv_budget, kv_bytes_per_token=self.kv_bytes_per_token,
                                forward_overhead=overhead, overhead_measured=measured, overhead_source=source)

    @classmethod
    def from_pretrained(cls, checkpoint: str, *, device: str = "cpu", dtype: str = "float32", **options) -> HFScorer:
        from race_core.policy import load_policy

        model, tokenizer = load_policy(checkpoint, device=device, dtype=dtype)
        return cls(model, tokenizer, **options)

    # -- public -------------------------------------------------------------------------------
    @property
    def kv_bytes_held(self) -> int:
        """Bytes of the KV-prefix copies kept now (at most `kv_budget`)."""
        return self._prefixes.held

    def release(self, keys: Sequence[Hashable] | None = None) -> None:
        self._prefixes.release(keys)

    @torch.inference_mode()
    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        with record_function("hf.rows"):
            rendered = [self.renderer.render(r.trajectory) for r in requests]
            spans = [x.action_spans[r.from_turn: r.last_turn + 1] for r, x in zip(requests, rendered, strict=True)]
            rows = [self._row(r.key, x, s) for r, x, s in zip(requests, rendered, spans, strict=True)]
        with record_function("hf.plan"):
            plan = self._plan_batches(rows)
        results: list[list[float] | None] = [None] * len(requests)
        for batch in plan:
            for i, logprobs in zip(batch, self._token_logprobs([rows[i] for i in batch]), strict=True):
                per_turn = np.split(logprobs, np.cumsum([end - start for start, end in spans[i]])[:-1])
                results[i] = [float(np.mean(lp)) for lp in per_turn]
        self.stats.requests += len(requests)
        return results  # type: ignore[return-value]

    def measure_noise(self, requests: Sequence[ScoreRequest]) -> float:
        """Max |difference| between scoring each request alone (no cache) and all in one batch
        (`batch_noise`); the prefix cache is set aside meanwhile and restored after."""
        saved = (self.prefix_reuse, self._prefixes)
        try:
            self._prefixes, self.prefix_reuse, self._one_batch = KeptCopies(None), False, True
            self.noise = batch_noise(self, requests)
        finally:
            (self.prefix_reuse, self._prefixes), self._one_batch = saved, False
        return self.noise

    @torch.inference_mode()
    def verify_against_forward(self) -> dict[str, float]:
        """Check the scorer against the model's own forward on a short probe of random ids, token by
        token against `log_softmax(model(input_ids).logits)`: `head_logits` on the decoder's hidden
        states (`head`, within PROBE_TOLERANCE), and the scorer on two rows of different lengths in
        one batch, then on continuations of both that reuse their cached prefixes, prefix reuse on
        whatever the scorer's setting (`scored`, within `tolerance`: see NOISE_FACTOR). Returns the
        max |differences|; raises ValueError naming the architecture when one exceeds its bound.
        Run once per model object when a scorer is built (seven forwards of at most 40 tokens)."""
        architecture = f"model_type {getattr(self.model.config, 'model_type', '?')!r} ({type(self.model).__name__})"
        rng = np.random.default_rng(0)
        vocab = self.model.get_input_embeddings().weight.shape[0]
        firsts = [rng.integers(0, vocab, n) for n in (40, 28)]
        seconds = [np.concatenate([ids[:split], rng.integers(0, vocab, extra)])
                   for ids, split, extra in zip(firsts, (24, 10), (13, 19), strict=True)]
        saved = (self.prefix_reuse, self._prefixes, self.stats)
        self.prefix_reuse, self._prefixes, self.stats = True, KeptCopies(None), ScorerStats()
        measured = {"head": 0.0, "scored": 0.0}
        max_logit = 0.0
        try:
            for sequences, starts in ((firsts, (1, 1)), (seconds, (24, 10))):
                rows = [_Row(key, ids, *self._reusable(key, ids, start - 1), np.arange(start, len(ids)))
                        for key, ids, start in zip(("probe-0", "probe-1"), sequences, starts, strict=True)]
                for row, got in zip(rows, self._token_logprobs(rows), strict=True):
                    ids = torch.as_tensor(row.ids, device=self.device)[None]
                    logits = self.model(ids, use_cache=False).logits[0]
                    own = torch.log_softmax(logits.double(), -1)
                    if row.key == "probe-0" and row.prefix is None:
                        hidden = self.model.get_decoder()(input_ids=ids, use_cache=False).last_hidden_state[0]
                        ours = torch.log_softmax(head_logits(self.model, hidden).double(), -1)
                        measured["head"] = float((ours - own).abs().max())
                    scored = np.abs(got - own[row.targets - 1, row.ids[row.targets]].cpu().numpy())
                    measured["scored"] = max(measured["scored"], float(np.max(scored)))
                    max_logit = max(max_logit, float(logits.abs().max()))
        except Exception as exc:
            raise ValueError(f"HFScorer cannot score {architecture}: checking it against its own forward failed "
                             f"({type(exc).__name__}: {exc}). The scorer runs the decoder alone over a cache of "
                             f"per-position keys and values (no recurrent or linear-attention layers) and "
                             f"race_core.scoring.hf.head_logits on its hidden states.") from exc
        finally:
            self.prefix_reuse, self._prefixes, self.stats = saved
        eps = torch.finfo(next(self.model.parameters()).dtype).eps
        measured["tolerance"] = max(PROBE_TOLERANCE, NOISE_FACTOR * eps * max_logit)
        if not measured["head"] <= PROBE_TOLERANCE:
            raise ValueError(
                f"HFScorer refuses {architecture}: its forward turns the decoder's hidden states into logits "
                f"differently from race_core.scoring.hf.head_logits (log-probs differ by up to "
                f"{measured['head']:.3g}, tolerance {PROBE_TOLERANCE:g}), so its scores would be silently wrong; "
                f"model types whose head transform is known: {', '.join(sorted(HEADS))}.")
        if not measured["scored"] <= measured["tolerance"]:
            raise ValueError(
                f"HFScorer refuses {architecture}: with its cache, padding and position ids the scorer's token "
                f"log-probs differ from the model's own forward by up to {measured['scored']:.3g} (tolerance "
                f"{measured['tolerance']:.3g}) on a 2-row probe with prefix reuse, so its scores would be wrong.")
        return measured

    def close(self) -> None:
        """Drop the prefix cache (the model stays with whoever loaded it)."""
        self.release()

    # -- internals ----------------------------------------------------------------------------
    def _row(self, key: Hashable, rendered: Rendered, spans: list[tuple[int, int]]) -> _Row:
        """The row that scores the action tokens of `spans`: the ids up to the last one, fed after
        what the cache of `key` can give."""
        ids = rendered.input_ids[: spans[-1][1]]
        prefix, reused = self._reusable(key, ids, spans[0][0] - 1)
        return _Row(key, ids, prefix, reused, np.concatenate([np.arange(a, b) for a, b in spans]))

    def _reusable(self, key: Hashable, ids: np.ndarray, limit: int) -> tuple[KVCopy | None, int]:
        """Pick the cached sequence sharing the longest prefix with `ids`; return how many of its
        leading tokens can be reused (at most `limit`: the token before the first one scored, whose
        hidden state must be computed)."""
        if not self.prefix_reuse:
            return None, 0
        best, best_common = None, 0
        for entry in self._prefixes.get(key):
            common = _common_prefix(entry.ids, ids)
            if common > best_common:
                best, best_common = entry, common
        if best is None:
            return None, 0
        if best_common < len(best.ids):
            # The request diverges from every cached sequence: the best one is the trajectory as
            # the cover holds it now, the others are outdated candidates.
            self._prefixes.put(key, [best])
        # else it continues `best` (a later part of the same candidate): keep the base as well.
        self._prefixes.used(best)
        return best, min(best_common, limit)

    def _plan_batches(self, rows: list[_Row]) -> list[list[int]]:
        """The forward batches of `rows` (indices), of least total cost on the device
        (`plan.plan_batches`); all of them in one batch while the noise is measured."""
        if self._one_batch:
            return [list(range(len(rows)))] if rows else []
        return plan_batches([row.fed for row in rows], [row.reused for row in rows], self.cost,
                            self.batch_size, self.max_batch_tokens)

    def _token_logprobs(self, rows: list[_Row]) -> list[np.ndarray]:
        """One batched forward of the rows' new tokens over their cached prefixes: for each row,
        the log-probs of its tokens at `targets`. Its steps are named for `torch.profiler`
        (`hf.forward rows=.. prefix=.. fed=..`, within it `hf.kv_fill`, `hf.decoder`, `hf.head`,
        `hf.keep`), which `bench.profile` reads."""
        past_len = max(row.reused for row in rows)
        new_len = max(row.fed for row in rows)
        with record_function(f"hf.forward rows={len(rows)} prefix={past_len} fed={new_len}"):
            hidden, cache = self._decode(rows, past_len, new_len)
            with record_function("hf.head"):
                # Gather the hidden states that predict target tokens, then one head over only those.
                rows_idx = np.concatenate([np.full(len(row.targets), b) for b, row in enumerate(rows)])
                cols_idx = np.concatenate([row.targets - 1 - row.reused for row in rows])
                targets = torch.from_numpy(np.concatenate([row.ids[row.targets] for row in rows])).to(self.device)
                logits = head_logits(self.model, hidden[torch.from_numpy(rows_idx), torch.from_numpy(cols_idx)])
                token_logprobs = torch.log_softmax(logits.float(), dim=-1).gather(1, targets[:, None])[:, 0]
                token_logprobs = token_logprobs.double().cpu().numpy()
            stats = self.stats
            stats.forward_calls += 1
            stats.rows += len(rows)
            stats.tokens_processed += sum(row.fed for row in rows)
            stats.padded_positions += len(rows) * new_len
            stats.tokens_reused += sum(row.reused for row in rows)
            stats.attention_pairs += self.cost.pairs(len(rows), past_len, new_len, sum(row.reused for row in rows))
            if self.prefix_reuse:
                stats.kv_bytes_copied += getattr(cache, "copied", 0)
                start = 0 if isinstance(cache, in_place.NewTokensCache) else past_len  # where the fed positions begin
                with record_function("hf.keep"):
                    self._keep_prefixes(rows, start, start + new_len, cache)
        return np.split(token_logprobs, np.cumsum([len(row.targets) for row in rows])[:-1])

    def _decode(self, rows: list[_Row], past_len: int, new_len: int) -> tuple[torch.Tensor, object]:
        """The decoder's last hidden states of the rows' fed positions (right-padded to `new_len`) over
        their reused prefixes (left-padded to `past_len`), and the batch's cache (None without reuse)."""
        input_ids = torch.full((len(rows), new_len), self.pad_id, dtype=torch.long)
        attention = torch.zeros((len(rows), past_len + new_len), dtype=torch.long)
        positions = torch.zeros((len(rows), new_len), dtype=torch.long)
        for b, row in enumerate(rows):
            input_ids[b, :row.fed] = torch.from_numpy(row.ids[row.reused:])
            attention[b, past_len - row.reused: past_len + row.fed] = 1
            positions[b] = torch.arange(row.reused, row.reused + new_len)
        layers = self.model.config.get_text_config().num_hidden_layers
        decoder = self.model.get_decoder()
        if self.in_place:
            return self._decode_in_place(decoder, rows, input_ids, positions, layers, past_len)
        cache = (_batch_cache(layers, rows, past_len, past_len + new_len, self._packing, self.device)
                 if self.prefix_reuse else None)
        # Nothing cached (always so without prefix reuse): only right padding, which no real token
        # attends to under the causal mask, so one call without a padding mask takes SDPA's causal
        # kernel (it skips the upper triangle). Otherwise chunks, which the cache links.
        causal_only = past_len == 0
        step = self.chunk_tokens if self.chunk_tokens and not causal_only else new_len
        hidden_chunks = []
        for s in range(0, new_len, step):
            e = min(s + step, new_len)
            mask = None if causal_only else attention[:, : past_len + e].to(self.device)
            with record_function("hf.decoder"):
                out = decoder(input_ids=input_ids[:, s:e].to(self.device), attention_mask=mask,
                              position_ids=positions[:, s:e].to(self.device), past_key_values=cache,
                              use_cache=self.prefix_reuse)
            cache = out.past_key_values
            hidden_chunks.append(out.last_hidden_state)
            self.stats.decoder_calls += 1
            self.stats.mask_bytes += 0 if mask is None else len(rows) * (e - s) * (past_len + e)
        return (hidden_chunks[0] if len(hidden_chunks) == 1 else torch.cat(hidden_chunks, dim=1)), cache

    def _decode_in_place(self, decoder, rows: list[_Row], input_ids: torch.Tensor, positions: torch.Tensor,
                         layers: int, past_len: int) -> tuple[torch.Tensor, object]:
        """`_decode` with each row's prefix read where it is kept (`attention.prefix_attention`): one
        call of the decoder, no mask, no copy of a prefix; the cache holds the new tokens' keys/values."""
        prefixes = [row.prefix.prefix_parts(row.reused) if row.reused else () for row in rows]
        cache = in_place.NewTokensCache(layers, past_len, [row.fed for row in rows])
        with record_function("hf.decoder"), in_place.reading_prefixes(self.model, prefixes):
            out = decoder(input_ids=input_ids.to(self.device), attention_mask=None,
                          position_ids=positions.to(self.device), past_key_values=cache, use_cache=True)
        self.stats.decoder_calls += 1
        return out.last_hidden_state, cache

    def _keep_prefixes(self, rows: list[_Row], past_len: int, width: int, cache) -> None:
        """Keep each row's whole fed sequence (the reused prefix's segments and a segment of the
        new tokens), within the KV budget: the sequences it continues are dropped first, then the
        least recently used copies."""
        layers = _cache_layers(cache)
        kept_lengths = {k.shape[-2] for k, _ in layers}
        if kept_lengths != {width}:
            raise RuntimeError(f"the model's cache kept {sorted(kept_lengths)} positions per layer, not all "
                               f"{width} fed: a truncating (sliding-window) cache cannot be reused")
        self._packing = self._packing or Packing.of(layers)
        buffer = getattr(cache, "buffer", None)  # packed: [layers, 2, rows, heads, width, dim]
        written = cache if isinstance(cache, in_place.NewTokensCache) else None  # rows written where they are kept
        # bytes per position of one row's copy (keys and values differ in size under latent attention)
        position_bytes = sum(t.shape[1] * t.shape[3] * t.element_size() for layer in layers for t in layer)
        for b, row in enumerate(rows):
            kept = [e for e in self._prefixes.get(row.key) if _common_prefix(e.ids, row.ids) < len(e.ids)]
            self._prefixes.put(row.key, kept[-(MAX_SEQUENCES_PER_KEY - 1):])
            reused = compacted(row.prefix.prefix_parts(row.reused)) if row.reused else ()
            own = Segment([], row.fed, row.fed * position_bytes)  # its tensors are set once it fits
            copy = KVCopy(ids=row.ids.copy(), parts=(*reused, (own, row.fed)))
            fits, dropped = self._prefixes.make_room(copy)
            self.stats.evictions += dropped + int(not fits)
            if fits:
                fed = slice(past_len, past_len + row.fed)
                if written is not None:
                    own.data = written.row(b)
                else:
                    own.data = (buffer[:, :, b, :, fed].clone() if buffer is not None
                                else [(k[b, :, fed].clone(), v[b, :, fed].clone()) for k, v in layers])
                    self.stats.kv_bytes_copied += own.nbytes
                made = [s for s, _ in reused if s not in {s for s, _ in row.prefix.parts}]  # compacted
                self.stats.kv_bytes_copied += sum(s.nbytes for s in made)
                self._prefixes.put(row.key, [*self._prefixes.get(row.key), copy])
                self.stats.kv_bytes_peak = max(self.stats.kv_bytes_peak, self._prefixes.held)
