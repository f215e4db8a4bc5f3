"""The stage key (docs/architecture.md §7): one place that says when a stage's output can be reused.

key = sha256 of the canonical JSON of (stage name, stage version, config, input digests, model
digest, code). `code` is what the stage's numbers depend on besides its inputs: the fingerprint of
the source of the modules that compute them and the versions of the libraries that change them
(`tasks.fingerprints.stage_code`). Canonical JSON sorts keys, so the key is the same across
processes and dict orderings.
"""

from __future__ import annotations

import dataclasses
import hashlib
from collections.abc import Mapping, Sequence
from typing import Any

from race_core.schema import canonical_json


def stage_key(
    stage: str,
    version: str | int,
    config: Mapping[str, Any] | Any,
    input_digests: Sequence[str] | Mapping[str, str],
    model_digest: str | None,
    code: Mapping[str, Any] | None = None,
) -> str:
    """sha256 hex of the canonical JSON of the six things a stage's output depends on.

    `config` is a dict or a (frozen) dataclass; `input_digests` is an ordered list of digests or
    a dict name -> digest (its order does not matter). `version` is compared as text, so 2 and
    "2" name the same version. `code` is a JSON-able mapping (code fingerprint, library versions).
    """
    if dataclasses.is_dataclass(config) and not isinstance(config, type):
        config = dataclasses.asdict(config)
    if not isinstance(config, Mapping):
        raise TypeError(f"config must be a dict or a dataclass, got {type(config).__name__}")
    if isinstance(input_digests, Mapping):
        inputs: Any = {str(k): str(v) for k, v in input_digests.items()}
    elif isinstance(input_digests, (str, bytes)):
        raise TypeError("input_digests must be a list or dict of digests, not a single string")
    else:
        inputs = [str(d) for d in input_digests]
    payload = {
        "stage": stage,
        "version": str(version),
        "config": dict(config),
        "inputs": inputs,
        "model": model_digest,
        "code": dict(code) if code is not None else None,
    }
    return hashlib.sha256(canonical_json(payload).encode("utf-8")).hexdigest()
