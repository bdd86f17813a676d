"""GET /v1/flows over a period still reaching into the present: each first page aggregates
afresh (a poller sees the windows stored since), while the later pages of one paging read
the snapshot its first page took. A closed period's pages are served from one snapshot."""

from __future__ import annotations

import time
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from collector_helpers import READ, WINDOW_NS, InProcessServer, send_clean_window
from fleetlens.api.config import Settings

from fleetlens.topology import Topology, leaf_spine


@pytest.fixture
def topo() -> Topology:
    return leaf_spine(hosts=4, nics=2, leaves=2, spines=2)


@pytest.fixture
def srv(tmp_path: Path, topo: Topology) -> Iterator[InProcessServer]:
    inventory = tmp_path / "topology.json"
    topo.save(inventory)
    settings = Settings(db_path=tmp_path / "f.duckdb", inventory=str(inventory),
                        read_token=READ, loop_interval_s=3600)  # fmt: skip
    with InProcessServer(settings) as s:
        yield s


def _page(cl: httpx.Client, since: int, until: int, limit: int, offset: int) -> tuple[int, list]:
    r = cl.get("/v1/flows", params={"since": since, "until": until, "limit": limit,
                                    "offset": offset})  # fmt: skip
    assert r.status_code == 200, r.text
    return int(r.headers["X-Total-Count"]), r.json()


def _windows_counted(rows: list[dict]) -> int:
    return sum(r["windows"] for r in rows)


def test_a_live_period_counts_windows_stored_after_the_first_read(
    srv: InProcessServer, topo: Topology
) -> None:
    start = (time.time_ns() // WINDOW_NS - 5) * WINDOW_NS
    since, until = start, start + 120 * WINDOW_NS  # ends two minutes from now
    host = topo.hosts[0]
    send_clean_window(srv.collector, topo, host, start)
    with srv.client(READ) as cl:
        total, rows = _page(cl, since, until, 1000, 0)
        assert total == len(rows) > 0 and _windows_counted(rows) == total
        send_clean_window(srv.collector, topo, host, start + WINDOW_NS)
        total2, rows2 = _page(cl, since, until, 1000, 0)
    assert total2 == total  # the same flows ...
    assert _windows_counted(rows2) == 2 * total  # ... each with the second window now


def test_pages_of_one_paging_read_one_snapshot_even_while_live(
    srv: InProcessServer, topo: Topology
) -> None:
    start = (time.time_ns() // WINDOW_NS - 5) * WINDOW_NS
    since, until = start, start + 120 * WINDOW_NS
    send_clean_window(srv.collector, topo, topo.hosts[0], start)
    with srv.client(READ) as cl:
        total, first = _page(cl, since, until, 3, 0)
        # a new flow's window lands mid-paging: the paging goes on over its first snapshot
        send_clean_window(srv.collector, topo, topo.hosts[1], start)
        rows = list(first)
        while len(rows) < total:
            t, page = _page(cl, since, until, 3, len(rows))
            assert t == total and page
            rows += page
        assert len(rows) == total
        assert {r["src_nic"].split("/")[0] for r in rows} == {topo.hosts[0]}
        t, _ = _page(cl, since, until, 3, 0)  # a new paging sees both hosts' flows
    assert t == 2 * total


def test_a_closed_period_is_read_once_for_all_its_pages(
    srv: InProcessServer, topo: Topology
) -> None:
    start = (time.time_ns() // WINDOW_NS - 30) * WINDOW_NS  # ended well before the max wait
    since, until = start, start + 2 * WINDOW_NS
    send_clean_window(srv.collector, topo, topo.hosts[0], start)
    with srv.client(READ) as cl:
        total, _ = _page(cl, since, until, 1000, 0)
        send_clean_window(srv.collector, topo, topo.hosts[1], start)  # a very late upload
        again, _ = _page(cl, since, until, 1000, 0)
    assert again == total  # served from the period's snapshot until it expires
