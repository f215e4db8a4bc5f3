"""The pipeline's stages, each declared once: the declaration is what runs (docs/architecture.md §7, §8).

A `Stage` says
- what the stage is called (`name`: its folder under the store's `stages/`, its Prefect task's name)
  and the `version` its key carries (raise it when the stage computes other bytes from the same inputs);
- which stages' outputs it reads (`needs`: what `flows.run` looks up when the stage is left out);
- what its key hashes besides its config and inputs (`key`: the modules that compute its numbers and
  the libraries that change them; None for a check, which stores nothing);
- the function that runs it (`run`, `module:function`, its *entry*: a plain function of `tasks/` that
  takes the store and keyword arguments, manifests in, manifest out, and knows nothing of Prefect),
  called with the stage's `inputs` (manifests, policies and parameters the flow body hands it), its
  `config` section (the `PipelineConfig` field passed to it as `config`) and the other sections it
  `reads` (passed under their own names: `resources`, `cover` for ε), plus `only_cached`, `force`
  and, for a stage that reports `progress`, `on_progress`; its log lines go to its module's logger;
- the objects its manifest holds (`outputs`), the kind of units its work splits into (`units`, a key
  of `tasks.units.UNIT_KINDS`: an executor runs them, in this process, a Prefect pool or Ray) and
  whether it needs a device (`gpu`: its task carries the `gpu` tag).

What reads these declarations: `tasks.pipeline_tasks.stage_task` (the one Prefect task of every
stage: name, retries, tags, summary artifact), `flows.run.PipelineRun.stage` (which stages a
selection needs, and the inputs a call must give), `tasks.fingerprints` (the code part of a key) and
`tasks.base.run_stage` (the version). Adding a stage: a declaration here, its entry function, a line in
the flow body. This module imports nothing of the stages, so reading it costs nothing.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable
from dataclasses import dataclass
from importlib import import_module
from typing import Any


@dataclass(frozen=True)
class StageKey:
    """The code part of a stage's key (`tasks.fingerprints.stage_code`)."""

    sources: tuple[str, ...]  # globs relative to the project root: the modules that compute its numbers
    libraries: tuple[str, ...] = ()  # distributions whose versions change its numbers (vllm added for backend vllm)


ENTRY_OPTIONS = ("only_cached", "force")  # what every entry takes besides its declared arguments


@dataclass(frozen=True)
class Stage:
    name: str
    version: int  # in its key
    needs: tuple[str, ...]  # the stages whose output it reads
    key: StageKey | None  # None: the stage stores nothing (a check)
    run: str  # "module:function", its entry
    inputs: tuple[str, ...] = ()  # the keyword arguments the caller hands its entry
    config: str | None = None  # the PipelineConfig section passed as `config` (None: the caller passes it)
    reads: tuple[str, ...] = ()  # other PipelineConfig sections it reads, passed under their own names
    outputs: tuple[str, ...] = ()  # the object names of its manifest
    units: str | None = None  # the unit kind its work splits into (tasks.units.UNIT_KINDS)
    gpu: bool = False  # loads a model: its task carries the `gpu` tag
    progress: str = ""  # reports progress (its entry takes `on_progress`): the progress artifact's title
    artifact: str = ""  # its summary artifact's name, formatted with its inputs (default: its name)

    def function(self) -> Callable[..., Any]:
        module, name = self.run.split(":")
        return getattr(import_module(module), name)

    @property
    def arguments(self) -> tuple[str, ...]:
        """The keyword arguments of its entry besides the options every entry takes."""
        return (*self.inputs, "config", *self.reads)

    def check_arguments(self, given: Iterable[str]) -> None:
        """A call's keyword arguments against the declaration: a TypeError naming what is missing or unknown."""
        given = set(given)
        missing = [name for name in self.arguments if name not in given]
        unknown = sorted(given - set(self.arguments))
        if missing or unknown:
            said = "; ".join(f"{what} {names}" for what, names in (("missing", missing), ("unknown", unknown))
                             if names)
            raise TypeError(f"stage {self.name!r}: {said} (it takes {list(self.arguments)}, "
                            "as declared in tasks/declarations.py)")

    def artifact_name(self, inputs: dict[str, Any]) -> str:
        return self.artifact.format(**inputs) if self.artifact else self.name


_RENDER = ("race_core/render.py", "race_core/schema.py", "race_core/policy.py")
_POLICY_LOOP = ("race_core/rollout.py", "race_core/sampling/*.py", "race_core/vllm_engine.py",
                "race_core/envs/*.py", "race_core/envs/calculator/*.py")  # the environments a policy plays
_TRAINING = ("race_core/train/distributed.py", "race_core/train/worker.py")  # the harness, the launched entry
_MODEL_LIBRARIES = ("torch", "transformers", "tokenizers")
_TOKENS = ("transformers", "tokenizers")  # token counts

DECLARED: tuple[Stage, ...] = (
    Stage("ingest", 1, (), StageKey(("race_core/schema.py", "race_core/importers/*.py", "storage/parquet.py",
                                     "tasks/stages.py", "tasks/base.py")),
          "tasks.stages:ingest_stage", inputs=("inputs",), config="ingest", outputs=("trajectories", "rejects")),
    Stage("validate", 1, ("ingest",), None, "tasks.stages:validate_stage", inputs=("ingested",), config="ingest"),
    Stage("cover", 1, ("ingest",),
          StageKey(("race_core/cover.py", "race_core/scoring/*.py", "race_core/vllm_engine.py",
                    "race_core/decisions.py", *_RENDER, "storage/parquet.py", "tasks/stages.py", "tasks/shards.py",
                    "tasks/cover_scoring.py", "tasks/rows.py", "tasks/base.py"), _MODEL_LIBRARIES),
          "tasks.stages:cover_stage", inputs=("trajectories", "policy"), config="cover", reads=("resources",),
          outputs=("decisions", "rejects"), units="cover-shard", gpu=True, progress="LoGiC cover"),
    Stage("compress", 1, ("ingest", "cover"),
          StageKey(("race_core/decisions.py", *_RENDER, "storage/parquet.py", "tasks/stages.py"), _TOKENS),
          "tasks.stages:compress_stage", inputs=("trajectories", "decided", "policy"), config="cover",
          outputs=("compressed",)),
    Stage("arm", 2, ("ingest", "compress"),
          StageKey(("race_core/ablation.py", "race_core/envs/*.py", "race_core/decisions.py", *_RENDER,
                    "storage/parquet.py", "tasks/stages.py", "tasks/ablation.py"), _TOKENS),
          "tasks.ablation:arm_stage", inputs=("trajectories", "race", "arm", "policy"), config="cover",
          outputs=("compressed",), artifact="arm-{arm}"),
    Stage("sft", 1, ("compress",),
          StageKey(("race_core/train/sft.py", *_TRAINING, "race_core/loss.py", *_RENDER,
                    "storage/parquet.py", "tasks/training_stages.py", "tasks/training_runs.py"),
                   (*_MODEL_LIBRARIES, "peft", "accelerate")),  # peft: LoRA; accelerate: gradient sync, autocast
          "tasks.training_stages:sft_stage", inputs=("compressed", "base"), config="sft", reads=("resources",),
          outputs=("checkpoint",), gpu=True),
    Stage("sample", 1, ("sft",),  # one RL iteration's rollouts: the rl stage runs it for each of its iterations
          StageKey((*_POLICY_LOOP, *_RENDER, "tasks/training_stages.py", "tasks/chunks.py"), _MODEL_LIBRARIES),
          "tasks.training_stages:sample_stage", inputs=("policy", "iteration"), config="rl", reads=("resources",),
          outputs=("rollouts",), units="sample-chunk", gpu=True),
    Stage("rl", 2, ("sft",),  # a run of iterations (tasks.rl_run): sample, update, evaluate every rl.eval_every
          StageKey(("race_core/train/rl*.py", "race_core/train/optimizer_state.py", *_TRAINING, "race_core/loss.py",
                    "race_core/cover.py", "race_core/scoring/*.py", "race_core/evaluate.py", *_POLICY_LOOP,
                    "race_core/vllm_weights.py", *_RENDER, "tasks/training_stages.py", "tasks/training_runs.py",
                    "tasks/chunks.py", "tasks/rl_run.py", "tasks/live_run.py"), (*_MODEL_LIBRARIES, "accelerate")),
          "tasks.rl_run:rl_run_stage", inputs=("policy",), config="rl", reads=("cover", "evaluate", "resources"),
          outputs=("checkpoint",), gpu=True, progress="RL iterations"),  # cover: its ε (unless rl.epsilon)
    Stage("evaluate", 2, (), StageKey(("race_core/evaluate.py", *_POLICY_LOOP, *_RENDER, "tasks/training_stages.py",
                                       "storage/parquet.py"), _MODEL_LIBRARIES),
          "tasks.training_stages:evaluate_stage", inputs=("policy", "label"), config="evaluate", reads=("resources",),
          outputs=("report",), gpu=True, artifact="evaluate-{label}"),
    Stage("bootstrap", 1, (),  # a chat checkpoint made a calculator policy (`race ablate --checkpoint`)
          StageKey(("race_core/train/checkpoint_bootstrap.py", "race_core/train/sft.py",
                    *_TRAINING, "race_core/loss.py", *_POLICY_LOOP,
                    *_RENDER, "tasks/agent_bootstrap.py"), (*_MODEL_LIBRARIES, "peft", "accelerate")),
          "tasks.agent_bootstrap:bootstrap_stage", inputs=("checkpoint",), reads=("resources",),
          outputs=("checkpoint",), gpu=True),  # its config: an AgentBootstrapConfig, given by the caller
)
STAGES: dict[str, Stage] = {stage.name: stage for stage in DECLARED}


def declared(name: str) -> Stage:
    try:
        return STAGES[name]
    except KeyError:
        raise ValueError(f"stage {name!r} is not declared: add it to tasks/declarations.py") from None
