"""The HF scorer equals each architecture's own forward: post-decoder logit transforms (Gemma's
soft-capping, Cohere's and Granite's logit scales) and sliding-window attention under the prefix
cache, on tiny random models built here (no download)."""

import functools

import numpy as np
import pytest
import torch
import transformers

from race_core.envs.expert import expert_dataset
from race_core.render import Renderer
from race_core.scoring import ScoreRequest, hf
from race_core.scoring.hf import PROBE_TOLERANCE, HFScorer, head_logits
from race_core.tiny import TINY, build_tokenizer

WINDOW = 8  # far shorter than the trajectories (150-350 tokens), so reused prefixes outgrow it
ARCHITECTURES = {
    "llama": ("LlamaConfig", "LlamaForCausalLM", {}),
    "qwen2": ("Qwen2Config", "Qwen2ForCausalLM",
              {"use_sliding_window": True, "sliding_window": WINDOW, "max_window_layers": 1}),  # full, sliding
    "mistral": ("MistralConfig", "MistralForCausalLM", {"sliding_window": WINDOW}),
    "gemma2": ("Gemma2Config", "Gemma2ForCausalLM",  # sliding, full; eager: attention soft-capping too
               {"sliding_window": WINDOW, "final_logit_softcapping": 1.0, "head_dim": 32, "attn_implementation": "eager"}),
    "gemma3_text": ("Gemma3TextConfig", "Gemma3ForCausalLM",
                    {"sliding_window": WINDOW, "final_logit_softcapping": 1.0, "head_dim": 32,
                     "layer_types": ["sliding_attention", "full_attention"]}),
    "granite": ("GraniteConfig", "GraniteForCausalLM",
                {"logits_scaling": 8.0, "embedding_multiplier": 12.0, "residual_multiplier": 0.22,
                 "attention_multiplier": 0.0078125}),
    "granitemoe": ("GraniteMoeConfig", "GraniteMoeForCausalLM",
                   {"logits_scaling": 6.0, "num_local_experts": 4, "num_experts_per_tok": 2}),
    "cohere": ("CohereConfig", "CohereForCausalLM", {"logit_scale": 0.0625}),
    "cohere2": ("Cohere2Config", "Cohere2ForCausalLM",
                {"logit_scale": 0.0625, "sliding_window": WINDOW, "layer_types": ["sliding_attention", "full_attention"]}),
    "minicpm3": ("MiniCPM3Config", "MiniCPM3ForCausalLM",  # latent attention: cached keys 24 wide, values 16
                 {"num_key_value_heads": 2, "q_lora_rank": 32, "kv_lora_rank": 24, "qk_nope_head_dim": 16,
                  "qk_rope_head_dim": 16, "v_head_dim": 8, "dim_model_base": 16}),
}
TRANSFORMED = ["gemma2", "gemma3_text", "granite", "granitemoe", "cohere", "cohere2", "minicpm3"]


@functools.cache
def tiny_tokenizer():
    return build_tokenizer(TINY)  # vocab_size 512, as every model here


@pytest.fixture(scope="module")
def tokenizer():
    return tiny_tokenizer()


@pytest.fixture(scope="module")
def trajectories():
    return expert_dataset(4, seed=0)


@functools.cache
def build(architecture: str, **overrides):
    config_name, model_name, options = ARCHITECTURES[architecture]
    tokenizer = tiny_tokenizer()
    shape = {"vocab_size": len(tokenizer), "hidden_size": 64, "intermediate_size": 128, "num_hidden_layers": 2,
             "num_attention_heads": 2, "num_key_value_heads": 1, "max_position_embeddings": 4096,
             "pad_token_id": tokenizer.pad_token_id, "bos_token_id": tokenizer.bos_token_id,
             "eos_token_id": tokenizer.eos_token_id}
    config = getattr(transformers, config_name)(**{**shape, **options, **overrides})
    torch.manual_seed(0)
    return getattr(transformers, model_name)(config).eval()


@functools.cache
def plain_logprobs(architecture: str, ids: tuple[int, ...]) -> np.ndarray:
    """Log-probs of each token (from position 1) in one cache-free forward of the whole sequence."""
    input_ids = torch.tensor(ids)
    with torch.no_grad():
        logits = build(architecture)(input_ids[None]).logits[0].double()
    return torch.log_softmax(logits, -1)[:-1].gather(1, input_ids[1:, None])[:, 0].numpy()


def plain_action_means(architecture, renderer, trajectory):
    rendered = renderer.render(trajectory)
    logprobs = plain_logprobs(architecture, tuple(rendered.input_ids.tolist()))
    return [float(np.mean(logprobs[a - 1: b - 1])) for a, b in rendered.action_spans]


@pytest.mark.parametrize("prefix_reuse", [True, False])
@pytest.mark.parametrize("batch_size", [1, 3])
@pytest.mark.parametrize("architecture", list(ARCHITECTURES))
def test_scorer_equals_the_models_own_forward_over_cover_rounds(tokenizer, trajectories, architecture,
                                                                batch_size, prefix_reuse):
    model = build(architecture)
    assert model.config.model_type == architecture
    renderer = Renderer(tokenizer)
    scorer = HFScorer(model, tokenizer, batch_size=batch_size, prefix_reuse=prefix_reuse, renderer=renderer)
    current = dict(enumerate(trajectories))
    requests = [ScoreRequest(i, t) for i, t in current.items()]
    for t in range(4):
        if t > 0:  # a cover round: remove reasoning t from the held trajectory, accept every other round;
            # and a new trajectory, nothing cached, in the same batches
            requests = [ScoreRequest(i, c.without_reasoning(t), from_turn=t)
                        for i, c in current.items() if len(c.turns) > t]
            requests.insert(1, ScoreRequest(("new", t), trajectories[t]))
        for request, scores in zip(requests, scorer.score(requests), strict=True):
            expected = plain_action_means(architecture, renderer, request.trajectory)[request.from_turn:]
            assert np.max(np.abs(np.array(scores) - expected)) < 1e-5
            if t % 2 == 1 and request.key in current:
                current[request.key] = request.trajectory
    assert (scorer.stats.tokens_reused > 0) == prefix_reuse


@pytest.mark.parametrize("architecture", TRANSFORMED)
def test_the_head_applies_the_architectures_logit_transform(architecture):
    """What the scorer computed before `head_logits` (the output embedding alone) is far off."""
    model = build(architecture)
    ids = torch.arange(1, 41)[None]
    with torch.no_grad():
        hidden = model.get_decoder()(ids).last_hidden_state
        own = torch.log_softmax(model(ids).logits, -1)
        ours = torch.log_softmax(head_logits(model, hidden), -1)
        embedding_only = torch.log_softmax(model.get_output_embeddings()(hidden), -1)
    assert (ours - own).abs().max() < 1e-5
    assert (embedding_only - own).abs().max() > 1e-2


@pytest.mark.parametrize("architecture", ["mistral", "gemma2"])
def test_the_sliding_window_shapes_the_scores_it_is_checked_on(tokenizer, trajectories, architecture):
    windowless = build(architecture, sliding_window=4096)
    rendered = Renderer(tokenizer).render(trajectories[0])
    assert len(rendered.input_ids) > 10 * WINDOW
    ids = torch.as_tensor(rendered.input_ids)[None]
    with torch.no_grad():
        windowed_logits, full_logits = build(architecture)(ids).logits, windowless(ids).logits
    assert torch.equal(windowed_logits[:, :WINDOW], full_logits[:, :WINDOW])
    assert (windowed_logits - full_logits).abs().max() > 1e-2


def test_a_model_whose_forward_changes_the_logits_unknowingly_is_refused(tokenizer):
    class TripledLogits(transformers.LlamaForCausalLM):
        def forward(self, *args, **kwargs):
            out = super().forward(*args, **kwargs)
            out.logits = out.logits * 3
            return out

    model = TripledLogits(build("llama").config).eval()
    with pytest.raises(ValueError, match=r"refuses model_type 'llama' \(TripledLogits\).* by up to \d"):
        HFScorer(model, tokenizer)


def test_the_probe_runs_once_per_model_and_leaves_no_trace(tokenizer, monkeypatch):
    model = build("mistral")
    first = HFScorer(model, tokenizer, prefix_reuse=False)
    assert first.prefix_reuse is False and first.kv_bytes_held == 0 and first.stats.forward_calls == 0
    probe = first.verify_against_forward()
    assert probe["head"] == 0.0 and probe["scored"] < 1e-6 and probe["tolerance"] == PROBE_TOLERANCE
    assert first.kv_bytes_held == 0 and first.prefix_reuse is False  # the probe's own copies are gone
    monkeypatch.setattr(HFScorer, "verify_against_forward", lambda self: pytest.fail("probed twice"))
    assert HFScorer(model, tokenizer).stats.extra["probe"] == probe


def test_a_cache_that_keeps_only_the_window_is_refused(tokenizer, monkeypatch):
    """What a `DynamicCache` built from the config does to sliding-window layers: the reused prefix
    would lose its start."""
    model = build.__wrapped__("mistral")  # a model object not probed yet
    monkeypatch.setattr(hf, "_batch_cache", lambda *args: transformers.DynamicCache(config=model.config))
    with pytest.raises(ValueError, match=r"cannot score model_type 'mistral'.*cache kept \[7\] positions"):
        HFScorer(model, tokenizer)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float16])
def test_half_precision_passes_the_probe_within_its_rounding(tokenizer, dtype):
    model = build.__wrapped__("llama").to(dtype)
    probe = HFScorer(model, tokenizer).stats.extra["probe"]
    assert probe["head"] == 0.0 and PROBE_TOLERANCE < probe["scored"] < probe["tolerance"]
