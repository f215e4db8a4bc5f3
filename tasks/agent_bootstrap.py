"""The bootstrap stage: a chat checkpoint made a policy of an environment (`race_core.train.checkpoint_bootstrap`),
stored like every trained policy (a checkpoint folder object and its digest), keyed by the recipe's
settings, the dtype it trained in and the checkpoint's digest. A checkpoint whose tokenizer already
carries the environment's prompt (a `race bootstrap` output, or a policy this pipeline trained) plays
as it is: no stage runs for it.
"""

from __future__ import annotations

from typing import Any

from race_core.config import Resources
from race_core.envs import DEFAULT_ENV
from race_core.envs.agent import BARE, AgentPrompt
from race_core.policy import load_tokenizer
from race_core.train.checkpoint_bootstrap import AgentBootstrapConfig
from storage import ArtifactStore
from tasks.base import run_stage
from tasks.policy_ref import PolicyRef, put_policy


def plays(checkpoint: str, env: str = DEFAULT_ENV) -> bool:
    """Whether the checkpoint's tokenizer carries a prompt of environment `env` (it was bootstrapped before)."""
    prompt = AgentPrompt.of(load_tokenizer(checkpoint))
    return prompt != BARE and prompt.environment == env


def agent_policy(store: ArtifactStore, checkpoint: str, config: AgentBootstrapConfig, resources: Resources,
                 only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """The `config.env` policy made from `checkpoint` by `config.recipe` (a stage manifest: `PolicyRef.of`
    reads it); its metrics are the recipe's report (what it trained on, the fresh on-policy check)."""
    base = PolicyRef.local(checkpoint)
    keyed = {**config.key_fields(), "dtype": resources.dtype, **resources.training_keyed()}

    def compute() -> dict[str, Any]:
        from race_core.train.checkpoint_bootstrap import bootstrap_agent
        from race_core.train.distributed import TrainOptions, clear_state
        from tasks.training_runs import make_room, train_state_dir

        make_room(resources)
        # the SFT state saved every resources.train_save_every steps: a bootstrap killed mid-way resumes there
        state = train_state_dir("bootstrap", keyed, {}, base.digest)
        model, tokenizer = base.load(store, resources)
        report = bootstrap_agent(model, tokenizer, config, options=TrainOptions.of(resources, state))
        stored = put_policy(store, model, tokenizer)
        clear_state(state)
        return {**stored, "metrics": {"recipe": report.recipe, "actions": report.agent["actions"],
                                      "rounds": report.rounds, "check": report.check,
                                      "wall_seconds": report.wall_seconds}}

    return run_stage(store, "bootstrap", keyed, {}, base.digest, compute, only_cached=only_cached, force=force)


def bootstrap_stage(store: ArtifactStore, *, checkpoint: str, config: AgentBootstrapConfig, resources: Resources,
                    only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """The bootstrap stage's entry (`tasks.declarations`): `agent_policy`."""
    return agent_policy(store, checkpoint, config, resources, only_cached=only_cached, force=force)
