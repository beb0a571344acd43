"""The package's layers (pyproject.toml's ``[tool.importlinter]`` contracts) hold, and every
module of the package has its place in them.

The contracts say which module may import which: a module imports only from its own layer
or those below it, and no package's modules import each other in a cycle. import-linter reads
the source's imports (those inside functions and under ``TYPE_CHECKING`` too), so a lazy
import cannot hide a cycle.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

import grimp
from importlinter.cli import lint_imports

ROOT = Path(__file__).resolve().parents[2]
PYPROJECT = ROOT / "pyproject.toml"


def _layered_modules() -> set[str]:
    """Every module named by a layer of the layers contract."""
    config = tomllib.loads(PYPROJECT.read_text())["tool"]["importlinter"]
    (layers,) = (c["layers"] for c in config["contracts"] if c["type"] == "layers")
    return {name.strip() for layer in layers for name in layer.split("|")}


def test_the_import_contracts_hold() -> None:
    assert lint_imports(config_filename=str(PYPROJECT), no_cache=True) == 0


def test_every_module_of_the_package_has_a_layer() -> None:
    """A module is placed by naming it or a package holding it; a package whose own
    ``__init__`` imports nothing of the package may instead have each submodule placed."""
    graph = grimp.build_graph("django_jobq")
    layered = _layered_modules()

    def placed(module: str) -> bool:
        parts = module.split(".")
        return any(".".join(parts[:n]) in layered for n in range(2, len(parts) + 1))

    unplaced: set[str] = set()
    for module in graph.modules:
        if ".migrations" in module or placed(module):
            continue
        children = graph.find_children(module)
        imports_nothing = not graph.find_modules_directly_imported_by(module)
        if not (children and imports_nothing and all(placed(c) for c in children)):
            unplaced.add(module)
    # The root package re-exports the public API (``from django_jobq import job``): it is the
    # top of everything, as any user's import of it is.
    assert unplaced == {"django_jobq"}
