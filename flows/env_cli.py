"""`race env check NAME [--checkpoint DIR]`: is an environment (race's own, installed, or
`module:attribute`) fit to play? One line per problem (`race_core.envs.check`), exit status 1 when
there is any; then what it measured, as JSON.

`add_env_parser(subparsers)` adds it to the `race` command.
"""

from __future__ import annotations

import argparse
import json


def add_env_parser(subparsers) -> argparse.ArgumentParser:
    p = subparsers.add_parser("env", help="check an environment (a plug-in's too): its splits, expert, judge, "
                                          "tools and the cover on its episodes")
    p.add_argument("action", choices=("check",))
    p.add_argument("name", help="an environment's name, or module:attribute of one")
    p.add_argument("--tasks", type=int, default=4, help="tasks of each split (default: 4)")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--checkpoint", metavar="DIR", help="render the expert's episodes in this checkpoint's chat "
                                                     "template and run the cover on them (transformers)")
    p.add_argument("--epsilon", type=float, default=0.1, help="the cover's ε (default: 0.1)")
    p.add_argument("--device", default="cpu")
    p.set_defaults(func=cmd_env)
    return p


def cmd_env(args) -> int:
    from race_core.envs.check import check_environment

    if args.tasks < 1:
        raise ValueError(f"--tasks must be at least 1, got {args.tasks}")
    result = check_environment(args.name, tasks=args.tasks, seed=args.seed, checkpoint=args.checkpoint,
                               epsilon=args.epsilon, device=args.device)
    for line in result.problems:
        print(f"race env check {args.name}: {line}")
    print(json.dumps({"environment": args.name, "ok": result.ok, **result.facts}, indent=2))
    return 0 if result.ok else 1
