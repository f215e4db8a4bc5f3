"""The environments the pipeline can play (`--env NAME`), from three places:

- declared here, one line each (`ENVIRONMENTS`): the calculator and the lookup world;
- installed: a package declares `[project.entry-points."race.environments"] NAME = "module:attribute"`
  and its environment is `--env NAME` (in the CLI's help and the UI's form once installed);
- referenced: `--env module:attribute` for any importable `race_core.envs.base.Environment` instance
  (a module of the user's own, importable from where the pipeline runs).

An environment is one object, `race_core.envs.base.Environment`; a name is resolved when first asked
for (naming one costs nothing). docs/guides/environments.md shows how to write one.
"""

from __future__ import annotations

import hashlib
import importlib
import logging
import sys
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from race_core.envs.base import Environment

logger = logging.getLogger(__name__)

ENVIRONMENTS = {
    "calculator": "race_core.envs.calculator.environment:CALCULATOR",  # docs/architecture.md §6: 1-3 operations, or two-part
    "lookup": "race_core.envs.lookup:LOOKUP",  # multi-hop lookups in a generated people directory, then calc
}
ENTRY_POINT_GROUP = "race.environments"
DEFAULT_ENV = "calculator"
_KEYS: dict[int, str] = {}  # id(environment) -> the name `get_environment` found it by


@cache
def installed_environments() -> dict[str, str]:
    """NAME -> "module:attribute" of the environments installed packages declare (entry point group
    `race.environments`). A name the package declares itself keeps its meaning (a warning says so)."""
    from importlib.metadata import entry_points

    found: dict[str, str] = {}
    for point in entry_points(group=ENTRY_POINT_GROUP):
        if point.name in ENVIRONMENTS:
            logger.warning(f"environment {point.name!r} of {point.value!r} (entry point {ENTRY_POINT_GROUP}) "
                           f"is ignored: {point.name!r} is race's own")
            continue
        found.setdefault(point.name, point.value)
    return found


def environment_names() -> tuple[str, ...]:
    """Every name `--env` takes besides `module:attribute` references: race's own, then installed ones."""
    return (*ENVIRONMENTS, *sorted(installed_environments()))


ENV_NAMES = environment_names()


def is_reference(name: str) -> bool:
    """`module:attribute` rather than a name."""
    return ":" in name


@cache
def get_environment(name: str) -> Environment:
    """The environment `name` names (race's own, installed, or a `module:attribute` reference). A name
    nothing declares, a reference that does not import, or an object that is no `Environment` is a
    ValueError saying which."""
    from race_core.envs.base import Environment

    where = ENVIRONMENTS.get(name) or installed_environments().get(name) or (name if is_reference(name) else None)
    if where is None:
        raise ValueError(f"unknown environment {name!r}: expected one of {list(environment_names())} or "
                         "module:attribute of an importable race_core.envs.base.Environment")
    module, _, attribute = where.partition(":")
    try:
        found: Any = importlib.import_module(module)
        for part in attribute.split("."):
            found = getattr(found, part)
    except (ImportError, AttributeError) as exc:
        raise ValueError(f"environment {name!r}: cannot load {where!r}: {type(exc).__name__}: {exc}") from None
    if not isinstance(found, Environment):
        raise ValueError(f"environment {name!r}: {where!r} is a {type(found).__name__}, not an instance of "
                         "race_core.envs.base.Environment")
    _KEYS.setdefault(id(found), name)
    return found


def environment_key(env: Environment) -> str:
    """The name `get_environment` finds `env` by (what a policy's prompt records): its `module:attribute`
    where it was loaded by reference, else its name."""
    return _KEYS.get(id(env), env.name)


def environment_named(environment: str) -> Environment | None:
    """The environment whose trajectories carry `environment` in their `environment` field (e.g.
    `bounded-calculator-v1`), among race's own, installed ones and those loaded by reference; or None."""
    names = (*environment_names(), *(key for key in _KEYS.values() if is_reference(key)))
    for name in names:
        try:
            env = get_environment(name)
        except ValueError as exc:  # a broken installed plug-in does not hide the others
            logger.warning(str(exc))
            continue
        if env.environment == environment:
            return env
    return None


def environment_code(name: str) -> dict[str, str | None] | None:
    """What a stage's key must cover of an environment not race's own: the sha256 of the source file
    its object is defined in and its distribution's version (None for race's own, whose source the
    stages' declared sources already cover)."""
    if name in ENVIRONMENTS:
        return None
    env = get_environment(name)
    module = sys.modules.get(type(env).__module__)
    source = getattr(module, "__file__", None)
    digest = hashlib.sha256(Path(source).read_bytes()).hexdigest() if source else None
    top = type(env).__module__.partition(".")[0]
    return {"source": digest, "package": _distribution_version(top)}


def _distribution_version(top_module: str) -> str | None:
    from importlib.metadata import PackageNotFoundError, packages_distributions, version

    for distribution in packages_distributions().get(top_module, ()):
        try:
            return version(distribution)
        except PackageNotFoundError:
            continue
    return None


def env_argument(value: str) -> str:
    """argparse's `type=` for an `--env` option: the name, once it resolves (else the reason)."""
    import argparse

    try:
        get_environment(value)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from None
    return value


def env_help() -> str:
    """The `--env` choices, for help texts."""
    return ", ".join(environment_names()) + ", or module:attribute"
