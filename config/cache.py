"""The shared cache (``CACHES`` in settings): Django's Redis cache, made safe to share a Redis database."""

from __future__ import annotations

from django.core.cache.backends.redis import RedisCache


class PrefixedRedisCache(RedisCache):
    """Django's ``RedisCache`` whose ``clear()`` deletes only this cache's keys (its ``KEY_PREFIX``).

    The default location is the Celery broker's Redis database; Django's own ``clear()`` would run
    ``FLUSHDB`` there and drop every queued task.
    """

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
