"""``manage.py run_as_leader --lock beat -- celery -A config beat``: run a command on exactly one replica.

Kubernetes runs two replicas of the scheduler (Celery beat) for availability, but two beats would send every
periodic task twice. Each replica takes a PostgreSQL session advisory lock named by ``--lock`` on a connection
of its own; the one that holds it runs the command, the others wait (standby) and try again every
``--retry-seconds``. The lock lives as long as that database session: when the leader's pod dies, PostgreSQL
ends the session and a standby takes over; when the leader loses its connection, it stops its command (a
standby may already lead) and exits non-zero, so it is restarted as a standby. SIGTERM stops the command and
releases the lock. (The schedule cycle itself is serialised by its own transaction lock; this keeps beat single.)
"""

from __future__ import annotations

import contextlib
import hashlib
import signal
import subprocess
import sys
import time

from django.core.management.base import BaseCommand, CommandError
from django.db import connection


def lock_key(name: str) -> int:
    """A stable signed 64-bit key for ``pg_try_advisory_lock`` from a name."""
    return int.from_bytes(hashlib.sha256(f"gpubroker:leader:{name}".encode()).digest()[:8], "big", signed=True)


class Command(BaseCommand):
    help = "Run a command only while holding a PostgreSQL advisory lock (one leader among replicas)."

    def add_arguments(self, parser):
        parser.add_argument("--lock", required=True, help="name of the lock (e.g. beat)")
        parser.add_argument("--retry-seconds", type=float, default=5.0)
        parser.add_argument("--check-seconds", type=float, default=5.0,
                            help="how often the leader checks its database session")
        parser.add_argument("argv", nargs="+", help="the command to run (after --)")

    def handle(self, *args, **options):
        import psycopg

        stop = {"requested": False}

        def on_signal(signum, _frame):
            stop["requested"] = True

        signal.signal(signal.SIGTERM, on_signal)
        signal.signal(signal.SIGINT, on_signal)
        params = connection.get_connection_params()
        params.pop("cursor_factory", None)
        params.pop("context", None)
        key = lock_key(options["lock"])
        session = None
        announced = False
        while not stop["requested"]:
            try:
                if session is None or session.closed:
                    session = psycopg.connect(**params, autocommit=True)
                if session.execute("SELECT pg_try_advisory_lock(%s)", [key]).fetchone()[0]:
                    break
            except psycopg.Error as error:
                self.stderr.write(f"leader {options['lock']}: database not reachable ({error}); retrying")
                session = None
            if not announced:
                self.stdout.write(f"leader {options['lock']}: standby (another replica holds the lock)")
                self.stdout.flush()  # seen at once by whoever watches the replica (and by the test)
                announced = True
            time.sleep(options["retry_seconds"])
        if stop["requested"]:
            return
        self.stdout.write(f"leader {options['lock']}: leading; starting {' '.join(options['argv'])}")
        self.stdout.flush()
        child = subprocess.Popen(options["argv"])
        code = 0
        try:
            while not stop["requested"]:
                if child.poll() is not None:
                    code = child.returncode
                    break
                time.sleep(min(options["check_seconds"], 0.5))
                if self._session_lost(session, options["check_seconds"]):
                    self.stderr.write(f"leader {options['lock']}: lost the database session; stopping the command")
                    code = 75  # EX_TEMPFAIL: restart me as a standby
                    break
        finally:
            if child.poll() is None:
                child.terminate()
                try:
                    child.wait(timeout=20)
                except subprocess.TimeoutExpired:
                    child.kill()
                    child.wait()
            with contextlib.suppress(Exception):  # closing a lost session
                session.close()
        if code:
            raise CommandError(f"leader {options['lock']}: exit {code}", returncode=code)
        sys.stdout.flush()

    _last_check = 0.0

    def _session_lost(self, session, every: float) -> bool:
        now = time.monotonic()
        if now - self._last_check < every:
            return False
        self._last_check = now
        try:
            session.execute("SELECT 1").fetchone()
        except Exception:  # noqa: BLE001 - any failure of the session loses the lock
            return True
        return False
