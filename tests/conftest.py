import pytest
from django.core.cache import cache

from tests.factories import make_world


@pytest.fixture(autouse=True)
def _clear_cache():
    cache.clear()  # throttle counters
    yield


@pytest.fixture
def world(db):
    return make_world()
