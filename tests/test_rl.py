"""Cover-aware RL on real rollouts: the loss equals a hand computation from the batch's logged
tensors, skipped reasoning gets exactly zero gradient, one iteration updates the weights, and the
pipeline's path (the sample stage's rollouts JSON in a real store, then the rl stage) gives the
same loss, gradients and weights as the in-memory one.

The policy is the SMOKE bootstrap (the TINY model fitted to expert episodes of a few one-operation
tasks); CONFIG's iteration 0 draws exactly those tasks, sampled at temperature 1: its groups mix
successes and failures, so the advantages are not all zero. ε = 10 makes the cover accept removals
(every drop is below it), so the batch has skipped turns and closure terms whatever the tiny
model's likelihoods are.
"""

from __future__ import annotations

import pytest
import torch

from race_core.config import Resources, RLConfig, replace
from race_core.loss import cover_aware_loss
from race_core.policy import load_policy
from race_core.render import Renderer, Role
from race_core.rollout import rollouts_from_json, rollouts_to_json, sample_rollouts, training_tasks
from race_core.train.bootstrap import SMOKE, ensure_bootstrap, smoke_tasks
from race_core.train.rl import update_from_rollouts

CONFIG = RLConfig(tasks_per_iteration=SMOKE.expert_tasks, group_size=4, temperature=1.0, max_new_tokens=64,
                  max_turns=4, lr=1e-3, seed=SMOKE.expert_seed, difficulty=SMOKE.difficulty)
EPSILON = 10.0
# Tolerances from printed measurements (float32, CPU; `pytest -s tests/test_rl.py` prints them):
# logp_old (the sampler's, one sequence at a time) against logp_new (the update's forward over the
# padded batch): measured 6.4e-6 and, in another session, 1.5e-5 at most; about 7x the larger.
RECOMPUTE_ATOL = 1e-4
# the loss against the float64 hand computation from the same tensors: measured 2.3e-8 relative
LOSS_RTOL = 5e-7


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    return ensure_bootstrap(tmp_path_factory.getbasetemp() / "race-shared", SMOKE).checkpoint


@pytest.fixture(scope="module")
def iteration(checkpoint):
    model, tokenizer = load_policy(checkpoint)
    before = {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert [t.task_id for t in training_tasks(CONFIG, 0)] == [t.task_id for t in smoke_tasks()]
    rollouts = sample_rollouts(model, tokenizer, CONFIG, 0)
    report = update_from_rollouts(model, tokenizer, rollouts, CONFIG, epsilon=EPSILON)
    return report, before, model, tokenizer


def test_the_batch_has_what_the_loss_checks_need(iteration):
    report = iteration[0]
    advantages = report.batch.advantages
    assert (advantages > 0).any() and (advantages < 0).any(), "groups should mix successes and failures"
    assert report.closure_terms > 0 and report.masked_tokens > 0
    assert 0 < report.success_rate < 1
    assert report.policy_tokens == int(report.batch.policy_mask.sum())
    assert report.total_turns == sum(len(r.turns) for r in report.rollouts)


def test_rl_loss_equals_a_hand_computation_from_the_logged_tensors(iteration):
    report = iteration[0]
    b = report.batch
    rows, width = b.input_ids.shape
    surrogate_sum, policy_count = 0.0, 0
    for i in range(rows):
        a = float(b.advantages[i])
        for j in range(width):
            if not b.policy_mask[i, j]:
                continue
            policy_count += 1  # N_policy counts every policy token, masked ones too
            if b.skipped_mask[i, j]:
                continue
            ratio = float(torch.exp(report.logp_new[i, j] - b.logp_old[i, j]))
            clipped = min(max(ratio, 1 - CONFIG.clip), 1 + CONFIG.clip)
            surrogate_sum += min(ratio * a, clipped * a)
    actor = -surrogate_sum / policy_count
    closure = -sum(float(x) for x in report.closure_logprobs) / b.total_turns
    expected = actor + CONFIG.closure_weight * closure
    print(f"measured |loss - hand computation|: {abs(report.loss - expected):.2e} (loss {report.loss:.6f})")
    assert report.loss == pytest.approx(expected, rel=LOSS_RTOL, abs=0)
    assert policy_count == report.policy_tokens and len(report.closure_logprobs) == report.closure_terms


def test_skipped_reasoning_tokens_get_exactly_zero_gradient(iteration):
    report = iteration[0]
    b = report.batch
    logp_new = report.logp_new.clone().requires_grad_(True)
    closure = report.closure_logprobs.clone().requires_grad_(True)
    loss = cover_aware_loss(logp_new, b.logp_old, b.advantages, b.policy_mask, b.skipped_mask, closure,
                            b.total_turns, clip=CONFIG.clip, closure_weight=CONFIG.closure_weight)
    loss.backward()
    skipped = b.skipped_mask & b.policy_mask
    assert skipped.any()
    assert torch.all(logp_new.grad[skipped] == 0)
    kept = b.policy_mask & ~b.skipped_mask & (b.advantages[:, None] != 0)
    assert (logp_new.grad[kept] != 0).any()
    assert torch.all(logp_new.grad[~b.policy_mask] == 0)
    assert torch.allclose(closure.grad, torch.full_like(closure, -CONFIG.closure_weight / b.total_turns))


def test_skipped_mask_covers_the_rollouts_own_reasoning_of_skipped_turns(iteration):
    report = iteration[0]
    b = report.batch
    for row, rollout in enumerate(report.rollouts):
        a = rollout.arrays()
        n = len(a["token_ids"])
        cover = report.covers.get(row)
        skipped_turns = cover.skipped_turns if cover else ()
        expected = a["policy_mask"] & (a["roles"] == int(Role.REASONING)) & torch.isin(
            torch.from_numpy(a["turns"]), torch.tensor(skipped_turns, dtype=torch.int32)).numpy()
        assert b.skipped_mask[row, :n].numpy().tolist() == expected.tolist()
        assert not b.skipped_mask[row, n:].any()
        if not rollout.success:
            assert cover is None


def test_closure_terms_read_the_close_marker_after_the_open_marker_of_the_compressed_trajectory(iteration):
    """One closure context per rollout with skipped turns: its compressed rendering up to the last
    skipped turn's close marker; each term's target tokens are its turn's close marker, right after
    that turn's open marker (causal: what precedes a marker is the compressed context up to it)."""
    report, _, _, tokenizer = iteration
    renderer = Renderer(tokenizer)
    b = report.batch
    assert len(b.closure_rows) == len(set(b.closure_rows)) == len({row for row, _ in b.closure_turns})
    for c, row in enumerate(b.closure_rows):
        compressed = renderer.render(report.covers[row].trajectory)
        n = int(b.closure_attention_mask[c].sum())
        assert b.closure_input_ids[c, :n].tolist() == compressed.input_ids[:n].tolist()
        for k, (term_row, turn) in enumerate(b.closure_turns):
            if term_row != row:
                continue
            assert compressed.reasoning_token_count(turn) == 0
            marker_at = compressed.turn_starts[turn] + len(renderer.open_ids)
            targets = (b.closure_term_index[c] == k).nonzero().flatten().tolist()
            assert targets == list(range(marker_at, marker_at + len(renderer.close_ids)))
            assert b.closure_input_ids[c, marker_at:marker_at + len(targets)].tolist() == list(renderer.close_ids)
        assert n == max(int(t) for t in (b.closure_term_index[c] >= 0).nonzero().flatten()) + 1
    assert (report.closure_logprobs < 0).all()


def test_sampler_logprobs_match_the_recomputed_policy_logprobs(iteration):
    """The incremental sequence is exactly what the sampler saw: before the update, the trainer's
    logp_new equals the sampler's log-probs on every policy token, up to the float noise of
    recomputing them padded in one batch; logp_old is the trainer's own (one step: logp_new itself),
    and the gap to the sampler's is recorded."""
    report = iteration[0]
    b = report.batch
    on = b.policy_mask & report.forwarded[:, None]
    diff = (report.logp_new - b.sampler_logprobs)[on].abs()
    print(f"measured RL recompute noise (float32, CPU): max |logp_new - sampler logp| {diff.max():.2e} over "
          f"{int(on.sum())} policy tokens")
    assert diff.max() < RECOMPUTE_ATOL
    assert torch.equal(b.logp_old[on], report.logp_new[on])  # ratio 1 at the one step
    assert report.counts["old_logprob_gap_max"] == pytest.approx(float(diff.max()))
    # rows of groups whose rewards are all alike (advantage 0) ran no forward pass
    assert report.forwarded.tolist() == (b.advantages != 0).tolist()
    assert report.counts["skipped_rows"] == int((b.advantages == 0).sum())


def test_one_iteration_changes_the_weights(iteration):
    report, before, model, _ = iteration
    after = model.state_dict()
    changed = [k for k in before if not torch.equal(before[k], after[k])]
    assert changed
    assert len(report.losses) == CONFIG.epochs and torch.isfinite(torch.tensor(report.loss))
    summary = report.summary()
    assert summary["masked_tokens"] == report.masked_tokens and summary["rollouts"] == 16


@pytest.fixture(scope="module")
def pipeline_path(checkpoint, tmp_path_factory):
    """The pipeline's RL path: the sample stage writes the rollouts as JSON into a real store, an
    update reads them back and updates the policy (tasks/training_stages.py `rl_update`: what each
    iteration of a launched RL run does)."""
    from storage import ArtifactStore
    from tasks.training_stages import PolicyRef, rl_update, sample

    store = ArtifactStore(str(tmp_path_factory.mktemp("rl-store")))
    policy = PolicyRef.local(checkpoint)
    sampled = sample(store, policy, CONFIG, Resources(), 0)
    updated = rl_update(store, policy, sampled["objects"]["rollouts"], CONFIG, EPSILON, Resources(), 0)
    return store, sampled, updated


def test_the_sample_stage_stores_the_rollouts_the_in_memory_path_samples(iteration, pipeline_path):
    store, sampled, _ = pipeline_path
    stored = rollouts_from_json(store.get_bytes(sampled["objects"]["rollouts"]).decode("utf-8"))
    assert stored == iteration[0].rollouts
    assert rollouts_from_json(rollouts_to_json(stored)) == stored


def test_rollouts_through_the_stores_json_give_the_same_loss_and_gradients(checkpoint, iteration,
                                                                           pipeline_path):
    """update_from_rollouts on the rollouts as the rl stage reads them (the sample stage's JSON
    object) and on the in-memory ones: the same loss and, parameter by parameter, the same raw
    gradient (clipping off, so a gradient is compared as computed)."""
    store, sampled, _ = pipeline_path
    from_store = rollouts_from_json(store.get_bytes(sampled["objects"]["rollouts"]).decode("utf-8"))
    unclipped = replace(CONFIG, max_grad_norm=0.0)
    updated = []
    for batch in (iteration[0].rollouts, from_store):
        model, tokenizer = load_policy(checkpoint)  # two copies of the pre-update policy
        report = update_from_rollouts(model, tokenizer, batch, unclipped, epsilon=EPSILON)
        updated.append((report, dict(model.named_parameters())))
    (in_memory, params), (from_json, params_again) = updated
    assert CONFIG.epochs == 1 and from_json.loss == in_memory.loss == iteration[0].loss
    assert from_json.covers.keys() == in_memory.covers.keys() and in_memory.closure_terms > 0
    assert any(p.grad is not None and p.grad.abs().sum() > 0 for p in params.values())
    for name, p in params.items():
        assert p.grad is not None and params_again[name].grad is not None, name
        assert torch.equal(p.grad, params_again[name].grad), name


def test_the_rl_stage_writes_the_policy_of_the_in_memory_update(iteration, pipeline_path, tmp_path,
                                                                 monkeypatch):
    store, _, updated = pipeline_path
    report, before, in_memory_model, _ = iteration
    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "checkpoints"))
    from tasks.training_stages import PolicyRef

    stage_model, _ = PolicyRef.of(updated).load(store, Resources())
    assert updated["metrics"]["loss"] == report.loss
    assert updated["metrics"]["masked_tokens"] == report.masked_tokens > 0
    stage_params = dict(stage_model.named_parameters())
    for name, p in in_memory_model.named_parameters():
        assert torch.equal(stage_params[name], p), name
    assert any(not torch.equal(stage_params[k], before[k]) for k in stage_params)


def test_plain_grpo_scores_every_generated_token_and_supervises_no_closure(checkpoint, iteration):
    """`cover_aware=False` (the ablation's GRPO baseline): on the same rollouts, no cover, so nothing is
    masked and no closure term is added; the loss is the clipped surrogate over every policy token."""
    cover_aware = iteration[0]
    model, tokenizer = load_policy(checkpoint)
    plain = update_from_rollouts(model, tokenizer, cover_aware.rollouts, replace(CONFIG, cover_aware=False),
                                 epsilon=EPSILON)
    assert cover_aware.masked_tokens > 0 and cover_aware.closure_terms > 0
    assert plain.covers == {} and plain.masked_tokens == 0 and plain.closure_terms == 0
    assert not plain.batch.skipped_mask.any()
    assert plain.policy_tokens == cover_aware.policy_tokens and plain.loss != cover_aware.loss


def test_micro_batches_give_the_one_forward_loss_gradients_and_logged_tensors(checkpoint, iteration):
    """rl.micro_batch (3 rollouts, then 3 closure contexts, per forward; gradients accumulated): the
    loss, every parameter's raw gradient and the logged log-probs (of real tokens) are the
    one-forward update's, to float32 summation-order noise (the parts are sums with the whole
    batch's denominators)."""
    report, *_ = iteration
    rollouts = report.rollouts
    assert len(rollouts) > 3 and report.closure_terms > 3  # several micro-batches of each kind
    unclipped = replace(CONFIG, max_grad_norm=0.0)
    runs = []
    for config in (unclipped, replace(unclipped, micro_batch=3)):
        model, tokenizer = load_policy(checkpoint)
        updated = update_from_rollouts(model, tokenizer, rollouts, config, epsilon=EPSILON)
        runs.append((updated, {n: p.grad.clone() for n, p in model.named_parameters() if p.grad is not None}))
    (whole, grads), (micro, micro_grads) = runs
    print(f"\nmicro-batched vs one forward: loss {abs(micro.loss - whole.loss):.2e}, "
          f"max gradient difference {max((micro_grads[n] - g).abs().max().item() for n, g in grads.items()):.2e}")
    assert (micro.policy_tokens, micro.masked_tokens, micro.closure_terms, micro.total_turns) == (
        whole.policy_tokens, whole.masked_tokens, whole.closure_terms, whole.total_turns)
    assert micro.loss == pytest.approx(whole.loss, rel=1e-5, abs=1e-7)
    assert micro.closure_loss == pytest.approx(whole.closure_loss, rel=1e-5)
    real = whole.batch.attention_mask.bool()  # a micro-batch is cut to its own longest rollout: no pads' values
    assert torch.allclose(micro.logp_new[real], whole.logp_new[real], atol=RECOMPUTE_ATOL)
    assert torch.allclose(micro.closure_logprobs, whole.closure_logprobs, atol=RECOMPUTE_ATOL)
    assert grads.keys() == micro_grads.keys() and grads
    for name, grad in grads.items():
        assert torch.allclose(micro_grads[name], grad, rtol=1e-4, atol=1e-6), name


def _update(checkpoint, rollouts, config, **kwargs):
    model, tokenizer = load_policy(checkpoint)
    report = update_from_rollouts(model, tokenizer, rollouts, config, epsilon=EPSILON, **kwargs)
    return report, model


def test_rows_of_advantage_zero_left_out_of_the_backward_change_no_gradient(checkpoint, iteration):
    """The same update with and without the rows whose advantage is zero: the same loss and, parameter
    by parameter, the same raw gradient (their surrogate is ρ·0); the skipped rows are counted."""
    rollouts = iteration[0].rollouts
    unclipped = replace(CONFIG, max_grad_norm=0.0)
    (skipping, model), (every, full) = (_update(checkpoint, rollouts, unclipped, skip_idle_rows=skip)
                                        for skip in (True, False))
    idle = int((skipping.batch.advantages == 0).sum())
    assert idle > 0 and skipping.counts["skipped_rows"] == idle and every.counts["skipped_rows"] == 0
    assert skipping.counts["trained_tokens"] < every.counts["trained_tokens"]
    assert skipping.loss == pytest.approx(every.loss, rel=1e-6, abs=1e-9)
    grads = {n: p.grad for n, p in full.named_parameters()}
    for name, p in model.named_parameters():
        assert torch.allclose(p.grad, grads[name], rtol=1e-5, atol=1e-8), name


def test_mini_batches_take_one_step_each_with_their_own_denominators(checkpoint, iteration):
    """`mini_batch` 4 over 16 rollouts, two epochs: eight optimizer steps, the rows in a seeded order
    that changes with the epoch and the iteration; logp_old is the trainer's before the first step, so
    the first step's ratio is 1 and the later ones' move."""
    from race_core.train.rl import mini_batches

    rollouts = iteration[0].rollouts
    config = replace(CONFIG, mini_batch=4, epochs=2)
    plan = mini_batches(len(rollouts), config, 0)
    assert len(plan) == 8 and all(sorted(sum(plan[e * 4:(e + 1) * 4], [])) == list(range(16)) for e in (0, 1))
    assert plan[:4] != plan[4:] and mini_batches(len(rollouts), config, 1) != plan  # epoch and iteration reorder
    assert mini_batches(len(rollouts), config, 0) == plan  # seeded
    report, _ = _update(checkpoint, rollouts, config)
    assert len(report.losses) == len(report.grad_norms) == 8 and "old_logprobs" in report.phases
    on = report.batch.policy_mask & report.forwarded[:, None]
    first = plan[0]
    rows = [r for r in first if report.forwarded[r]]
    assert torch.allclose(report.logp_new[rows][on[rows]], report.batch.logp_old[rows][on[rows]], atol=1e-6)


def test_the_closure_only_arm_masks_nothing_and_supervises_closure(checkpoint, iteration):
    """`mask_reasoning` off (the paper's "without the reasoning mask"): the cover still runs and its
    closure terms train, but every generated reasoning token keeps its policy gradient."""
    cover_aware = iteration[0]
    report, _ = _update(checkpoint, cover_aware.rollouts, replace(CONFIG, mask_reasoning=False))
    assert report.masked_tokens == 0 and not report.batch.skipped_mask.any()
    assert report.closure_terms == cover_aware.closure_terms > 0 and report.covers.keys() == cover_aware.covers.keys()


def test_the_adaptthink_reward_adds_the_share_of_turns_without_reasoning_to_successes():
    from race_core.rollout import Rollout
    from race_core.schema import Turn
    from race_core.train.rl import shaped_reward

    turns = [Turn("think", "calc[1+1]", "2"), Turn("", "finish[2]", "done")]
    won = Rollout(task_id="t", group=0, sample_index=0, question="q", prompt_length=0, turns=turns, success=True,
                  reward=1.0)
    lost = Rollout(task_id="t", group=0, sample_index=1, question="q", prompt_length=0, turns=turns, reward=0.0)
    config = replace(CONFIG, skip_bonus=0.05)
    assert shaped_reward(won, config) == pytest.approx(1.0 + 0.05 * 0.5)
    assert shaped_reward(lost, config) == 0.0 and shaped_reward(won, CONFIG) == 1.0


def test_the_optimizer_state_saved_and_loaded_takes_the_next_step_bit_for_bit(checkpoint, iteration, tmp_path):
    """Two updates in a row with one optimizer, against the first update, its optimizer saved to
    safetensors and loaded into a fresh AdamW over a reloaded model, then the second: equal weights."""
    from race_core.policy import save_policy
    from race_core.train.optimizer_state import load_optimizer, save_optimizer
    from race_core.train.rl import make_optimizer

    rollouts = iteration[0].rollouts
    model, tokenizer = load_policy(checkpoint)
    optimizer = make_optimizer(model, CONFIG)
    update_from_rollouts(model, tokenizer, rollouts, CONFIG, optimizer=optimizer, epsilon=EPSILON, iteration=0)
    save_policy(model, tokenizer, tmp_path / "policy")
    save_optimizer(optimizer, model, tmp_path / "optimizer")
    update_from_rollouts(model, tokenizer, rollouts, CONFIG, optimizer=optimizer, epsilon=EPSILON, iteration=1)

    again, tokenizer = load_policy(tmp_path / "policy")
    fresh = make_optimizer(again, CONFIG)
    load_optimizer(fresh, again, tmp_path / "optimizer")
    update_from_rollouts(again, tokenizer, rollouts, CONFIG, optimizer=fresh, epsilon=EPSILON, iteration=1)
    for (name, p), q in zip(model.named_parameters(), again.parameters(), strict=True):
        assert torch.equal(p, q), name
    with pytest.raises(ValueError, match="a AdamW's|not a SGD"):
        load_optimizer(torch.optim.SGD(again.parameters(), lr=0.1), again, tmp_path / "optimizer")
