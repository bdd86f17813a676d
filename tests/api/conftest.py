"""Fixtures for the collector tests (helpers live in collector_helpers.py)."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from collector_helpers import Server, start_server

from fleetlens.topology import Topology, leaf_spine


@pytest.fixture(scope="module")
def topo() -> Topology:
    return leaf_spine(hosts=4, nics=2, leaves=2, spines=2)


@pytest.fixture(scope="module")
def inventory(topo: Topology, tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("inv") / "fleet.json"
    topo.save(path)
    return path


@pytest.fixture(scope="module")
def server(inventory: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    s = start_server(tmp_path_factory.mktemp("collector"), inventory)
    try:
        yield s
    finally:
        s.stop()
