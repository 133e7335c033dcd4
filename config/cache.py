"""The shared cache (``CACHES`` in settings): Django's Redis cache, made safe to share a Redis database."""

from __future__ import annotations

from django.core.cache.backends.redis import RedisCache, RedisCacheClient


class ReusingRedisCacheClient(RedisCacheClient):
    """Django's client, keeping one ``redis.Redis`` per connection pool. Django's makes a new one for every
    cache operation, and ``redis.Redis()`` copies its table of response callbacks each time: in the lease
    benchmark's profile that was the API's largest cost of its own (~0.9 ms of CPU per lease, for the throttles'
    and the cycle flag's few operations). A ``redis.Redis`` is safe to share between threads (its pool hands each
    command a connection) and after a fork (the pool notices the new process and reconnects)."""

    def __init__(self, *args, **kwargs):
        super().__init__(*args, **kwargs)
        self._clients: dict[int, object] = {}

    def get_client(self, key=None, *, write=False):
        pool = self._get_connection_pool(write)
        client = self._clients.get(id(pool))
        if client is None:
            client = self._clients.setdefault(id(pool), self._client(connection_pool=pool))
        return client


class PrefixedRedisCache(RedisCache):
    """Django's ``RedisCache`` whose ``clear()`` deletes only this cache's keys (its ``KEY_PREFIX``).

    The default location is the Celery broker's Redis database; Django's own ``clear()`` would run
    ``FLUSHDB`` there and drop every queued task. Its client is ``ReusingRedisCacheClient``.
    """

    def __init__(self, server, params):
        super().__init__(server, params)
        self._class = ReusingRedisCacheClient

    def clear(self) -> bool:
        client = self._cache.get_client(write=True)
        pattern = self.key_func("*", self.key_prefix, "*")  # "<prefix>:<version>:<key>"
        batch: list[bytes] = []
        for key in client.scan_iter(match=pattern, count=1000):
            batch.append(key)
            if len(batch) >= 1000:
                client.delete(*batch)
                batch.clear()
        if batch:
            client.delete(*batch)
        return True
