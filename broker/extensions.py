"""Where the apps built on leasing take part in its decisions, without leasing importing them.

Leasing knows nothing of money; billing (which reads leases to meter them) registers, in its ``AppConfig.ready``:

- **admission checks** for new requests and for renewals: a check refuses by raising an ``ApplicationError``
  (billing's spend caps raise ``BudgetExceeded``, a 402) and may return a warning, which goes into the lease's
  event; every registered check runs, in registration order, before anything is written. A request check may
  say when it applies (``applies``: a boolean query expression over the request's project row, e.g. "a spend
  cap exists for this tenant or project"); leasing evaluates it inside the project lookup the request makes
  anyway, so a check that does not apply costs the request no query at all;
- **the list prices** of whole GPUs per model, that ``model: auto`` ranks models by.

Auto-tiering (``tiering``) registers a **gpu resolver** for ``gpu: {"kind": "auto", ...}``: before leasing
validates a request, the resolver turns that gpu object into a concrete one (a whole GPU, a MIG profile or a
share of one model) with the reason it was chosen, which goes into the lease's reason and first event; it may
refuse by raising an ``ApplicationError`` (``profile_first``).

The dependency so runs one way: billing → leasing, tiering → leasing. A deployment without billing leases with
no checks and ranks ``model: auto`` by the scheduling core's own order; one without tiering refuses kind
``auto`` as an unknown kind. Tests may register their own and remove them (the ``unregister`` callables
returned).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import datetime

from tenants.access import Actor


@dataclass(frozen=True)
class RequestAdmission:
    """A request that passed leasing's own rules, as an admission check sees it. ``gpu`` is the request's gpu
    object with ``model`` set when exactly one model's quota admits it."""

    actor: Actor
    project: object  # tenants.models.Project
    gpu: dict
    workload_class: str
    duration_seconds: int
    now: datetime


@dataclass(frozen=True)
class RenewalAdmission:
    """A renewal of an ACTIVE lease to end at ``ends_at``, read under the lease's row lock."""

    lease: object  # broker.models.Lease
    ends_at: datetime
    now: datetime


@dataclass(frozen=True)
class GpuRequest:
    """A request whose ``gpu.kind`` a resolver answers for, before leasing validates anything else."""

    actor: Actor
    project: object  # the body's project (a slug, unchecked)
    gpu: dict
    workload_class: object
    duration_seconds: object
    now: datetime
    preview: bool = False  # a preview or a quote: the resolver must write nothing


@dataclass(frozen=True)
class GpuChoice:
    """A resolver's answer: the concrete ``gpu`` object to lease, and why (the lease's reason)."""

    gpu: dict
    reason: str


GpuResolver = Callable[[GpuRequest], GpuChoice]
_gpu_resolvers: dict[str, GpuResolver] = {}


def gpu_resolver_register(kind: str, resolver: GpuResolver) -> Callable[[], None]:
    """``resolver`` answers for ``gpu.kind == kind`` (the last registered for a kind wins)."""
    _gpu_resolvers[kind] = resolver
    return lambda: _gpu_resolvers.pop(kind, None) if _gpu_resolvers.get(kind) is resolver else None


def gpu_resolve(request: GpuRequest) -> GpuChoice | None:
    """The registered resolver's choice for the request's gpu kind; None when no resolver answers for it (then
    leasing's own validation rules the kind)."""
    kind = request.gpu.get("kind") if isinstance(request.gpu, dict) else None
    resolver = _gpu_resolvers.get(kind) if isinstance(kind, str) else None
    return resolver(request) if resolver else None


def gpu_kinds() -> list[str]:
    """The kinds resolvers answer for (``auto`` with tiering installed)."""
    return sorted(_gpu_resolvers)


RequestCheck = Callable[[RequestAdmission], str]
RenewalCheck = Callable[[RenewalAdmission], str]
_request_checks: list[RequestCheck] = []
_request_applies: dict[RequestCheck, Callable[[], object]] = {}
_renewal_checks: list[RenewalCheck] = []
_list_prices: list[Callable[[datetime], dict[str, int]]] = []
_money_formats: list[Callable[[int, str], str]] = []


def _register(registry: list, item) -> Callable[[], None]:
    if item not in registry:
        registry.append(item)
    return lambda: registry.remove(item) if item in registry else None


def request_check_register(check: RequestCheck, *, applies: Callable[[], object] | None = None
                           ) -> Callable[[], None]:
    """Register ``check``. ``applies()`` (optional) returns a boolean expression (``Exists(...)``) evaluated on the
    request's ``tenants.Project`` row — ``OuterRef("pk")`` is the project, ``OuterRef("tenant_id")`` its tenant —
    and the check runs only for a request where it is true (``request_admit``'s ``applicable``)."""
    if applies is not None:
        _request_applies[check] = applies
    remove = _register(_request_checks, check)

    def unregister() -> None:
        remove()
        _request_applies.pop(check, None)

    return unregister


def renewal_check_register(check: RenewalCheck) -> Callable[[], None]:
    return _register(_renewal_checks, check)


def list_prices_register(source: Callable[[datetime], dict[str, int]]) -> Callable[[], None]:
    """``source(now)`` → whole-GPU price per hour per model (minor units, one currency); the last registered wins."""
    return _register(_list_prices, source)


def money_format_register(format_money: Callable[[int, str], str]) -> Callable[[], None]:
    """``format_money(minor, currency)`` → an amount as people read it ("0.80 USD"); the last registered wins."""
    return _register(_money_formats, format_money)


def request_check_conditions() -> list[tuple[RequestCheck, Callable[[], object]]]:
    """(check, its ``applies``: call it for the expression) of the checks that said when they apply, in
    registration order."""
    return [(check, _request_applies[check]) for check in _request_checks if check in _request_applies]


def request_admit(admission: RequestAdmission, *, applicable: dict[RequestCheck, bool] | None = None) -> str:
    """Run every request check (but those ``applicable`` maps to False: their ``applies`` was false for this
    request's project); the warnings, joined (refusals propagate)."""
    applicable = applicable or {}
    return " ".join(warning for check in _request_checks
                    if applicable.get(check, True) and (warning := check(admission)))


def renewal_admit(admission: RenewalAdmission) -> str:
    return " ".join(warning for check in _renewal_checks if (warning := check(admission)))


def list_prices(now: datetime) -> dict[str, int]:
    return _list_prices[-1](now) if _list_prices else {}


def money_format(amount_minor: int, currency: str) -> str:
    """An amount in minor units with its currency (billing's format when installed, else the integer named as
    minor units: never a bare number)."""
    if _money_formats:
        return _money_formats[-1](amount_minor, currency)
    return f"{amount_minor} {currency} minor units"


# -- waits a change of the pool could end (issue 30: the capacity planner on arrival) -------------------------
@dataclass(frozen=True)
class PoolWait:
    """A schedule cycle left requests waiting that an idle GPU of another mode would serve once switched
    (``broker.scheduler.pool_wait``): the (model, mode) pairs, in the cycle's transaction at ``now``. A listener
    (the capacity loop) sends its work after the cycle commits."""

    pools: tuple[tuple[str, str], ...]  # (GPU model, the mode the waiting requests need: whole, mig or shared)
    now: datetime


PoolWaitListener = Callable[[PoolWait], None]
_pool_wait_listeners: list[PoolWaitListener] = []


def pool_wait_register(listener: PoolWaitListener) -> Callable[[], None]:
    """``listener(wait)`` is told of every cycle that leaves such requests waiting (inside its transaction)."""
    return _register(_pool_wait_listeners, listener)


def pool_wait_listened() -> bool:
    """Whether anyone listens: a cycle without listeners does not look for such waits."""
    return bool(_pool_wait_listeners)


def pool_wait_tell(wait: PoolWait) -> None:
    for listener in list(_pool_wait_listeners):
        listener(wait)


# -- reclaim across modes (issue 30): a GPU emptied for an in-quota lease of another mode ----------------------
@dataclass(frozen=True)
class ModeSwitchFor:
    """A schedule cycle found no room for an in-quota lease in its mode and chose a GPU of another mode, idle or held
    only by over-quota leases it has just given notice (``broker.scheduler.DecisionMode.SWITCH``). The listener (the
    capacity loop) closes the GPU to the scheduler and switches it once those leases have left. Told inside the
    cycle's transaction, under its lock."""

    gpu: int  # the GPU's primary key
    to_mode: str  # whole, mig or shared
    leases: tuple[int, ...]  # the over-quota leases given notice to empty it (none: it was idle)
    lease: int  # the in-quota lease it is for
    now: datetime


ModeSwitchModes = Callable[[frozenset[str], datetime], frozenset[tuple[str, str]]]
ModeSwitchListener = Callable[[ModeSwitchFor], None]
_mode_switchers: list[tuple[ModeSwitchModes, ModeSwitchListener]] = []


def mode_switch_register(modes: ModeSwitchModes, listener: ModeSwitchListener) -> Callable[[], None]:
    """``modes(models, now)``: the (model, mode) pairs to which the listener switches GPUs on its own (the cycle lets
    the core reclaim across modes only there); ``listener(switch)`` carries out each switch a cycle decides. The last
    registered answers."""
    return _register(_mode_switchers, (modes, listener))


def mode_switch_modes(models: frozenset[str], now: datetime) -> frozenset[tuple[str, str]]:
    """The pairs of ``models`` a GPU may be switched to for in-quota work; none without a listener."""
    if not _mode_switchers:
        return frozenset()
    return _mode_switchers[-1][0](models, now)


def mode_switch_tell(switch: ModeSwitchFor) -> None:
    if not _mode_switchers:
        raise RuntimeError("a switch decided with no listener to carry it out")  # mode_switch_modes said none
    _mode_switchers[-1][1](switch)
