"""Command-line options generated from the config dataclasses of `race_core.config`, so a setting
is declared once (name, type, default, help) and reaches the CLI, the flow and the UI alike.

A section's fields get its prefix (`sft.lr` -> `--sft-lr`, `rl.iterations` -> `--rl-iterations`;
ingest, cover and resources have none: `--epsilon`, `--device`). A field typed `Literal[...]` takes
those choices. Options default to "not given", so a command's base config (the library defaults, or
the demo's) keeps every value not named.
"""

from __future__ import annotations

import argparse
import dataclasses
import types
import typing
from typing import Any, Literal

from race_core.config import field_help, field_types, replace

PREFIXES = {"ingest": "", "cover": "", "resources": "", "sft": "sft-", "rl": "rl-", "evaluate": "eval-"}
FLAGS = {"inputs": "--input"}  # top-level fields whose flag is not their name
DEST = "config:"  # argparse dest prefix of generated options


def add_config_options(parser: argparse.ArgumentParser, base: Any, top: tuple[str, ...], sections: tuple[str, ...],
                       required: tuple[str, ...] = (), leave_out: tuple[str, ...] = ()) -> None:
    """Options for the `top` fields of `base`'s class and every field of its `sections` but those of
    `leave_out` (dotted names, `resources.train_processes`: fields none of the command's stages reads)."""
    cls = type(base)
    helps, kinds = field_help(cls), field_types(cls)
    for name in top:
        _add(parser, FLAGS.get(name, "--" + name.replace("_", "-")), name, kinds[name], getattr(base, name),
             helps.get(name, ""), name in required)
    for section in sections:
        part = getattr(base, section)
        doc = (type(part).__doc__ or "").strip().splitlines()[0]
        group = parser.add_argument_group(f"{section} ({doc})" if doc else section)
        section_helps, section_kinds = field_help(type(part)), field_types(type(part))
        for f in dataclasses.fields(part):
            if f"{section}.{f.name}" in leave_out:
                continue
            flag = "--" + PREFIXES[section] + f.name.replace("_", "-")
            _add(group, flag, f"{section}.{f.name}", section_kinds[f.name], getattr(part, f.name),
                 section_helps.get(f.name, ""))


def _add(parser, flag: str, dotted: str, kind: Any, default: Any, help_text: str, required: bool = False) -> None:
    options: dict[str, Any] = {"dest": DEST + dotted, "help": f"{help_text} (default: {default!r})",
                               "default": argparse.SUPPRESS, "required": required}
    kind = _unwrap_optional(kind)
    if kind is bool:
        options["action"] = "store_true" if not default else argparse.BooleanOptionalAction
    elif typing.get_origin(kind) is tuple:
        options.update(nargs="+", type=typing.get_args(kind)[0])
    else:
        options["type"] = kind
    if typing.get_origin(options.get("type")) is Literal:  # "" is a field's automatic value: the option not given
        options.update(type=str, choices=[c for c in typing.get_args(options["type"]) if c != ""])
    elif kind is not bool:
        options["metavar"] = dotted.rsplit(".", 1)[-1].upper()
    if required:
        options["help"] = help_text
    parser.add_argument(flag, **options)


def _unwrap_optional(kind: Any) -> Any:
    """`int | None` -> int."""
    if isinstance(kind, types.UnionType) or typing.get_origin(kind) is typing.Union:
        args = [a for a in typing.get_args(kind) if a is not type(None)]
        return args[0] if len(args) == 1 else str
    return kind


def config_from_args(base: Any, args: argparse.Namespace) -> Any:
    """`base` with every generated option that was given on the command line."""
    given = {dest[len(DEST):]: value for dest, value in vars(args).items() if dest.startswith(DEST)}
    return replace(base, **{k: tuple(v) if isinstance(v, list) else v for k, v in given.items()})
