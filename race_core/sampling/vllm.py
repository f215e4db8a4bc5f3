"""vLLM sampler: token-id prompts in, sampled assistant turns with their raw log-probs out.

Generation stops at the same tokens as the transformers sampler (`stop_token_ids`: the first token
of the assistant turn's closing wrapper, and EOS) and only there: `ignore_eos=True` keeps vLLM from
adding the checkpoint's own EOS list, and the stop token vLLM hit is kept in `token_ids` (vLLM
always returns stop tokens in the ids; only stop *strings* are cut from the text).

Log-probs are those of the unprocessed distribution (temperature 1, no top-p): the engine runs
with `logprobs_mode="raw_logprobs"` and each request asks for `logprobs=0`, i.e. the sampled token's
own log-prob. Request i gets seed `params.seed + i * params.n`; vLLM gives its k-th parallel
sample `seed + k`, so every sample has its own seed and the result does not depend on batching.

The engine is built once per stage and released after: `close()`, or use the sampler as a context
manager (`EngineOwner`).
"""

from __future__ import annotations

from collections.abc import Sequence

from race_core.render import Renderer
from race_core.sampling import Sample, SamplingParams, sample_until_stop, stop_token_ids
from race_core.vllm_engine import EngineOwner


class VLLMSampler(EngineOwner):
    """Samples assistant turns with a vLLM engine."""

    name = "vllm"
    # Prefix caching on unless asked otherwise: the n samples of a prompt share its prefill.
    engine_defaults = {"enable_prefix_caching": True}
    engine_required = {"logprobs_mode": "raw_logprobs"}

    def __init__(self, llm, tokenizer=None, *, renderer: Renderer | None = None, owns_engine: bool = False):
        """Wrap an existing `vllm.LLM` (built with `logprobs_mode="raw_logprobs"`, vLLM's default)."""
        super().__init__(llm, tokenizer, renderer=renderer, owns_engine=owns_engine)
        mode = getattr(llm.model_config, "logprobs_mode", "raw_logprobs")
        if str(getattr(mode, "value", mode)) != "raw_logprobs":
            raise ValueError(f"the sampler needs an engine with logprobs_mode='raw_logprobs', not {mode!r}")
        self.stop_ids = stop_token_ids(self.tokenizer, self.renderer)

    def sample(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Sample]]:
        """For each prompt, `params.n` samples (one engine call for all prompts)."""
        if not prompts:
            return []
        llm = self.engine()
        from vllm import SamplingParams as EngineSamplingParams

        greedy = params.greedy or params.temperature <= 0
        per_request = [
            EngineSamplingParams(
                n=params.n, temperature=0.0 if greedy else params.temperature,
                top_p=1.0 if greedy else params.top_p,
                max_tokens=params.max_new_tokens, seed=params.seed + i * params.n,
                stop_token_ids=list(self.stop_ids), ignore_eos=True, logprobs=0, detokenize=False,
            )
            for i in range(len(prompts))
        ]
        outputs = llm.generate([{"prompt_token_ids": [int(t) for t in p]} for p in prompts],
                               per_request, use_tqdm=False)
        return [[self._sample(c) for c in sorted(out.outputs, key=lambda c: c.index)] for out in outputs]

    def _sample(self, completion) -> Sample:
        ids = list(completion.token_ids)
        logprobs = [float(entries[tok].logprob) for tok, entries in zip(ids, completion.logprobs, strict=True)]
        return sample_until_stop(ids, logprobs, self.stop_ids, self.tokenizer)
