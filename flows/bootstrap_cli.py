"""`race bootstrap --checkpoint DIR --out DIR2 [--recipe expert-sft|expert-iteration]`: any local chat
checkpoint into a calculator policy in its own chat format (`race_core.train.checkpoint_bootstrap`),
saved as a `save_pretrained` folder with `race_bootstrap.json` (the recipe, what it trained on, and
the fresh on-policy check) beside it. The options are the fields of `AgentBootstrapConfig`.

`add_bootstrap_parser(subparsers)` adds it to the `race` command.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

from flows.options import add_config_options, config_from_args


def _fields() -> tuple[str, ...]:
    from race_core.train.checkpoint_bootstrap import AgentBootstrapConfig

    return tuple(f.name for f in dataclasses.fields(AgentBootstrapConfig) if f.name != "sft")


def add_bootstrap_parser(subparsers):
    """Add `bootstrap` to the `race` command's subparsers."""
    from race_core.train.checkpoint_bootstrap import AgentBootstrapConfig

    p = subparsers.add_parser("bootstrap", help="train a chat checkpoint to play the calculator in its own chat "
                                                "format (expert SFT or expert iteration)")
    p.add_argument("--checkpoint", required=True, help="a local save_pretrained folder of a chat model")
    p.add_argument("--out", required=True, help="the calculator policy's folder (must not exist)")
    p.add_argument("--device", default="cpu", help="cpu, cuda or cuda:N (default: cpu)")
    p.add_argument("--dtype", default="float32", help="model dtype while training (default: float32)")
    p.add_argument("--mixed-precision", default="no", choices=("no", "bf16", "fp16"),
                   help="SFT autocast: bf16 (CPUs with AMX / AVX512-BF16, GPUs), fp16 (GPU only) or no (default: no)")
    add_config_options(p, AgentBootstrapConfig(), top=_fields(), sections=("sft",))
    p.set_defaults(func=cmd_bootstrap)
    return p


def cmd_bootstrap(args) -> int:
    from race_core.train.checkpoint_bootstrap import AgentBootstrapConfig, bootstrap_checkpoint

    out = Path(args.out)
    if out.exists():
        raise FileExistsError(f"--out {str(out)!r} exists: give a new folder")
    config = config_from_args(AgentBootstrapConfig(), args)
    report = bootstrap_checkpoint(args.checkpoint, out, config, device=args.device, dtype=args.dtype,
                                  mixed_precision=args.mixed_precision)
    print(json.dumps({"checkpoint": str(out), "recipe": report.recipe, "check": report.check,
                      "rounds": report.rounds, "wall_s": report.wall_seconds}, indent=2))
    return 0
