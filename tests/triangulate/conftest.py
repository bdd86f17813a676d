"""The shared lab stack of the triangulation lab tests (lab_pool.py): one for the session,
closed as soon as the next test does not use it, so that no other lab test runs beside its
eight agents."""

from __future__ import annotations

from collections.abc import Iterator

import pytest
from lab_pool import RailStack

_POOL = pytest.StashKey[RailStack]()


@pytest.fixture(scope="session")
def rail_pool(request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
              ) -> Iterator[RailStack]:  # fmt: skip
    pool = RailStack(tmp_path_factory.mktemp("rail"))
    request.session.stash[_POOL] = pool
    try:
        yield pool
    finally:
        pool.close()


@pytest.hookimpl(trylast=True)
def pytest_runtest_teardown(item: pytest.Item, nextitem: pytest.Item | None) -> None:
    pool = item.session.stash.get(_POOL, None)
    if pool is not None and "rail_pool" not in getattr(nextitem, "fixturenames", ()):
        pool.close()
