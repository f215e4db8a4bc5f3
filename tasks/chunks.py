"""The sample stage's unit of work: a chunk of an RL iteration's training tasks (DESIGN §8 scale-out).

With `rl.sample_chunk` = C > 0 the K tasks of an iteration are played C at a time
(`race_core.rollout.sample_chunks`): chunk c has its own sampler seed, so its rollouts depend on the
policy, the config and c alone, not on the process that plays it or what else it plays (up to
the float rounding of that process's kernels: tests/test_scale_out.py). Each chunk
commits its rollouts object and a manifest `stages/sample-chunk/<scope>-<c>.json` (the scope is the
sample stage's key), create-if-absent like a cover shard; the stage's rollouts are the chunks' in task
order. On a pool (`resources.pool`) each chunk is a child flow run of `race-sample-chunk/<pool>`
(`flows.shard`); without, this process plays the chunks in turn. Either way a killed run resumes at
the first chunk without a manifest. C = 0 (the default) is one draw of all K tasks, as before.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from race_core.config import RLConfig
from storage import ArtifactStore
from tasks.shards import commit_record, unit_provenance, usable

CHUNK_STAGE = "sample-chunk"
Log = Callable[[str], None]


def chunk_record(scope: str, chunk: int) -> str:
    return f"stages/{CHUNK_STAGE}/{scope}-{chunk}.json"


def chunk_committed(store: ArtifactStore, scope: str, chunk: int) -> dict[str, Any] | None:
    return usable(store, chunk_record(scope, chunk))


def sample_and_commit(store: ArtifactStore, scope: str, chunks: list[int], load: Callable[[], tuple[Any, Any]],
                      config: RLConfig, iteration: int, log: Log, device: str = "", force: bool = False
                      ) -> dict[str, int]:
    """Play each of `chunks` not committed yet (the policy loaded by `load` on the first that needs
    it) and commit it; counts of chunks `sampled` (and committed) and `dropped` (committed by another
    writer first)."""
    from race_core.rollout import rollouts_to_json, sample_chunks, sample_rollouts

    ranges, model, counts = sample_chunks(config), None, {"sampled": 0, "dropped": 0}
    for chunk in chunks:
        if not force and chunk_committed(store, scope, chunk) is not None:
            continue
        if model is None:
            model, tokenizer = load()
        rollouts = sample_rollouts(model, tokenizer, config, iteration, chunk)
        data = rollouts_to_json(rollouts).encode("utf-8")
        digest = store.put_bytes(data)
        record = {"stage": CHUNK_STAGE, "key": f"{scope}-{chunk}", "chunk": chunk, "tasks": list(ranges[chunk]),
                  "objects": {"rollouts": digest}, "object_sizes": {digest: len(data)},
                  "metrics": {"rollouts": len(rollouts), "successes": sum(r.success for r in rollouts)},
                  **unit_provenance(device)}
        ours = commit_record(store, chunk_record(scope, chunk), record, force)
        counts["sampled" if ours else "dropped"] += 1
        start, stop = ranges[chunk]
        log(f"sample: chunk {chunk} (tasks {start}-{stop - 1}, {record['metrics']['successes']}/{len(rollouts)} "
            f"succeeded) " + ("committed" if ours else "was committed by another run meanwhile; this copy is dropped"))
    return counts


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
