"""Policy checkpoints: local folders only, safetensors only, no remote code. Loading, saving,
the digest that identifies a checkpoint, and the tokenizer facts every backend shares (pad id)."""

from __future__ import annotations

import hashlib
from pathlib import Path

from race_core.config import canonical_dtype


def torch_dtype(name: str):
    import torch

    return getattr(torch, canonical_dtype(name))


# The files that define a model: its config, weights, tokenizer and chat template (what
# `save_pretrained` writes). Anything else in the folder (a README, `.git`, a cache marker) is not
# the model and leaves its digest alone.
MODEL_FILES = (
    "config.json", "generation_config.json", "*.safetensors", "*.safetensors.index.json",
    "tokenizer.json", "tokenizer_config.json", "special_tokens_map.json", "added_tokens.json",
    "vocab.json", "vocab.txt", "merges.txt", "*.model",  # BPE / WordPiece / sentencepiece vocabularies
    "chat_template.jinja", "chat_template.json", "additional_chat_templates/*.jinja",
)
DIGEST_CHUNK = 1 << 20  # bytes read at a time: memory stays flat for any weights size


def checkpoint_digest(folder: str | Path) -> str:
    """sha256 over (relative path, file sha256) of the files that define the model (`MODEL_FILES`),
    each streamed in chunks: identifies a checkpoint."""
    folder = check_checkpoint_dir(folder)
    files = sorted({path for pattern in MODEL_FILES for path in folder.glob(pattern) if path.is_file()})
    h = hashlib.sha256()
    for path in files:
        file_hash = hashlib.sha256()
        with path.open("rb") as fh:
            while chunk := fh.read(DIGEST_CHUNK):
                file_hash.update(chunk)
        h.update(path.relative_to(folder).as_posix().encode() + b"\0")
        h.update(file_hash.digest())
    return h.hexdigest()


CONTEXT_FIELDS = ("max_position_embeddings", "n_positions", "max_sequence_length", "seq_length", "n_ctx")


def model_context(config) -> int | None:
    """The longest sequence a model was built for, from its transformers config (None if unknown)."""
    for name in CONTEXT_FIELDS:
        value = getattr(config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def pad_token_id(tokenizer, fallback: int = 0) -> int:
    """The id used to pad batches: the tokenizer's pad token, else `fallback`. Padding is always
    masked out, so any id works; one place decides which."""
    return tokenizer.pad_token_id if tokenizer.pad_token_id is not None else fallback


def check_checkpoint_dir(checkpoint: str | Path) -> Path:
    path = Path(checkpoint)
    if not path.is_dir():
        raise FileNotFoundError(
            f"checkpoint {str(path)!r} is not a local folder (hub names are not downloaded; "
            "pass a folder written by save_pretrained)"
        )
    if not (path / "config.json").exists():
        raise FileNotFoundError(f"checkpoint folder {str(path)!r} has no config.json")
    if not any(path.glob("*.safetensors")):
        raise FileNotFoundError(f"checkpoint folder {str(path)!r} has no .safetensors weights (pickle is refused)")
    return path


def load_tokenizer(checkpoint: str | Path):
    from transformers import AutoTokenizer

    path = check_checkpoint_dir(checkpoint)
    tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True, trust_remote_code=False)
    if tokenizer.pad_token_id is None:
        tokenizer.pad_token = tokenizer.eos_token
    return tokenizer


def load_policy(checkpoint: str | Path, device: str = "cpu", dtype: str = "float32"):
    """(model, tokenizer) from a local `save_pretrained` folder, in eval mode on `device`. On a CPU
    the process keeps freed memory for its next forward (`memory.keep_freed_memory`)."""
    import torch
    from transformers import AutoModelForCausalLM

    from race_core.memory import keep_freed_memory

    if torch.device(device).type == "cpu":
        keep_freed_memory()

    path = check_checkpoint_dir(checkpoint)
    model = AutoModelForCausalLM.from_pretrained(
        path, local_files_only=True, trust_remote_code=False, use_safetensors=True, dtype=torch_dtype(dtype)
    )
    return model.to(device).eval(), load_tokenizer(path)


def save_policy(model, tokenizer, out_dir: str | Path) -> Path:
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out, safe_serialization=True)
    tokenizer.save_pretrained(out)
    return out
