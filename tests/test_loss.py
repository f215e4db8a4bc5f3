import pytest
import torch

from race_core.loss import cover_aware_loss, grpo_advantages, sft_loss


def test_worked_example_of_design_section_5():
    logp_new = torch.zeros(2, 3, requires_grad=True)
    logp_old = torch.zeros(2, 3)
    policy = torch.ones(2, 3, dtype=torch.bool)
    skipped = torch.zeros(2, 3, dtype=torch.bool)
    skipped[0, 1] = True
    closure = torch.tensor([-2.0], requires_grad=True)
    loss = cover_aware_loss(logp_new, logp_old, torch.ones(2), policy, skipped, closure, total_turns=4)
    assert loss.item() == pytest.approx(-5 / 6 + 0.01, abs=1e-7)
    loss.backward()
    assert logp_new.grad[0, 1].item() == 0.0
    assert logp_new.grad[1, 2].item() == pytest.approx(-1 / 6, abs=1e-7)
    assert closure.grad[0].item() == pytest.approx(-0.02 / 4, abs=1e-9)


def test_denominator_counts_masked_policy_tokens_and_ignores_context():
    logp = torch.zeros(1, 4)
    policy = torch.tensor([[True, True, True, False]])
    skipped = torch.tensor([[True, True, False, False]])
    loss = cover_aware_loss(logp, logp, torch.ones(1), policy, skipped, torch.zeros(0), total_turns=1)
    assert loss.item() == pytest.approx(-1 / 3)


def test_ratio_is_clipped_for_positive_advantage():
    logp_new = torch.log(torch.tensor([[2.0]])).requires_grad_()
    loss = cover_aware_loss(logp_new, torch.zeros(1, 1), torch.ones(1), torch.ones(1, 1, dtype=torch.bool),
                            torch.zeros(1, 1, dtype=torch.bool), torch.zeros(0), total_turns=1)
    assert loss.item() == pytest.approx(-1.2)
    loss.backward()
    assert logp_new.grad.item() == 0.0


@pytest.mark.parametrize(("ratio", "advantage", "expected_loss", "expected_grad"), [
    # ρ = 0.5 < 1 − c, A = +1: ρA = 0.5, clip(ρ)A = 0.8; min = 0.5, the UNclipped term: loss −0.5,
    # d loss / d logp_new = −ρA = −0.5 (a loss of the clipped term alone gives −0.8 and gradient 0)
    (0.5, 1.0, -0.5, -0.5),
    # ρ = 1.5 > 1 + c, A = −1: ρA = −1.5, clip(ρ)A = −1.2; min = −1.5, the UNclipped term: loss 1.5,
    # gradient −ρA = +1.5 (the clipped term alone: 1.2 and 0)
    (1.5, -1.0, 1.5, 1.5),
    # ρ = 0.5, A = −1: ρA = −0.5, clip(ρ)A = −0.8; min = −0.8, the clipped term: loss 0.8, gradient 0
    (0.5, -1.0, 0.8, 0.0),
])
def test_the_surrogate_is_the_pessimistic_min_of_the_clipped_and_unclipped_terms(ratio, advantage,
                                                                                  expected_loss, expected_grad):
    logp_new = torch.log(torch.tensor([[ratio]])).requires_grad_()
    one_policy_token = torch.ones(1, 1, dtype=torch.bool)
    loss = cover_aware_loss(logp_new, torch.zeros(1, 1), torch.tensor([advantage]), one_policy_token,
                            ~one_policy_token, torch.zeros(0), total_turns=1, clip=0.2)
    assert loss.item() == pytest.approx(expected_loss, abs=1e-6)
    loss.backward()
    assert logp_new.grad.item() == pytest.approx(expected_grad, abs=1e-6)


def test_per_token_advantages_are_accepted():
    adv = torch.tensor([[1.0, -1.0]])
    loss = cover_aware_loss(torch.zeros(1, 2), torch.zeros(1, 2), adv, torch.ones(1, 2, dtype=torch.bool),
                            torch.zeros(1, 2, dtype=torch.bool), torch.zeros(0), total_turns=1)
    assert loss.item() == pytest.approx(0.0)


def test_grpo_advantages_normalise_within_groups():
    adv = grpo_advantages([1, 0, 0, 1, 1, 1, 0], ["a", "a", "a", "b", "b", "b", "c"])
    a = adv[:3]
    assert a[0] > 0 > a[1] and a[1] == a[2]
    assert a.sum().item() == pytest.approx(0, abs=1e-6)
    assert torch.all(adv[3:6] == 0)  # equal rewards: no signal
    assert adv[6] == 0  # a group of one
    assert a[0].item() == pytest.approx((1 - 1 / 3) / (torch.tensor([1.0, 0, 0]).std().item() + 1e-6), rel=1e-5)


def test_sft_loss_counts_only_target_tokens():
    vocab = 5
    logits = torch.zeros(1, 4, vocab)
    logits[0, 0, 2] = 10.0  # predicts token 1's successor well
    ids = torch.tensor([[0, 2, 3, 4]])
    only_first = torch.tensor([[False, True, False, False]])
    loss = sft_loss(logits, ids, only_first)
    expected = -torch.log_softmax(logits[0, 0], -1)[2]
    assert loss.item() == pytest.approx(expected.item(), rel=1e-6)
    all_targets = torch.tensor([[False, True, True, True]])
    assert sft_loss(logits, ids, all_targets).item() > loss.item()
