"""The lease request's statements (the token, the project read, the insert) run as server-side prepared
statements (``core.prepared.preparing_cursor``), through Django's cursor wrapper (its transaction and error
translation; while Django logs queries they run unprepared, so the log has their text); everything else stays
unprepared, as Django runs it."""

from django.db import connection
from django.test.utils import CaptureQueriesContext

from tests.factories import make_world


def _prepared() -> list[str]:
    with connection.cursor() as cursor:
        cursor.execute("SELECT statement FROM pg_prepared_statements")
        return [row[0] for row in cursor.fetchall()]


def test_lease_request_statements_are_prepared_and_still_counted(db):
    world = make_world()
    client = world.client("member")
    body = {"project": world.project.slug, "gpu": {"kind": "mig", "profile": "1g.10gb"}}
    first = client.post("/api/v1/leases", body, format="json", HTTP_IDEMPOTENCY_KEY="prep-1")
    assert first.status_code == 201
    prepared = _prepared()
    assert any("INSERT INTO \"broker_lease\"" in text for text in prepared)
    assert any("FROM \"tenants_project\"" in text for text in prepared)
    assert any("FROM \"tenants_apitoken\"" in text for text in prepared)
    assert len(prepared) == 3  # nothing else was prepared
    with CaptureQueriesContext(connection) as queries:  # logged: unprepared, with the values in the text
        second = client.post("/api/v1/leases", body, format="json", HTTP_IDEMPOTENCY_KEY="prep-2")
    assert second.status_code == 201
    assert any("INSERT INTO \"broker_lease\"" in query["sql"] and "'prep-2'" in query["sql"]
               for query in queries.captured_queries)
    again = client.post("/api/v1/leases", body, format="json", HTTP_IDEMPOTENCY_KEY="prep-1")
    assert again.status_code == 200 and again.json()["id"] == first.json()["id"]  # the replay, same statements
    other = client.post("/api/v1/leases", {**body, "priority": 5}, format="json", HTTP_IDEMPOTENCY_KEY="prep-1")
    assert other.status_code == 409
    assert len(_prepared()) == 3


def test_a_failed_prepared_insert_rolls_back_cleanly(db):
    """An IntegrityError in the prepared insert (the same key raced) leaves the connection usable."""
    from django.db import IntegrityError

    from broker.models import Lease
    from broker.services.request import _lease_insert

    world = make_world()
    client = world.client("member")
    body = {"project": world.project.slug, "gpu": {"kind": "mig", "profile": "1g.10gb"}}
    assert client.post("/api/v1/leases", body, format="json", HTTP_IDEMPOTENCY_KEY="race").status_code == 201
    existing = Lease.objects.get(idempotency_key="race")
    copy = Lease.objects.get(pk=existing.pk)
    copy.pk = None
    copy._state.adding = True
    try:
        _lease_insert(copy, [])
    except IntegrityError:
        pass
    else:
        raise AssertionError("the duplicate key was inserted")
    assert Lease.objects.filter(idempotency_key="race").count() == 1
