"""vLLM scorer (DESIGN §9): action likelihoods from `prompt_logprobs` over token-id prompts.

Each request becomes one token-id prompt, the trajectory rendered by our Renderer and cut at the
end of the last action scored, with `SamplingParams(max_tokens=1, prompt_logprobs=0)`: vLLM then
returns, for every prompt position, the log-probability of the token actually there (in a dict of
token id -> Logprob that also holds the top-k, which for k = 0 is empty). ℓ of a turn is the mean
over its action tokens, exactly as in the transformers scorer.

All requests of one `score` call (one wavefront round of the cover) go to the engine in one
`generate` call; vLLM's scheduler batches them. The engine runs with prefix caching off: vLLM does
not reuse its prefix cache for prompt-logprob requests anyway, and cached prompt logprobs have been
reported to depend on request order. So nothing is kept between calls and `release` has nothing to
forget; each call feeds every prompt token (`stats.tokens_processed`).

The engine is built once per stage and released after: `close()`, or use the scorer as a context
manager.
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from pathlib import Path
from typing import Any

import numpy as np

from race_core.render import Renderer
from race_core.scoring import ScoreRequest
from race_core.scoring.hf import ScorerStats
from race_core.vllm_engine import build_engine, require_vllm, shutdown_engine


class VLLMScorer:
    """Scores action likelihoods with a vLLM engine (prompt log-probs of token-id prompts)."""

    name = "vllm"

    def __init__(self, llm, tokenizer=None, *, renderer: Renderer | None = None, owns_engine: bool = False):
        """Wrap an existing `vllm.LLM` (built with `enable_prefix_caching=False`). The tokenizer
        defaults to the one in the engine's checkpoint folder, loaded as the transformers
        scorer loads it; `owns_engine` makes `close()` shut the engine down."""
        require_vllm()
        if tokenizer is None:
            from race_core.policy import load_tokenizer

            tokenizer = load_tokenizer(llm.model_config.tokenizer)
        self.llm = llm
        self.tokenizer = tokenizer
        self.renderer = renderer or Renderer(tokenizer)
        self.owns_engine = owns_engine
        self.stats = ScorerStats()
        self.noise: float | None = None
        if getattr(llm.llm_engine.vllm_config.cache_config, "enable_prefix_caching", False):
            message = "the scoring engine has prefix caching on: prompt logprobs may depend on request order"
            self.stats.extra["warning"] = message
            warnings.warn(message, stacklevel=2)

    @classmethod
    def from_pretrained(cls, checkpoint: str | Path, *, dtype: str = "float32", device: str | None = None,
                        batch_size: int | None = None, **engine_options: Any) -> VLLMScorer:
        """Build the scoring engine over a local checkpoint folder. `batch_size` caps the
        sequences the engine runs at once (vLLM's `max_num_seqs`); other options go to `vllm.LLM`."""
        require_vllm()
        from race_core.policy import load_tokenizer

        if batch_size is not None:
            engine_options.setdefault("max_num_seqs", batch_size)
        engine_options["enable_prefix_caching"] = False  # see the module docstring
        llm = build_engine(checkpoint, dtype=dtype, device=device, **engine_options)
        return cls(llm, load_tokenizer(checkpoint), owns_engine=True)

    # -- public -------------------------------------------------------------------------------
    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        """For each request, the action mean log-probs of turns from_turn..last_turn (one engine
        call for all requests)."""
        if not requests:
            return []
        if self.llm is None:
            raise RuntimeError("this VLLMScorer is closed")
        from vllm import SamplingParams

        rendered = [self.renderer.render(r.trajectory) for r in requests]
        prompts = [x.input_ids[: x.action_spans[r.last_turn][1]].tolist()
                   for r, x in zip(requests, rendered, strict=True)]
        outputs = self.llm.generate(
            [{"prompt_token_ids": ids} for ids in prompts],
            SamplingParams(max_tokens=1, prompt_logprobs=0, temperature=1.0, detokenize=False),
            use_tqdm=False,
        )
        scores = []
        for r, x, ids, out in zip(requests, rendered, prompts, outputs, strict=True):
            per_position = out.prompt_logprobs
            scores.append([
                float(np.mean([_token_logprob(per_position, ids, k) for k in range(*x.action_spans[j])]))
                for j in range(r.from_turn, r.last_turn + 1)
            ])
        self.stats.forward_calls += 1
        self.stats.requests += len(requests)
        self.stats.tokens_processed += sum(len(ids) for ids in prompts)
        return scores

    def release(self, keys: Sequence[Hashable] | None = None) -> None:
        """Nothing is kept between calls (no prefix cache), so nothing to forget."""
        return None

    def measure_noise(self, requests: Sequence[ScoreRequest]) -> float:
        """Max |difference| between scoring each request alone (one engine call each) and all of
        them in one call."""
        alone = [self.score([r])[0] for r in requests]
        batched = self.score(list(requests))
        self.noise = max((abs(a - b) for xs, ys in zip(alone, batched, strict=True)
                          for a, b in zip(xs, ys, strict=True)), default=0.0)
        return self.noise

    def close(self) -> None:
        """Shut the engine down and free its memory (only an engine this scorer built)."""
        llm, self.llm = self.llm, None
        if self.owns_engine:
            shutdown_engine(llm)

    def __enter__(self) -> VLLMScorer:
        return self

    def __exit__(self, *exc) -> None:
        self.close()


def _token_logprob(per_position: list[dict[int, Any] | None], ids: list[int], k: int) -> float:
    """log p(ids[k] | ids[:k]) from vLLM's prompt logprobs (the entry of the actual token)."""
    entries = per_position[k]
    if entries is None or ids[k] not in entries:
        raise RuntimeError(f"vLLM returned no prompt logprob for position {k} (token {ids[k]})")
    return float(entries[ids[k]].logprob)
