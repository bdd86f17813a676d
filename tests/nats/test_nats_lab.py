"""Issue 27 on real packets: one agent per lab host publishing its batches to a 3-node NATS
JetStream cluster (``fleetlens agent --nats``), 2 collector shards storing them, the fleet
tier judging from the shards' summaries, localize a lab loss fault as the single collector
does (``tests/triangulate/test_triangulate_lab.py``: the same fabric, fault and bounds).

The fabric is that test's, 8 hosts x 2 NICs, 4 leaves, 2 spines (rail wiring): its two pods
are two partitions of which each shard prefers one, so both shards store, and a leaf->spine
link is named alone. The NATS servers listen on the lab's management address, where the
agents in the host namespaces reach the fleet tier (registration, plan, clocks over HTTP);
shards and fleet tier run in the root namespace. Every process is stopped by its PID, the
fault healed and the fabric torn down, also on failure.
"""

from __future__ import annotations

import asyncio
import collections
import os
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from collector_waits import all_synced, get_json, until
from fleetlens.fixtures.collector import CollectorProcess
from fleetlens.fixtures.lab import faults
from fleetlens.fixtures.lab.defaults import LAB_BACKGROUND_LOSS
from fleetlens.fixtures.lab.fabric import Lab, lab_fabric
from fleetlens.fixtures.lab.stack import Stack
from fleetlens.fixtures.lab.state import LabState
from nats_helpers import pending, stored_ids

from fleetlens.stream import MSG_ID, STREAM

nats = pytest.importorskip("nats")
fixture = pytest.importorskip("fleetlens.fixtures.nats")

pytestmark = [
    pytest.mark.root,  # deselected by -m "not root"
    pytest.mark.skipif(os.geteuid() != 0, reason="needs root: network namespaces"),
]
NAME = f"n{os.getpid() % 100000}"
SHARDS = 2
LINK = "leaf1->spine0"
LOSS_PCT = 2
# The single collector's bounds (test_triangulate_lab.py): injection to verdict, heal to
# healthy, and the time any wrong verdict gets to show before "nothing else" is judged.
LOCALIZE_S, CLEAR_S, SETTLE_S = 5.0, 30.0, 3.0
WARMUP_S = 6.0  # each flow's delay baseline, once its delays count as evidence
BASELINE_S = 90.0  # clean and synced from the agents' start


@dataclass
class Cluster:
    lab: Lab
    agents: Stack  # its "collector" is the fleet tier
    nats_url: str
    shards: list[CollectorProcess]


@pytest.fixture(scope="module")
def cluster(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Cluster]:
    work: Path = tmp_path_factory.mktemp("nats-lab")
    with (
        lab_fabric(NAME, hosts=8, nics=2, leaves=4, spines=2) as lab,
        fixture.NatsCluster(work / "nats", host=lab.collector_ip) as nc,
    ):
        inventory = LabState.path(lab.name).parent / "topology.json"
        procs: list[CollectorProcess] = []
        agents = Stack(lab, work)
        try:
            procs += [
                fixture.start_shard(work, nc.url, i, SHARDS, inventory, ["--insecure-no-auth"])
                for i in range(SHARDS)
            ]
            tier = fixture.start_fleet(
                work, nc.url, SHARDS, inventory, host=lab.collector_ip,
                args=["--insecure-no-auth", "--background-loss", str(LAB_BACKGROUND_LOSS)],
            )  # fmt: skip
            procs.append(tier)
            agents.port = int(tier.url.rsplit(":", 1)[1])
            for h in lab.topo.hosts:  # no primers: as the single collector's test, for CPU
                agents.start_agent(h, "--nats", nc.url, "--inventory", str(inventory),
                                   "--primer", "off")  # fmt: skip
            yield Cluster(lab, agents, nc.url, procs[:SHARDS])
        finally:
            agents.close()
            for p in procs:
                p.stop()


def _faulty(c: Cluster) -> dict[str, list[str]]:
    """The faulty links, each with its ambiguity group's members (itself when alone)."""
    rows = get_json(c.agents.url, "/v1/links?state=faulty&limit=1000")
    return {r["link_id"]: r.get("group_members") or [r["link_id"]] for r in rows}


def _faulty_nics(c: Cluster) -> list[str]:
    return [r["nic_id"] for r in get_json(c.agents.url, "/v1/nics?state=faulty&limit=1000")]


def _published_ids(url: str) -> list[str]:
    """The message id of every message in the windows' stream: each batch id agents published
    (a retry of a stored id is not a message: the duplicate window dropped it)."""

    async def go() -> list[str]:
        nc = await nats.connect(url.split(","))
        try:
            js = nc.jetstream()
            state = (await js.stream_info(STREAM)).state
            return [(await js.get_msg(STREAM, seq)).headers[MSG_ID]
                    for seq in range(state.first_seq, state.last_seq + 1)]  # fmt: skip
        finally:
            await nc.close()

    return asyncio.run(go())


def _clean(c: Cluster) -> bool:
    return (
        not _faulty(c) and not _faulty_nics(c) and all_synced(c.agents.url, len(c.lab.topo.hosts))
    )


def test_agents_over_nats_and_two_shards_localize_a_loss_and_store_each_batch_once(
    cluster: Cluster,
) -> None:
    c = cluster
    until(lambda: _clean(c), BASELINE_S, "clean, synced baseline")
    time.sleep(WARMUP_S)
    try:
        faults.add_loss(c.lab, LINK, LOSS_PCT)
        took = until(lambda: LINK in _faulty(c), LOCALIZE_S + 2, f"verdict on {LINK}")
        print(f"\n{LINK}: localized after {took:.1f} s")  # the margin, for ``pytest -s``
        time.sleep(SETTLE_S)
        found = _faulty(c)
        assert set(found) <= set(found[LINK]), f"{LINK} found, but also others: {found}"
        assert took <= LOCALIZE_S, f"{LINK} localized after {took:.1f} s"
    finally:
        faults.heal(c.lab)
    until(lambda: not _faulty(c), CLEAR_S, f"clear verdicts after healing {LINK}")

    stopped = c.agents.stop_agents()  # each drains its queue into the stream first
    assert set(stopped.values()) == {0}, stopped
    until(lambda: pending(c.nats_url) == 0, 60, "every batch acknowledged by a shard")
    published = _published_ids(c.nats_url)
    for s in c.shards:
        s.stop()  # their files, read-only next, have one writer each
    copies = collections.Counter(stored_ids([s.db for s in c.shards]))
    assert [i for i, n in copies.items() if n > 1] == [], "batches stored twice"
    assert published and set(copies) == set(published)
    per_shard = [len(stored_ids([s.db])) for s in c.shards]
    assert min(per_shard) > 0, f"a shard stored nothing: {per_shard}"
    print(f"{len(published)} batches published, each stored once; per shard {per_shard}")
