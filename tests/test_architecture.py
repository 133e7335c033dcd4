"""Dependencies point one way (docs/architecture.md §2): the catalogue, the scheduling core and the capacity planner
import only the standard library and themselves (the planner also the scheduler's types); the node agent
imports the catalogue and itself. Relative imports count as imports of the package they resolve into."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE = {
    "gpus": {"gpus"},
    "broker/scheduler": {"gpus", "broker.scheduler"},
    "broker/capacity": {"gpus", "broker.scheduler", "broker.capacity"},
    "agent": {"gpus", "agent"},
}
THIRD_PARTY_ALLOWED = {"agent": {"nvidia_ml_py", "pynvml", "aiohttp"}}


def _module_of(path: Path) -> list[str]:
    """The dotted package path of the module at ``path`` (``broker/capacity/planner.py`` -> broker.capacity)."""
    return list(path.relative_to(ROOT).parent.parts)


def imports_of(path: Path, source: str | None = None) -> set[str]:
    """Every module ``path`` imports, as dotted names; relative imports resolved against its package."""
    tree = ast.parse(source if source is not None else path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name for alias in node.names}
        elif isinstance(node, ast.ImportFrom):
            if node.level == 0:
                base = node.module or ""
            else:
                package = _module_of(path)
                parent = package[: len(package) - (node.level - 1)] if node.level > 1 else package
                base = ".".join([*parent, *(node.module.split(".") if node.module else [])])
            if node.module or node.level == 0:
                names.add(base)
            else:  # from . import x  /  from .. import x: the names are modules of that package
                names |= {f"{base}.{alias.name}" for alias in node.names}
    return names


def offending(name: str, allowed: set[str]) -> bool:
    if name.split(".")[0] in sys.stdlib_module_names:
        return False
    return not any(name == prefix or name.startswith(prefix + ".") for prefix in allowed)


@pytest.mark.parametrize("package", sorted(PURE))
def test_architecture_pure_packages_import_only_stdlib(package):
    folder = ROOT / package
    if not folder.exists():
        pytest.skip(f"{package} does not exist yet")
    allowed = PURE[package] | THIRD_PARTY_ALLOWED.get(package, set())
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in folder.rglob("*.py")
        for name in imports_of(path)
        if offending(name, allowed)
    }
    assert not offenders, offenders


@pytest.mark.parametrize(
    ("source", "bad"),
    [
        ("from ..sim import capacity", "broker.sim"),
        ("from ..api import views", "broker.api"),
        ("from .. import models", "broker.models"),
        ("import django", "django"),
        ("from django.db import models", "django.db"),
        ("from broker import models", "broker"),
    ],
)
def test_architecture_catches_relative_and_django_imports(source, bad):
    """The check itself: a relative import out of the pure package is caught like an absolute one (the old
    check skipped every ``from . import`` / ``from .. import`` and ``broker`` allowed all of broker)."""
    path = ROOT / "broker" / "capacity" / "planner.py"
    names = imports_of(path, source)
    assert bad in names
    assert offending(bad, PURE["broker/capacity"])


def test_architecture_allows_the_pure_packages_own_imports():
    path = ROOT / "broker" / "capacity" / "planner.py"
    names = imports_of(path, "from .types import Mode\nfrom broker.scheduler.types import Kind\nimport math")
    assert not [n for n in names if offending(n, PURE["broker/capacity"])]
