"""Dependencies point one way (DESIGN.md §2): the catalogue and the scheduling core import only the
standard library and themselves; the node agent imports the catalogue and itself."""

import ast
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
PURE = {"gpus": {"gpus"}, "broker/scheduler": {"gpus", "broker"}, "agent": {"gpus", "agent"}}
THIRD_PARTY_ALLOWED = {"agent": {"nvidia_ml_py", "pynvml", "aiohttp"}}


def _imports(path: Path) -> set[str]:
    tree = ast.parse(path.read_text(), filename=str(path))
    names = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names |= {alias.name.split(".")[0] for alias in node.names}
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names.add(node.module.split(".")[0])
    return names


@pytest.mark.parametrize("package", sorted(PURE))
def test_architecture_pure_packages_import_only_stdlib(package):
    folder = ROOT / package
    if not folder.exists():
        pytest.skip(f"{package} does not exist yet")
    allowed = PURE[package] | THIRD_PARTY_ALLOWED.get(package, set()) | set(sys.stdlib_module_names)
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in folder.rglob("*.py")
        for name in _imports(path) - allowed
    }
    assert not offenders, offenders
