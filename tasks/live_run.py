"""What an RL run keeps across its iterations in its process (`tasks.rl_run`): the trainer (the
policy's model, tokenizer and AdamW optimizer) and the sampler that plays the policy (the process's
shared vLLM engine, `race_core.sampling.shared`, or with `hf` the trainer's own model), and the
local checkpoint folders of the policies it wrote, removed once superseded. A run whose updates go
to launched training processes keeps only their outputs' names here (the policy and the optimizer
state's object), and a model for sampling with `hf`.
"""

from __future__ import annotations

import shutil
import uuid
from pathlib import Path
from typing import Any

from race_core.config import Resources, RLConfig
from storage import ArtifactStore, put_checkpoint
from tasks.policy_ref import PolicyRef, checkpoint_cache


class LiveRun:
    """What an RL run keeps across its iterations in this process: the trainer (model, tokenizer,
    optimizer: the policy of the iteration at hand) and the sampler that plays it. Built lazily: a run
    whose samples and evaluations are all cached builds no engine. `phases` holds the seconds spent
    building the engine and loading weights into it since it was last cleared."""

    def __init__(self, store: ArtifactStore, start: PolicyRef, config: RLConfig, resources: Resources,
                 keep: bool = True):
        self.store, self.start, self.config, self.resources = store, start, config, resources
        self.keep = keep  # off: the baseline that closes everything after each iteration (`rl_run(live=False)`)
        self.model = self.tokenizer = self.optimizer = self.renderer = None
        self.holds: PolicyRef | None = None  # the policy the trainer's model holds
        self.current = start  # the run's policy: the one the next update trains
        self.other: tuple[str, Any] | None = None  # with `hf`: (digest, sampler) of another policy of the run's
        self.engine = None  # the process's vLLM engine (`race_core.sampling.shared`), holding `engine_holds`
        self.engine_holds: PolicyRef | None = None
        self.created: list[Path] = []  # local checkpoint folders this run wrote (removed when superseded)
        self.superseded: list[PolicyRef] = []
        self.phases: dict[str, float] = {}
        self.engine_starts = 0  # engines this run built (0: it found the process's engine of another stage)
        self.optimizer_state: str | None = None  # the store object of the optimizer state last saved or restored
        self.launched: tuple[PolicyRef, str] | None = None  # a launched update's policy and optimizer state

    def __enter__(self) -> LiveRun:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    # -- the trainer ------------------------------------------------------------------------------
    def _trainer(self, policy: PolicyRef) -> None:
        if self.model is not None:
            if self.holds.digest != policy.digest:
                raise RuntimeError(f"the RL run's trainer holds policy {self.holds.digest[:12]}, not {policy.digest[:12]}")
            return
        from race_core.render import Renderer
        from race_core.train.rl import make_optimizer

        self.model, self.tokenizer = policy.load(self.store, self.resources)
        self.renderer = Renderer(self.tokenizer)
        self.optimizer = make_optimizer(self.model, self.config)
        self.holds = policy

    def restore(self, policy: PolicyRef, optimizer: str) -> None:
        """The trainer at a saved state: the policy's checkpoint and the optimizer's state object."""
        import tempfile

        from race_core.train.optimizer_state import load_optimizer
        from tasks.training_runs import launches

        self.close_trainer()
        self.optimizer_state, self.current = optimizer, policy
        if launches(self.resources):  # the launched processes load them
            return
        self._trainer(policy)
        with tempfile.TemporaryDirectory(prefix="race-optimizer-") as tmp:
            load_optimizer(self.optimizer, self.model, self.store.restore_folder(optimizer, tmp))

    def close_trainer(self) -> None:
        self.model = self.tokenizer = self.optimizer = self.renderer = self.holds = None

    def update(self, rollouts, rollouts_digest: str, iteration: int, epsilon: float) -> dict[str, Any]:
        """One update of the trainer's policy on its rollouts: the update's metrics (`RLReport.summary`).
        In launched training processes (`resources`), one launch on the stored rollouts, its optimizer
        continuing from the state the last one saved."""
        from race_core.memory import release_freed_memory
        from race_core.train.distributed import TrainOptions
        from race_core.train.rl import update_from_rollouts
        from tasks.training_runs import launches

        policy = self.current
        if launches(self.resources):
            return self._launched_update(policy, rollouts_digest, iteration, epsilon)
        self._trainer(policy)
        report = update_from_rollouts(self.model, self.tokenizer, rollouts, self.config, optimizer=self.optimizer,
                                      renderer=self.renderer, epsilon=epsilon, iteration=iteration,
                                      skip_idle_rows=self.keep,
                                      options=TrainOptions(mixed_precision=self.resources.mixed_precision,
                                                           gradient_checkpointing=self.resources.gradient_checkpointing))
        self.optimizer.zero_grad(set_to_none=True)
        self.holds = None  # the weights moved: `save` names them
        release_freed_memory()
        return report.summary()

    def _launched_update(self, policy: PolicyRef, rollouts_digest: str, iteration: int, epsilon: float
                         ) -> dict[str, Any]:
        import hashlib

        from tasks.training_runs import rl_compute, train_state_root

        # named by what the launch computes: a retried launch resumes from the state its processes saved
        what = repr((policy.digest, rollouts_digest, iteration, epsilon, self.optimizer_state, self.config,
                     self.resources))
        state = train_state_root() / f"rl-{hashlib.sha256(what.encode()).hexdigest()[:24]}"
        done = rl_compute(self.store, policy, rollouts_digest, self.config, epsilon, self.resources, state,
                          optimizer=self.optimizer_state or "", iteration=iteration)
        self.launched = (PolicyRef.of(done), done["optimizer"])
        self.close_trainer()  # a model this process held for sampling is the old policy's
        return done["metrics"]

    def save(self, store: ArtifactStore) -> tuple[PolicyRef, str]:
        """The trainer's policy and optimizer state into the store: (the policy, the state's object).
        The checkpoint folder stays in this host's checkpoint cache, where the engine reads it."""
        import tempfile

        from race_core.policy import checkpoint_digest, save_policy
        from race_core.train.optimizer_state import save_optimizer

        if self.launched is not None:  # stored by the launch; its folder here is the engine's copy, removed in turn
            (self.current, self.optimizer_state), self.launched = self.launched, None
            if not (checkpoint_cache() / self.current.folder).exists():  # not another run's or stage's copy
                self.created.append(checkpoint_cache() / self.current.folder)
            return self.current, self.optimizer_state
        cache = checkpoint_cache()
        cache.mkdir(parents=True, exist_ok=True)
        staging = cache / f".rl-{uuid.uuid4().hex}"
        try:
            save_policy(self.model, self.tokenizer, staging)
            folder = put_checkpoint(store, staging)
            digest = checkpoint_digest(staging)
            target = cache / folder
            if (target / ".complete").exists():
                shutil.rmtree(staging)
            else:
                shutil.rmtree(target, ignore_errors=True)
                staging.rename(target)
                (target / ".complete").write_text(folder)
                self.created.append(target)
        finally:
            shutil.rmtree(staging, ignore_errors=True)
        with tempfile.TemporaryDirectory(prefix="race-optimizer-") as tmp:
            self.optimizer_state = store.put_folder(save_optimizer(self.optimizer, self.model, tmp))
        self.holds = self.current = PolicyRef(digest=digest, folder=folder)
        return self.holds, self.optimizer_state

    # -- the sampler --------------------------------------------------------------------------------
    def sampler(self, policy: PolicyRef, purpose: str):
        """A sampler that plays `policy` (`purpose`: sample or evaluate, whose stages batch alike)."""
        if self.config.sampler == "hf":
            from race_core.sampling.hf import HFSampler

            batch = 32 if purpose == "sample" else 64  # as the sample and evaluate stages batch their own
            if policy.digest != self.current.digest:  # another policy of the run's (an evaluation of an earlier one)
                if self.other is None or self.other[0] != policy.digest:
                    model, tokenizer = policy.load(self.store, self.resources)
                    self.other = (policy.digest, HFSampler(model, tokenizer, batch_size=batch))
                return self.other[1]
            self.other = None
            self._trainer(policy)
            return HFSampler(self.model, self.tokenizer, renderer=self.renderer, batch_size=batch)
        if self.engine is None or self.engine_holds.digest != policy.digest:  # the process's engine, this policy in it
            from race_core.sampling.shared import shared_sampler

            self.engine = shared_sampler(policy.local_path(self.store), device=self.resources.device,
                                         dtype=self.resources.dtype, digest=policy.digest,
                                         **self.resources.sampler_options(self.config.sampler))
            self.engine_holds = policy
            self.engine_starts += self.engine.built
            self.phases.update(self.engine.seconds)
            self._sweep()
        return self.engine

    def lazy_sampler(self, policy: PolicyRef, purpose: str) -> _LazySampler:
        """`sampler(policy, purpose)`, made (the engine built, the weights loaded) only when a stage
        that is not cached plays something."""
        return _LazySampler(self, policy, purpose)

    def forget(self, policy: PolicyRef) -> None:
        """`policy` is superseded: its local checkpoint folder goes once no sampler reads it, if this
        run wrote it."""
        self.superseded.append(policy)
        self._sweep()

    def _sweep(self) -> None:
        for policy in list(self.superseded):
            if self.engine_holds is not None and self.engine_holds.digest == policy.digest:
                continue
            self.superseded.remove(policy)
            folder = checkpoint_cache() / policy.folder if policy.folder else None
            if folder in self.created:
                shutil.rmtree(folder, ignore_errors=True)
                self.created.remove(folder)

    def close(self) -> None:
        """Drop the trainer; the process's engine stays for the next stage, but for the baseline
        (`keep` off), which builds one every iteration."""
        if self.engine is not None and not self.keep:
            from race_core.sampling.shared import release_shared

            release_shared()
        self.engine = self.engine_holds = self.other = None
        self.close_trainer()


class _LazySampler:
    """A sampler that asks its `LiveRun` for the real one when first used (see `LiveRun.lazy_sampler`)."""

    def __init__(self, live: LiveRun, policy: PolicyRef, purpose: str):
        from race_core.policy import load_tokenizer
        from race_core.render import Renderer

        self.live, self.policy, self.purpose = live, policy, purpose
        if live.renderer is None:
            live.renderer = Renderer(load_tokenizer(live.start.local_path(live.store)))
        self.renderer = live.renderer
        self.name = live.config.sampler
        self.real = None

    def sample(self, prompts, params):
        if self.real is None:  # asked for once: a stage calls this at every turn
            self.real = self.live.sampler(self.policy, self.purpose)
        return self.real.sample(prompts, params)
