"""What a stage's numbers depend on besides its config and inputs: the one place that lists it.

The `code` part of a stage key (docs/architecture.md §7, `storage.keys.stage_key`) is
- `source`: sha256 over (path, content) of the modules that compute the stage's numbers
  (the `key.sources` of the stage's declaration in `tasks.declarations`; globs are relative to
  the project root), so editing one of them reruns that stage and no other;
- `libraries`: the installed versions of the libraries that change its numbers (its `key.libraries`),
  plus vllm when the stage's config says `backend: vllm` or `sampler: vllm`.

The cover's rendering (`Renderer.render_mode`: canonical or segments tokenization, and what the chat
template does with reasoning) is not keyed on its own: it is a function of the tokenizer and
template files (in the model digest, `race_core.policy.MODEL_FILES`), of `race_core/render.py` (in
the cover's source) and of the tokenizers/transformers versions (in its libraries), and no setting
chooses it. The files are read each time a key is computed (a few small files), so a process whose
modules were edited after it started keys on the new source.
"""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from functools import cache
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from tasks.declarations import STAGES, StageKey, declared

SOURCE_ROOT = Path(__file__).resolve().parents[1]  # the folder holding race_core/, storage/, tasks/



def keyed_stages() -> tuple[str, ...]:
    """The declared stages that store something (a key with a code part)."""
    return tuple(name for name, stage in STAGES.items() if stage.key is not None)


def _declared_key(stage: str) -> StageKey:
    key = declared(stage).key
    if key is None:
        raise ValueError(f"stage {stage!r} stores nothing: its declaration in tasks/declarations.py has no key")
    return key


def stage_code(stage: str, config: Mapping[str, Any]) -> dict[str, Any]:
    """The `code` part of `stage`'s key: its source fingerprint and the library versions it runs on, and
    for a stage that plays an environment not race's own, that environment's source and version, and
    the versions of the `libraries` an environment names (distributions that decide its tasks and judge,
    e.g. the cooking games' textworld)."""
    from race_core.envs import environment_code, get_environment

    names = _declared_key(stage).libraries
    if "vllm" in (config.get("backend"), config.get("sampler")):  # the cover's scorer, a stage's sampler
        names = (*names, "vllm")
    env = config.get("env")
    if isinstance(env, str):
        names = (*names, *getattr(get_environment(env), "libraries", ()))
    code = {"source": source_fingerprint(stage), "libraries": {name: installed_version(name) for name in names}}
    if isinstance(env, str) and (environment := environment_code(env)):
        code["environment"] = environment
    return code


def source_fingerprint(stage: str) -> str:
    """sha256 over (relative path, content) of the files of the stage's declared sources under `SOURCE_ROOT`."""
    patterns = _declared_key(stage).sources
    files = sorted({path for pattern in patterns for path in _matches(pattern)})
    h = hashlib.sha256()
    for path in files:
        h.update(path.relative_to(SOURCE_ROOT).as_posix().encode() + b"\0")
        h.update(hashlib.sha256(path.read_bytes()).digest())
    return h.hexdigest()


def _matches(pattern: str) -> list[Path]:
    found = [p for p in SOURCE_ROOT.glob(pattern) if p.is_file()]
    if not found:  # a renamed module must not silently drop out of the key
        raise FileNotFoundError(f"stage source {pattern!r} matches no file under {SOURCE_ROOT}")
    return found


@cache
def installed_version(distribution: str) -> str | None:
    """The installed version of a distribution (None when it is not installed)."""
    try:
        return version(distribution)
    except PackageNotFoundError:
        return None
