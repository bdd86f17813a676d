"""Ambiguity groups through a real collector: on the two-leaf inventory a lossy uplink and the
downlink after it carry the same flows, and the API (/v1/links, /v1/links/{id}), /metrics
and the collector log say so."""

from __future__ import annotations

import time
from urllib.parse import quote

import pytest
from collector_helpers import INGEST, READ, Server, make_windows, metric

from fleetlens.batch import encode_batch
from fleetlens.ties import group_id
from fleetlens.topology import Topology

FABRIC, TWIN = "leaf0->spine0", "spine0->leaf1"  # two leaves: the same flows


@pytest.fixture(scope="module")
def fed(server: Server, topo: Topology) -> Server:
    start = (time.time_ns() // 10**9 - 3) * 10**9
    with server.client(INGEST) as c:
        for host in topo.hosts:
            t = make_windows(topo, host, start, n_windows=2, lossy_links=frozenset({FABRIC}))
            body, ctype = encode_batch(host, t)
            assert c.post("/v1/ingest", content=body, headers={"Content-Type": ctype}).is_success
    deadline = time.monotonic() + 20
    with server.client(READ) as c:
        while time.monotonic() < deadline:
            faulty = {x["link_id"] for x in c.get("/v1/links", params={"state": "faulty"}).json()}
            if {FABRIC, TWIN} <= faulty:
                return server
            time.sleep(0.2)
    raise AssertionError(f"the group was never reported: {faulty}")


def test_links_name_the_group(fed: Server) -> None:
    gid = group_id([FABRIC, TWIN])
    with fed.client() as c:
        faulty = {x["link_id"]: x for x in c.get("/v1/links", params={"state": "faulty"}).json()}
        detail = c.get(f"/v1/links/{quote(TWIN, safe='')}").json()
        alone = c.get(f"/v1/links/{quote('leaf0->spine1', safe='')}").json()
    assert set(faulty) == {FABRIC, TWIN}  # every member, nothing outside
    for x in faulty.values():
        assert (x["group_id"], x["group_size"], x["group_members"]) == (gid, 2, [FABRIC, TWIN])
        assert x["confidence"] <= 0.5
    assert detail["group_id"] == gid and detail["group_size"] == 2 and detail["state"] == "faulty"
    assert alone["group_size"] == 1 and alone["group_members"] == []


def test_metrics_carry_the_group(fed: Server) -> None:
    with fed.client() as c:
        text = c.get("/metrics").text
    gid = group_id([FABRIC, TWIN])
    for lk in (FABRIC, TWIN):
        assert metric(text, "fleetlens_faulty_link_group_size", link=lk, group=gid) == 2
    with pytest.raises(KeyError):  # only faulty links of a group: the series stay bounded
        metric(text, "fleetlens_faulty_link_group_size", link="leaf0->spine1")


def test_the_collector_log_names_the_plans_unidentifiable_links(fed: Server) -> None:
    log = fed.process.log.read_text()
    assert "probe plan: 8 links unidentifiable, in 4 groups" in log
    assert f"{FABRIC} = {TWIN}" in log
