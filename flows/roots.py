"""Where a served flow run may read and write (`race serve --allow-root ROOT ...`).

Anyone who can create flow runs on a served deployment chooses its parameters. Without limits, a
run could read any fsspec URL through `inputs` (http included) or write into any folder through
`report_dir` or `store`. `race serve --allow-root` puts the roots in `RACE_ALLOWED_ROOTS` (the
served flow runs inherit it), and each flow checks every path and URL parameter against them
before anything runs: a local path must resolve (symlinks and `..` followed) inside a local root,
a URL must start with a URL root of the same scheme. Without the variable (the CLI on your own
machine) nothing is restricted.
"""

from __future__ import annotations

import os
from collections.abc import Iterable
from pathlib import Path

ROOTS_ENV = "RACE_ALLOWED_ROOTS"
SEPARATOR = "\n"


def allowed_roots() -> tuple[str, ...] | None:
    """The roots a served flow may touch, or None when unrestricted."""
    value = os.environ.get(ROOTS_ENV)
    return tuple(r for r in value.split(SEPARATOR) if r) if value else None


def roots_env(roots: Iterable[str]) -> str:
    """The `RACE_ALLOWED_ROOTS` value for these roots (local ones made absolute)."""
    return SEPARATOR.join(r if "://" in r else str(Path(r).resolve()) for r in roots)


def check_within_roots(parameters: dict[str, Iterable[str] | str | None], roots: tuple[str, ...] | None) -> None:
    """Raise ValueError naming the first parameter whose path or URL is outside `roots`."""
    if roots is None:
        return
    for name, values in parameters.items():
        for value in [values] if isinstance(values, str) else (values or ()):
            if not _within(str(value), roots):
                raise ValueError(f"parameter {name!r}: {value!r} is outside the roots this server allows "
                                 f"({', '.join(roots)}; race serve --allow-root)")


def _within(value: str, roots: tuple[str, ...]) -> bool:
    if "://" in value:
        return any("://" in root and value.startswith(root.rstrip("/") + "/") or value == root for root in roots)
    path = Path(value.split("*", 1)[0] or ".").resolve()  # a glob: its fixed part
    return any("://" not in root and path.is_relative_to(Path(root).resolve()) for root in roots)
