"""Auto-tiering's pages (docs/portal.md, docs/tiering.md): ``/workloads/`` — the tenant's registered workloads;
``/workloads/<name>`` — a workload's profile as a chart of throughput and price per slice (server-rendered SVG,
the recommended slice highlighted, the target drawn), its measurements with their provenance, its profiling runs
and the open advice on its running leases. Reads go through ``tiering.selectors`` (another tenant's workload is
404); the recommendation is ``tiering.services.workload_predict`` without storing (a page view writes nothing)."""

from __future__ import annotations

from django.contrib import messages
from django.shortcuts import redirect, render

from core.errors import ApplicationError
from gpus.performance import slice_from_key
from portal.views import TenantView
from tenants import selectors as tenant_selectors
from tiering import selectors
from tiering.models import Provenance

CHART_WIDTH = 640
LABEL_WIDTH = 190
ROW_HEIGHT = 26
PROVENANCE_ORDER = {Provenance.PROFILED: 0, Provenance.OBSERVED: 1, Provenance.PREDICTED: 2}


def profile_chart(*, profiles: list, prices: dict[str, float], recommended: str | None, required: float) -> dict:
    """The chart's geometry: one row per slice (its measured figure when there is one, else the prediction),
    throughput as a bar scaled to the fastest, price per hour as a second bar scaled to the dearest, the target as
    a line across the throughput bars. Templates only draw what this says."""
    best: dict[str, object] = {}
    for profile in profiles:
        held = best.get(profile.slice_key)
        if held is None or (PROVENANCE_ORDER[profile.provenance], -profile.measured_at.timestamp()) < (
                PROVENANCE_ORDER[held.provenance], -held.measured_at.timestamp()):
            best[profile.slice_key] = profile
    chosen = sorted(best.values(), key=lambda p: (prices.get(p.slice_key, float("inf")), p.slice_key))
    fastest = max((p.throughput for p in chosen), default=0.0) or 1.0
    dearest = max((prices.get(p.slice_key, 0.0) for p in chosen), default=0.0) or 1.0
    span = CHART_WIDTH - LABEL_WIDTH - 90
    rows = []
    for number, profile in enumerate(chosen):
        price = prices.get(profile.slice_key)
        y = 24 + number * ROW_HEIGHT
        rows.append({
            "label": slice_from_key(profile.slice_key).label, "key": profile.slice_key, "y": y,
            "text_y": y + 11, "price_y": y + 15, "price_text_y": y + 21,
            "width": round(span * profile.throughput / fastest, 1) if profile.fits else 0,
            "price_width": round(span * (price or 0) / dearest, 1), "throughput": profile.throughput,
            "price": price, "fits": profile.fits, "provenance": profile.provenance,
            "basis": profile.basis or profile.provenance,
            "meets": profile.fits and profile.throughput >= required,
            "recommended": profile.slice_key == recommended, "value_x": LABEL_WIDTH + 6})
    target_x = LABEL_WIDTH + round(span * min(required / fastest, 1.0), 1) if required else None
    return {"rows": rows, "width": CHART_WIDTH, "height": 34 + len(rows) * ROW_HEIGHT, "label_width": LABEL_WIDTH,
            "bar_x": LABEL_WIDTH, "target_x": target_x, "required": required,
            "bottom": 24 + len(rows) * ROW_HEIGHT}


class WorkloadListView(TenantView):
    template_name = "portal/workloads.html"

    def get(self, request):
        return render(request, self.template_name, {"workloads": selectors.workload_list(actor=self.actor)})


class WorkloadDetailView(TenantView):
    template_name = "portal/workload_detail.html"

    def get(self, request, name: str, error: str = "", status: int = 200):
        from tiering.models import Regime
        from tiering.services import tenant_slice_prices, workload_predict, workload_regime

        workload = selectors.workload_get(actor=self.actor, name=name)
        prices = {where.key: price for where, price in tenant_slice_prices(tenant=workload.tenant)}
        try:
            decision = workload_predict(workload=workload, store=False)
            recommendation = {"reason": decision.reason, "profile_first": decision.profile_first,
                              "slice": decision.option.slice.key if decision.option and not decision.profile_first
                              else None, "label": decision.option.slice.label if decision.option else "",
                              "required": decision.required, "options": sorted(
                                  decision.options, key=lambda o: (o.price, o.slice.key))}
        except ApplicationError as error:
            recommendation = {"reason": error.message, "profile_first": True, "slice": None, "label": "",
                              "required": workload.target_throughput or 0.0, "options": []}
        regime, regime_source = workload_regime(workload)
        profiles = list(selectors.profile_list(workload=workload))
        chart = profile_chart(profiles=profiles, prices=prices, recommended=recommendation["slice"],
                              required=recommendation["required"])
        return render(request, self.template_name, {
            "workload": workload, "chart": chart, "recommendation": recommendation,
            "regime": regime, "regime_source": regime_source, "regimes": Regime.choices,
            "measured": [p for p in profiles if p.provenance != Provenance.PREDICTED],
            "runs": selectors.profiling_run_list(workload=workload)[:10],
            "advice": selectors.advice_list(actor=self.actor, workload=workload),
            "projects": tenant_selectors.project_list(actor=self.actor), "can_use": self.actor.can("use"),
            "error": error}, status=status)


class WorkloadProfileView(WorkloadDetailView):
    """``POST /workloads/<name>/profile``: start a profiling run (``tiering.profiler.profiling_start``) on the
    chosen project; its refusal is shown on the page, in the service's words."""

    http_method_names = ["post"]
    write_action = "use"

    def post(self, request, name: str):
        from tiering.profiler import profiling_start

        workload = selectors.workload_get(actor=self.actor, name=name)
        try:
            run = profiling_start(actor=self.actor, workload=workload, project=request.POST.get("project", ""))
        except ApplicationError as error:
            return self.get(request, name, error=error.message, status=409 if error.status == 409 else 400)
        messages.success(request, f"Profiling run {run.pk} started: {run.leases.count()} lease(s), one per slice.")
        return redirect("portal:workload", name=workload.name)


class WorkloadRegimeView(WorkloadDetailView):
    """``POST /workloads/<name>/regime``: set the regime the workload runs in (``engine``, ``eager`` or empty:
    inferred), through ``tiering.services.workload_regime_set``; a refusal is shown on the page."""

    http_method_names = ["post"]
    write_action = "use"

    def post(self, request, name: str):
        from tiering.services import workload_regime_set

        workload = selectors.workload_get(actor=self.actor, name=name)
        try:
            workload_regime_set(actor=self.actor, workload=workload, regime=request.POST.get("regime", ""))
        except ApplicationError as error:
            return self.get(request, name, error=error.message, status=400)
        messages.success(request, f"Regime set: {workload.get_regime_display()}.")
        return redirect("portal:workload", name=workload.name)
