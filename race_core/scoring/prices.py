"""The per-call price a CPU's batch plans take: measured per machine class, then fixed there.

The hf scorer's planner (`plan.py`) prices a forward as positions + attention pairs + a fixed price
per model call, in positions. That price is the machine's: a CPU with matrix extensions runs the
layers' products faster, so the same call's fixed part is worth more positions, and thread counts
change it too. It is measured (`plan.measure_overhead`: a call on one token against one on 4 x 64)
once per *machine class* and model shape, then fixed, because the plan decides which rows share a
forward and so the last bits of the scores a cover stores: a price that moved with the machine's
load would make a resumed cover's bytes differ from a clean one's on the same machine.

Where a price comes from, first match:

1. `prices.json` beside this module: prices measured on the machine classes the project ran on
   (`race bench price` prints the entry of this machine; the same entry on every machine of that
   class, so two hosts of one class plan alike);
2. this machine's own cache (`$RACE_CACHE_DIR/forward-prices/`, default `~/.cache/race`): one file
   per (class, shape), written once, create-if-absent, the first writer's figure kept;
3. measured now, and written to that cache.

A machine class is the CPU model, vendor and matrix extensions (`race_core.cpu.cpu_facts`) and the
torch thread count; a model shape is what sets a forward's cost (type, widths, layers, heads,
vocabulary, dtype), not the weights. Accelerators keep one figure (`plan.ACCELERATOR_OVERHEAD`): a
GPU call's fixed part is thousands of positions on any of them.
"""

from __future__ import annotations

import hashlib
import json
import os
from pathlib import Path
from typing import Any

import torch

from race_core.cpu import cpu_facts

TABLE = Path(__file__).with_name("prices.json")


def machine_class() -> dict[str, Any]:
    """This CPU's class: model, vendor, matrix extensions and torch threads."""
    facts = cpu_facts()
    return {"cpu": facts["model"], "vendor": facts["vendor"], "matrix_extensions": list(facts["matrix_extensions"]),
            "torch_threads": torch.get_num_threads()}


def model_shape(model) -> dict[str, Any]:
    """What sets a forward's cost: the text model's type, widths, depth, heads, vocabulary and dtype."""
    config = model.config.get_text_config()
    return {"model_type": config.model_type, "hidden": config.hidden_size, "layers": config.num_hidden_layers,
            "heads": config.num_attention_heads,
            "kv_heads": getattr(config, "num_key_value_heads", None) or config.num_attention_heads,
            "intermediate": getattr(config, "intermediate_size", None), "vocab": config.vocab_size,
            "dtype": str(next(model.parameters()).dtype).removeprefix("torch.")}


def entry_key(machine: dict[str, Any], shape: dict[str, Any]) -> str:
    """The id of a (machine class, model shape) pair: sha256 of their canonical JSON, 16 hex digits."""
    text = json.dumps({"machine": machine, "shape": shape}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:16]


def cache_dir() -> Path:
    return Path(os.environ.get("RACE_CACHE_DIR") or Path.home() / ".cache" / "race") / "forward-prices"


def table() -> dict[str, dict[str, Any]]:
    """The measured entries the project ships: entry key -> {machine, shape, forward_overhead}."""
    return json.loads(TABLE.read_text()) if TABLE.exists() else {}


def cpu_overhead(model) -> tuple[float, str]:
    """The per-call price (positions) of `model` on this CPU, and where it came from: "table",
    "cache" or "measured" (then written to the cache)."""
    from race_core.scoring.plan import measure_overhead

    machine, shape = machine_class(), model_shape(model)
    key = entry_key(machine, shape)
    shipped = table().get(key)
    if shipped is not None:
        return float(shipped["forward_overhead"]), "table"
    path = cache_dir() / f"{key}.json"
    if path.exists():
        return float(json.loads(path.read_text())["forward_overhead"]), "cache"
    entry = {"machine": machine, "shape": shape, "forward_overhead": measure_overhead(model)}
    path.parent.mkdir(parents=True, exist_ok=True)
    written = path.with_name(f".{path.name}.{os.getpid()}")
    written.write_text(json.dumps(entry, indent=1, sort_keys=True) + "\n")
    try:
        os.link(written, path)  # create-if-absent, whole: a concurrent first writer's figure wins
    except FileExistsError:
        return float(json.loads(path.read_text())["forward_overhead"]), "cache"
    finally:
        written.unlink()
    return float(entry["forward_overhead"]), "measured"
