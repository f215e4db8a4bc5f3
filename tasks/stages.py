"""The pipeline's stages as plain functions: manifests in, manifests out (docs/architecture.md §7, §8).

Each stage computes its key from (stage name, version, the config it runs, input digests, model
digest, its code fingerprint and library versions: `tasks.fingerprints`); if the store holds a
manifest under that key the stage returns it (`cached: True`) without running. Otherwise it computes, puts its objects, and writes the manifest last (the commit point).
With `only_cached=True` a stage never computes: it returns the stored manifest or raises
`StageNotRun` (a pipeline run that leaves a stage out still uses that stage's stored output).
These functions know nothing of Prefect: `tasks/` wraps them as tasks, and `race cover` calls them
directly. They take the typed configs of `race_core.config` and pass digests, never tensors or
DataFrames.

Each stage also has an *entry* (`ingest_stage`, `cover_stage`, ...: the function its declaration in
`tasks.declarations` names), which takes the manifests and policies of the stages before it as
keyword arguments and calls the function here; `tasks.pipeline_tasks.stage_task` makes it a Prefect task.

Stage names (in the store's `stages/<name>/`): ingest, cover (all of Algorithm 1: the decisions; one
manifest per shard under `stages/cover-shard/`, `tasks.shards`),
compress (applies them), sft, sample, rl, evaluate. Stores written before the rename kept the cover
under `stages/score/` and compression under `stages/decide/`; those manifests are no longer read
(their keys hashed other configs anyway): the next run recomputes, and `race gc` keeps every object
an old manifest still references.
"""

from __future__ import annotations

import glob
import hashlib
import logging
import os
import time
from collections.abc import Callable, Iterable, Iterator
from contextlib import contextmanager
from dataclasses import asdict
from typing import Any

import fsspec

from race_core.config import CoverConfig, IngestConfig, Resources
from race_core.decisions import CrossTurn, cross_turn_text
from race_core.importers import RACE, ImportStats, import_stream, left_out_text
from race_core.progress import ProgressFigures
from race_core.schema import DUPLICATE, Duplicates, Reject, Trajectory, iter_jsonl_stream
from storage import ArtifactStore
from storage.parquet import compressed_row, iter_rows_from_store
from tasks import shards
from tasks.base import StageNotRun, TempDataset, iter_trajectories, run_stage  # noqa: F401 - re-exported
from tasks.cover_scoring import cover_key_config, cover_scorer  # noqa: F401 - cover_scorer: re-exported
from tasks.executors import executor_for
from tasks.policy_ref import PolicyRef

logger = logging.getLogger(__name__)

# -- ingest + validate -------------------------------------------------------------------------
def expand_inputs(patterns: Iterable[str], allow_empty: bool = False) -> list[str]:
    """Local paths, globs, or fsspec URLs (globs too) -> a sorted list of files. A pattern that
    matches nothing is an error naming it, unless `allow_empty` (an inbox with nothing new yet);
    a local glob whose folder does not exist is an error either way (a typo must not look empty)."""
    files: list[str] = []
    for pattern in patterns:
        pattern = str(pattern)
        if "://" in pattern:
            fs, _, paths = fsspec.get_fs_token_paths(pattern)
            protocol = fs.protocol if isinstance(fs.protocol, str) else fs.protocol[0]
            matched = [p if "://" in p else f"{protocol}://{p}" for p in paths]
        else:
            matched = sorted(glob.glob(pattern)) if glob.has_magic(pattern) else [pattern]
            if not matched and not os.path.isdir(folder := _glob_folder(pattern)):
                raise FileNotFoundError(f"input {pattern!r}: folder {folder!r} does not exist")
        if not matched and not allow_empty:
            raise FileNotFoundError(f"input {pattern!r} matched no file")
        files.extend(matched)
    return sorted(dict.fromkeys(files))


def _glob_folder(pattern: str) -> str:
    """The folder a local glob searches: its path up to the first part with a wildcard."""
    parts = os.path.normpath(pattern).split(os.sep)
    fixed = next(i for i, part in enumerate(parts) if glob.has_magic(part))
    return os.sep.join(parts[:fixed]) or (os.sep if pattern.startswith(os.sep) else ".")


class _DigestingReader:
    """A binary file read through sha256: `digest` and `size` cover exactly the bytes read so far."""

    def __init__(self, fh: Any):
        self._fh, self._sha, self.size, self.at_end = fh, hashlib.sha256(), 0, False

    def read(self, size: int = -1, /) -> bytes:
        data = self._fh.read(size)
        self._sha.update(data)
        self.size += len(data)
        self.at_end = self.at_end or (not data and size != 0)
        return data

    def read_to_end(self) -> None:
        while not self.at_end:
            self.read(1 << 20)

    @property
    def digest(self) -> str:
        return self._sha.hexdigest()


@contextmanager
def _open_input(url: str) -> Iterator[_DigestingReader]:
    try:
        fh = fsspec.open(url, "rb").open()
    except FileNotFoundError:
        raise FileNotFoundError(f"input file {url!r} does not exist") from None
    with fh:
        yield _DigestingReader(fh)


def file_digest(url: str) -> str:
    """sha256 of the file's bytes as stored (compressed, for a .gz), streamed."""
    with _open_input(url) as reader:
        reader.read_to_end()
        return reader.digest


def _read_items(url: str, config: IngestConfig, files_read: dict[str, dict[str, Any]],
                imported: ImportStats, duplicates: Duplicates) -> Iterator[Trajectory | Reject]:
    """The file's trajectories and rejects, read once; then `files_read[url]` holds the sha256 and
    size of exactly the bytes they came from (a file appended meanwhile: the part that was read).
    Agent logs (`config.format` not race) are converted record by record (`race_core.importers`),
    counted in `imported` (an `ImportStats`). A trajectory `duplicates` has seen is a `duplicate` reject."""
    with _open_input(url) as reader:
        if config.format == RACE:
            yield from iter_jsonl_stream(reader, url, config.limits(), duplicates)
        else:
            yield from import_stream(reader, url, config.format, config.import_options(), config.limits(), imported,
                                     duplicates)
        if not reader.at_end:  # a damaged gzip stream ended the read: its rest belongs to that reject
            reader.read_to_end()
        files_read[url] = {"sha256": reader.digest, "bytes": reader.size}


def ingest(store: ArtifactStore, inputs: Iterable[str], config: IngestConfig = IngestConfig(),
           only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """JSONL files (plain or gzip) -> `trajectories` + `rejects` Parquet. Duplicates (same id) are
    kept once, each later one a `duplicate` row of `rejects`, counted apart from the rejected lines.

    The key is made from what was read: each file is parsed and hashed in the same pass, so a file
    appended meanwhile gets the key of the bytes its rows came from (the manifest's `files_read` lists
    each file's sha256 and size as read). A cached ingest is found first with one hash-only pass
    (no parsing) over the files as they are now; only on a miss are they parsed, hashing again."""
    started = time.perf_counter()
    files = expand_inputs(inputs)
    # `strict` gates the run (the validate step); it does not change what ingest writes.
    keyed = {k: v for k, v in asdict(config).items() if k != "strict"}
    if only_cached or not force:
        found = {f: file_digest(f) for f in files}
        try:  # look up only: `compute` is never called
            return run_stage(store, "ingest", keyed, {"files": _canonical_inputs(found)}, None, dict,
                             only_cached=True, force=force)
        except StageNotRun:
            if only_cached:
                raise
    files_read: dict[str, dict[str, Any]] = {}
    duplicates, first = 0, Duplicates()
    imported = ImportStats()
    with TempDataset(store, "trajectories") as good, TempDataset(store, "rejects") as bad:
        for f in files:
            for item in _read_items(f, config, files_read, imported, first):
                if isinstance(item, Reject):
                    bad.writer.write(item)
                    duplicates += item.code == DUPLICATE
                else:
                    good.writer.write(item)
    logger.info(f"ingest: {good.rows + bad.rows} records = {good.rows} trajectories + {bad.rows - duplicates} "
                f"rejected lines + {duplicates} duplicates (merged) from {len(files)} file(s)")
    metrics = {"ingested": good.rows, "rejected": bad.rows - duplicates, "duplicates": duplicates, "files": len(files)}
    if config.format != RACE:
        metrics["assumed_successful"] = imported.assumed_successful
        if imported.formats:  # format auto: the one picked for each file
            metrics["formats"] = imported.formats
        if imported.assumed_successful:
            logger.warning(f"ingest: warning: {imported.assumed_successful} {config.format} record(s) carry no "
                           f"success flag and were taken as successful (assume_successful)")
        if imported.left_out_steps:
            metrics["left_out_steps"] = imported.left_out_steps
            logger.info(f"ingest: {left_out_text(imported)}")
    produced = {"objects": {"trajectories": good.digest, "rejects": bad.digest}, "metrics": metrics,
                "files_read": [{"file": f, **files_read[f]} for f in files]}
    inputs_read = {"files": _canonical_inputs({f: r["sha256"] for f, r in files_read.items()})}
    manifest = run_stage(store, "ingest", keyed, inputs_read, None, lambda: produced, force=force)
    return {**manifest, "wall_s": round(time.perf_counter() - started, 3)}


def validate(ingested: dict[str, Any], config: IngestConfig) -> dict[str, Any]:
    """Gate before the cover: no valid trajectory, or (with `strict`) any rejected line, is an error."""
    metrics = ingested["metrics"]
    if metrics["ingested"] == 0:
        raise ValueError("no valid trajectory in the input; see rejects.parquet (race validate lists them)")
    if config.strict and metrics["rejected"]:
        raise ValueError(f"{metrics['rejected']} input line(s) rejected and strict is set; "
                         "see rejects.parquet (race validate lists them)")
    return metrics


def _canonical_inputs(digests: dict[str, str]) -> str:
    """Inputs are identified by content: the sorted list of file digests (paths may move)."""
    return hashlib.sha256("\n".join(sorted(digests.values())).encode()).hexdigest()


# -- cover + compress --------------------------------------------------------------------------
def cover(store: ArtifactStore, trajectories_digest: str, checkpoint: str, model_digest: str,
          config: CoverConfig = CoverConfig(), resources: Resources = Resources(),
          scorer_factory: Callable[[], Any] | None = None, on_progress: Callable[[ProgressFigures], None] | None = None,
          only_cached: bool = False, force: bool = False) -> dict[str, Any]:
    """Run the LoGiC cover (Algorithm 1) over the trajectories, shard by shard -> `decisions`
    Parquet, and `rejects` for the trajectories whose rendering is longer than the model's context
    (or `config.max_tokens`): those are not scored (code `too_long`, with the token count).

    The shards not committed yet are units of a `tasks.shards.CoverJob`, run by the executor that
    `resources` names (`tasks.executors`: this process, a Prefect work pool, Ray); then the
    committed shards are merged. Progress (`race_core.progress.CoverProgress`): a bar on a
    terminal, else a log line now and then; `on_progress(figures)` as it goes."""

    def compute() -> dict[str, Any]:
        scope = shards.shard_scope(config, resources, model_digest)
        plan = shards.plan_shards(store, trajectories_digest, resources.shard_size)
        todo = shards.shard_units(store, scope, plan, resources.shard_size, force)
        logger.info(f"cover: {len(plan)} shard(s) of up to {resources.shard_size}; {len(plan) - len(todo)} committed "
                    "before")
        if todo:
            job = shards.CoverJob(trajectories_digest, PolicyRef(model_digest, path=checkpoint), config, resources,
                                  scope, make_scorer=scorer_factory)
            executor_for(resources).run(job, todo, store, resources, force=force, on_progress=on_progress)
        return shards.merge_shards(store, scope, plan)

    return run_stage(store, "cover", cover_key_config(config, resources), {"trajectories": trajectories_digest},
                     model_digest, compute, only_cached, force)


def compress(store: ArtifactStore, trajectories_digest: str, decisions_digest: str, checkpoint: str,
             model_digest: str, epsilon: float, only_cached: bool = False,
             refused_digest: str | None = None, force: bool = False) -> dict[str, Any]:
    """Apply the accepted removals -> `compressed` Parquet (one row per trajectory the cover scored;
    the trajectories of `refused_digest`, the cover's rejects, are left out)."""

    def compute() -> dict[str, Any]:
        refused = {row["trajectory_id"] for row in iter_rows_from_store(store, refused_digest, "rejects")
                   } if refused_digest else set()
        accepted: dict[str, list[int]] = {}
        cross = CrossTurn()
        for row in iter_rows_from_store(store, decisions_digest, "decisions"):
            cross.add(row)
            if row["accepted"]:
                accepted.setdefault(row["trajectory_id"], []).append(int(row["turn"]))
        removals = ((t, accepted.get(t.id, [])) for t in iter_trajectories(store, trajectories_digest)
                    if t.id not in refused)
        manifest = write_compressed(store, removals, checkpoint, model_digest, epsilon)
        manifest["metrics"]["candidates"] = candidates = cross.candidates
        manifest["metrics"]["cross_turn"] = cross_turn = cross.figure()
        m = manifest["metrics"]
        logger.info(f"compress: removed reasoning in {m['removed']} of {candidates} candidate turns; reasoning "
                    f"tokens {m['reasoning_tokens_before']} -> {m['reasoning_tokens_after']}; "
                    f"{cross_turn_text(cross_turn)}")
        return manifest

    inputs = {"trajectories": trajectories_digest, "decisions": decisions_digest}
    if refused_digest:
        inputs["refused"] = refused_digest
    return run_stage(store, "compress", {"epsilon": epsilon}, inputs, model_digest, compute, only_cached, force)


# -- the entries the declarations name (tasks.declarations) -------------------------------------
def ingest_stage(store: ArtifactStore, *, inputs: list[str], config: IngestConfig, only_cached: bool = False,
                 force: bool = False) -> dict[str, Any]:
    """The input files (paths, globs, URLs) -> an ingest manifest."""
    return ingest(store, inputs, config, only_cached=only_cached, force=force)


def validate_stage(store: ArtifactStore, *, ingested: dict[str, Any], config: IngestConfig, only_cached: bool = False,
                   force: bool = False) -> dict[str, Any]:
    """The gate before the cover (a check: stores nothing, always runs)."""
    return validate(ingested, config)


def cover_stage(store: ArtifactStore, *, trajectories: dict[str, Any], policy: PolicyRef | dict[str, Any],
                config: CoverConfig, resources: Resources, only_cached: bool = False, force: bool = False,
                on_progress: Callable[[ProgressFigures], None] | None = None) -> dict[str, Any]:
    """The LoGiC cover over the trajectories of an ingest (or select-new) manifest, scored by `policy`
    -> decisions; a shard that runs out of memory is scored again with a smaller batch and KV budget
    (`tasks.shards.CoverWorker.shrink`), on every executor."""
    policy = PolicyRef.of(policy)
    return cover(store, trajectories["objects"]["trajectories"], policy.local_path(store), policy.digest, config,
                 resources, only_cached=only_cached, force=force, on_progress=on_progress)


def compress_stage(store: ArtifactStore, *, trajectories: dict[str, Any], decided: dict[str, Any],
                   policy: PolicyRef | dict[str, Any], config: CoverConfig, only_cached: bool = False,
                   force: bool = False) -> dict[str, Any]:
    """The cover's accepted removals applied (at the cover's ε) -> compressed trajectories."""
    policy = PolicyRef.of(policy)
    return compress(store, trajectories["objects"]["trajectories"], decided["objects"]["decisions"],
                    policy.local_path(store), policy.digest, config.epsilon, only_cached=only_cached,
                    refused_digest=decided["objects"].get("rejects"), force=force)


# -- nightly: only what the catalog has not seen -----------------------------------------------
def write_compressed(store: ArtifactStore, removals: Iterable[tuple[Trajectory, Iterable[int]]], checkpoint: str,
                     model_digest: str, epsilon: float) -> dict[str, Any]:
    """A `compressed` dataset of (original, turns whose reasoning is removed) pairs, rows keyed by the
    original's id, with its token counts -> the manifest fields {objects, metrics} of a stage."""
    from race_core.decisions import reasoning_tokens, remove_reasoning
    from race_core.policy import load_tokenizer
    from race_core.render import Renderer

    renderer = Renderer(load_tokenizer(checkpoint))
    before = after = removed = 0
    with TempDataset(store, "compressed") as out:
        for original, turns in removals:
            skipped = sorted(turns)
            compressed = remove_reasoning(original, skipped)
            tokens_before = reasoning_tokens(renderer, original)
            tokens_after = reasoning_tokens(renderer, compressed)
            before, after, removed = before + tokens_before, after + tokens_after, removed + len(skipped)
            row = compressed_row(compressed, skipped, tokens_before, tokens_after, model_digest, epsilon)
            row["id"] = original.id  # rows are keyed by the source trajectory's id
            out.writer.write(row)
    return {"objects": {"compressed": out.digest},
            "metrics": {"trajectories": out.rows, "removed": removed, "reasoning_tokens_before": before,
                        "reasoning_tokens_after": after}}


def catalog_scope(model_digest: str, config: CoverConfig, resources: Resources):
    from storage import Scope

    return Scope(model_digest=model_digest, epsilon=config.epsilon,
                 scorer={"backend": config.backend, "dtype": resources.dtype})


def select_new(store: ArtifactStore, trajectories_digests: list[str], model_digest: str,
               config: CoverConfig, resources: Resources) -> dict[str, Any]:
    """The trajectories not yet compressed for this (model, ε, scorer) as one dataset. Not cached:
    the answer depends on the catalog, which grows; it is cheap (ids only, then one pass)."""
    from storage import Catalog

    catalog = Catalog(store)
    scope = catalog_scope(model_digest, config, resources)
    done = catalog.compressed_ids(scope)
    seen: set[str] = set()
    total = 0
    with TempDataset(store, "trajectories") as out:
        for digest in trajectories_digests:
            for trajectory in iter_trajectories(store, digest):
                total += 1
                if trajectory.id in done or trajectory.id in seen:
                    continue
                seen.add(trajectory.id)
                out.writer.write(trajectory)
    logger.info(f"select: {out.rows} new of {total} trajectories (already compressed: {total - out.rows})")
    return {"objects": {"trajectories": out.digest}, "ids": sorted(seen),
            "metrics": {"new": out.rows, "seen": total, "already_compressed": total - out.rows},
            "scope": scope.to_dict(), "cached": False}


def record_part(store: ArtifactStore, compressed_digest: str, ids: list[str], model_digest: str,
                config: CoverConfig, resources: Resources) -> dict[str, Any]:
    """Append the new compressed part to the catalog (old parts are never rewritten)."""
    from storage import Catalog

    entry = Catalog(store).append_part(catalog_scope(model_digest, config, resources), compressed_digest, ids,
                                       meta={"rows": len(ids)})
    return {"objects": {"part": compressed_digest}, "metrics": {"rows": len(ids)}, "entry": entry,
            "cached": False}
