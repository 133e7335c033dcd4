import pytest

from portal.templatetags.gpu_units import gpus


@pytest.mark.parametrize(("milli", "text"), [(4000, "4"), (2500, "2.5"), (429, "0.43"), (0, "0"), (None, "\u2013")])
def test_units_gpus_filter(milli, text):
    assert gpus(milli) == text


def test_units_sparkline_points_span_the_box():
    from portal.presenters import Sparkline

    line = Sparkline([0, 50, 100], width=200, height=40)
    assert line.points == "0.0,38.0 100.0,20.0 200.0,2.0"
    assert (line.mean, line.last, line.peak) == (50.0, 100, 100)
    assert Sparkline([30]).points.count(",") == 2  # one sample: a flat line across


@pytest.mark.parametrize(("seconds", "text"), [(0, "0 s"), (59, "59 s"), (90, "1 min 30 s"), (3600, "1 h"),
                                               (86400 + 7200 + 5, "1 d 2 h"), (None, "\u2013")])
def test_units_duration_filter(seconds, text):
    from portal.templatetags.portal_tags import duration

    assert duration(seconds) == text


def test_units_shape_label_and_slots():
    from types import SimpleNamespace

    from django.db.backends.postgresql.psycopg_any import NumericRange

    from portal.presenters import shape_label
    from portal.templatetags.portal_tags import slot_range

    lease = SimpleNamespace(kind="mig", profile="3g.40gb", count=2, gang=True, milli=0, memory_mib=0, tier="",
                            models_allowed=[])
    assert shape_label(lease) == "2 × MIG 3g.40gb · auto · all on one node"
    lease = SimpleNamespace(kind="share", profile="", count=1, gang=True, milli=250, memory_mib=8192, tier="L4",
                            models_allowed=[])
    assert shape_label(lease) == "1 × share 250 m / 8192 MiB · L4"
    lease = SimpleNamespace(kind="whole", profile="", count=2, gang=True, milli=0, memory_mib=0, tier="H100-80GB",
                            models_allowed=[], cpu_milli_per_unit=8000, host_memory_mib_per_unit=65_536)
    assert shape_label(lease) == "2 × whole GPU · H100-80GB · all on one node · 8 cores + 64 GiB host each"
    assert slot_range(SimpleNamespace(slots=NumericRange(4, 8))) == "slots 4–7"
    assert slot_range(SimpleNamespace(slots=NumericRange(2, 3))) == "slot 2"


def test_units_fleet_map_draws_shares_side_by_side():
    from types import SimpleNamespace

    from django.db.backends.postgresql.psycopg_any import NumericRange

    from portal.presenters import fleet_map

    tenant = SimpleNamespace(pk=1, slug="acme")
    gpu = SimpleNamespace(pk=7, index=0, uuid="GPU-1", model="L4", mode="shared", memory_mib=23034, nvlink_domain="")
    node = SimpleNamespace(node_id="n1", pool="default", status="ready", cordoned=False, hostname="",
                           last_heartbeat_at=None, gpus=SimpleNamespace(all=lambda: [gpu]), isolation="uid",
                           workload_runtime="process", workload_roots=None, host_cpu_milli=16_000,
                           host_memory_mib=65_536)

    def share(pk, milli):
        lease = SimpleNamespace(pk=pk, state="active", tenant=tenant, tenant_id=1, project=SimpleNamespace(slug="p"))
        return SimpleNamespace(gpu_id=7, lease=lease, mig_start=None, slots=NumericRange(0, 0), milli=milli,
                               memory_mib=4096, preemptible=pk == 2, instance_id=f"alloc-{pk}")

    [card], colours = fleet_map([node], [share(1, 250), share(2, 500)], [tenant], {"alloc-2": 37.0})
    first, second = card.gpus[0].segments
    assert (first.left, first.width, second.left, second.width) == (0.0, 25.0, 25.0, 50.0)
    assert "over quota" in second.detail and "37% busy" in second.detail and colours == {1: first.colour}
    assert card.gpus[0].summary == "750 of 1000 milli shared"
    assert card.host == "16 cores · 64 GiB host"  # what its agent reports of the host
