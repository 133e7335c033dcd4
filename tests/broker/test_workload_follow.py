"""Following a workload's log over the real web server (issue 27 item 2): gunicorn as production runs it
(``infra.run.web_command``: gthread, 2 workers x 4 threads), a real Celery worker, simulated agents running the
workload as a real process.

Fifty follows of one tenant at once must not take the web threads from everyone else: ``/healthz`` and another
tenant's API keep answering in under a second; a follow waits at most ``WORKLOAD_LOG_FOLLOW_SECONDS`` and answers
``next_offset`` to re-ask from; over the tenant's cap of waiting follows the answer is 429 problem+json with
Retry-After (docs/leasing.md "Following a log")."""

from __future__ import annotations

import statistics
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import requests

from config.celery import app
from tests.api import server
from tests.factories import make_quota
from tests.support.api import Api
from tests.support.processes import wait_until

FOLLOWS = 50
# the server's bounded wait in this test: long enough that all fifty follows reach the server while the first
# ones wait, even on a 2-core CI machine busy with other tests (with the default 5 s, the burst could still be
# queueing when the first waiters answered, and a late follow rightly took the freed place)
FOLLOW_SECONDS = 15
# prints "started", stays silent until the test creates the file named by argv[1], prints "more", then sleeps
# bounded (180 s at most), so a failed run that never releases its lease leaves no workload behind: the agent
# keeps workloads running when it stops, to adopt them again
WAITER = ("import os, sys, time\nend = time.monotonic() + 180\nprint('started', flush=True)\n"
          "while not os.path.exists(sys.argv[1]) and time.monotonic() < end:\n"
          "    time.sleep(0.1)\nprint('more', flush=True)\ntime.sleep(max(0, end - time.monotonic()))\n")


def test_workload_follow_fifty_follows_leave_healthz_and_another_tenant_under_a_second(
        worker, workload_fleet, world, shared, tmp_path, settings):
    make_quota(world.project, "A100-80GB", deserved=1000, limit=2000, tenant_deserved=1000, tenant_limit=4000)
    # the trigger lies in the project's own directory under the workload root (<root>/<tenant>/<project>): as
    # root the agent runs the workload as the tenant's own user with a private /tmp, so tmp_path is not its to see
    own = shared / "acme" / "vision"
    own.mkdir(parents=True)
    trigger = own / "print-more"
    # the server sends its tasks to the test worker's queue
    queue = app.conf.task_default_queue
    with server.production_web_server(server.test_database_url(), CELERY_TASK_DEFAULT_QUEUE=queue,
                                       WORKLOAD_LOG_FOLLOW_SECONDS=str(FOLLOW_SECONDS),
                                       WORKLOAD_ALLOWED_ROOTS=str(shared)) as site:
        member = Api(site, world.tokens["member"])
        status, lease = member.call("POST", "/leases", {
            "project": "vision", "gpu": {"kind": "whole", "model": "A100-80GB"},
            "workload": {"command": [sys.executable, "-c", WAITER, str(trigger)], "workdir": str(own)}})
        assert status == 201, lease
        logs = f"{site}/api/v1/leases/{lease['id']}/logs"
        auth = {"Authorization": f"Bearer {world.tokens['member']}"}
        wait_until(lambda: "started" in requests.get(logs, headers=auth, timeout=10).json().get("data", ""),
                   timeout=60)
        offset = requests.get(logs, headers=auth, timeout=10).json()["next_offset"]

        def follow(_):
            started = time.monotonic()
            try:
                response = requests.get(logs, params={"follow": 60, "offset": offset}, headers=auth,
                                        timeout=2 * FOLLOW_SECONDS)
            except requests.Timeout:
                response = None  # held past 30 s (the old unbounded sleeps queued behind each other)
            return response, time.monotonic() - started

        latencies: list[tuple[str, float]] = []
        done = threading.Event()

        def probe():
            other = {"Authorization": f"Bearer {world.tokens['outsider']}"}
            while not done.is_set():
                for name, url, headers in (("healthz", f"{site}/healthz", {}),
                                           ("other tenant", f"{site}/api/v1/leases", other)):
                    started = time.monotonic()
                    try:
                        status = requests.get(url, headers=headers, timeout=5).status_code
                    except requests.Timeout:
                        status = "timeout"
                    latencies.append((f"{name} {status}", time.monotonic() - started))
                time.sleep(0.1)

        prober = threading.Thread(target=probe)
        with ThreadPoolExecutor(max_workers=FOLLOWS) as pool:
            futures = [pool.submit(follow, i) for i in range(FOLLOWS)]
            # probe while the follows are held, not while the burst of 50 new connections is being answered:
            # on a busy 2-core CI machine the refusals themselves (token check, a database round trip each)
            # take a second to drain, which is load, not a held thread. Once the tenant's refusals are back,
            # every follow still out is waiting, and a waiting follow must hold no web thread.
            wait_until(lambda: sum(f.done() for f in futures) >= FOLLOWS - settings.WORKLOAD_LOG_FOLLOWS_PER_TENANT,
                       timeout=20)
            assert not all(f.done() for f in futures), "every follow answered before the probes began"
            prober.start()
            answers = [future.result() for future in futures]
        done.set()
        prober.join()

        statuses = [response.status_code if response is not None else "timeout" for response, _ in answers]
        # no web thread is held: every probe answered 200 in under a second while the follows were out
        slowest = sorted(latencies, key=lambda item: -item[1])[:5]
        assert latencies and all(label.endswith(" 200") and seconds < 1.0 for label, seconds in latencies), \
            f"slowest probes {slowest}; follows {sorted(statuses, key=str)[:3]}..., {statuses.count('timeout')} " \
            f"held past 30 s"
        # at most the tenant's cap waited; the rest were told to come back, as problem+json with Retry-After
        assert set(statuses) <= {200, 429} and statuses.count(200) <= settings.WORKLOAD_LOG_FOLLOWS_PER_TENANT, \
            [(r.status_code, round(t, 2), r.json()) for r, t in answers if r is not None and r.status_code == 200]
        refused = [response for response, _ in answers if response.status_code == 429]
        assert len(refused) >= FOLLOWS - settings.WORKLOAD_LOG_FOLLOWS_PER_TENANT
        assert all(r.headers["Content-Type"] == "application/problem+json" and int(r.headers["Retry-After"]) >= 1
                   and r.json()["code"] == "too_many_follows" and r.json()["field"] == "follow" for r in refused)
        # a follow that waited waited at most the bounded wait, and answers the cursor to re-ask from
        waited = [(response.json(), seconds) for response, seconds in answers if response.status_code == 200]
        assert all(body["data"] == "" and body["next_offset"] == offset and body["state"] == "running"
                   and seconds < FOLLOW_SECONDS + 3 for body, seconds in waited)

        # the long poll: re-asked from the cursor, a follow answers as soon as the workload writes
        def later():
            time.sleep(1.0)
            trigger.touch()

        threading.Thread(target=later).start()
        started = time.monotonic()
        body = requests.get(logs, params={"follow": 60, "offset": offset}, headers=auth,
                            timeout=2 * FOLLOW_SECONDS).json()
        assert body["data"] == "more\n" and body["next_offset"] == offset + 5, \
            f"{body} after {time.monotonic() - started:.1f} s; " + "; ".join(
                requests.get(logs, params={"stream": stream, "offset": 0}, headers=auth, timeout=10).text
                for stream in ("stdout", "stderr")) + str(member.call("GET", f"/leases/{lease['id']}"))
        assert time.monotonic() - started < FOLLOW_SECONDS + 3
        print(f"\n{FOLLOWS} follows: {statuses.count(200)} waited, {statuses.count(429)} refused (429); "
              f"probes: {len(latencies)}, median {statistics.median(s for _, s in latencies) * 1000:.0f} ms, "
              f"slowest {max(s for _, s in latencies) * 1000:.0f} ms")
        member.call("DELETE", f"/leases/{lease['id']}")


def test_workload_follow_schema_documents_the_long_poll_and_429(client, db):
    import yaml

    schema = yaml.safe_load(client.get("/api/schema/").content)
    operation = schema["paths"]["/api/v1/leases/{id}/logs"]["get"]
    follow = next(p for p in operation["parameters"] if p["name"] == "follow")
    assert "next_offset" in follow["description"] and "WORKLOAD_LOG_FOLLOW_SECONDS" in follow["description"]
    refused = operation["responses"]["429"]
    assert "too_many_follows" in refused["description"] and "Retry-After" in refused["headers"]
    assert "application/problem+json" in refused["content"]


def test_workload_follow_waits_in_one_process_at_most_its_share_of_threads(settings, transactional_db):
    """The per-process cap: with every waiting place of this process taken, a follow of any tenant is told to
    come back in a second (429) instead of taking one more web thread."""
    from broker.services.workloads import TooManyFollows, _follow_slot

    settings.WORKLOAD_LOG_FOLLOW_WAITERS = 1
    settings.WORKLOAD_LOG_FOLLOWS_PER_TENANT = 5
    with _follow_slot(1), pytest.raises(TooManyFollows) as refused, _follow_slot(2):
        pass
    assert refused.value.retry_after_seconds == 1 and refused.value.field == "follow"
    with _follow_slot(2):  # given back: free again
        pass
