"""The environments the pipeline can play (`--env NAME`): one declaration each, below.

An environment is one module with one `race_core.envs.base.Environment` instance in it; the
declaration names where it lives (imported when first asked for, so naming one costs nothing).
"""

from __future__ import annotations

import importlib
from functools import cache
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from race_core.envs.base import Environment

ENVIRONMENTS = {
    "calculator": "race_core.envs.calculator.environment:CALCULATOR",  # docs/architecture.md §6: 1-3 operations, or two-part
    "lookup": "race_core.envs.lookup:LOOKUP",  # multi-hop lookups in a generated people directory, then calc
}
ENV_NAMES = tuple(ENVIRONMENTS)
DEFAULT_ENV = "calculator"


@cache
def get_environment(name: str) -> Environment:
    """The environment declared as `name`; an unknown name is an error naming the choices."""
    try:
        where = ENVIRONMENTS[name]
    except KeyError:
        raise ValueError(f"unknown environment {name!r}: expected one of {list(ENVIRONMENTS)}") from None
    module, _, attribute = where.partition(":")
    return getattr(importlib.import_module(module), attribute)


def environment_named(environment: str) -> Environment | None:
    """The declared environment whose trajectories carry `environment` in their `environment`
    field (e.g. `bounded-calculator-v1`), or None."""
    return next((env for env in map(get_environment, ENVIRONMENTS) if env.environment == environment), None)
