"""On-policy sampling: token-id prompts in, sampled continuations with their log-probs out.

A Sampler continues each prompt (token ids ending right before the assistant's `<think>`) until
the end of the assistant turn, and returns the sampled token ids with their log-probabilities
under the sampling policy (the RL "old" log-probs). Samplers never see reference actions.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Protocol, runtime_checkable

if TYPE_CHECKING:
    from race_core.render import Renderer


@dataclass(frozen=True)
class SamplingParams:
    temperature: float = 1.0
    top_p: float = 1.0
    max_new_tokens: int = 96
    n: int = 1  # samples per prompt
    seed: int = 0
    greedy: bool = False


@dataclass(frozen=True)
class Sample:
    token_ids: tuple[int, ...]  # the sampled tokens, the stop token included when one was hit
    logprobs: tuple[float, ...]  # log p(token) under the sampling policy (temperature 1, no top-p)
    text: str  # decoded token_ids
    finish_reason: str  # "stop" (end of the assistant turn) or "length"


def stop_token_ids(tokenizer, renderer: Renderer) -> tuple[int, ...]:
    """Tokens that end an assistant turn: the first token of the turn's closing wrapper (and of a
    tool-call turn's, for a policy that acts by tool calls), and EOS."""
    from race_core.envs.agent import TOOLS, AgentPrompt

    stops = []
    if renderer.end_ids:
        stops.append(renderer.end_ids[0])
    if AgentPrompt.of(tokenizer).actions == TOOLS and (tool_end := renderer.encode(renderer.assistant_end(True))):
        stops.append(tool_end[0])
    if tokenizer.eos_token_id is not None:
        stops.append(tokenizer.eos_token_id)
    return tuple(dict.fromkeys(stops))


def sample_until_stop(ids: Sequence[int], logprobs: Sequence[float], stop_ids: Sequence[int], tokenizer) -> Sample:
    """A Sample cut after the first stop token (kept), or the whole generation if none came."""
    end = next((i + 1 for i, tok in enumerate(ids) if tok in stop_ids), None)
    finish = "stop" if end is not None else "length"
    end = end if end is not None else len(ids)
    kept = list(ids[:end])
    return Sample(token_ids=tuple(kept), logprobs=tuple(float(x) for x in logprobs[:end]),
                  text=tokenizer.decode(kept, skip_special_tokens=False), finish_reason=finish)


@runtime_checkable
class Sampler(Protocol):
    name: str

    def sample(self, prompts: Sequence[Sequence[int]], params: SamplingParams) -> list[list[Sample]]:
        """For each prompt, `params.n` samples."""
        ...


def make_sampler(backend: str, checkpoint: str, *, shared: bool = False, **options) -> Sampler:
    """Build a sampler by backend name ('hf' or 'vllm') over a local checkpoint folder. `shared`: vLLM's
    on the process's one engine (`race_core.sampling.shared`), which keeps it for the next caller."""
    if backend == "hf":
        from race_core.sampling.hf import HFSampler

        options.pop("digest", None)
        return HFSampler.from_pretrained(checkpoint, **options)
    if backend == "vllm":
        if shared:
            from race_core.sampling.shared import shared_sampler

            return shared_sampler(checkpoint, **options)
        from race_core.sampling.vllm import VLLMSampler

        options.pop("digest", None)
        return VLLMSampler.from_pretrained(checkpoint, **options)
    raise ValueError(f"unknown sampling backend {backend!r}: expected 'hf' or 'vllm'")
