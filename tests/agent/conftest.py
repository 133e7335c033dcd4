"""Agents as real processes on loopback (tests/support/agents.py), and clients that sign like the broker does."""

from __future__ import annotations

import pytest

from tests.support.agents import AgentProcess


@pytest.fixture(scope="module")
def agent(tmp_path_factory):
    """One agent process per test module (starting one takes about a second)."""
    process = AgentProcess(tmp_path_factory.mktemp("agent")).start()
    yield process
    process.stop()


@pytest.fixture
def client(agent):
    """A client of the module's agent, which starts each test with no instances."""
    client = agent.client(retries=0)
    for instance in client.inventory()["instances"]:
        client.destroy(instance["allocation_id"])
    return client
