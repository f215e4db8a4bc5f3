"""An optimizer's state as safe files, so a training run stopped between two updates continues where
an uninterrupted one would (docs/architecture.md §7: only safetensors and JSON are stored).

`save_optimizer(optimizer, model, folder)` writes `optimizer.safetensors` (each parameter's state
tensors, keyed `<parameter name>/<state name>`) and `optimizer.json` (the hyperparameters of each
group, and which parameters it holds, by name); `load_optimizer` puts them back into an optimizer
built over the same model. Values are written as they are held (float32 moments stay float32), so a
reloaded AdamW takes the next step bit for bit as the one that saved them. Parameters are named by
`model.named_parameters()` (tied weights once, under their first name).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch

STATE_FILE = "optimizer.safetensors"
META_FILE = "optimizer.json"


def _names(model) -> dict[int, str]:
    return {id(p): name for name, p in model.named_parameters()}


def save_optimizer(optimizer: torch.optim.Optimizer, model, folder: str | Path) -> Path:
    """Write the optimizer's state into `folder` (created); returns the folder."""
    from safetensors.torch import save_file

    out = Path(folder)
    out.mkdir(parents=True, exist_ok=True)
    names = _names(model)
    tensors: dict[str, torch.Tensor] = {}
    groups: list[dict[str, Any]] = []
    for group in optimizer.param_groups:
        params = [names[id(p)] for p in group["params"]]
        groups.append({**{k: v for k, v in group.items() if k != "params"}, "params": params})
        for p, name in zip(group["params"], params, strict=True):
            for key, value in optimizer.state.get(p, {}).items():
                tensors[f"{name}/{key}"] = value.detach().cpu().contiguous() if torch.is_tensor(value) \
                    else torch.tensor(value)
    save_file(tensors, str(out / STATE_FILE))
    (out / META_FILE).write_text(json.dumps({"type": type(optimizer).__name__, "groups": groups}, sort_keys=True,
                                            default=_json_value))
    return out


def load_optimizer(optimizer: torch.optim.Optimizer, model, folder: str | Path) -> None:
    """Load the state `save_optimizer` wrote into `optimizer` (built over the same model's parameters,
    in the same groups); an optimizer of another type or other parameters is an error naming them."""
    from safetensors.torch import load_file

    folder = Path(folder)
    meta = json.loads((folder / META_FILE).read_text())
    if meta["type"] != type(optimizer).__name__:
        raise ValueError(f"{folder}: the saved state is a {meta['type']}'s, not a {type(optimizer).__name__}'s")
    names = _names(model)
    mine = [[names[id(p)] for p in group["params"]] for group in optimizer.param_groups]
    saved = [group["params"] for group in meta["groups"]]
    if mine != saved:
        raise ValueError(f"{folder}: the saved optimizer state holds other parameters than this model's "
                         f"({sum(map(len, saved))} saved, {sum(map(len, mine))} here)")
    tensors = load_file(str(folder / STATE_FILE))
    by_name = {name: p for name, p in ((names[id(p)], p) for g in optimizer.param_groups for p in g["params"])}
    state: dict[torch.nn.Parameter, dict[str, Any]] = {}
    for key, value in tensors.items():
        name, _, field = key.rpartition("/")
        param = by_name[name]
        state.setdefault(param, {})[field] = value.to(param.device) if value.dim() else value
    optimizer.state.clear()
    optimizer.state.update(state)
    for group, saved_group in zip(optimizer.param_groups, meta["groups"], strict=True):
        for k, v in saved_group.items():
            if k != "params":
                group[k] = tuple(v) if isinstance(v, list) else v


def _json_value(value: Any) -> Any:
    if torch.is_tensor(value):
        return value.item()
    raise TypeError(f"an optimizer setting of type {type(value).__name__} cannot be saved as JSON")
