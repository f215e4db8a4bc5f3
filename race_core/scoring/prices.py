"""The per-call price a CPU's batch plans take: measured per machine class, fixed in a table.

The hf scorer's planner (`plan.py`) prices a forward as positions + attention pairs + a fixed price
per model call, in positions. That price is the machine's: a CPU with matrix extensions runs the
layers' products faster, so the same call's fixed part is worth more positions. It is measured
(`race bench price`: `plan.measure_overhead`, a call on one token against one on 4 x 64, several
times) per *machine class* and model shape and written to a table; the pipeline only reads the table.
It never measures on its own, because the plan decides which rows share a forward and so the last
bits of the scores a cover stores: a price measured by each process would move with the machine's
load and with each worker's thread count, and a resumed cover, or one spread over a Prefect pool or
Ray actors, would store other bytes than one process's clean run.

Where a price comes from, first match:

1. the table in `$RACE_FORWARD_PRICES` (a JSON file of `race bench price` entries: a user's own
   classes; give every host of a pool the same file);
2. `prices.json` beside this module: the classes the project measured;
3. `plan.CPU_OVERHEAD`, for a class nobody measured.

A machine class is the CPU model, vendor and matrix extensions (`race_core.cpu.cpu_facts`); a model
shape is what sets a forward's cost (type, widths, depth, heads, vocabulary, dtype), not the weights.
The thread count an entry was measured at is recorded beside it, not in its key, so that processes
of one host with different thread counts (a pool's or Ray's workers) plan alike. Accelerators keep
one figure (`plan.ACCELERATOR_OVERHEAD`): a GPU call's fixed part is thousands of positions on any.
"""

from __future__ import annotations

import hashlib
import json
import os
from functools import cache
from pathlib import Path
from typing import Any

from race_core.cpu import cpu_facts

TABLE = Path(__file__).with_name("prices.json")
USER_TABLE = "RACE_FORWARD_PRICES"  # environment variable: a user's table, read before the shipped one


def machine_class() -> dict[str, Any]:
    """This CPU's class: model, vendor and matrix extensions."""
    facts = cpu_facts()
    return {"cpu": facts["model"], "vendor": facts["vendor"], "matrix_extensions": list(facts["matrix_extensions"])}


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


@cache
def _read(path: str) -> dict[str, dict[str, Any]]:
    try:
        return json.loads(Path(path).read_text())
    except FileNotFoundError:
        return {}
    except ValueError as exc:
        raise ValueError(f"{path}: not a table of forward prices ({exc})") from None


def tables() -> list[tuple[str, dict[str, dict[str, Any]]]]:
    """(source, entries) in the order they are read: the user's table, then the shipped one."""
    user = os.environ.get(USER_TABLE)
    return ([(f"${USER_TABLE}", _read(user))] if user else []) + [("prices.json", _read(str(TABLE)))]


def cpu_overhead(model) -> tuple[float, str]:
    """The per-call price (positions) of `model` on this CPU's class, and where it came from."""
    from race_core.scoring.plan import CPU_OVERHEAD

    key = entry_key(machine_class(), model_shape(model))
    for source, entries in tables():
        if key in entries:
            return float(entries[key]["forward_overhead"]), f"{source} {key}"
    return CPU_OVERHEAD, f"default (class not measured: race bench price; entry {key})"
