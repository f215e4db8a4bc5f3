"""vLLM scorer (docs/architecture.md §9): action likelihoods from `prompt_logprobs` over token-id prompts.

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
manager (`EngineOwner`).
"""

from __future__ import annotations

import warnings
from collections.abc import Hashable, Sequence
from typing import Any

import numpy as np

from race_core.render import Renderer
from race_core.scoring import ScoreRequest, ScorerStats, batch_noise
from race_core.vllm_engine import EngineOwner


class VLLMScorer(EngineOwner):
    """Scores action likelihoods with a vLLM engine (prompt log-probs of token-id prompts)."""

    name = "vllm"
    engine_required = {"enable_prefix_caching": False}  # see the module docstring

    def __init__(self, llm, tokenizer=None, *, renderer: Renderer | None = None, owns_engine: bool = False):
        """Wrap an existing `vllm.LLM` (built with `enable_prefix_caching=False`)."""
        super().__init__(llm, tokenizer, renderer=renderer, owns_engine=owns_engine)
        self.stats = ScorerStats()
        self.noise: float | None = None
        self.max_length = int(llm.model_config.max_model_len)  # longer prompts fail the whole call
        if getattr(llm.llm_engine.vllm_config.cache_config, "enable_prefix_caching", False):
            message = "the scoring engine has prefix caching on: prompt logprobs may depend on request order"
            self.stats.extra["warning"] = message
            warnings.warn(message, stacklevel=2)

    # -- public -------------------------------------------------------------------------------
    def score(self, requests: Sequence[ScoreRequest]) -> list[list[float]]:
        """For each request, the action mean log-probs of turns from_turn..last_turn (one engine
        call for all requests)."""
        if not requests:
            return []
        llm = self.engine()
        from vllm import SamplingParams

        rendered = [self.renderer.render(r.trajectory) for r in requests]
        prompts = [x.input_ids[: x.action_spans[r.last_turn][1]].tolist()
                   for r, x in zip(requests, rendered, strict=True)]
        outputs = llm.generate(
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
        self.stats.rows += len(prompts)
        self.stats.tokens_processed += sum(len(ids) for ids in prompts)
        return scores

    def release(self, keys: Sequence[Hashable] | None = None) -> None:
        """Nothing is kept between calls (no prefix cache), so nothing to forget."""
        return None

    def measure_noise(self, requests: Sequence[ScoreRequest]) -> float:
        """Max |difference| between scoring each request alone (one engine call each) and all of
        them in one call (`batch_noise`)."""
        self.noise = batch_noise(self, requests)
        return self.noise


def _token_logprob(per_position: list[dict[int, Any] | None], ids: list[int], k: int) -> float:
    """log p(ids[k] | ids[:k]) from vLLM's prompt logprobs (the entry of the actual token)."""
    entries = per_position[k]
    if entries is None or ids[k] not in entries:
        raise RuntimeError(f"vLLM returned no prompt logprob for position {k} (token {ids[k]})")
    return float(entries[ids[k]].logprob)
