"""One vLLM sampling engine per process, shared by everything in it that plays a policy.

Building a vLLM engine costs about a minute on a CPU (45-90 s for SmolLM2-135M) and far more than a
short evaluation plays. A flow evaluates many policies of one architecture (every SFT arm, every RL
run's points) and an RL run samples a new policy every iteration, so the process keeps one engine and
gives it each policy's weights in place (`EngineOwner.load_weights`): `shared_sampler(checkpoint, ...)`
returns a sampler over the process's engine when it has one of this checkpoint's architecture,
tokenizer, dtype, device and engine options (loading the checkpoint's weights if it holds others),
else it builds one that replaces it. The sampler it returns is borrowed: its `close()` leaves the
engine to the next caller. `release_shared()` shuts the engine down (a training stage on a GPU
needs the memory back; the process's exit does it too). Its scores on loaded weights equal a fresh
engine's (`tests/test_vllm_live.py`), so sharing changes how long stages take, not what they play.
"""

from __future__ import annotations

import atexit
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

_STATE: dict[str, Any] = {"engine": None, "key": None, "holds": None, "builds": 0}


@dataclass
class SharedSampler:
    """A borrowed view of the process's engine: samples like a `VLLMSampler`; `close()` keeps the engine."""

    owner: Any  # the VLLMSampler that owns the engine
    built: bool = False  # whether this call built the engine (else it reused it)
    loaded: bool = False  # whether this call loaded weights into it
    seconds: dict[str, float] = field(default_factory=dict)  # engine_start / weight_load of this call
    name: str = "vllm"

    @property
    def renderer(self):
        return self.owner.renderer

    @property
    def tokenizer(self):
        return self.owner.tokenizer

    def sample(self, prompts, params):
        return self.owner.sample(prompts, params)

    def engine(self):
        return self.owner.engine()

    def close(self) -> None:
        """Nothing: the engine stays for the next stage (`release_shared` shuts it down)."""


def _signature(checkpoint: Path) -> str:
    from race_core.vllm_engine import TOKENIZER_FILES, _shape_of

    return json.dumps({"architecture": _shape_of(checkpoint, ("config.json",), "architecture"),
                       "tokenizer": _shape_of(checkpoint, TOKENIZER_FILES, "tokenizer")}, sort_keys=True)


def shared_sampler(checkpoint: str | Path, *, device: str = "cpu", dtype: str = "float32", digest: str | None = None,
                   **engine_options: Any) -> SharedSampler:
    """A sampler playing the policy in `checkpoint` on the process's engine (see the module docstring).
    `digest`: the checkpoint's model digest when the caller knows it (else it is computed)."""
    import time

    from race_core.policy import check_checkpoint_dir, checkpoint_digest
    from race_core.sampling.vllm import VLLMSampler

    path = check_checkpoint_dir(checkpoint)
    key = (_signature(path), device, dtype, json.dumps(engine_options, sort_keys=True, default=str))
    digest = digest or checkpoint_digest(path)
    view = SharedSampler(owner=None)
    if _STATE["engine"] is None or _STATE["key"] != key:
        release_shared()
        began = time.perf_counter()
        _STATE["engine"] = VLLMSampler.from_pretrained(path, device=device, dtype=dtype, **engine_options)
        _STATE.update(key=key, holds=digest, builds=_STATE["builds"] + 1)
        view.built, view.seconds["engine_start"] = True, round(time.perf_counter() - began, 3)
    elif _STATE["holds"] != digest:
        began = time.perf_counter()
        _STATE["engine"].load_weights(path)
        _STATE["holds"] = digest
        view.loaded, view.seconds["weight_load"] = True, round(time.perf_counter() - began, 3)
    view.owner = _STATE["engine"]
    return view


def shared_engine_builds() -> int:
    """Engines this process has built for sharing (a count that only grows)."""
    return _STATE["builds"]


def release_shared() -> None:
    """Shut the process's shared engine down, if it has one."""
    engine, _STATE["engine"] = _STATE["engine"], None
    _STATE.update(key=None, holds=None)
    if engine is not None:
        engine.close()


def _release_at_exit() -> None:
    """The engine's shutdown at the interpreter's exit: its log lines may meet streams already closed
    (a test runner's capture), which is no error of ours to report."""
    import logging

    logging.raiseExceptions = False
    release_shared()


atexit.register(_release_at_exit)
