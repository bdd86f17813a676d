"""Partitions (``fleetlens/stream.py``): a host's leaf, or its pod under rail wiring, split by
a stable hash into parts of about ``HOSTS_PER_PARTITION`` hosts where the group is larger, so
partitions outnumber the shards of a rail-wired fleet; hosts outside the inventory hashed."""

from __future__ import annotations

import subprocess
import sys
from collections import Counter

from fleetlens.stream import HOSTS_PER_PARTITION, UNKNOWN_BUCKETS, Partitions
from fleetlens.topology import Topology

RAIL = "leafspine:hosts=1024,nics=8,leaves=32,spines=8"


def test_small_groups_keep_their_leaf_or_pod_name() -> None:
    host = Partitions(Topology.load("leafspine:hosts=8,nics=2,leaves=4,spines=2,wiring=host"))
    assert set(host.by_host.values()) == {"leaf0", "leaf1", "leaf2", "leaf3"}
    rail = Partitions(Topology.load("leafspine:hosts=8,nics=2,leaves=4,spines=2"))
    assert set(rail.by_host.values()) == {"pod-leaf0", "pod-leaf1"}
    assert rail.all() == ["pod-leaf0", "pod-leaf1"] + [f"x{i:02d}" for i in range(UNKNOWN_BUCKETS)]


def test_large_pods_are_split_into_parts_of_about_the_bound() -> None:
    topo = Topology.load(RAIL)
    parts = Partitions(topo)
    sizes = Counter(parts.by_host.values())
    pods = {p.rsplit("-", 1)[0] for p in sizes}
    assert pods == {f"pod-leaf{i}" for i in range(4)}  # 4 pods of 256 hosts
    assert len(sizes) == 4 * 256 // HOSTS_PER_PARTITION
    assert sum(sizes.values()) == len(topo.nics_by_host)
    assert max(sizes.values()) <= 1.5 * HOSTS_PER_PARTITION  # a hash: 24-41 hosts of 32
    # every part holds hosts of one pod only: its hosts share their leaves
    for p in sizes:
        leaves = {frozenset(n.leaf for n in topo.nics_by_host[h])
                  for h, q in parts.by_host.items() if q == p}  # fmt: skip
        assert len(leaves) == 1, p


def test_every_process_computes_the_same_partitions() -> None:
    """Agents, shards and the simulator run in different processes (str hash is salted)."""
    code = f"from fleetlens.stream import Partitions; from fleetlens.topology import Topology; " \
           f"print(sorted(Partitions(Topology.load({RAIL!r})).by_host.items()))"  # fmt: skip
    runs = {subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                           check=True).stdout for _ in range(2)}  # fmt: skip
    assert runs == {f"{sorted(Partitions(Topology.load(RAIL)).by_host.items())}\n"}


def test_placement_balances_hosts_over_shards() -> None:
    """Every shard gets a near-equal share of the hosts (within 5 %; a hash of the old 4 pods
    put 1.8x the mean on one of 4 shards)."""
    parts = Partitions(Topology.load(RAIL))
    for k in (2, 3, 4, 8):
        hosts = Counter(parts.preferred_shard(parts.of(h), k) for h in parts.by_host)
        assert set(hosts) == set(range(k))
        assert max(hosts.values()) <= 1.05 * len(parts.by_host) / k, (k, hosts)
        assert {parts.preferred_shard(p, k) for p in parts.all()} == set(range(k))
