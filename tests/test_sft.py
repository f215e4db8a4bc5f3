"""SFT: assistant-only targets, the loss goes down, gradient accumulation is exact, LoRA saves a
plain checkpoint that loads offline."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from race_core.envs.expert import expert_dataset
from race_core.policy import load_policy
from race_core.render import ASSISTANT_ROLES, Renderer, Role
from race_core.tiny import TINY, ensure_checkpoint
from race_core.train.sft import SFTConfig, encode_examples, train_sft


@pytest.fixture(scope="module")
def base(tmp_path_factory):
    return ensure_checkpoint(tmp_path_factory.getbasetemp() / "race-shared", TINY)


@pytest.fixture(scope="module")
def data():
    return expert_dataset(12, seed=4, difficulty=1)


def test_targets_are_the_assistant_tokens_only(base, data):
    _, tokenizer = load_policy(base)
    renderer = Renderer(tokenizer)
    example = encode_examples(renderer, data[:1], max_length=10_000)[0]
    rendered = renderer.render(data[0])
    assert np.array_equal(example.target_mask, np.isin(rendered.roles, [int(r) for r in ASSISTANT_ROLES]))
    assert not example.target_mask[rendered.mask(Role.OBSERVATION, Role.CONTEXT)].any()
    assert example.target_mask[rendered.mask(Role.REASONING, Role.ACTION, Role.OPEN, Role.CLOSE)].all()
    assert len(encode_examples(renderer, data[:1], max_length=20)[0].input_ids) == 20


def test_sft_lowers_the_loss_and_saves_a_loadable_checkpoint(base, data, tmp_path):
    config = SFTConfig(lr=1e-2, steps=24, batch_size=4, warmup_steps=2, seed=0)
    report = train_sft(base, None, data, config, tmp_path / "sft")
    assert len(report.losses) == 24 and report.steps == 24
    first, last = np.mean(report.losses[:3]), np.mean(report.losses[-3:])
    assert last < 0.7 * first, (first, last)
    model, _ = load_policy(report.checkpoint)
    reference, _ = load_policy(base)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(model.state_dict()[weight], reference.state_dict()[weight])


def test_sft_is_deterministic_and_accumulation_equals_a_larger_batch(base, data):
    def run(**kw):
        model, tokenizer = load_policy(base)
        report = train_sft(model, tokenizer, data, SFTConfig(lr=1e-3, steps=2, seed=7, **kw))
        return report.losses, model.state_dict()["model.layers.1.mlp.down_proj.weight"]

    losses_a, weights_a = run(batch_size=4)
    losses_b, weights_b = run(batch_size=4)
    assert losses_a == losses_b and torch.equal(weights_a, weights_b)
    losses_c, weights_c = run(batch_size=2, grad_accumulation=2)  # same examples per step
    # two half batches sum in another order than one whole: measured 1.1e-7 relative on the losses
    # and 2.0e-8 on the weights after 2 Adam steps (float32, CPU; `pytest -s` prints them), ~10x
    loss_difference = max(abs(c - a) / abs(a) for c, a in zip(losses_c, losses_a, strict=True))
    weight_difference = (weights_c - weights_a).abs().max().item()
    print(f"measured accumulation vs one batch: losses {loss_difference:.1e} relative, weights {weight_difference:.1e}")
    assert loss_difference <= 1e-6 and weight_difference <= 2e-7


def test_lora_sft_merges_and_the_folder_loads_offline(base, data, tmp_path):
    from transformers import AutoModelForCausalLM

    config = SFTConfig(lr=1e-2, steps=3, batch_size=4, lora=True, lora_r=4, seed=0)
    report = train_sft(base, None, data, config, tmp_path / "lora")
    assert report.lora and len(report.losses) == 3
    assert not (tmp_path / "lora" / "adapter_config.json").exists()  # merged: a plain checkpoint
    model = AutoModelForCausalLM.from_pretrained(tmp_path / "lora", local_files_only=True)
    reference, _ = load_policy(base)
    weight = "model.layers.0.self_attn.q_proj.weight"
    assert not torch.equal(model.state_dict()[weight], reference.state_dict()[weight])
    # only the adapted projections moved: the MLP is untouched
    mlp = "model.layers.0.mlp.up_proj.weight"
    assert torch.equal(model.state_dict()[mlp], reference.state_dict()[mlp])


def test_saved_training_states_of_a_tied_model_drop_the_alias_quietly_and_resume_tied(base, data, tmp_path, caplog):
    """The tiny Llama ties lm_head to the embeddings, as SmolLM2 does: a saved training state holds the
    embedding once (safetensors keeps no alias) without accelerate's "Removed shared tensor" warning,
    and the model resumed from it, and the checkpoint saved at the end, are tied again."""
    import logging

    from safetensors import safe_open

    from race_core.policy import save_policy
    from race_core.train.distributed import TrainOptions

    def tied(model) -> bool:
        return model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()

    state = tmp_path / "state"
    model, tokenizer = load_policy(base)
    assert tied(model)
    with caplog.at_level(logging.WARNING):
        train_sft(model, tokenizer, data, SFTConfig(steps=3, batch_size=2), options=TrainOptions(state_dir=str(state),
                                                                                                  save_every=1))
    assert not [r for r in caplog.records if "shared tensor" in r.getMessage()], caplog.text
    (saved,) = sorted(state.glob("step-*/model.safetensors"))  # the last state kept: after step 2 of 3
    with safe_open(str(saved), "pt") as weights:
        names = set(weights.keys())
    assert "model.embed_tokens.weight" in names and "lm_head.weight" not in names
    again, _ = load_policy(base)
    report = train_sft(again, tokenizer, data, SFTConfig(steps=3, batch_size=2),
                       options=TrainOptions(state_dir=str(state), save_every=1))
    assert report.steps == 3 and tied(again)  # resumed at step 2, one step trained, still tied
    assert torch.equal(again.lm_head.weight, model.lm_head.weight)  # the same run as the one that did not stop
    reloaded, _ = load_policy(save_policy(again, tokenizer, tmp_path / "out"))
    assert tied(reloaded) and torch.equal(reloaded.lm_head.weight, again.lm_head.weight)


@pytest.mark.parametrize(("total", "warmup", "min_ratio"), [(16, 0, 0.1), (64, 10, 0.1), (1800, 100, 0.0), (7, 3, 0.5)])
def test_the_lr_schedule_is_transformers_cosine_with_a_floor_but_for_a_warmup_that_starts_above_zero(
        total, warmup, min_ratio):
    """After the warmup the factor is transformers' cosine-with-min-lr schedule to the last bit; its
    warmup starts at 1/warmup where transformers' starts at 0 (a first step that would not move)."""
    from transformers.optimization import _get_cosine_schedule_with_warmup_lr_lambda as transformers_factor

    from race_core.train.sft import lr_factor

    for step in range(total):
        ours = lr_factor(step, total, warmup, min_ratio)
        theirs = transformers_factor(step, num_warmup_steps=warmup, num_training_steps=total, num_cycles=0.5,
                                     min_lr_rate=min_ratio)
        assert ours == (theirs if step >= warmup else (step + 1) / warmup)
