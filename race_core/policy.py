"""Loading and saving policy checkpoints: local folders only, safetensors only, no remote code."""

from __future__ import annotations

from pathlib import Path

DTYPES = {"float32": "float32", "fp32": "float32", "bfloat16": "bfloat16", "bf16": "bfloat16",
          "float16": "float16", "fp16": "float16"}


def torch_dtype(name: str):
    import torch

    try:
        return getattr(torch, DTYPES[name])
    except KeyError:
        raise ValueError(f"unknown dtype {name!r}: expected one of {sorted(DTYPES)}") from None


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
    """(model, tokenizer) from a local `save_pretrained` folder, in eval mode on `device`."""
    from transformers import AutoModelForCausalLM

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
