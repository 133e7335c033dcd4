"""Migration and quantization advice from a running lease's telemetry (docs/tiering.md, "Advice").

``advice_scan`` (Celery ``tiering.advice_scan``, every ``TIERING_ADVICE_SECONDS``) looks at every ACTIVE lease whose
workload said what it is (``POST /api/v1/leases/{id}/samples`` with ``workload``): over the last
``TIERING_ADVICE_WINDOW_SECONDS`` it reads the lease's engine activity (mean) and framebuffer (peak) from Prometheus
and the median of its samples, and records them as an ``observed`` profile of the workload on that slice (the
profile kept true while the workload runs). Then, against the workload's target at the tenant's prices:

- **too big**: the target is met with room to spare (throughput ≥ 1.5 × target, or the engine busy < 40 % and the
  framebuffer < 50 % full) and the decision engine names a cheaper slice predicted to meet it → migrate there,
  with the saving per hour;
- **too small**: under target, or the framebuffer ≥ 95 % full (memory pressure), and a slice is predicted to
  meet it → migrate there, with the predicted speed-up;
- **quantize**: an inference workload in 16/32-bit that the performance model says would fit and meet its target
  on a cheaper slice at INT8 or FP8 → advice only (it changes the model: not ours to do).

Each advice says what its suggested slice's figure rests on (``TierAdvice.basis``: a measurement there, another
slice's measurement scaled by the performance model, or a prediction) and, unless measured, the model's typical
error for the workload's regime (``TierAdvice.expected_error``, ``gpus.measured.expected_error``); quantization
advice is always a prediction.

One open row per (lease, kind), refreshed by each scan; closed when the lease is no longer active or the advice no
longer holds. Nothing is changed by advice.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, replace
from datetime import datetime, timedelta

from django.conf import settings
from django.db import transaction
from django.utils import timezone

from broker.choices import LeaseState
from broker.models import Lease
from gpus.measured import expected_error
from gpus.performance import estimate, regime_infer, slice_from_key
from tiering.models import AdviceBasis, AdviceKind, LeaseSample, Provenance, TierAdvice

logger = logging.getLogger(__name__)
QUANTIZED = ("int8", "fp8")


@dataclass(frozen=True, slots=True)
class FigureBasis:
    """What an advised slice's figure rests on (``AdviceBasis``) and, unless measured there, the performance model's
    typical error for the workload's regime and task (``gpus.measured.expected_error``: cross-validated by
    architecture on measured GPUs)."""

    basis: str
    expected_error: float | None
    regime: str
    how: str = ""

    def phrase(self, throughput: float) -> str:
        """The words the advice's reason uses for it (the API's ``basis`` and ``expected_error`` say the same)."""
        if self.basis == AdviceBasis.MEASURED:
            return f"gave {throughput:,.0f}/s there when measured"
        if self.basis == AdviceBasis.SCALED:
            return (f"is expected to give {throughput:,.0f}/s ({self.how}, by the performance model's ratio between "
                    f"the two slices in the {self.regime} regime, a ratio typically within "
                    f"±{self.expected_error:.0%})")
        return (f"is predicted to give {throughput:,.0f}/s (a prediction: typically within "
                f"±{self.expected_error:.0%} for a workload in the {self.regime} regime)")


def figure_basis(*, slice_key: str, how: str, measured_keys: set[str], regime: str, task: str) -> FigureBasis:
    """A measurement of the workload on ``slice_key``; else another slice's measurement scaled in the workload's
    regime (``how``: the decision option's ``scaled from <slice> measurement``); else a prediction. The two
    last carry the regime's expected error (a scaled figure's ratio is the model's)."""
    if slice_key in measured_keys:
        return FigureBasis(AdviceBasis.MEASURED, None, regime)
    error = expected_error(regime, task)
    if how.startswith("scaled from"):
        return FigureBasis(AdviceBasis.SCALED, error, regime, how)
    return FigureBasis(AdviceBasis.PREDICTED, error, regime)


def lease_slice_key(lease: Lease) -> str | None:
    """The slice a lease holds (its first allocation): ``MODEL``, ``MODEL/mig/PROFILE``, ``MODEL/share/MILLI``."""
    allocation = lease.allocations.filter(freed_at__isnull=True).select_related("gpu").order_by("pk").first()
    if allocation is None:
        return None
    model = allocation.gpu.model
    if allocation.kind == "mig":
        return f"{model}/mig/{allocation.mig_profile}"
    if allocation.kind == "share":
        return f"{model}/share/{allocation.milli}"
    return model


def advice_scan(*, now: datetime | None = None) -> dict[str, int]:
    """Scan the active leases whose workload is known; returns counts (leases seen, advice open)."""
    from tiering.profiler import PrometheusMissing, lease_telemetry
    from tiering.services import profile_record, spec_of, tenant_slice_prices, workload_predict

    now = now or timezone.now()
    window = timedelta(seconds=settings.TIERING_ADVICE_WINDOW_SECONDS)
    seen = opened = 0
    active = Lease.objects.filter(state=LeaseState.ACTIVE, tiering_samples__workload__isnull=False).distinct()
    for lease in active.order_by("pk"):
        sample = (LeaseSample.objects.filter(lease=lease, workload__isnull=False).select_related("workload")
                  .order_by("-reported_at").first())
        workload, key = sample.workload, lease_slice_key(lease)
        if key is None:
            continue
        first = LeaseSample.objects.filter(lease=lease).order_by("reported_at").values_list(
            "reported_at", flat=True).first()
        start = max(first + timedelta(seconds=5), now - window)  # from the workload's first sample on
        try:
            figures = lease_telemetry(lease=lease, start=start, end=now)
        except PrometheusMissing as error:
            logger.warning("advice: lease %s: %s", lease.pk, error)
            continue
        if figures["throughput"] is None or figures["memory_mib"] is None:
            continue
        seen += 1
        where = slice_from_key(key)
        profile_record(workload=workload, slice_key=key, provenance=Provenance.OBSERVED,
                       throughput=figures["throughput"], memory_mib=figures["memory_mib"],
                       engine_active=figures["engine_active"], lease=lease, at=now)
        prices = dict((s.key, price) for s, price in tenant_slice_prices(tenant=lease.tenant))
        current_price = prices.get(key)
        decision = workload_predict(workload=workload, store=False)
        required = decision.required
        evidence = {"throughput": round(figures["throughput"], 2), "required": round(required, 2),
                    "engine_active": figures["engine_active"], "memory_mib": figures["memory_mib"],
                    "slice_memory_mib": where.memory_mib, "samples": figures["samples"],
                    "window_seconds": int((now - start).total_seconds())}
        found: dict[str, dict] = {}
        # exploring (cheaper slices might do) still names a confident slice: advice may point there
        option = decision.option if not decision.profile_first or decision.candidates else None
        engine = figures["engine_active"] if figures["engine_active"] is not None else 1.0
        # the regime it runs in: the one registered with the workload, else the one its measured engine activity
        # here points to (eager keeps the engine idle between its operations): the performance model's figures for
        # it are that regime's, with that regime's error
        regime = workload.regime or regime_infer(spec_of(workload), where, engine)
        spec = replace(spec_of(workload), regime=regime)
        evidence["regime"] = spec.regime
        evidence["regime_source"] = ("registered" if workload.regime
                                     else f"inferred from this lease's engine activity ({engine:.0%})")
        if option is not None:
            evidence["suggested_basis"] = option.basis  # "measured", "scaled from <slice> measurement", "predicted…"
        measured_keys = set(workload.profiles.exclude(provenance=Provenance.PREDICTED).values_list("slice_key",
                                                                                                   flat=True))

        def basis(slice_key: str, throughput: float, how: str = "", spec=spec, measured_keys=measured_keys) -> str:
            return figure_basis(slice_key=slice_key, how=how, measured_keys=measured_keys, regime=spec.regime,
                                task=spec.task).phrase(throughput)
        roomy = figures["throughput"] >= 1.5 * required or (
            engine < 0.4 and figures["memory_mib"] < 0.5 * where.memory_mib)
        pressed = figures["throughput"] < required or figures["memory_mib"] >= 0.95 * where.memory_mib
        if option is not None and current_price is not None and option.slice.key != key:
            rests = figure_basis(slice_key=option.slice.key, how=option.basis, measured_keys=measured_keys,
                                 regime=spec.regime, task=spec.task)
            if roomy and option.price < current_price:
                found[AdviceKind.TOO_BIG] = {
                    "suggested": option.slice.key, "saving": current_price - option.price, "speedup": None,
                    "basis": rests.basis, "expected_error": rests.expected_error,
                    "reason": (f"too big: {figures['throughput']:,.0f}/s for {required:,.0f}/s needed, engine "
                               f"{engine:.0%} busy, {figures['memory_mib']:,} of {where.memory_mib:,} MiB; "
                               f"{option.slice.label} {basis(option.slice.key, option.throughput, option.basis)} "
                               f"(confidence {option.confidence:.0%}) at {option.price:.2f}/h instead of "
                               f"{current_price:.2f}/h")}
            elif pressed:
                speedup = option.throughput / max(figures["throughput"], 1e-9)
                found[AdviceKind.TOO_SMALL] = {
                    "suggested": option.slice.key, "saving": current_price - option.price, "speedup": speedup,
                    "basis": rests.basis, "expected_error": rests.expected_error,
                    "reason": (f"too small: {figures['throughput']:,.0f}/s for {required:,.0f}/s needed, "
                               f"{figures['memory_mib']:,} of {where.memory_mib:,} MiB; {option.slice.label} "
                               f"{basis(option.slice.key, option.throughput, option.basis)} "
                               f"(×{speedup:.1f}, confidence {option.confidence:.0%}) at {option.price:.2f}/h")}
        if spec.task != "training" and spec.precision not in QUANTIZED and current_price is not None:
            # cheaper than what it needs unquantized: the slice it is on, or the one the engine names
            baseline = min(current_price, option.price) if option is not None else current_price
            best = None
            for precision in QUANTIZED:
                quantized = replace(spec, precision=precision)
                for candidate, price in tenant_slice_prices(tenant=lease.tenant):
                    truth = estimate(quantized, candidate)
                    if truth.fits and truth.throughput >= required and price < baseline and (
                            best is None or price < best[2]):
                        best = (precision, candidate, price, truth)
            if best is not None:
                precision, candidate, price, truth = best
                found[AdviceKind.QUANTIZE] = {  # never measured at the new precision: always a prediction
                    "suggested": candidate.key, "saving": current_price - price, "speedup": None,
                    "basis": AdviceBasis.PREDICTED, "expected_error": expected_error(spec.regime, spec.task),
                    "reason": (f"quantized to {precision.upper()} it would fit {candidate.label} "
                               f"({truth.memory_mib:,} of {candidate.memory_mib:,} MiB) and give "
                               f"{truth.throughput:,.0f}/s (a prediction of the performance model, never measured at "
                               f"{precision.upper()}: typically within ±{expected_error(spec.regime, spec.task):.0%} "
                               f"in its {spec.regime} regime) for {required:,.0f}/s needed, at "
                               f"{price:.2f}/h instead of {current_price:.2f}/h; advice only: quantizing changes "
                               f"the model")}
        opened += _advice_save(lease=lease, workload=workload, key=key, found=found, evidence=evidence, now=now)
    # advice on leases that are no longer active is closed
    TierAdvice.objects.filter(open=True).exclude(lease__state=LeaseState.ACTIVE).update(open=False, updated_at=now)
    return {"leases": seen, "open": opened}


def _advice_save(*, lease: Lease, workload, key: str, found: dict, evidence: dict, now: datetime) -> int:
    from tenants.audit import audit_record

    with transaction.atomic():
        TierAdvice.objects.filter(lease=lease, open=True).exclude(kind__in=list(found)).update(open=False,
                                                                                                updated_at=now)
        for kind, item in found.items():
            values = {"suggested_slice": item["suggested"], "reason": item["reason"][:2000],
                      "saving_per_hour": round(item["saving"], 4), "speedup": item["speedup"], "evidence": evidence,
                      "basis": item["basis"], "expected_error": item["expected_error"],
                      "current_slice": key, "updated_at": now}
            row = TierAdvice.objects.filter(lease=lease, kind=kind, open=True).first()
            if row is None:
                TierAdvice.objects.create(tenant=lease.tenant, lease=lease, workload=workload, kind=kind,
                                          created_at=now, **values)
                audit_record(tenant=lease.tenant, by=None, action=f"tiering.advice_{kind}", target=f"lease {lease.pk}",
                             data={"suggested": item["suggested"], "saving_per_hour": values["saving_per_hour"]})
            else:
                TierAdvice.objects.filter(pk=row.pk).update(**values)
    return len(found)

