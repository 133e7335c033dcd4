"""Dependencies point one way (docs/architecture.md, "Layers"). One ordered table, checked over every module of
the project and every import in it, imports inside functions included:

    gpus < core < agent.protocol < tenants < broker < billing < tiering < notifications
         < {capacity, pipelines} < {portal, observability} < config

It refines the order issue 26 drew (``broker < {billing, tiering} < {capacity, pipelines, notifications}``): every
order stated there holds, and within those two rows the one dependency each has is ordered — tiering prices its
advice with billing's price books, and the capacity loop tells tenants its advice through notifications. Apps in
one row never import each other.

- A module imports its own package and the layers below it only. Relative imports are resolved first, and
  ``from broker import tasks`` is an import of the module ``broker.tasks``.
- No ``_private`` name crosses a top-level package: neither ``from billing.x import _y`` nor ``x._y`` on a
  module of another package (dunders such as ``__version__`` are public). Tests may reach into what they test.
- The node agent is two things: ``agent.protocol`` (client, signing, workload spec: the one agent module the
  broker and the apps above it import, in the table above ``core``) and the node-side daemon (the rest of
  ``agent/``), which sits beside the table: it imports ``gpus``, ``agent.protocol`` and itself, and nothing in
  the table imports it.
- The tools sit outside, above everything: ``tests/``, ``bench/`` (with the replay harness ``bench/sim``),
  ``infra/`` (the local services and the pytest plugin) and ``manage.py`` may import any module; no module of
  the table imports them.
- No circle between the modules of one package. The graph has an edge for every import written, at module
  level or inside a function: a function-level import is a dependency all the same (it only moves the import
  to the first call), and a circle hidden inside a function is the one that shows up as a partly initialised
  module when a worker calls it first. ``if TYPE_CHECKING:`` imports are left out of the circle check (they never
  run) but count for the layers. Importing ``a.b.c`` is an edge to ``a.b.c`` only, not to the package
  ``a.b`` Python initialises on the way: every package's ``__init__`` that gathers its submodules would be a
  circle with each of them otherwise.

Besides the table, the pure cores (the catalogue, the scheduler, the planners, billing's arithmetic, the tiering
engine, the node agent) import only the standard library and what is listed for them, and load no Django.
The apps built on the broker take part in its decisions through ``broker.extensions``; tenants asks the broker
through ``tenants.extensions``: a lower layer is never imported by a higher one's name.
"""

from __future__ import annotations

import ast
import json
import subprocess
import sys
from dataclasses import dataclass
from functools import cache
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent

# The table, lowest first: a module of one row imports its own package and the rows before it.
LAYERS: list[set[str]] = [
    {"gpus"},
    {"core"},
    {"agent.protocol"},
    {"tenants"},
    {"broker"},
    {"billing"},
    {"tiering"},
    {"notifications"},
    {"capacity", "pipelines"},
    {"portal", "observability"},
    {"config"},
]
LAYER = {unit: rank for rank, row in enumerate(LAYERS) for unit in row}
# beside the table: the node-side agent daemon and what it may import
SIDE = {"agent": {"gpus", "agent.protocol"},
        # the command-line client and SDK (docs/cli.md): installed alone, it talks to the server over HTTP only
        "gpubroker_client": set()}
# outside the table, above it: may import anything, imported by nothing in the table
TOOLS = {"tests", "bench", "infra", "manage"}
SKIP_DIRS = {".venv", ".git", "var", "node_modules", "__pycache__", "static", "templates", "docs"}


# -- reading the project ----------------------------------------------------------------------------------------
def _project_files() -> list[Path]:
    return sorted(path for path in ROOT.rglob("*.py")
                  if not SKIP_DIRS & set(path.relative_to(ROOT).parts[:-1]))


def _dotted_of(path: Path) -> str:
    return ".".join(path.relative_to(ROOT).with_suffix("").parts).removesuffix(".__init__")


@cache
def project_modules() -> frozenset[str]:
    return frozenset(_dotted_of(path) for path in _project_files())


@cache
def top_level() -> frozenset[str]:
    return frozenset(module.split(".")[0] for module in project_modules())


def unit_of(module: str) -> str | None:
    """The row (or side, or tool) a project module belongs to; None for the standard library and third parties."""
    top = module.split(".")[0]
    if top not in top_level():
        return None
    if module == "agent.protocol" or module.startswith("agent.protocol."):
        return "agent.protocol"
    if module == "agent.relay":  # the HTTP and WebSocket relay both sides run: the agent to a workload's port, the
        return "agent.protocol"  # broker's interactive proxy to the agent (stdlib and aiohttp only, no node code)
    return top


@dataclass(frozen=True)
class Import:
    target: str  # the module imported (``from a import b`` names ``a.b`` when that is a module)
    names: tuple[str, ...]  # the names taken from it with ``from ... import``
    line: int
    type_only: bool  # inside ``if TYPE_CHECKING:``


def _package_of(module: str, path: Path) -> list[str]:
    parts = module.split(".")
    return parts if path.name == "__init__.py" else parts[:-1]


def _type_checking(test: ast.expr) -> bool:
    return (isinstance(test, ast.Name) and test.id == "TYPE_CHECKING") or (
        isinstance(test, ast.Attribute) and test.attr == "TYPE_CHECKING")


def read_imports(path: Path, source: str | None = None, module: str | None = None,
                 modules: frozenset[str] | None = None) -> tuple[list[Import], dict[str, str], ast.AST]:
    """Every import of the file (anywhere in it), and the local names bound to project modules."""
    module = module or _dotted_of(path)
    modules = project_modules() if modules is None else modules
    tree = ast.parse(source if source is not None else path.read_text(), filename=str(path))
    type_only_nodes = {id(inner) for node in ast.walk(tree) if isinstance(node, ast.If) and _type_checking(node.test)
                       for stmt in node.body for inner in ast.walk(stmt)}
    imports: list[Import] = []
    bound: dict[str, str] = {}  # local name -> dotted module it stands for
    for node in ast.walk(tree):
        type_only = id(node) in type_only_nodes
        if isinstance(node, ast.Import):
            for alias in node.names:
                imports.append(Import(alias.name, (), node.lineno, type_only))
                if alias.asname:
                    bound[alias.asname] = alias.name
                else:
                    bound[alias.name.split(".")[0]] = alias.name.split(".")[0]
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                package = _package_of(module, path)
                package = package[: len(package) - (node.level - 1)]
                base = ".".join([*package, *(node.module.split(".") if node.module else [])])
            else:
                base = node.module or ""
            plain = []
            for alias in node.names:
                candidate = f"{base}.{alias.name}"
                if candidate in modules:  # from package import module
                    imports.append(Import(candidate, (), node.lineno, type_only))
                    bound[alias.asname or alias.name] = candidate
                else:
                    plain.append(alias.name)
            if plain or not node.names:
                imports.append(Import(base, tuple(plain), node.lineno, type_only))
    return imports, bound, tree


def _attribute_chain(node: ast.expr) -> list[str] | None:
    parts = []
    while isinstance(node, ast.Attribute):
        parts.append(node.attr)
        node = node.value
    if not isinstance(node, ast.Name):
        return None
    return [node.id, *reversed(parts)]


def _private(name: str) -> bool:
    return name.startswith("_") and not (name.startswith("__") and name.endswith("__"))


def _owner(target: str, modules: frozenset[str]) -> str:
    """The project module ``target`` names or lies in (``broker.services.lease_request`` -> broker.services)."""
    parts = target.split(".")
    while parts and ".".join(parts) not in modules:
        parts.pop()
    return ".".join(parts) or target


# -- the rules ----------------------------------------------------------------------------------------------
def layer_problem(module: str, target: str) -> str | None:
    """Why ``module`` may not import ``target`` (None when it may)."""
    mine, theirs = unit_of(module), unit_of(target)
    if theirs is None or theirs == mine or mine in TOOLS:
        return None
    if theirs in TOOLS:
        return f"imports the tool {theirs!r} (tests, benchmarks and infra sit above every layer)"
    if theirs == "agent":
        return "imports the node-side agent (only agent.protocol is the broker's side of the agent)"
    if mine in SIDE:
        return None if theirs in SIDE[mine] else f"the node agent imports only {sorted(SIDE[mine])}"
    if mine not in LAYER or theirs not in LAYER:
        return f"{mine or theirs!r} is in no row of the table: add it to LAYERS"
    if LAYER[theirs] >= LAYER[mine]:
        return f"{mine} (row {LAYER[mine]}) imports {theirs} (row {LAYER[theirs]}): not below it"
    return None


def problems_of(path: Path, source: str | None = None, module: str | None = None) -> set[str]:
    """Every layer and privacy problem of one file."""
    module = module or _dotted_of(path)
    modules = project_modules()
    imports, bound, tree = read_imports(path, source, module, modules)
    top = module.split(".")[0]
    mine = unit_of(module)
    found = set()
    for imp in imports:
        why = layer_problem(module, imp.target)
        if why:
            found.add(f"{module}:{imp.line} imports {imp.target}: {why}")
        if mine in TOOLS:
            continue  # a test may reach into what it tests
        if unit_of(imp.target) and imp.target.split(".")[0] != top:
            for name in imp.names:
                if _private(name):
                    found.add(f"{module}:{imp.line} imports the private name {name} of {imp.target}")
    for node in ast.walk(tree) if mine not in TOOLS else ():
        if isinstance(node, ast.Attribute) and _private(node.attr):
            chain = _attribute_chain(node.value)
            if not chain or chain[0] not in bound:
                continue
            target = ".".join([bound[chain[0]], *chain[1:]])
            if target in modules and target.split(".")[0] != top:
                found.add(f"{module}:{node.lineno} uses the private name {node.attr} of {target}")
    return found


def circles(package: str, edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components (more than one module) of ``package``'s import graph (Tarjan)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []

    def visit(node: str) -> None:  # the graphs are small (a package's modules): recursion is fine
        index[node] = low[node] = len(index)
        stack.append(node)
        on_stack.add(node)
        for nxt in sorted(edges.get(node, ())):
            if nxt not in index:
                visit(nxt)
                low[node] = min(low[node], low[nxt])
            elif nxt in on_stack:
                low[node] = min(low[node], index[nxt])
        if low[node] == index[node]:
            component = []
            while True:
                member = stack.pop()
                on_stack.discard(member)
                component.append(member)
                if member == node:
                    break
            if len(component) > 1:
                found.append(sorted(component))

    for node in sorted(edges):
        if node not in index:
            visit(node)
    return found


def package_graph(package: str) -> dict[str, set[str]]:
    modules = project_modules()
    edges: dict[str, set[str]] = {}
    for path in _project_files():
        module = _dotted_of(path)
        if module.split(".")[0] != package:
            continue
        imports, _, _ = read_imports(path, module=module, modules=modules)
        edges[module] = {_owner(imp.target, modules) for imp in imports
                         if not imp.type_only and imp.target.split(".")[0] == package} - {module}
    return edges


# -- the checks ---------------------------------------------------------------------------------------------
def test_architecture_every_package_has_a_place():
    """A new top-level package must be put in the table (or beside it) before it can be imported."""
    placed = set(LAYER) | set(SIDE) | TOOLS
    unplaced = {unit_of(module) for module in project_modules()} - placed
    assert not unplaced, f"add {sorted(unplaced)} to LAYERS, SIDE or TOOLS"


def test_architecture_table_of_layers_holds():
    offenders = sorted(problem for path in _project_files() for problem in problems_of(path))
    assert not offenders, "\n".join(offenders)


@pytest.mark.parametrize("package", sorted(LAYER.keys() - {"agent.protocol"} | set(SIDE)))
def test_architecture_no_circle_inside_a_package(package):
    found = circles(package, package_graph(package))
    assert not found, found


# -- the checker catches what it must (each case: a line written in a module -> what it reports) ------------
@pytest.mark.parametrize(
    ("module", "source", "expected"),
    [
        # upward, sideways within a row, and into the tools
        ("tenants.services", "from broker.services import lease_release", "tenants (row 3) imports broker"),
        ("tenants.api.views", "def f():\n    from broker import selectors\n", "tenants (row 3) imports broker"),
        ("notifications.services", "from portal.views import TenantView", "notifications (row 7) imports portal"),
        ("billing.services.prices", "from tiering import services", "billing (row 5) imports tiering"),
        ("capacity.services", "from pipelines.selectors import plan_get", "capacity (row 8) imports pipelines (row 8)"),
        ("notifications.services", "def f():\n    from capacity.models import Adjustment\n", "notifications (row 7)"),
        ("core.errors", "from tenants.models import Tenant", "core (row 1) imports tenants"),
        ("gpus.mig", "import core.errors", "gpus (row 0) imports core"),
        ("broker.selectors", "from config.celery import app", "broker (row 4) imports config"),
        ("core.problems", "from config import urls", "core (row 1) imports config"),
        ("capacity.services", "from bench.sim import capacity", "imports the tool 'bench'"),
        # relative imports resolve to the package they name
        ("broker.services.request", "from ...billing import services", "broker (row 4) imports billing"),
        ("tenants.api.views", "from ...broker.api import views", "tenants (row 3) imports broker"),
        # the broker and every app see only agent.protocol of the agent
        ("broker.services.provisioning", "from agent.server import node_app", "imports the node-side agent"),
        ("broker.validation", "from agent import workloads", "imports the node-side agent"),
        ("capacity.services", "from agent.sim import SimBackend", "imports the node-side agent"),
        ("agent.protocol", "from agent.daemon import main", "imports the node-side agent"),
        # the node side: gpus, the protocol, itself
        ("agent.daemon", "from core.errors import NotFound", "the node agent imports only"),
        ("agent.server", "from broker.models import Node", "the node agent imports only"),
        # private names across packages, imported or reached through a module
        ("capacity.services", "from broker.services.request import _lease_dry_run",
         "the private name _lease_dry_run of broker.services.request"),
        ("portal.ops", "from billing.services import utilisation\nutilisation._prometheus()\n",
         "the private name _prometheus of billing.services.utilisation"),
        ("portal.ops", "import billing.services.utilisation\nbilling.services.utilisation._prometheus()\n",
         "the private name _prometheus of billing.services.utilisation"),
        ("portal.ops", "from billing.services import utilisation as u\nu._prometheus\n",
         "the private name _prometheus of billing.services.utilisation"),
    ],
)
def test_architecture_catches_a_bad_import(module, source, expected):
    path = ROOT / (module.replace(".", "/") + ".py")
    found = problems_of(path, source, module)
    assert any(expected in problem for problem in found), found


@pytest.mark.parametrize(
    ("module", "source"),
    [
        ("broker.services.request", "from core.errors import Conflict\nfrom tenants.models import Project\n"
                                    "from agent.protocol import AgentClient\nfrom gpus.mig import profile_get"),
        ("broker.services.request", "from ..scheduler import plan\nfrom . import transitions"),
        ("portal.views", "from billing.selectors import invoice_list\nfrom capacity import selectors\n"
                         "def f():\n    from broker.services import lease_release\n"),
        ("tiering.services", "from billing.selectors import price_books_for"),
        ("capacity.services", "from notifications.services import notification_emit"),
        ("tenants.services", "from tenants.extensions import tenant_status_listeners\n"
                             "from core.admin import ServiceAdmin"),
        ("agent.daemon", "from agent.protocol import sign\nfrom agent.backend import Backend\nfrom gpus import mig"),
        ("tests.broker.test_x", "from agent.sim import SimBackend\nfrom broker.services.request import _x"),
        ("bench.leasing", "from config.celery import app\nfrom agent.fleet import Fleet"),
        ("broker.services.request", "from broker.services import _helpers\nfrom .transitions import _transition"),
        ("agent.daemon", "import agent\nagent.__version__"),
    ],
)
def test_architecture_allows_what_the_table_allows(module, source):
    path = ROOT / (module.replace(".", "/") + ".py")
    problems = problems_of(path, source, module)
    assert problems == set(), problems


def test_architecture_circle_check_finds_a_circle_through_a_function_level_import():
    modules = frozenset({"broker.tasks", "broker.services", "broker.services.triggers", "broker.models"})
    sources = {
        "broker.tasks": "from broker.services import lease_release\n",
        "broker.services": "from .triggers import schedule_cycle_request\n",
        "broker.services.triggers": "def request():\n    from broker import tasks\n",
        "broker.models": "from django.db import models\n",
    }
    edges = {}
    for module, source in sources.items():
        path = ROOT / (module.replace(".", "/") + ("/__init__.py" if module == "broker.services" else ".py"))
        imports, _, _ = read_imports(path, source, module, modules)
        edges[module] = {_owner(imp.target, modules) for imp in imports if imp.target.startswith("broker")} - {module}
    assert circles("broker", edges) == [["broker.services", "broker.services.triggers", "broker.tasks"]]
    # under TYPE_CHECKING it never runs: no circle
    source = "from typing import TYPE_CHECKING\nif TYPE_CHECKING:\n    from broker import tasks\n"
    imports, _, _ = read_imports(ROOT / "broker/services/triggers.py", source, "broker.services.triggers", modules)
    assert [imp.type_only for imp in imports if imp.target == "broker.tasks"] == [True]


# -- the pure cores -----------------------------------------------------------------------------------------
# a folder (every module under it) or one module -> the project modules it may import, besides the standard
# library; a prefix allows its submodules ("gpus" allows gpus.mig)
PURE = {
    "gpus": {"gpus"},
    "broker/scheduler": {"gpus", "broker.scheduler"},
    "capacity/planner": {"gpus", "broker.scheduler.types", "capacity.planner"},
    # the pipeline planners (ESG, model splits): the catalogue and themselves
    "pipelines/planner": {"gpus", "pipelines.planner"},
    "agent": {"gpus", "agent"},
    "gpubroker_client": {"gpubroker_client"},
    # billing's arithmetic: money and rates, metering intervals, SLO figures, periods (no Django, no database)
    "billing/core/pricing.py": {"gpus"},
    "billing/core/metering.py": set(),
    "billing/core/slo.py": set(),
    "billing/core/periods.py": set(),
    # auto-tiering's decision engine: features, rules, the forest, the choice (docs/tiering.md)
    "tiering/engine": {"gpus", "tiering.engine"},
}
# yarl: aiohttp's own URL type (installed with it), so the relay can pass a path already encoded (agent/relay.py)
THIRD_PARTY_ALLOWED = {"agent": {"nvidia_ml_py", "pynvml", "aiohttp", "yarl"}, "tiering/engine": {"numpy", "sklearn"},
                       "gpubroker_client": {"requests"}}
# what must not be loaded at all when the pure modules are imported (a package __init__ counts too)
FRAMEWORKS = {"django", "rest_framework", "celery", "kombu", "psycopg", "requests", "httpx"}


def _files(target: str) -> list[Path]:
    path = ROOT / target
    return [path] if target.endswith(".py") else sorted(path.rglob("*.py"))


def _dotted(target: str) -> str:
    return target.removesuffix(".py").replace("/", ".")


def imports_of(path: Path, source: str | None = None) -> set[str]:
    """Every module ``path`` imports, as dotted names; relative imports resolved against its package."""
    imports, _, _ = read_imports(path, source, _dotted_of(path))
    return {imp.target for imp in imports}


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
    database driver: checked in a fresh interpreter, so a dynamic or indirect import is caught too. The agent's
    protocol module is in the list: the node side imports it, and it must stay installable without Django."""
    modules = sorted({_dotted(str(path.relative_to(ROOT))).removesuffix(".__init__")
                      for target in PURE if target not in ("agent", "gpubroker_client") for path in _files(target)}
                     | {"agent.protocol"})
    code = (f"import importlib, json, sys\nfor m in {modules!r}: importlib.import_module(m)\n"
            "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    assert "broker" in loaded and "billing" in loaded and "agent" in loaded  # the check did import them
    assert not loaded & FRAMEWORKS, sorted(loaded & FRAMEWORKS)


def test_architecture_client_loads_nothing_of_the_server():
    """The client (``gpubroker_client``, docs/cli.md) imported in a fresh interpreter loads ``requests`` and the
    standard library: no Django, DRF, Celery or database driver, and no package of the server."""
    code = ("import json, sys, gpubroker_client, gpubroker_client.cli\n"
            "print(json.dumps(sorted({n.split('.')[0] for n in sys.modules})))")
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=60,
                            env={"PATH": "/usr/bin:/bin", "PYTHONPATH": str(ROOT)})
    assert result.returncode == 0, result.stderr
    loaded = set(json.loads(result.stdout.splitlines()[-1]))
    assert "gpubroker_client" in loaded and "requests" in loaded
    server = (top_level() - {"gpubroker_client"}) | FRAMEWORKS - {"requests"}
    assert not loaded & server, sorted(loaded & server)


def _offenders_in(target: str, module: str, source: str) -> set[str]:
    """What the check would report for ``source`` written in ``module`` of ``target``."""
    allowed = {_dotted(target)} | PURE[target] | THIRD_PARTY_ALLOWED.get(target, set())
    return {name for name in imports_of(ROOT / module, source) if offending(name, allowed)}


@pytest.mark.parametrize(
    ("target", "module", "source", "bad"),
    [
        # relative imports resolve into the package they name
        ("capacity/planner", "capacity/planner/planner.py", "from ..api import views", "capacity.api.views"),
        ("capacity/planner", "capacity/planner/planner.py", "from .. import models", "capacity.models"),
        ("capacity/planner", "capacity/planner/planner.py", "import django", "django"),
        ("capacity/planner", "capacity/planner/planner.py", "from django.db import models", "django.db"),
        ("capacity/planner", "capacity/planner/planner.py", "from broker import models", "broker.models"),
        # the planner may use the scheduler's types, not the scheduler itself
        ("capacity/planner", "capacity/planner/planner.py", "from broker.scheduler.plan import plan",
         "broker.scheduler.plan"),
        ("capacity/planner", "capacity/planner/planner.py", "from broker.scheduler import placement",
         "broker.scheduler.placement"),
        ("capacity/planner", "capacity/planner/planner.py", "from broker.scheduler import plan",
         "broker.scheduler.plan"),
        # the scheduling core: itself, gpus and the standard library; not the rest of the broker
        ("broker/scheduler", "broker/scheduler/plan.py", "from capacity.planner import plan_capacity",
         "capacity.planner"),
        ("broker/scheduler", "broker/scheduler/plan.py", "from broker.selectors import lease_queue",
         "broker.selectors"),
        ("broker/scheduler", "broker/scheduler/plan.py", "from .. import services", "broker.services"),
        ("broker/scheduler", "broker/scheduler/plan.py", "from broker import choices", "broker.choices"),
        # billing's arithmetic: no Django, no billing models or services
        ("billing/core/pricing.py", "billing/core/pricing.py", "from django.conf import settings", "django.conf"),
        ("billing/core/pricing.py", "billing/core/pricing.py", "from ..models import PriceBook", "billing.models"),
        ("billing/core/metering.py", "billing/core/metering.py", "from billing.services import period_bounds",
         "billing.services"),
        ("billing/core/slo.py", "billing/core/slo.py", "from .. import models", "billing.models"),
        ("billing/core/slo.py", "billing/core/slo.py", "from billing.core.pricing import to_minor",
         "billing.core.pricing"),
        # the pipeline planners: not the scheduler, not the Django app that stores their plans
        ("pipelines/planner", "pipelines/planner/esg.py", "from broker.scheduler import plan", "broker.scheduler.plan"),
        ("pipelines/planner", "pipelines/planner/esg.py", "from pipelines.models import Pipeline", "pipelines.models"),
        # the decision engine: not the tiering app's models or services
        ("tiering/engine", "tiering/engine/decide.py", "from ..models import Workload", "tiering.models"),
        ("tiering/engine", "tiering/engine/forest.py", "from tiering import services", "tiering.services"),
        # the node agent: not core (Django), not the broker
        ("agent", "agent/daemon.py", "from core.errors import NotFound", "core.errors"),
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
