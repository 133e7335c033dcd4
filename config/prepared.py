"""ORM queries compiled once per process, for the hottest read paths (the bearer token, the lease request).

Building and compiling a Django queryset with joins, subqueries and annotations costs one to three milliseconds
of CPU every time — more than PostgreSQL spends answering it. A :class:`PreparedQuery` builds its queryset once,
with a distinct *sentinel* value standing for each argument, compiles it to SQL, remembers where each sentinel
landed among the parameters, and from then on only runs that SQL with the call's values in those places. The
query is the ORM's own (the same joins, the same quoting, the same rows); nothing is cached but its text.

    token = PreparedQuery(lambda prefix: ApiToken.objects.filter(prefix=prefix).values("id", "tenant__slug"),
                          prefix="\\x00prefix")
    token.rows(prefix="abc")  # -> [{"id": 7, "tenant__slug": "acme"}]

The builder must be a ``.values(...)`` queryset, so rows come back as plain dicts; a sentinel must reach the SQL
unchanged as a parameter (``exact`` lookups, ``OuterRef`` comparisons). A sentinel that does not appear exactly
once, or a parameter the ORM transformed, is a programming error caught at the first call.
"""

from __future__ import annotations

import threading
from collections.abc import Callable
from typing import Any

from django.db import connections


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
        with connection.cursor() as cursor:
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
