"""Fitting a tiny policy until it provably plays its training episodes, whatever the CPU's kernels.

A test that asserts what a fitted policy does after a fixed number of SFT steps asserts a margin of
one machine: the same steps reach slightly different weights on another CPU's kernels, and a policy
that is barely fitted then writes another episode. `fit_until_greedy` instead trains until greedy
decoding provably writes every training episode (teacher-forced: at every token the policy writes,
the argmax of the model's next-token distribution is that token, stop tokens included), so the
greedy policy replays them exactly on any machine once this returns.
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

from race_core.render import Renderer, Role
from race_core.schema import Trajectory

WRITTEN = (Role.OPEN, Role.REASONING, Role.CLOSE, Role.ACTION_PREFIX, Role.ACTION)


def greedy_misses(model, renderer: Renderer, trajectories: Sequence[Trajectory]) -> int:
    """How many tokens the policy writes in `trajectories` (each turn's tokens from its open marker
    to its stop token) are not the argmax of the model's next-token distribution at that point."""
    misses = 0
    model.eval()
    with torch.no_grad():
        for trajectory in trajectories:
            rendered = renderer.render(trajectory)
            ids = torch.as_tensor(rendered.input_ids, dtype=torch.long)[None]
            predicted = model(input_ids=ids).logits[0].argmax(-1)
            roles = rendered.roles.tolist()
            written = [p for p, role in enumerate(roles) if role in WRITTEN]
            written += [p for p, role in enumerate(roles) if role == Role.END and roles[p - 1] != Role.END]  # the stop
            misses += sum(int(predicted[p - 1]) != int(rendered.input_ids[p]) for p in written)
    return misses


def fit_until_greedy(model, tokenizer, trajectories: Sequence[Trajectory], sft, rounds: int = 8) -> int:
    """Train `model` in place with `sft` (a `SFTConfig`) until `greedy_misses` is 0, at most `rounds`
    times; returns the SFT rounds it took. Fails the test (AssertionError) when it does not fit."""
    from race_core.train.sft import train_sft

    renderer = Renderer(tokenizer)
    for done in range(rounds + 1):
        misses = greedy_misses(model, renderer, trajectories)
        if misses == 0:
            return done
        if done < rounds:
            train_sft(model, tokenizer, list(trajectories), sft)
    raise AssertionError(f"the policy still misses {misses} greedy tokens of its training episodes after {rounds} "
                         "rounds of SFT")
