"""The only writers of auto-tiering rows (docs/tiering.md): register a workload, record a profile or a
throughput sample, retrain the decision model, predict (and store) the cheapest slice for a workload.
Each is one transaction with its audit row; errors name the field (``core.errors``)."""

from __future__ import annotations

import math
import random
from dataclasses import replace
from datetime import timedelta

from django.db import transaction
from django.db.models import Max
from django.utils import timezone

from broker.models import Lease
from core.errors import Conflict, NotFound, PermissionDenied, ValidationFailed
from gpus.architectures import ARCHITECTURES, ConvNet
from gpus.measured import expected_error, fill
from gpus.performance import (
    PRECISIONS,
    REGIMES,
    TASKS,
    Slice,
    estimate,
    regime_infer,
    slice_from_key,
    slices_for,
    whole,
    work_of,
    workload_problems,
)
from gpus.performance import Workload as Spec
from tenants.access import Actor
from tenants.audit import audit_record
from tiering.engine.decide import EXPLORE_CONFIDENCE, Decision, Option, choose, measured_meets, required_throughput
from tiering.engine.features import Observation
from tiering.engine.forest import DEFAULT_THRESHOLD, Row, TierModel, validation_error
from tiering.models import LeaseSample, Profile, ProfilingLease, Provenance, TierModelRecord, Workload

REFERENCE_SLICE = "A100-80GB"  # where a profiling run starts: it holds almost every workload
FIELDS = ("architecture", "task", "precision", "batch_size", "seq_len", "image_size")


def spec_of(workload: Workload) -> Spec:
    """The workload's definition for the performance model, in the engine regime (the reference set's, which the
    decision model is trained on); ``spec_run`` gives it in the regime it runs in."""
    return Spec(*(getattr(workload, name) for name in FIELDS))


def workload_regime(workload: Workload) -> tuple[str, str]:
    """The regime the workload runs in and how that is known: the one registered with it, else the one its
    measured engine activity points to (``gpus.performance.regime_infer``; on the reference slice when measured
    there, else its latest measurement), else ``engine`` (the performance model's default) until it is measured."""
    if workload.regime:
        return workload.regime, "registered"
    seen = [p for p in _measured(workload).values() if p.engine_active is not None and p.fits and p.throughput > 0]
    if not seen:
        return "engine", "the default: no measured engine activity yet"
    best = next((p for p in seen if p.slice_key == REFERENCE_SLICE), None) or \
        max(seen, key=lambda p: (p.measured_at, p.pk))
    regime = regime_infer(spec_of(workload), slice_from_key(best.slice_key), best.engine_active)
    return regime, f"inferred from the engine activity measured on {best.slice_key} ({best.engine_active:.0%})"


def spec_run(workload: Workload) -> Spec:
    """The workload's definition in the regime it runs in (``workload_regime``)."""
    return replace(spec_of(workload), regime=workload_regime(workload)[0])


def _number(data: dict, name: str, *, integer: bool, low: float, high: float, default=None):
    value = data.get(name, default)
    if value is None:
        return None
    if isinstance(value, bool) or not isinstance(value, int | float) or (integer and not isinstance(value, int)):
        raise ValidationFailed(f"{name} must be {'an integer' if integer else 'a number'}.", field=name)
    if not low <= value <= high:
        raise ValidationFailed(f"{name} must be between {low:g} and {high:g}.", field=name)
    return value


def workload_clean(data: dict) -> dict:
    """A workload definition checked field by field; the first problem raises, naming its field."""
    if not isinstance(data, dict):
        raise ValidationFailed("The body must be a JSON object.", field="body")
    name = data.get("name")
    if not isinstance(name, str) or not name.strip():
        raise ValidationFailed("name is required: a short name for the workload.", field="name")
    name = name.strip()
    if len(name) > 64 or not all(c.isalnum() or c in "-_." for c in name):
        raise ValidationFailed("name may hold up to 64 letters, digits, '-', '_' and '.'.", field="name")
    architecture = data.get("architecture")
    if not isinstance(architecture, str) or architecture.lower() not in ARCHITECTURES:
        raise ValidationFailed(f"architecture must be one of {', '.join(sorted(ARCHITECTURES))}.",
                               field="architecture")
    task = data.get("task", "inference")
    if task not in TASKS:
        raise ValidationFailed(f"task must be one of {', '.join(TASKS)}.", field="task")
    precision = data.get("precision", "bf16")
    if precision not in PRECISIONS:
        raise ValidationFailed(f"precision must be one of {', '.join(PRECISIONS)}.", field="precision")
    cleaned = {
        "name": name, "architecture": architecture.lower(), "task": task, "precision": precision,
        "batch_size": _number(data, "batch_size", integer=True, low=1, high=4096, default=1),
        "seq_len": _number(data, "seq_len", integer=True, low=1, high=131072, default=512),
        "image_size": _number(data, "image_size", integer=True, low=32, high=2048, default=224),
        "target_throughput": _number(data, "target_throughput", integer=False, low=1e-6, high=1e9),
        "target_latency_ms": _number(data, "target_latency_ms", integer=False, low=0.01, high=3.6e6),
    }
    framework = data.get("framework", "")
    if not isinstance(framework, str) or len(framework) > 32:
        raise ValidationFailed("framework must be a short text (up to 32 characters).", field="framework")
    cleaned["framework"] = framework
    regime = data.get("regime") or ""  # null, "" or left out: inferred
    if regime not in ("", *REGIMES):
        raise ValidationFailed(f"regime must be one of {', '.join(REGIMES)}, or null to infer it from the "
                               "measured engine activity.", field="regime")
    cleaned["regime"] = regime
    spec = object.__new__(Spec)  # unchecked: workload_problems names the field, Spec() would only raise
    for key in FIELDS:
        object.__setattr__(spec, key, cleaned[key])
    problems = workload_problems(spec)
    if problems:
        field, message = problems[0]
        raise ValidationFailed(f"{field}: {message}.", field=field)
    if cleaned["target_throughput"] is None and cleaned["target_latency_ms"] is None:
        raise ValidationFailed("Give a target: target_throughput (samples/s; tokens/s for generation) or "
                               "target_latency_ms (per step).", field="target_throughput")
    return cleaned


def workload_register(*, actor: Actor, data: dict) -> Workload:
    actor.require("use")
    cleaned = workload_clean(data)
    with transaction.atomic():
        if Workload.objects.filter(tenant=actor.tenant, name=cleaned["name"]).exists():
            raise Conflict(f"A workload named '{cleaned['name']}' already exists.", field="name")
        workload = Workload.objects.create(tenant=actor.tenant, **cleaned)
        audit_record(tenant=actor.tenant, by=actor, action="tiering.workload_register", target=workload.name,
                     data={**{k: v for k, v in cleaned.items() if k != "name"}})
    return workload


def workload_regime_set(*, actor: Actor, workload: Workload, regime: str) -> Workload:
    """Set the regime the workload runs in (``engine``, ``eager``, or ``""``: inferred from its measured engine
    activity); audited. The next prediction uses it."""
    actor.require("use")
    if regime not in ("", *REGIMES):
        raise ValidationFailed(f"regime must be one of {', '.join(REGIMES)}, or empty to infer it from the "
                               "measured engine activity.", field="regime")
    with transaction.atomic():
        previous = workload.regime
        Workload.objects.filter(pk=workload.pk).update(regime=regime)
        workload.regime = regime
        audit_record(tenant=workload.tenant, by=actor, action="tiering.workload_regime_set", target=workload.name,
                     data={"regime": regime, "previous": previous})
    return workload


def profile_record(*, workload: Workload, slice_key: str, provenance: str, throughput: float, memory_mib: int,
                   engine_active: float | None = None, lease: Lease | None = None, at=None) -> Profile:
    """A measured (profiled or observed) figure of ``workload`` on a slice."""
    try:
        where = slice_from_key(slice_key)
    except (KeyError, ValueError) as error:
        raise ValidationFailed(str(error.args[0]), field="slice") from None
    if provenance not in (Provenance.PROFILED, Provenance.OBSERVED):
        raise ValidationFailed("provenance must be profiled or observed (predictions are the engine's).",
                               field="provenance")
    if not throughput >= 0 or memory_mib < 0:
        raise ValidationFailed("throughput and memory_mib must not be negative.", field="throughput")
    samples = work_of(spec_of(workload)).samples
    with transaction.atomic():
        profile = Profile.objects.create(
            workload=workload, slice_key=where.key, tier=where.model, provenance=provenance, throughput=throughput,
            memory_mib=memory_mib, engine_active=engine_active, fits=throughput > 0,
            step_ms=samples / throughput * 1000 if throughput > 0 else None, lease=lease,
            measured_at=at or timezone.now())
        audit_record(tenant=workload.tenant, by=None, action=f"tiering.profile_{provenance}", target=workload.name,
                     data={"slice": where.key, "throughput": round(throughput, 3), "memory_mib": memory_mib,
                           "lease": lease.pk if lease else None})
    return profile


def lease_sample_record(*, actor: Actor, lease_id: int, throughput, step_ms=None, workload=None) -> LeaseSample:
    """The workload's own throughput on its lease (what the profiler and the advice read); ``workload`` names
    the registered workload the process is, so the advice knows what runs on the lease."""
    actor.require("use")
    lease = Lease.objects.filter(pk=lease_id, tenant=actor.tenant).first()
    if lease is None:
        raise NotFound(f"No lease {lease_id}.", field="id")
    throughput = _number({"throughput": throughput}, "throughput", integer=False, low=0, high=1e12)
    if throughput is None:
        raise ValidationFailed("throughput is required (samples/s; tokens/s for generation).", field="throughput")
    step_ms = _number({"step_ms": step_ms}, "step_ms", integer=False, low=0.0, high=3.6e6)
    named = None
    if workload is not None:
        named = Workload.objects.filter(tenant=actor.tenant, name=workload).first() \
            if isinstance(workload, str) else None
        if named is None:
            raise NotFound(f"No workload named {workload!r} in this tenant.", field="workload")
    if lease.state not in ("active", "releasing"):
        raise Conflict(f"Lease {lease_id} is {lease.state}: samples are taken while it runs.", field="id")
    return LeaseSample.objects.create(lease=lease, throughput=float(throughput), step_ms=step_ms, workload=named)


def lease_sample_record_by_credential(*, credential, lease_id: int, throughput, step_ms=None,
                                      workload=None) -> LeaseSample:
    """A profiling lease's sample, posted with its samples credential (``tiering.credentials``): accepted for
    the one lease of the credential's run and slice while the run runs (403 for any other lease and once the run
    is over), recorded as the run's workload's. Nothing else accepts the credential."""
    from tiering.models import ProfilingRun, ProfilingState

    run = ProfilingRun.objects.select_related("workload").filter(pk=credential.run_id).first()
    if run is None or run.state != ProfilingState.RUNNING:
        raise PermissionDenied("This samples credential's profiling run is over.", field="id")
    item = ProfilingLease.objects.filter(run=run, slice_key=credential.slice_key).first()
    if item is None:  # the run is still requesting its leases: the workload retries
        raise Conflict("This samples credential's lease is not registered with its run yet; retry.", field="id")
    if item.lease_id != lease_id:
        raise PermissionDenied(f"This samples credential posts samples for lease {item.lease_id} only.", field="id")
    if workload is not None and workload != run.workload.name:
        raise PermissionDenied(f"This samples credential reports workload {run.workload.name!r} only.",
                               field="workload")
    lease = Lease.objects.get(pk=lease_id)
    throughput = _number({"throughput": throughput}, "throughput", integer=False, low=0, high=1e12)
    if throughput is None:
        raise ValidationFailed("throughput is required (samples/s; tokens/s for generation).", field="throughput")
    step_ms = _number({"step_ms": step_ms}, "step_ms", integer=False, low=0.0, high=3.6e6)
    if lease.state not in ("active", "releasing"):
        raise Conflict(f"Lease {lease_id} is {lease.state}: samples are taken while it runs.", field="id")
    return LeaseSample.objects.create(lease=lease, throughput=float(throughput), step_ms=step_ms,
                                      workload=run.workload)


# -- the profile database and the model --------------------------------------------------------------------

def _observation(profile: Profile) -> Observation:
    return Observation(slice_from_key(profile.slice_key), profile.throughput, profile.memory_mib,
                       profile.engine_active if profile.engine_active is not None else 1.0)


def reference_of(workload: Workload) -> Observation | None:
    """The workload's latest measurement on the reference slice, else its latest measurement that ran."""
    measured = workload.profiles.exclude(provenance=Provenance.PREDICTED).filter(fits=True, throughput__gt=0)
    best = measured.filter(slice_key=REFERENCE_SLICE).order_by("-measured_at").first() or \
        measured.order_by("-measured_at").first()
    return _observation(best) if best else None


def training_rows() -> list[Row]:
    rows = []
    for workload in Workload.objects.prefetch_related("profiles"):
        reference = reference_of(workload)
        if reference is None:
            continue
        spec = spec_of(workload)
        latest: dict[str, Profile] = {}
        for profile in workload.profiles.all():
            if profile.provenance == Provenance.PREDICTED:
                continue
            if profile.slice_key not in latest or profile.measured_at > latest[profile.slice_key].measured_at:
                latest[profile.slice_key] = profile
        rows += [Row(spec, slice_from_key(p.slice_key), reference, p.throughput, p.memory_mib)
                 for p in latest.values()]
    return rows


def model_retrain(*, trees: int = 60, folds: int = 3) -> TierModelRecord | None:
    """Train the decision model on every measured profile and calibrate it as the benchmark does: per-tier
    errors on ``folds`` folds of held-out architectures (measurement noise taken out), and the confidence
    threshold chosen on those folds at the platform's list prices (misses ≤ 2 %). None when there are too
    few rows to learn from."""
    rows = training_rows()
    if len([r for r in rows if r.throughput > 0]) < 10:
        return None
    model = TierModel(n_estimators=trees).fit(rows)
    model.calibrate(rows, folds=folds, trees=max(10, trees // 3), least=10)
    prices = dict((where.key, price) for where, price in tenant_slice_prices(tenant=None))
    threshold = model.choose_threshold(lambda where: prices.get(where.key)) if prices and model.residuals \
        else None
    if threshold is None or not any(row["decisions"] for row in model.threshold_folds.values()):
        model.threshold, threshold = None, DEFAULT_THRESHOLD  # nothing to choose on: the default, said so
    model.held_out = []  # the folds' predictions served the choice; the persisted model keeps their residuals
    error = validation_error(rows, n_estimators=trees)
    newest = Profile.objects.exclude(provenance=Provenance.PREDICTED).aggregate(at=Max("measured_at"))["at"]
    with transaction.atomic():
        record = TierModelRecord.objects.create(
            training_set_date=newest, rows=model.rows, validation_error=None if math.isnan(error) else error,
            compute_efficiency=model.compute_efficiency, memory_efficiency=model.memory_efficiency,
            threshold=threshold, noise=model.noise,
            calibration={"chosen_on_folds": model.threshold is not None, "folds": folds,
                         "tiers": sorted(model.residuals), "thresholds": model.threshold_folds},
            blob=model.to_bytes())
        audit_record(tenant=None, by=None, action="tiering.model_retrain", target=f"model {record.pk}",
                     data={"rows": record.rows, "validation_error": record.validation_error, "threshold": threshold,
                           "training_set_date": newest.isoformat()})
    return record


def model_threshold(record: TierModelRecord) -> float:
    """The least confidence a prediction needs to place on: the one calibrated with the model."""
    return record.threshold if record.threshold is not None else DEFAULT_THRESHOLD


def model_current() -> tuple[TierModelRecord, TierModel] | None:
    record = TierModelRecord.objects.order_by("-trained_at", "-id").first()
    return (record, TierModel.from_bytes(bytes(record.blob))) if record else None


def reference_set_seed(*, count: int = 120, seed: int = 0, noise: float = 0.03) -> int:
    """The platform's reference workloads profiled on every slice of the catalogue by the performance model
    (what the simulated fleet's profiler measures), so a fresh deployment's model has a profile database to
    learn from. Idempotent: a second run with the same ``count`` and ``seed`` creates nothing (each workload that
    exists still takes its draws, so those after it are the same as in the first run). Returns the number created."""
    rng = random.Random(seed)
    created = 0
    now = timezone.now() - timedelta(minutes=1)
    names = sorted(ARCHITECTURES)
    slices = [s for model in ("H100-80GB", "A100-80GB", "A100-40GB", "L4") for s in slices_for(model)]
    for index in range(count):
        arch = ARCHITECTURES[names[index % len(names)]]
        tasks = ["training", "inference"] + (["generation"] if getattr(arch, "kind", "") == "decoder" else [])
        task = rng.choice(tasks)
        precision = rng.choice(("bf16", "fp32") if task == "training" else ("bf16", "fp8", "int8"))
        batch = rng.choice((1, 4, 16, 64))
        size = rng.choice((224, 384)) if isinstance(arch, ConvNet) or arch.kind == "vit" else rng.choice((128, 512))
        spec = Spec(arch.name, task, precision, batch, 512 if size in (224, 384) else size,
                    size if size in (224, 384) else 224)
        if not estimate(spec, whole(REFERENCE_SLICE)).fits:
            continue
        name = f"ref-{index:04d}-{arch.name}"
        if Workload.objects.filter(tenant=None, name=name).exists():
            for where in slices:  # the same draws as creating it: the workloads after it come out the same
                _simulated(None, spec, where, rng, noise, now)
            continue
        workload = Workload.objects.create(tenant=None, name=name, framework="reference",
                                           **{k: getattr(spec, k) for k in FIELDS})
        created += 1
        Profile.objects.bulk_create([_simulated(workload, spec, where, rng, noise, now) for where in slices])
    return created


def _simulated(workload: Workload | None, spec: Spec, where: Slice, rng: random.Random, noise: float, at) -> Profile:
    truth = estimate(spec, where)
    throughput = truth.throughput * math.exp(rng.gauss(0, noise)) if truth.fits else 0.0
    return Profile(workload=workload, slice_key=where.key, tier=where.model, provenance=Provenance.PROFILED,
                   throughput=throughput, memory_mib=truth.memory_mib, engine_active=truth.engine_active,
                   fits=truth.fits, step_ms=truth.step_ms if truth.fits else None, measured_at=at)


# -- predictions ---------------------------------------------------------------------------------------------

def tenant_slice_prices(*, tenant) -> list[tuple[Slice, float]]:
    """Every slice of a tier the tenant's price book prices and the performance model knows, with its price
    per hour (a share: the GPU-hour rate × milli / 1000, as billing charges it). ``tenant`` None: the general
    list prices (what the model's threshold is calibrated at)."""
    from billing.selectors import price_books_for
    from billing.selectors.prices import list_rate_table
    from gpus.performance import SPECS

    now = timezone.now()
    if tenant is None:
        table = list_rate_table(at=now)
        if table is None:
            return []
    else:
        books = price_books_for(tenant=tenant, start=now, end=now + timedelta(seconds=1))
        if not books:
            return []
        table = books[-1][2]
    out = []
    for tier in sorted({t for t, _kind, _profile in table.rates}):
        if tier not in SPECS:
            continue
        for where in slices_for(tier):
            found = table.base(tier, where.kind, where.profile)
            if found is None:
                continue
            price = float(found[0]) * (where.milli / 1000 if where.kind == "share" else 1)
            out.append((where, price))
    return out


def _measured(workload: Workload) -> dict[str, Profile]:
    """The workload's latest measurement (profiled or observed) per slice."""
    latest: dict[str, Profile] = {}
    for profile in workload.profiles.exclude(provenance=Provenance.PREDICTED).order_by("measured_at", "pk"):
        latest[profile.slice_key] = profile
    return latest


def _lognormal_confidence(throughput: float, required: float, typical_error: float) -> float:
    """The chance that a figure off by ``typical_error`` as a median (log-normal: σ = ln(1 + e) / 0.6745) still
    reaches ``required``."""
    if throughput <= 0:
        return 0.0
    if required <= 0:
        return 1.0
    sigma = math.log1p(typical_error) / 0.6745
    return 0.5 * (1 + math.erf(math.log(throughput / required) / (sigma * math.sqrt(2))))


def workload_predict(*, workload: Workload, store: bool = True, target_throughput: float | None = None,
                     target_latency_ms: float | None = None, tiers: set[str] | None = None) -> Decision:
    """The cheapest slice at the tenant's prices predicted to meet the workload's target, with confidence;
    ``profile_first`` when the workload has no measurement yet, no model is trained, or none is confident.
    A target given here replaces the workload's (a request's inline target); ``tiers`` limits the slices to
    those models (the ones a project has quota for).

    Measured beats modelled (docs/tiering.md §3): a slice the workload was measured on (profiled or observed)
    takes its measurement; every other slice takes ``gpus.measured.fill`` — the nearest measurement scaled by the
    performance model's ratio between the two slices in the workload's own regime (``workload_regime``), so a
    host-bound workload gets no faster on a bigger GPU. Its confidence is the lower of the decision model's
    calibrated one for that tier and the regime's cross-validated error (``expected_error``) read as a
    log-normal spread. Each option says what it rests on (``Option.basis``)."""
    spec = spec_run(workload)
    if target_throughput is None and target_latency_ms is None:
        target_throughput, target_latency_ms = workload.target_throughput, workload.target_latency_ms
    required = required_throughput(spec, target_throughput, target_latency_ms)
    reference = reference_of(workload)
    current = model_current()
    if reference is None:
        return Decision(None, required, True, "no measurement of this workload yet: profile first")
    if current is None:
        return Decision(None, required, True, "no decision model is trained yet: profile first")
    record, model = current
    priced = [(where, price) for where, price in tenant_slice_prices(tenant=workload.tenant)
              if tiers is None or where.model in tiers]
    if not priced:
        raise ValidationFailed("No price book applies to this tenant: nothing to compare.", field="workload")
    measured = _measured(workload)
    figures = {key: (p.throughput if p.fits else 0.0, p.memory_mib, p.engine_active) for key, p in measured.items()}
    typical_error = expected_error(spec.regime, spec.task)
    # a slice a profiling run of this workload already tried (measured or not, e.g. it found no capacity) is not
    # explored again: exploring must end in a placement
    tried = set(ProfilingLease.objects.filter(run__workload=workload).values_list("slice_key", flat=True))
    options = []
    for where, price in priced:
        seen = measured.get(where.key)
        if seen is None:
            filled = fill(spec, where, figures)
            confidence = _lognormal_confidence(filled.throughput, required, typical_error)
            if model.calibrated(where):
                confidence = min(confidence, model.confidence(where, filled.throughput, required))
            if where.key in tried and confidence < model_threshold(record):
                confidence = 0.0  # tried and not measured: only a confident prediction places there
            basis = (f"{filled.source} measurement" if filled.source.startswith("scaled from")
                     else f"predicted (±{typical_error:.0%})")
            memory = filled.memory_mib if filled.fits else max(filled.memory_mib, where.memory_mib * 2)
            options.append(Option(where, price, filled.throughput, memory, confidence, basis))
        else:  # measured on this very slice (profiled or observed): the measurement rules, not the model
            memory = seen.memory_mib if seen.fits else where.memory_mib * 2
            meets = measured_meets(seen.throughput, required, record.noise or 0.0)
            options.append(Option(where, price, seen.throughput, memory, 1.0 if meets else 0.0, "measured"))
    # cheaper slices that might do (confidence ≥ EXPLORE_CONFIDENCE) are profiled first before paying for a bigger one
    decision = choose(options, required, min_confidence=model_threshold(record), headroom=0.05,
                      explore=EXPLORE_CONFIDENCE)
    decision = replace(decision, options=tuple(options))
    if store:
        with transaction.atomic():
            workload.profiles.filter(provenance=Provenance.PREDICTED).delete()
            Profile.objects.bulk_create([
                Profile(workload=workload, slice_key=o.slice.key, tier=o.slice.model,
                        provenance=Provenance.PREDICTED, throughput=o.throughput, memory_mib=o.memory_mib,
                        confidence=o.confidence, fits=o.memory_mib <= o.slice.memory_mib, basis=o.basis,
                        step_ms=work_of(spec).samples / o.throughput * 1000 if o.throughput > 0 else None)
                for o in options])
            audit_record(tenant=workload.tenant, by=None, action="tiering.predict", target=workload.name,
                         data={"model": record.pk, "chosen": decision.option.slice.key if decision.option else None,
                               "confidence": decision.option.confidence if decision.option else None,
                               "basis": decision.option.basis if decision.option else None,
                               "regime": spec.regime, "profile_first": decision.profile_first})
    return decision
