"""Fixtures for the simulator tests: small fabrics, short runs."""

from __future__ import annotations

import pytest
from sim_helpers import SMALL

from fleetlens.topology import Topology, from_spec


@pytest.fixture(scope="session")
def small_topo() -> Topology:
    return from_spec(SMALL)
