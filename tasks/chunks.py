"""The sample stage's unit of work: a chunk of an RL iteration's training tasks (docs/architecture.md §8 scale-out).

With `rl.sample_chunk` = C > 0 the K tasks of an iteration are played C at a time
(`race_core.rollout.sample_chunks`): chunk c has its own sampler seed, so its rollouts depend on the
policy, the config and c alone, not on the process that plays it or what else it plays (up to
the float rounding of that process's kernels: tests/test_scale_out.py). Each chunk
commits its rollouts object and a manifest `stages/sample-chunk/<scope>-<c>.json` (the scope is the
sample stage's key), create-if-absent like a cover shard; the stage's rollouts are the chunks' in task
order. `SampleJob` is the sample stage's `tasks.units.UnitJob` (a unit: {index: c}); the executor that
`resources` names plays the chunks, and a killed run resumes at the first chunk without a manifest.
C = 0 (the default) is one draw of all K tasks, as before.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, replace
from typing import Any

from race_core.config import RL_UPDATE_ONLY, Resources, RLConfig, from_dict
from race_core.envs import get_environment
from race_core.sampling import make_sampler
from storage import ArtifactStore, stage_key
from tasks import units
from tasks.base import _rl_keyed
from tasks.declarations import declared
from tasks.fingerprints import stage_code
from tasks.policy_ref import PolicyRef
from tasks.units import Unit, UnitJob, UnitWorker

logger = logging.getLogger(__name__)

CHUNK_STAGE = "sample-chunk"


def sample_keyed(policy: PolicyRef, config: RLConfig, resources: Resources, iteration: int
                  ) -> tuple[dict[str, Any], dict[str, str]]:
    """The sample stage's keyed config and inputs."""
    keyed = {k: v for k, v in _rl_keyed(config, resources, iteration).items() if k not in RL_UPDATE_ONLY}
    return {**keyed, "env_revision": get_environment(config.env).revision}, {"policy": policy.folder or policy.digest}


def sample_scope(policy: PolicyRef, config: RLConfig, resources: Resources, iteration: int) -> str:
    """The sample stage's key: the scope of its chunks' manifests (`tasks.chunks`)."""
    keyed, inputs = sample_keyed(policy, config, resources, iteration)
    return stage_key("sample", declared("sample").version, keyed, inputs, policy.digest, stage_code("sample", keyed))


def chunk_record(scope: str, chunk: int) -> str:
    return f"stages/{CHUNK_STAGE}/{scope}-{chunk}.json"


def chunk_committed(store: ArtifactStore, scope: str, chunk: int) -> dict[str, Any] | None:
    return units.usable(store, chunk_record(scope, chunk))


@dataclass
class SampleJob(UnitJob):
    """The chunks of one RL iteration's sampling as units: the policy (as the stage keys it), the
    config, the iteration; `source`: where a worker loads the policy from (default: `policy`)."""

    policy: PolicyRef
    config: RLConfig
    resources: Resources
    iteration: int
    scope: str
    source: PolicyRef | None = None

    kind = "sample-chunk"
    what = "sample"
    noun = "chunks"

    def spec(self) -> dict[str, Any]:
        return {"policy": asdict(self.policy), "config": asdict(self.config), "resources": asdict(self.resources),
                "iteration": self.iteration, "scope": self.scope,
                "source": asdict(self.source) if self.source is not None else None}

    @classmethod
    def from_spec(cls, spec: dict[str, Any]) -> SampleJob:
        source = spec.get("source")
        job = cls(PolicyRef(**spec["policy"]), from_dict(RLConfig, spec["config"]),
                  from_dict(Resources, spec["resources"]), int(spec["iteration"]), spec["scope"],
                  PolicyRef(**source) if source else None)
        units.check_same_scope("chunk", sample_scope(job.policy, job.config, job.resources, job.iteration), job.scope)
        return job

    def portable(self, store: ArtifactStore) -> SampleJob:
        return replace(self, source=(self.source or self.policy).stored(store))

    def committed(self, store: ArtifactStore, unit: Unit) -> dict[str, Any] | None:
        return chunk_committed(store, self.scope, self.index(unit))

    def worker(self, store: ArtifactStore, device: str, publish: Callable[[Any], None] | None = None,
               planned: list[Unit] | None = None) -> SampleWorker:
        return SampleWorker(self, store, device)


class SampleWorker(UnitWorker):
    """Plays a sample job's chunks in this process with one loaded policy (loaded on the first chunk
    that needs it) and commits each."""

    def __init__(self, job: SampleJob, store: ArtifactStore, device: str):
        from race_core.rollout import sample_chunks

        self.job, self.store, self.device = job, store, device
        self.ranges = sample_chunks(job.config)
        self.model = self.tokenizer = self.sampler = None

    def do(self, unit: Unit, force: bool = False) -> dict[str, Any]:
        from race_core.rollout import rollouts_to_json, sample_rollouts

        job, chunk = self.job, self.job.index(unit)
        if not force and chunk_committed(self.store, job.scope, chunk) is not None:
            return {"committed": False, "skipped": True, "read_bytes": 0, "load_s": 0.0}
        load_s = 0.0
        if self.model is None and self.sampler is None:
            started = time.perf_counter()
            source = job.source or job.policy
            if job.config.sampler == "hf":
                self.model, self.tokenizer = source.load(self.store, replace(job.resources, device=self.device))
            else:  # another backend over the same checkpoint (vllm): the process's engine
                self.sampler = make_sampler(job.config.sampler, source.local_path(self.store), shared=True,
                                            device=self.device, dtype=job.resources.dtype, digest=source.digest,
                                            **job.resources.sampler_options(job.config.sampler))
            load_s = time.perf_counter() - started
        rollouts = sample_rollouts(self.model, self.tokenizer, job.config, job.iteration, chunk, sampler=self.sampler)
        data = rollouts_to_json(rollouts).encode("utf-8")
        digest = self.store.put_bytes(data)
        record = {"stage": CHUNK_STAGE, "key": f"{job.scope}-{chunk}", "chunk": chunk,
                  "tasks": list(self.ranges[chunk]), "objects": {"rollouts": digest},
                  "object_sizes": {digest: len(data)},
                  "metrics": {"rollouts": len(rollouts), "successes": sum(r.success for r in rollouts)},
                  **units.unit_provenance(self.device)}
        ours = units.commit_record(self.store, chunk_record(job.scope, chunk), record, force)
        start, stop = self.ranges[chunk]
        logger.info(f"sample: chunk {chunk} (tasks {start}-{stop - 1}, {record['metrics']['successes']}/{len(rollouts)} "
                    f"succeeded) " + ("committed" if ours else "was committed by another run meanwhile; this copy is dropped"))
        return {"committed": ours, "skipped": False, "read_bytes": 0, "load_s": round(load_s, 3)}

    def close(self) -> None:
        if self.sampler is not None and hasattr(self.sampler, "close"):
            self.sampler.close()
        self.model = self.tokenizer = self.sampler = None


def merge_chunks(store: ArtifactStore, scope: str, chunks: int) -> list[Any]:
    """The stage's rollouts: the committed chunks' in task order."""
    from race_core.rollout import rollouts_from_json

    rollouts = []
    for chunk in range(chunks):
        manifest = chunk_committed(store, scope, chunk)
        if manifest is None:
            raise LookupError(f"sample: chunk {chunk} ({scope}-{chunk}) has no usable manifest after sampling: "
                              "run again to sample it")
        rollouts += rollouts_from_json(store.get_bytes(manifest["objects"]["rollouts"]).decode("utf-8"))
    return rollouts
