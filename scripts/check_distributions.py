"""Check what django-jobq's built distributions carry (run by scripts/check-wheel).

    python scripts/check_distributions.py dist/django_jobq-*.whl dist/django_jobq-*.tar.gz

The wheel must carry ``py.typed`` (the package is typed), the licence, the admin templates and
the migrations, and no test code; its metadata must name the licence, the classifiers and the
project's URLs and publish no development dependencies (they are a PEP 735 dependency group,
which is not metadata). The sdist must carry no tests: they need the repository's settings,
test apps and a PostgreSQL server, so they run from a checkout (MANIFEST.in).

Exits 1 with one line per problem, 0 when both are as they should be.
"""

from __future__ import annotations

import email.parser
import sys
import tarfile
import zipfile
from pathlib import Path


def wheel_problems(path: Path) -> list[str]:
    """What is wrong with the wheel at ``path``: a list of sentences, empty when nothing."""
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        metadata_name = next(name for name in names if name.endswith(".dist-info/METADATA"))
        metadata = email.parser.Parser().parsestr(wheel.read(metadata_name).decode())
    problems = []
    for required in ("django_jobq/py.typed", "django_jobq/migrations/0001_initial.py"):
        if required not in names:
            problems.append(f"wheel: {required} is missing")
    if not any(name.endswith(".dist-info/licenses/LICENSE") for name in names):
        problems.append("wheel: the LICENSE file is missing from .dist-info/licenses/")
    if not any(name.startswith("django_jobq/templates/") for name in names):
        problems.append("wheel: the admin templates are missing")
    top_level = {name.split("/")[0] for name in names}
    stray = sorted(top_level - {"django_jobq", Path(metadata_name).parent.name})
    if stray:
        problems.append(f"wheel: carries top-level entries other than the package: {stray}")
    if metadata.get("License-Expression") != "MIT":
        problems.append("wheel: METADATA has no License-Expression: MIT")
    classifiers = metadata.get_all("Classifier") or []
    for classifier in (
        "Typing :: Typed",
        "Framework :: Django :: 5.2",
        "Framework :: Django :: 6.1",
    ):
        if classifier not in classifiers:
            problems.append(f"wheel: METADATA lacks the classifier {classifier!r}")
    if not metadata.get_all("Project-URL"):
        problems.append("wheel: METADATA names no Project-URL")
    extras = metadata.get_all("Provides-Extra") or []
    if "dev" in extras:
        problems.append("wheel: METADATA publishes a 'dev' extra (a dependency group's job)")
    development = [
        requirement
        for requirement in metadata.get_all("Requires-Dist") or []
        if requirement.split()[0].split(";")[0] in {"pytest", "ruff", "mypy", "playwright"}
    ]
    if development:
        problems.append(f"wheel: METADATA requires development tools: {development}")
    return problems


def sdist_problems(path: Path) -> list[str]:
    """What is wrong with the sdist at ``path``: a list of sentences, empty when nothing."""
    with tarfile.open(path) as sdist:
        names = [name.split("/", 1)[1] for name in sdist.getnames() if "/" in name]
    problems = []
    tests = sorted(name for name in names if name.startswith(("tests/", "testproject/")))
    if tests:
        problems.append(f"sdist: carries {len(tests)} test files it cannot run, e.g. {tests[0]}")
    for required in ("LICENSE", "README.md", "pyproject.toml", "django_jobq/py.typed"):
        if required not in names:
            problems.append(f"sdist: {required} is missing")
    return problems


def main(paths: list[str]) -> int:
    problems: list[str] = []
    for name in paths:
        path = Path(name)
        if path.suffix == ".whl":
            problems += wheel_problems(path)
        elif path.name.endswith(".tar.gz"):
            problems += sdist_problems(path)
        else:
            problems.append(f"{path}: neither a wheel nor an sdist")
    for problem in problems:
        print(f"check_distributions: {problem}", file=sys.stderr)
    if not problems:
        print(f"check_distributions: {', '.join(Path(p).name for p in paths)}: as they should be")
    return 1 if problems else 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
