"""SFT and the RL update across processes (docs/architecture.md §8): the training stages launch 2 CPU processes
(torchrun, gloo) that give the 1-process step losses and weights of the same global batch within
the float noise measured here (the 1-process run regrouped: the same examples summed in another
order); a killed process fails the stage with an error that says which and where a rerun resumes,
and the rerun resumes there; process count and gradient checkpointing leave the stage key alone,
mixed precision does not; an accelerate config of two hosts trains as two processes on one.

Two hosts are two `race train-node`-joined launches on 127.0.0.1. Each 2-process launch takes 20-40 s
here (starting the processes dominates): five launches, about four minutes in all.
"""

from __future__ import annotations

import dataclasses
import logging

import numpy as np
import pytest
import torch

from race_core.config import Resources, RLConfig, SFTConfig, replace
from race_core.envs.expert import expert_dataset
from race_core.policy import load_policy
from race_core.schema import Turn
from race_core.train.bootstrap import SMOKE
from race_core.train.distributed import FAULT_ENV
from storage import ArtifactStore
from storage.parquet import compressed_row, write_dataset_to_store
from tasks.summary import summarize
from tasks.training_stages import PolicyRef, materialize, rl_update, sample, sft

SFT = SFTConfig(lr=1e-2, steps=6, batch_size=4, seed=0)
# test_rl's batch: the SMOKE policy's own training tasks, whose groups mix successes and failures
RL = RLConfig(tasks_per_iteration=SMOKE.expert_tasks, group_size=4, temperature=1.0, max_new_tokens=64, max_turns=4,
              lr=1e-3, seed=SMOKE.expert_seed, difficulty=SMOKE.difficulty, epochs=2)
EPSILON = 10.0  # every removal accepted: the batch has masked tokens and closure terms


@pytest.fixture(scope="module")
def cache(tmp_path_factory):
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path_factory.mktemp("train") / "checkpoints"))
        yield


@pytest.fixture(scope="module")
def compressed(tmp_path_factory):
    """A store holding compressed expert trajectories, turn 1's reasoning removed in every other one."""
    store = ArtifactStore(str(tmp_path_factory.mktemp("train-store")))
    rows = []
    for k, trajectory in enumerate(expert_dataset(12, seed=4, difficulty=1)):
        skipped = [1] if k % 2 and len(trajectory.turns) > 1 else []
        turns = tuple(Turn("", t.action, t.observation) if i in skipped else t for i, t in enumerate(trajectory.turns))
        rows.append(compressed_row(dataclasses.replace(trajectory, turns=turns), skipped, 0, 0,
                                   "test", EPSILON))
    digest, _ = write_dataset_to_store(store, "compressed", rows)
    return store, digest


def _weights(store, manifest) -> dict[str, torch.Tensor]:
    model, _ = load_policy(materialize(store, manifest["objects"]["checkpoint"]))
    return {k: v.detach().clone() for k, v in model.state_dict().items()}


def _max_diff(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[k] - b[k]).abs().max()) for k in a)


def _norm(a: dict[str, torch.Tensor], b: dict[str, torch.Tensor]) -> float:
    """The L2 norm of the difference of two sets of weights (all tensors together)."""
    assert a.keys() == b.keys()
    return float(torch.sqrt(sum(((a[k].double() - b[k].double()) ** 2).sum() for k in a)))


def _tolerance(noise: float, scale: float) -> float:
    """Ten times the measured noise, and never under float32's resolution at this scale."""
    return 10 * max(noise, float(np.finfo(np.float32).eps) * scale)


@pytest.fixture(scope="module")
def sft_runs(cache, compressed, smoke_policy):
    store, digest = compressed
    base = PolicyRef.local(smoke_policy)
    one = sft(store, digest, base, SFT, Resources())
    regrouped = sft(store, digest, base, replace(SFT, batch_size=2, grad_accumulation=2), Resources())
    two = sft(store, digest, base, SFT, Resources(train_processes=2), force=True)  # the same key as `one`
    runs = {name: (run, _weights(store, run)) for name, run in (("one", one), ("regrouped", regrouped), ("two", two))}
    return {**runs, "before": (None, {k: v.clone() for k, v in load_policy(smoke_policy)[0].state_dict().items()})}


def _compare(name: str, runs: dict[str, dict], weights: dict[str, dict], noise_runs: tuple[str, ...]) -> None:
    """Losses, gradient norms (they show a wrongly scaled gradient that Adam's update would hide) and
    weights of the 2-process run against the 1-process one, each within ten times the largest
    difference between the 1-process run and its regroupings (`noise_runs`)."""
    for figure in ("step_losses", "grad_norms"):
        values = {k: np.array(run[figure]) for k, run in runs.items()}
        noise = max(float(np.abs(values[k] - values["one"]).max()) for k in noise_runs)
        tolerance = _tolerance(noise, float(np.abs(values["one"]).max()))
        diff = float(np.abs(values["two"] - values["one"]).max())
        print(f"{name} {figure}: 2 processes vs 1 differ by {diff:.3g}; the 1-process noise is {noise:.3g}; "
              f"tolerance {tolerance:.3g}")
        assert len(values["two"]) == len(values["one"]) and diff <= tolerance, figure
    # weights: how far apart the updates are, relative to the update (Adam turns float noise in a
    # near-zero gradient into a sizeable step of that one weight, so a largest difference says little)
    update = _norm(weights["one"], weights["before"])
    noise = max(_norm(weights[k], weights["one"]) for k in noise_runs) / update
    diff = _norm(weights["two"], weights["one"]) / update
    print(f"{name} weights: the 2-process update differs from the 1-process one by {diff:.3g} of its size; "
          f"the 1-process noise is {noise:.3g}")
    assert diff <= _tolerance(noise, 1.0)


def test_two_processes_give_the_one_process_sft_losses_and_weights(sft_runs):
    one, two = sft_runs["one"][0], sft_runs["two"][0]
    assert (one["metrics"]["processes"], two["metrics"]["processes"]) == (1, 2)
    assert two["metrics"]["distributed_type"] == "MULTI_CPU" and len(two["metrics"]["step_losses"]) == SFT.steps
    assert two["metrics"]["target_tokens"] == one["metrics"]["target_tokens"]  # counted over both processes
    assert one["metrics"]["step_losses"][-1] < one["metrics"]["step_losses"][0]  # it trained
    _compare("sft", {k: run["metrics"] for k, (run, _) in sft_runs.items() if run is not None},
             {k: w for k, (_, w) in sft_runs.items()}, ("regrouped",))
    summary = summarize({"sft": {**two, "cached": False}})
    assert summary["training"]["sft"]["processes"] == 2
    assert summary["training"]["sft"]["step_losses"] == two["metrics"]["step_losses"]


def test_two_processes_give_the_one_process_rl_update(cache, tmp_path, smoke_policy):
    from race_core.rollout import rollouts_from_json
    from race_core.train.rl import update_from_rollouts

    store = ArtifactStore(str(tmp_path / "store"))
    policy = PolicyRef.local(smoke_policy)
    rollouts = sample(store, policy, RL, Resources(), 0)["objects"]["rollouts"]
    one = rl_update(store, policy, rollouts, RL, EPSILON, Resources(), 0)
    two = rl_update(store, policy, rollouts, RL, EPSILON, Resources(train_processes=2), 0)
    runs = {"one": one["metrics"], "two": two["metrics"]}
    weights = {"one": _weights(store, one), "two": _weights(store, two),
               "before": {k: v.clone() for k, v in load_policy(smoke_policy)[0].state_dict().items()}}
    # the noise: the same update in one process with the rows in other orders (summed in another order)
    batch = rollouts_from_json(store.get_bytes(rollouts).decode("utf-8"))
    order = np.random.default_rng(0).permutation(len(batch))
    for name, reordered in (("reversed", batch[::-1]), ("shuffled", [batch[i] for i in order])):
        model, tokenizer = load_policy(smoke_policy)
        report = update_from_rollouts(model, tokenizer, reordered, RL, epsilon=EPSILON)
        runs[name], weights[name] = report.summary(), {k: v.detach().clone() for k, v in model.state_dict().items()}
    assert (runs["one"]["processes"], runs["two"]["processes"]) == (1, 2)
    assert runs["one"]["masked_tokens"] > 0 and runs["one"]["closure_terms"] > 0  # the cover-aware terms in play
    for count in ("policy_tokens", "total_turns", "masked_tokens", "closure_terms"):  # all-reduced: global
        assert runs["two"][count] == runs["one"][count] == runs["reversed"][count], count
    _compare("rl", runs, weights, ("reversed", "shuffled"))


def test_a_killed_process_fails_the_stage_clearly_and_the_rerun_resumes_from_the_saved_step(
        sft_runs, compressed, smoke_policy, tmp_path, monkeypatch, caplog):
    from race_core.train.launch import TrainingFailed

    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "checkpoints"))
    digest = compressed[1]
    store = _fresh_store(compressed, tmp_path)  # without the clean run's manifest: this one computes
    resources = Resources(train_processes=2, train_save_every=2)
    monkeypatch.setenv(FAULT_ENV, "1:3")  # rank 1 is SIGKILLed right after optimizer step 3
    with pytest.raises(TrainingFailed) as failed:
        sft(store, digest, PolicyRef.local(smoke_policy), SFT, resources)
    message = str(failed.value)
    print(message.splitlines()[0])
    assert "rank 1 was killed by signal 9 (SIGKILL)" in message
    assert "the last saved training state is step 2" in message and "a rerun resumes from it" in message

    monkeypatch.delenv(FAULT_ENV)
    caplog.set_level(logging.INFO)
    caplog.clear()
    rerun = sft(store, digest, PolicyRef.local(smoke_policy), SFT, resources)
    lines = caplog.messages
    assert any("resuming from step 2" in line for line in lines), lines
    assert not any("sft: step 1/" in line or "sft: step 2/" in line for line in lines)  # steps 1-2 not redone
    assert rerun["metrics"]["resumed_from_step"] == 2
    clean, w_clean = sft_runs["two"]
    resumed = np.array(rerun["metrics"]["step_losses"])
    loss_diff = float(np.abs(resumed - np.array(clean["metrics"]["step_losses"])).max())
    weight_diff = _max_diff(_weights(store, rerun), w_clean)
    print(f"resumed vs uninterrupted 2-process run: loss {loss_diff:.3g}, weights {weight_diff:.3g}")
    assert loss_diff <= _tolerance(0.0, float(resumed.max())) and weight_diff <= _tolerance(0.0, 1.0)
    assert not (tmp_path / "train-state").exists() or not any((tmp_path / "train-state").iterdir())


def _fresh_store(compressed, tmp_path) -> ArtifactStore:
    """A store holding only the compressed trajectories (no manifest: the stage computes)."""
    source, digest = compressed
    store = ArtifactStore(str(tmp_path / "store"))
    assert store.put_file(source.get_file(digest, tmp_path / "compressed.parquet")) == digest
    return store


def test_two_hosts_train_as_two_processes_on_one(sft_runs, compressed, smoke_policy, tmp_path, monkeypatch, caplog):
    """An accelerate config of 2 hosts (here both on 127.0.0.1, one process each): the stage runs host
    0 and logs the command for host 1; `race train-node` joins with it; the losses are the 2-process ones."""
    import socket
    import subprocess
    import sys
    import threading

    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "checkpoints"))
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    config = tmp_path / "hosts.yaml"
    config.write_text(f"distributed_type: MULTI_CPU\nnum_machines: 2\nnum_processes: 2\nmachine_rank: 0\n"
                      f"main_process_ip: 127.0.0.1\nmain_process_port: {port}\nmixed_precision: 'no'\n")
    store = _fresh_store(compressed, tmp_path)
    caplog.set_level(logging.INFO, logger="tasks")
    result: dict = {}

    def host0() -> None:
        try:
            result["manifest"] = sft(store, compressed[1], PolicyRef.local(smoke_policy), SFT,
                                     Resources(accelerate_config=str(config)))
        except BaseException as exc:  # noqa: BLE001 - reported below
            result["error"] = exc

    thread = threading.Thread(target=host0)
    thread.start()
    command = None
    for _ in range(600):
        command = next((line.split(" run: ", 1)[1] for line in caplog.messages if "on host 1 run: " in line), None)
        if command or not thread.is_alive():
            break
        thread.join(0.2)
    assert command is not None, (caplog.messages, result)
    assert command.startswith("race train-node --store ") and "--machine-rank 1" in command
    joined = subprocess.run([sys.executable, "-m", "flows.cli", *command.split()[1:]], capture_output=True,
                            text=True, timeout=600)
    thread.join(600)
    assert not thread.is_alive() and "error" not in result, (result, joined.stderr[-3000:])
    assert joined.returncode == 0, joined.stderr[-3000:]
    metrics = result["manifest"]["metrics"]
    assert metrics["processes"] == 2 and metrics["distributed_type"] == "MULTI_CPU"
    clean = np.array(sft_runs["two"][0]["metrics"]["step_losses"])
    diff = float(np.abs(np.array(metrics["step_losses"]) - clean).max())
    print(f"2 hosts x 1 process vs 1 host x 2 processes: step losses differ by {diff:.3g}")
    assert diff <= _tolerance(0.0, float(clean.max()))


def test_process_count_and_gradient_checkpointing_keep_the_stage_key_mixed_precision_changes_it(
        compressed, tiny_checkpoint, tmp_path, monkeypatch):
    monkeypatch.setenv("RACE_CHECKPOINT_CACHE", str(tmp_path / "checkpoints"))
    store, digest = compressed
    base, config = PolicyRef.local(tiny_checkpoint), SFTConfig(steps=1, batch_size=2)
    first = sft(store, digest, base, config, Resources())
    same = sft(store, digest, base, config, Resources(train_processes=2, gradient_checkpointing=True,
                                                      train_save_every=3))
    assert same["cached"] and same["objects"] == first["objects"]
    autocast = sft(store, digest, base, config, Resources(mixed_precision="bf16"))
    assert not autocast["cached"] and autocast["config"]["mixed_precision"] == "bf16"
    assert "mixed_precision" not in first["config"]  # the default leaves existing keys as they were


def test_gradient_checkpointing_gives_the_same_losses_and_bf16_autocast_trains(tiny_checkpoint):
    from race_core.train.distributed import TrainOptions
    from race_core.train.sft import train_sft

    data = expert_dataset(8, seed=2, difficulty=1)
    config = SFTConfig(lr=1e-2, steps=3, batch_size=4, seed=1)
    runs = {}
    for name, options in (("plain", TrainOptions()), ("checkpointed", TrainOptions(gradient_checkpointing=True)),
                          ("bf16", TrainOptions(mixed_precision="bf16"))):
        model, tokenizer = load_policy(tiny_checkpoint)
        report = train_sft(model, tokenizer, data, config, options=options)
        runs[name] = report
        assert not model.is_gradient_checkpointing and report.extra["mixed_precision"] == options.mixed_precision
        assert next(model.parameters()).dtype == torch.float32  # autocast leaves the weights in their dtype
    plain, checkpointed, bf16 = (np.array(runs[k].losses) for k in ("plain", "checkpointed", "bf16"))
    assert np.abs(checkpointed - plain).max() <= _tolerance(0.0, float(plain.max()))
    assert np.isfinite(bf16).all() and not np.array_equal(bf16, plain)  # bf16 arithmetic: close, not equal
    assert np.abs(bf16 - plain).max() < 0.05 * plain.max()
