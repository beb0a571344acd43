"""Print pip constraints that pin each dependency of pyproject.toml to its floor.

    python scripts/dependency_floors.py > floors.txt
    pip install --constraint floors.txt "dist/django_jobq-...whl[binary]"

Each ``name>=X`` of ``[project] dependencies`` becomes ``name==X``, and psycopg's binary
build is pinned to psycopg's floor as well (the ``binary`` extra installs it), so that
scripts/check-wheel can run a job with the oldest releases the package claims to support.

Exits 1 naming the dependency when one has no ``>=`` floor.
"""

from __future__ import annotations

import re
import tomllib
from pathlib import Path

FLOOR = re.compile(r"(?P<name>[A-Za-z0-9_.-]+)(?:\[[^]]*\])?\s*>=\s*(?P<version>[0-9][0-9.]*)")


def floors(pyproject: Path) -> list[str]:
    """``name==floor`` (pip constraint lines, str) for each dependency of ``pyproject`` (the
    path of a pyproject.toml), plus ``psycopg-binary`` at psycopg's floor.

    Raises:
        SystemExit: a dependency has no ``>=`` floor.
    """
    dependencies = tomllib.loads(pyproject.read_text())["project"]["dependencies"]
    pins: dict[str, str] = {}
    for requirement in dependencies:
        match = FLOOR.match(requirement)
        if match is None:
            raise SystemExit(f"dependency_floors: {requirement!r} has no '>=' floor")
        pins[match["name"].lower()] = match["version"]
    pins["psycopg-binary"] = pins["psycopg"]
    return [f"{name}=={version}" for name, version in pins.items()]


if __name__ == "__main__":
    root = Path(__file__).resolve().parent.parent
    print("\n".join(floors(root / "pyproject.toml")))
