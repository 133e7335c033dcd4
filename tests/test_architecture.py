"""Dependencies point one way (docs/architecture.md §2): the catalogue, the scheduling core, the capacity planner
and billing's arithmetic import only the standard library and what is listed for them; the node agent imports
the catalogue and itself. Relative imports count as imports of the package they resolve into, and
``from broker import scheduler`` counts as an import of ``leasing`` (all of it). The apps built on leasing
(billing, fleet, notifications) take part in its decisions through ``broker.extensions``: leasing imports none
of them."""

import ast
import json
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
# a folder (every module under it) or one module -> the project modules it may import, besides the standard
# library; a prefix allows its submodules ("gpus" allows gpus.mig)
PURE = {
    "gpus": {"gpus"},
    "broker/scheduler": {"gpus", "broker.scheduler"},
    "capacity/planner": {"gpus", "broker.scheduler.types", "capacity.planner"},
    # the pipeline planners (ESG, model splits): the catalogue and themselves
    "pipelines/planner": {"gpus", "pipelines.planner"},
    "agent": {"gpus", "agent"},
    # billing's arithmetic: money and rates, metering intervals, SLO figures, periods (no Django, no database)
    "billing/core/pricing.py": {"gpus"},
    "billing/core/metering.py": set(),
    "billing/core/slo.py": set(),
    "billing/core/periods.py": set(),
    # auto-tiering's decision engine: features, rules, the forest, the choice (docs/tiering.md)
    "tiering/engine": {"gpus", "tiering.engine"},
}
THIRD_PARTY_ALLOWED = {"agent": {"nvidia_ml_py", "pynvml", "aiohttp"}, "tiering/engine": {"numpy", "sklearn"}}
# what must not be loaded at all when the pure modules are imported (a package __init__ counts too)
FRAMEWORKS = {"django", "rest_framework", "celery", "kombu", "psycopg", "requests"}


def _files(target: str) -> list[Path]:
    path = ROOT / target
    return [path] if target.endswith(".py") else sorted(path.rglob("*.py"))


def _dotted(target: str) -> str:
    return target.removesuffix(".py").replace("/", ".")


def _module_of(path: Path) -> list[str]:
    """The dotted package path of the module at ``path`` (``capacity/planner/planner.py`` -> capacity.planner)."""
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


@pytest.mark.parametrize("target", sorted(PURE))
def test_architecture_pure_packages_import_only_stdlib(target):
    assert (ROOT / target).exists(), f"{target} is listed as pure but does not exist: update PURE"
    allowed = {_dotted(target)} | PURE[target] | THIRD_PARTY_ALLOWED.get(target, set())
    offenders = {
        f"{path.relative_to(ROOT)}: {name}"
        for path in _files(target)
        for name in imports_of(path)
        if offending(name, allowed)
    }
    assert not offenders, offenders


def test_architecture_pure_modules_load_no_framework():
    """Importing every pure module (with the package __init__ files on the way) loads no Django, Celery or
    database driver: checked in a fresh interpreter, so a dynamic or indirect import is caught too."""
    modules = sorted({_dotted(str(path.relative_to(ROOT))).removesuffix(".__init__")
                      for target in PURE if target != "agent" for path in _files(target)})
    code = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    assert "broker" in loaded and "billing" in loaded  # the check did import them
    assert not loaded & FRAMEWORKS, sorted(loaded & FRAMEWORKS)


def _offenders_in(target: str, module: str, source: str) -> set[str]:
    """What the check would report for ``source`` written in ``module`` of ``target``."""
    allowed = {_dotted(target)} | PURE[target] | THIRD_PARTY_ALLOWED.get(target, set())
    return {name for name in imports_of(ROOT / module, source) if offending(name, allowed)}


@pytest.mark.parametrize(
    ("target", "module", "source", "bad"),
    [
        # relative imports resolve into the package they name
        ("capacity/planner", "capacity/planner/planner.py", "from ..sim import capacity", "capacity.sim"),
        ("capacity/planner", "capacity/planner/planner.py", "from ..api import views", "broker.api"),
        ("capacity/planner", "capacity/planner/planner.py", "from .. import models", "broker.models"),
        ("capacity/planner", "capacity/planner/planner.py", "import django", "django"),
        ("capacity/planner", "capacity/planner/planner.py", "from django.db import models", "django.db"),
        ("capacity/planner", "capacity/planner/planner.py", "from broker import models", "broker"),
        # the planner may use the scheduler's types, not the scheduler itself
        ("capacity/planner", "capacity/planner/planner.py", "from broker.scheduler.plan import plan",
         "broker.scheduler.plan"),
        ("capacity/planner", "capacity/planner/planner.py", "from ..scheduler import placement", "broker.scheduler"),
        ("capacity/planner", "capacity/planner/planner.py", "from broker.scheduler import plan", "broker.scheduler"),
        # the scheduling core: itself, gpus and the standard library; not the rest of leasing
        ("broker/scheduler", "broker/scheduler/plan.py", "from capacity.planner import plan_capacity",
         "capacity.planner"),
        ("broker/scheduler", "broker/scheduler/plan.py", "from broker.selectors import lease_queue",
         "broker.selectors"),
        ("broker/scheduler", "broker/scheduler/plan.py", "from .. import services", "broker.services"),
        ("broker/scheduler", "broker/scheduler/plan.py", "from broker import choices", "broker"),
        # billing's arithmetic: no Django, no billing models or services
        ("billing/core/pricing.py", "billing/core/pricing.py", "from django.conf import settings", "django.conf"),
        ("billing/core/pricing.py", "billing/core/pricing.py", "from ..models import PriceBook", "billing.models"),
        ("billing/core/metering.py", "billing/core/metering.py", "from billing.services import period_bounds",
         "billing.services"),
        ("billing/core/slo.py", "billing/core/slo.py", "from .. import models", "billing.models"),
        ("billing/core/slo.py", "billing/core/slo.py", "from billing.core.pricing import to_minor",
         "billing.core.pricing"),
        # the pipeline planners: not the scheduler, not the Django app that stores their plans
        ("pipelines/planner", "pipelines/planner/esg.py", "from broker.scheduler import plan", "broker.scheduler"),
        ("pipelines/planner", "pipelines/planner/esg.py", "from pipelines.models import Pipeline", "pipelines.models"),
        # the decision engine: not the tiering app's models or services
        ("tiering/engine", "tiering/engine/decide.py", "from ..models import Workload", "tiering.models"),
        ("tiering/engine", "tiering/engine/forest.py", "from tiering import services", "tiering"),
    ],
)
def test_architecture_catches_what_a_pure_module_must_not_import(target, module, source, bad):
    """The check itself: a relative import out of the pure package is caught like an absolute one, and a
    package's neighbours are not allowed because they share its top-level package."""
    assert bad in _offenders_in(target, module, source)


@pytest.mark.parametrize(
    ("target", "module", "source"),
    [
        ("capacity/planner", "capacity/planner/planner.py",
         "from .types import Mode\nfrom broker.scheduler.types import Kind\nfrom gpus.mig import profile_get\n"
         "import math"),
        ("broker/scheduler", "broker/scheduler/plan.py",
         "from .state import ClusterState\nfrom broker.scheduler.types import Kind\nfrom gpus import catalogue\n"
         "from __future__ import annotations\nimport heapq"),
        ("billing/core/pricing.py", "billing/core/pricing.py",
         "from decimal import Decimal\nfrom gpus.mig import profile_get"),
        ("billing/core/slo.py", "billing/core/slo.py", "import math\nfrom datetime import datetime"),
    ],
)
def test_architecture_allows_the_pure_modules_own_imports(target, module, source):
    assert _offenders_in(target, module, source) == set()


# the apps that read leases (to meter, bill, advise, notify) sit above leasing: it never imports them
ABOVE_LEASING = ("billing", "capacity", "notifications", "pipelines", "portal", "tiering")


def test_architecture_leasing_imports_no_app_built_on_it():
    offenders = {f"{path.relative_to(ROOT)}: {name}"
                 for path in _files("broker") for name in imports_of(path)
                 if name.split(".")[0] in ABOVE_LEASING}
    assert not offenders, sorted(offenders)


def test_architecture_leasing_check_sees_a_function_level_import():
    """The check reads imports inside functions too (the old budget check was one)."""
    source = "def f():\n    from billing.services import budget_check\n"
    assert "billing.services" in imports_of(ROOT / "broker/services/request.py", source)
