"""One contract for every installed scoring/sampling backend (DESIGN §9).

"hf" always runs; "vllm" runs wherever vllm is importable (marked `vllm`). Every backend scores the
same requests over the same tiny checkpoint and must agree with a plain, no-cache transformers
forward (and so with each other) to 1e-4 in float32, make the same cover decisions, and sample
assistant turns that end at the stop token with log-probs that re-scoring reproduces.

Environment knobs (for `scripts/gpu_check.sh`): RACE_CONTRACT_DEVICE (default "cpu") and
RACE_CONTRACT_DTYPE (default "float32") pick where and in what precision the backends run.
"""

from __future__ import annotations

import importlib.util
import os
from dataclasses import replace

import numpy as np
import pytest
import torch

from race_core.cover import logic_cover
from race_core.envs.expert import expert_dataset
from race_core.policy import load_policy, save_policy
from race_core.render import Renderer
from race_core.sampling import SamplingParams, make_sampler, stop_token_ids
from race_core.scoring import Scorer, ScoreRequest, make_scorer
from race_core.tiny import TINY, ensure_checkpoint

DEVICE = os.environ.get("RACE_CONTRACT_DEVICE", "cpu")
DTYPE = os.environ.get("RACE_CONTRACT_DTYPE", "float32")
ATOL = 1e-4 if DTYPE == "float32" else 5e-2
RESCORE_ATOL = 1e-3 if DTYPE == "float32" else 5e-2


HAS_VLLM = importlib.util.find_spec("vllm") is not None
BACKENDS = [pytest.param("hf", id="hf")]
if HAS_VLLM:
    BACKENDS.append(pytest.param("vllm", id="vllm", marks=pytest.mark.vllm))

EPSILONS = (1e-3, 0.05)
SAMPLING = SamplingParams(n=3, max_new_tokens=48, seed=7)


def backend_options(backend: str) -> dict:
    if backend == "hf":
        return {"device": DEVICE, "dtype": DTYPE}
    # One small engine per module: eager mode starts in seconds instead of a minute on CPU.
    os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", "1")  # GiB; the default takes far more
    options = {"device": DEVICE, "dtype": DTYPE, "enforce_eager": True, "max_model_len": 2048}
    if DEVICE.startswith("cuda"):
        options["gpu_memory_utilization"] = 0.25  # scorer and sampler engines side by side
    return options


def close(backend_object) -> None:
    if hasattr(backend_object, "close"):
        backend_object.close()


# -- fixtures ---------------------------------------------------------------------------------------
@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return ensure_checkpoint(tmp_path_factory.mktemp("contract"), TINY)


@pytest.fixture(scope="module")
def stop_checkpoint(checkpoint, tmp_path_factory):
    """The tiny checkpoint biased so that sampling actually ends turns: a random model almost never
    emits the stop token. Every embedding row gets a constant feature 1.0 in dimension 0, and a
    group of 16 tokens (the stop tokens and ordinary ones) 1.5; the weights are tied, so the shared
    +1.0 cancels in the softmax and the group gains a few nats. A draw then hits the stop ~1 step
    in 16 (most samples stop, some run to the length limit) while the stop is rarely the argmax
    (greedy runs are not all one token long)."""
    model, tokenizer = load_policy(checkpoint)
    stops = stop_token_ids(tokenizer, Renderer(tokenizer))
    group = [*stops, *[t for t in range(100, 200) if t not in stops][: 16 - len(stops)]]
    with torch.no_grad():
        embedding = model.get_input_embeddings().weight
        embedding[:, 0] = 1.0
        embedding[group, 0] = 1.5
    return save_policy(model, tokenizer, tmp_path_factory.mktemp("contract-stop"))


@pytest.fixture(scope="module")
def trajectories():
    trajectories = expert_dataset(12, seed=3)
    assert len(trajectories) >= 10 and max(len(t.turns) for t in trajectories) >= 3
    return trajectories


@pytest.fixture(scope="module")
def reference(checkpoint):
    model, tokenizer = load_policy(checkpoint, device=DEVICE, dtype=DTYPE)
    return model, Renderer(tokenizer)


@pytest.fixture(scope="module")
def reference_scores(reference, trajectories):
    model, renderer = reference
    return [plain_action_logprobs(model, renderer, t) for t in trajectories]


@pytest.fixture(scope="module", params=BACKENDS)
def scorer(request, checkpoint):
    scorer = make_scorer(request.param, str(checkpoint), **backend_options(request.param))
    yield scorer
    close(scorer)


@pytest.fixture(scope="module", params=BACKENDS)
def sampler(request, stop_checkpoint):
    sampler = make_sampler(request.param, str(stop_checkpoint), **backend_options(request.param))
    yield sampler
    close(sampler)


@pytest.fixture(scope="module")
def stop_model(stop_checkpoint):
    model, tokenizer = load_policy(stop_checkpoint, device=DEVICE, dtype=DTYPE)
    return model, Renderer(tokenizer)


@pytest.fixture(scope="module")
def prompts(stop_model, trajectories):
    _, renderer = stop_model
    return [renderer.prompt_ids(t.question, t.turns[: i % len(t.turns)]) for i, t in enumerate(trajectories[:6])]


@pytest.fixture(scope="module")
def samples(sampler, prompts):
    return sampler.sample(prompts, SAMPLING)


# -- the plain reference: one forward, no cache, no batching ------------------------------------------
@torch.inference_mode()
def plain_token_logprobs(model, ids: list[int]) -> np.ndarray:
    """log p(ids[k] | ids[:k]) for k >= 1 (index k-1 of the result), one plain forward."""
    input_ids = torch.tensor([ids], device=model.device)
    logits = model(input_ids=input_ids).logits[0, :-1].float()
    return torch.log_softmax(logits, -1).gather(1, input_ids[0, 1:, None])[:, 0].double().cpu().numpy()


def plain_action_logprobs(model, renderer: Renderer, trajectory) -> list[float]:
    rendered = renderer.render(trajectory)
    token_logprobs = plain_token_logprobs(model, rendered.input_ids.tolist())
    return [float(token_logprobs[start - 1: end - 1].mean()) for start, end in rendered.action_spans]


def partial_requests(trajectories) -> list[ScoreRequest]:
    """Requests as the cover makes them: from a turn on, some to the end, some only one turn."""
    requests = []
    for i, t in enumerate(trajectories):
        last = len(t.turns) - 1
        requests.append(ScoreRequest(("tail", i), t, from_turn=min(1, last)))
        requests.append(ScoreRequest(("one", i), t, from_turn=last, to_turn=last))
    return requests


# -- scoring ------------------------------------------------------------------------------------------
def test_backend_is_a_scorer(scorer):
    assert isinstance(scorer, Scorer)


def test_action_likelihoods_match_a_plain_forward(scorer, trajectories, reference_scores):
    scores = scorer.score([ScoreRequest(i, t) for i, t in enumerate(trajectories)])
    scorer.release()
    for got, want in zip(scores, reference_scores, strict=True):
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_partial_requests_score_only_the_requested_turns(scorer, trajectories, reference_scores):
    requests = partial_requests(trajectories)
    scores = scorer.score(requests)
    scorer.release()
    for request, got in zip(requests, scores, strict=True):
        want = reference_scores[request.key[1]][request.from_turn: request.last_turn + 1]
        assert len(got) == len(want)
        np.testing.assert_allclose(got, want, rtol=0, atol=ATOL)


def test_action_likelihoods_match_the_hf_backend(scorer, checkpoint, trajectories):
    hf = make_scorer("hf", str(checkpoint), **backend_options("hf"))
    requests = [ScoreRequest(i, t) for i, t in enumerate(trajectories)] + partial_requests(trajectories)
    want = hf.score(requests)
    got = scorer.score(requests)
    scorer.release()
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(g, w, rtol=0, atol=ATOL)


def test_batching_noise_is_far_below_epsilon(scorer, trajectories):
    noise = scorer.measure_noise([ScoreRequest(i, t) for i, t in enumerate(trajectories[:6])])
    scorer.release()
    assert noise < ATOL


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_cover_decisions_match_the_plain_algorithm(scorer, reference, trajectories, epsilon):
    model, renderer = reference
    want = logic_cover(trajectories, lambda ts: [plain_action_logprobs(model, renderer, t) for t in ts], epsilon)
    got = logic_cover(trajectories, scorer, epsilon)
    assert [r.skipped_turns for r in got] == [r.skipped_turns for r in want]
    assert [[a["accepted"] for a in r.audit] for r in got] == [[a["accepted"] for a in r.audit] for r in want]
    for g, w in zip(got, want, strict=True):
        for ga, wa in zip(g.audit, w.audit, strict=True):
            np.testing.assert_allclose(ga["drops"], wa["drops"], rtol=0, atol=2 * ATOL)


def test_cover_decisions_are_mixed_so_the_comparison_can_fail(reference, trajectories):
    """At some ε of the contract the reference accepts some candidates and rejects others."""
    model, renderer = reference
    flags = [a["accepted"] for eps in EPSILONS
             for r in logic_cover(trajectories, lambda ts: [plain_action_logprobs(model, renderer, t) for t in ts], eps)
             for a in r.audit if not a["skipped_empty"]]
    assert any(flags) and not all(flags)


def test_vllm_scores_a_round_in_one_engine_call_without_prefix_caching(scorer, trajectories):
    if scorer.name != "vllm":
        pytest.skip("vllm-specific")
    assert scorer.llm.llm_engine.vllm_config.cache_config.enable_prefix_caching is False
    calls, requests = scorer.stats.forward_calls, scorer.stats.requests
    scorer.score([ScoreRequest(i, t) for i, t in enumerate(trajectories)])
    assert scorer.stats.forward_calls == calls + 1
    assert scorer.stats.requests == requests + len(trajectories)


# -- sampling -----------------------------------------------------------------------------------------
def test_sampler_returns_n_samples_per_prompt(samples, prompts):
    assert len(samples) == len(prompts)
    assert all(len(per_prompt) == SAMPLING.n for per_prompt in samples)


def test_samples_end_at_the_stop_token_and_only_there(sampler, samples):
    flat = [s for per_prompt in samples for s in per_prompt]
    stops = set(sampler.stop_ids)
    assert any(s.finish_reason == "stop" for s in flat)
    for s in flat:
        assert s.finish_reason in ("stop", "length")
        assert len(s.token_ids) == len(s.logprobs) <= SAMPLING.max_new_tokens
        assert not stops & set(s.token_ids[:-1])
        if s.finish_reason == "stop":
            assert s.token_ids[-1] in stops
        else:
            assert len(s.token_ids) == SAMPLING.max_new_tokens and s.token_ids[-1] not in stops


@pytest.mark.parametrize("temperature, top_p", [(1.0, 1.0), (0.7, 0.9)])
def test_rescoring_the_samples_reproduces_their_logprobs(sampler, prompts, stop_model, temperature, top_p):
    """The log-probs are the raw policy's (temperature 1, no top-p), whatever shaped the draw."""
    model, _ = stop_model
    params = replace(SAMPLING, temperature=temperature, top_p=top_p)
    for prompt, per_prompt in zip(prompts, sampler.sample(prompts, params), strict=True):
        for s in per_prompt:
            rescored = plain_token_logprobs(model, list(prompt) + list(s.token_ids))[len(prompt) - 1:]
            np.testing.assert_allclose(s.logprobs, rescored, rtol=0, atol=RESCORE_ATOL)


def test_same_seed_gives_the_same_samples(sampler, prompts, samples):
    first = samples
    again = sampler.sample(prompts, SAMPLING)
    other = sampler.sample(prompts, replace(SAMPLING, seed=SAMPLING.seed + 1000))
    ids = [[s.token_ids for s in per_prompt] for per_prompt in first]
    assert ids == [[s.token_ids for s in per_prompt] for per_prompt in again]
    assert ids != [[s.token_ids for s in per_prompt] for per_prompt in other]


def test_greedy_samples_follow_the_argmax(sampler, prompts, stop_model):
    model, _ = stop_model
    greedy = sampler.sample(prompts, replace(SAMPLING, n=1, greedy=True, max_new_tokens=16))
    assert any(len(s.token_ids) > 1 for (s,) in greedy)
    for prompt, (s,) in zip(prompts, greedy, strict=True):
        ids = list(prompt) + list(s.token_ids)
        with torch.inference_mode():
            logits = model(input_ids=torch.tensor([ids], device=model.device)).logits[0].float()
        argmax = logits[len(prompt) - 1: len(ids) - 1].argmax(-1).tolist()
        assert list(s.token_ids) == argmax
