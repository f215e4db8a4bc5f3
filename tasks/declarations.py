"""The pipeline's stages, each declared once (docs/architecture.md §7, §8).

A `Stage` says what the stage is called (`name`, its folder under the store's `stages/`), which
stages' outputs it reads (`needs`), what its key hashes besides its config and inputs (`key`: the
modules that compute its numbers and the libraries that change them), which function runs it
(`run`, `module:function`, a plain function of `tasks/`: manifests in, manifest out), the objects
its manifest holds (`outputs`) and whether it needs a device (`gpu`: its task carries the `gpu` tag).

What reads these declarations today: `flows.run` (which stages a selection needs),
`tasks.fingerprints` (the code part of a key), `tasks.pipeline_tasks` (each task's name, retries and
tags). `run` and `outputs` are not yet what the flow calls: each stage still has a hand-written
Prefect task in `tasks.pipeline_tasks` that calls its function (a test checks that `run` names a function). Where a stage's units of work run (this process, a Prefect pool, Ray) is not part of it: a
stage whose work splits declares its units in its own module (`tasks.units.UnitJob`) and hands
them to `tasks.executors`. This module imports nothing of the stages, so reading it costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class StageKey:
    """The code part of a stage's key (`tasks.fingerprints.stage_code`)."""

    sources: tuple[str, ...]  # globs relative to the project root: the modules that compute its numbers
    libraries: tuple[str, ...] = ()  # distributions whose versions change its numbers (vllm added for backend vllm)


@dataclass(frozen=True)
class Stage:
    name: str
    needs: tuple[str, ...]  # the stages whose output it reads
    key: StageKey | None  # None: the stage stores nothing (a check)
    run: str  # "module:function"
    outputs: tuple[str, ...] = ()  # the object names of its manifest
    gpu: bool = False  # loads a model: its task carries the `gpu` tag

    def function(self) -> Callable[..., Any]:
        module, name = self.run.split(":")
        return getattr(import_module(module), name)


_RENDER = ("race_core/render.py", "race_core/schema.py", "race_core/policy.py")
_POLICY_LOOP = ("race_core/rollout.py", "race_core/sampling/*.py", "race_core/vllm_engine.py",
                "race_core/envs/*.py", "race_core/envs/calculator/*.py")  # the environments a policy plays
_TRAINING = ("race_core/train/distributed.py", "race_core/train/worker.py")  # the harness, the launched entry
_MODEL_LIBRARIES = ("torch", "transformers", "tokenizers")
_TOKENS = ("transformers", "tokenizers")  # token counts

DECLARED: tuple[Stage, ...] = (
    Stage("ingest", (), StageKey(("race_core/schema.py", "race_core/importers/*.py", "storage/parquet.py",
                                  "tasks/stages.py", "tasks/base.py")),
          "tasks.stages:ingest", ("trajectories", "rejects")),
    Stage("validate", ("ingest",), None, "tasks.stages:validate"),
    Stage("cover", ("ingest",),
          StageKey(("race_core/cover.py", "race_core/scoring/*.py", "race_core/vllm_engine.py",
                    "race_core/decisions.py", *_RENDER, "storage/parquet.py", "tasks/stages.py", "tasks/shards.py",
                    "tasks/cover_scoring.py", "tasks/rows.py", "tasks/base.py"), _MODEL_LIBRARIES),
          "tasks.stages:cover", ("decisions", "rejects"), gpu=True),
    Stage("compress", ("ingest", "cover"),
          StageKey(("race_core/decisions.py", *_RENDER, "storage/parquet.py", "tasks/stages.py"), _TOKENS),
          "tasks.stages:compress", ("compressed",)),
    Stage("arm", ("ingest", "compress"),
          StageKey(("race_core/ablation.py", "race_core/envs/*.py", "race_core/decisions.py", *_RENDER,
                    "storage/parquet.py", "tasks/stages.py", "tasks/ablation.py"), _TOKENS),
          "tasks.ablation:derived_arm", ("compressed",)),
    Stage("sft", ("compress",),
          StageKey(("race_core/train/sft.py", *_TRAINING, "race_core/loss.py", *_RENDER,
                    "storage/parquet.py", "tasks/training_stages.py", "tasks/training_runs.py"),
                   (*_MODEL_LIBRARIES, "peft", "accelerate")),  # peft: LoRA; accelerate: gradient sync, autocast
          "tasks.training_stages:sft", ("checkpoint",), gpu=True),
    Stage("sample", ("sft",),  # and, after the first iteration, the previous iteration's rl
          StageKey((*_POLICY_LOOP, *_RENDER, "tasks/training_stages.py", "tasks/chunks.py"), _MODEL_LIBRARIES),
          "tasks.training_stages:sample", ("rollouts",), gpu=True),
    Stage("rl", ("sample", "sft"),
          StageKey(("race_core/train/rl.py", *_TRAINING, "race_core/loss.py",
                    "race_core/cover.py", "race_core/scoring/*.py", "race_core/rollout.py", *_RENDER,
                    "tasks/training_stages.py", "tasks/training_runs.py"), (*_MODEL_LIBRARIES, "accelerate")),
          "tasks.training_stages:rl", ("checkpoint",), gpu=True),
    Stage("evaluate", (), StageKey(("race_core/evaluate.py", *_POLICY_LOOP, *_RENDER, "tasks/training_stages.py"),
                                   _MODEL_LIBRARIES),
          "tasks.training_stages:evaluate", ("report",), gpu=True),
    Stage("bootstrap", (),  # a chat checkpoint made a calculator policy (`race ablate --checkpoint`)
          StageKey(("race_core/train/checkpoint_bootstrap.py", "race_core/train/sft.py",
                    *_TRAINING, "race_core/loss.py", *_POLICY_LOOP,
                    *_RENDER, "tasks/agent_bootstrap.py"), (*_MODEL_LIBRARIES, "peft", "accelerate")),
          "tasks.agent_bootstrap:agent_policy", ("checkpoint",), gpu=True),
)
STAGES: dict[str, Stage] = {stage.name: stage for stage in DECLARED}


def declared(name: str) -> Stage:
    try:
        return STAGES[name]
    except KeyError:
        raise ValueError(f"stage {name!r} is not declared: add it to tasks/declarations.py") from None
