"""Fixtures for the probe agent's tests."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from engine_helpers import Host, make_host


@pytest.fixture
def pair_of_hosts() -> Iterator[tuple[Host, Host]]:
    a, b = make_host("127.0.0.2", 41000, 4), make_host("127.0.0.3", 42000, 4)
    try:
        yield a, b
    finally:
        a.close()
        b.close()
