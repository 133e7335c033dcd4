"""ORM queries compiled once per process, for the hottest read paths (the bearer token, the lease request).

Building and compiling a Django queryset with joins, subqueries and annotations costs one to three milliseconds
of CPU every time — more than PostgreSQL spends answering it. A :class:`PreparedQuery` builds its queryset once,
with a distinct *sentinel* value standing for each argument, compiles it to SQL, remembers where each sentinel
landed among the parameters, and from then on only runs that SQL with the call's values in those places. The
query is the ORM's own (the same joins, the same quoting, the same rows); nothing is cached but its text.

    token = PreparedQuery(lambda prefix: ApiToken.objects.filter(prefix=prefix).values("id", "tenant__slug"),
                          prefix="\\x00prefix")
    token.rows(prefix="abc")  # -> [{"id": 7, "tenant__slug": "acme"}]

Its SQL runs as a server-side prepared statement on PostgreSQL (:func:`preparing_cursor`): the text is the same
on every call, so PostgreSQL parses it once per connection and, once its generic plan is as good as the custom
ones, plans it once too, and psycopg sends the values apart from the text instead of quoting each into it.

The builder must be a ``.values(...)`` queryset, so rows come back as plain dicts; a sentinel must reach the SQL
unchanged as a parameter (``exact`` lookups, ``OuterRef`` comparisons). A sentinel that does not appear exactly
once, or a parameter the ORM transformed, is a programming error caught at the first call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections

try:
    import psycopg
except ImportError:  # pragma: no cover (the project runs on psycopg 3)
    psycopg = None


if psycopg is not None:
    from django.db.backends.postgresql.base import CursorMixin

    class _PreparingCursor(CursorMixin, psycopg.Cursor):
        """psycopg's server-side binding cursor that prepares every statement it runs (Django's connections use
        client-side binding with preparation off, ``prepare_threshold`` None, for connection poolers; its
        ``ClientCursor`` never prepares, whatever the threshold)."""

        def execute(self, query, params=None, *, prepare=None, binary=None):
            return super().execute(query, params, prepare=True, binary=binary)


_NEVER_BY_COUNT = 2**31 - 1  # psycopg prepares a statement after this many runs: only those asked to be prepared


def preparing_cursor(connection):
    """A cursor of ``connection`` (Django's wrapper: its transaction, error translation, query logging and
    ``execute_wrappers`` all apply) whose statements run as server-side prepared statements, kept by psycopg
    per connection (at most ``prepared_max``, 100 by default). For a few fixed statements on the hottest paths
    only: every distinct text takes a slot, and prepared statements need a session-pooling (or no) pooler —
    PgBouncer in transaction mode before 1.21 would not keep them. They pay off on a connection that outlives
    the request (``CONN_MAX_AGE``, 60 s here); on one opened per request the first run of each costs a round trip
    more (the Parse). Any other backend, or while Django logs queries: its ordinary cursor."""
    if psycopg is None or connection.vendor != "postgresql" or connection.queries_logged:
        return connection.cursor()  # while queries are logged (DEBUG, assertNumQueries): as Django runs them, with
        # the values in the logged text (Django finds no text for a prepared statement's run)
    connection.close_if_health_check_failed()
    connection.ensure_connection()
    with connection.wrap_database_errors:
        raw = connection.connection
        if raw.prepare_threshold is None:  # Django's "never prepare": allow explicit preparation only
            raw.prepare_threshold = _NEVER_BY_COUNT
        cursor = _PreparingCursor(raw)
        default = connection.connection.adapters.get_loader(1184, psycopg.pq.Format.TEXT)  # timestamptz
        if connection.timezone != default.timezone:
            from django.db.backends.postgresql.psycopg_any import register_tzloader

            register_tzloader(connection.timezone, cursor)
        return connection._prepare_cursor(cursor)


class PreparedQuery:
    def __init__(self, build: Callable[..., Any], **sentinels: Any) -> None:
        self.build = build
        self.sentinels = sentinels
        self._compiled: dict[str, tuple] = {}
        self._lock = threading.Lock()

    def _compile(self, alias: str) -> tuple:
        queryset = self.build(**self.sentinels)
        query = queryset.query
        if not query.values_select and not query.annotation_select:
            raise TypeError("PreparedQuery needs a .values(...) queryset")
        names = [*query.extra_select, *query.values_select, *query.annotation_select]
        compiler = query.get_compiler(alias)
        sql, params = compiler.as_sql()
        # the ORM's from_db_value converters of each column (JSON decoding, ...), as its iterables apply them
        converters = list(compiler.get_converters([column for column, _, _ in compiler.select]).items())
        slots: list = []
        found: dict[str, int] = dict.fromkeys(self.sentinels, 0)
        for value in params:
            name = next((key for key, sentinel in self.sentinels.items()
                         if type(value) is type(sentinel) and value == sentinel), None)
            if name is None:
                slots.append((False, value))  # a constant of the query itself
            else:
                found[name] += 1
                slots.append((True, name))
        missing = [name for name, count in found.items() if count == 0]
        if missing:
            raise ValueError(f"sentinels {missing} do not reach the SQL as parameters")
        return sql, slots, names, converters

    def rows(self, *, using: str = "default", **values: Any) -> list[dict[str, Any]]:
        """The rows for these argument values, as ``.values()`` would give them."""
        compiled = self._compiled.get(using)
        if compiled is None:
            with self._lock:
                compiled = self._compiled.get(using) or self._compile(using)
                self._compiled[using] = compiled
        sql, slots, names, converters = compiled
        params = [values[item] if is_argument else item for is_argument, item in slots]
        connection = connections[using]
        with preparing_cursor(connection) as cursor:
            cursor.execute(sql, params)
            rows = cursor.fetchall()
        result = []
        for row in rows:
            if converters:
                row = list(row)
                for position, (functions, expression) in converters:
                    value = row[position]
                    for function in functions:
                        value = function(value, expression, connection)
                    row[position] = value
            result.append(dict(zip(names, row, strict=True)))
        return result
