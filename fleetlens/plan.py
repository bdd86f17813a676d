"""The probe planner, shared by the agent (through the collector's plan) and the simulator.

Peers: NICs are numbered in topology order and NIC *i* probes NIC *i ± d* (mod N) for a set of
offsets *d* drawn once from the seed. The probe graph is therefore symmetric (Huygens needs both
directions of every edge), connected (offset 1 is always included) and full of short loops for
the network-effect correction, while random long offsets spread probes over every leaf pair.
Peers on the sending NIC's own host are skipped. Where two links would carry exactly the same
flows under those pairs (an ambiguity group, ``ties``) and the topology has a NIC pair whose
paths cross one but not the other, that pair is added in both directions
(``ties.tie_breakers``); ties no probe set can break (a two-leaf fabric's uplink and the
downlink after it) stay, and are reported as groups.

Source ports: a flow's ECMP path is fixed by its 5-tuple, so each peer gets enough source
ports that every equal-cost path between the two leaves is hit with probability
``1 - MISS_PROBABILITY`` (coupon collector bound), capped at ``MAX_PORTS_PER_PEER``. Agents
rotate through them round by round. Every peer of one NIC uses a prefix of that NIC's single
port range (the hash includes the destination, so peers still spread differently): an agent
then needs at most ``MAX_PORTS_PER_PEER`` sockets per NIC, not one per peer and port.
"""

from __future__ import annotations

import math
import weakref

import numpy as np

from fleetlens.records import ClockModel, HostPlan, PlanEntry
from fleetlens.ties import tie_breakers
from fleetlens.topology import Topology

PROBE_DPORT = 9470
PORT_LO, PORT_HI = 33000, 60999
MISS_PROBABILITY = 0.01
MAX_PORTS_PER_PEER = 64
PERIOD_NS = 10_000_000
WINDOW_NS = 1_000_000_000


def ports_needed(
    n_paths: int, miss: float = MISS_PROBABILITY, cap: int = MAX_PORTS_PER_PEER
) -> int:
    """Ports so that P(some path of ``n_paths`` unhit) <= miss, by the union bound."""
    if n_paths <= 1:
        return 1
    m = math.log(n_paths / miss) / -math.log1p(-1.0 / n_paths)
    return min(cap, math.ceil(m))


def peer_offsets(n_nics: int, peers: int, seed: int) -> np.ndarray:
    half = max(1, min(peers // 2, (n_nics - 1) // 2))
    rng = np.random.default_rng(seed)
    pool = np.arange(2, max(3, n_nics // 2 + 1))
    extra: np.ndarray = (
        rng.choice(pool, size=min(half - 1, pool.size), replace=False)
        if half > 1
        else np.empty(0, np.int64)
    )
    return np.unique(np.concatenate([[1], extra]).astype(np.int64))


# (id of the topology, peers, seed) -> (the topology, its pairs): a host's plan is asked for
# host by host, and the tie search enumerates the whole plan's paths
_PAIRS: dict[tuple[int, int, int], tuple[weakref.ref, tuple[np.ndarray, np.ndarray]]] = {}


def peer_pairs(topo: Topology, peers: int = 16, seed: int = 0) -> tuple[np.ndarray, np.ndarray]:
    """Directed (src, dst) NIC index pairs of the probe graph, symmetric, no same-host pairs,
    with the pairs that break the ties the topology can break."""
    key = (id(topo), peers, seed)
    got = _PAIRS.get(key)
    if got is None or got[0]() is not topo:
        for k in [k for k, (ref, _) in list(_PAIRS.items()) if ref() is None]:
            _PAIRS.pop(k, None)  # plans are asked for from several API threads at once
        pairs = tie_breakers(topo, *_offset_pairs(topo, peers, seed))
        got = _PAIRS[key] = (weakref.ref(topo), pairs)
    return got[1][0].copy(), got[1][1].copy()  # callers own their arrays


def _offset_pairs(topo: Topology, peers: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    n = len(topo.nics)
    offs = peer_offsets(n, peers, seed)
    src = np.repeat(np.arange(n), 2 * offs.size)
    dst = (src + np.tile(np.concatenate([offs, -offs]), n)) % n
    host_of = topo.index.nic_host
    keep = host_of[src] != host_of[dst]
    pairs = np.unique(np.stack([src[keep], dst[keep]], axis=1), axis=0)
    return pairs[:, 0], pairs[:, 1]


def port_counts(topo: Topology, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
    """Source ports per pair, from the number of equal-cost paths between their leaves."""
    leaf = topo.index.nic_leaf  # switch numbers
    key = leaf[src] * len(topo.switches) + leaf[dst]
    uniq, inverse = np.unique(key, return_inverse=True)
    sw = topo.switches
    counts = np.array(
        [
            ports_needed(len(topo.switch_paths(sw[k // len(sw)].id, sw[k % len(sw)].id)))
            for k in uniq
        ],
        dtype=np.int64,
    )
    return counts[inverse]


def base_ports(src: np.ndarray, seed: int) -> np.ndarray:
    """The first source port of each sending NIC's range: deterministic, well mixed
    (splitmix64 of the NIC index and the seed)."""
    x = (src.astype(np.uint64) << np.uint64(32)) ^ np.uint64(seed)
    with np.errstate(over="ignore"):
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        x ^= x >> np.uint64(31)
    span = PORT_HI - PORT_LO + 1 - MAX_PORTS_PER_PEER
    return (PORT_LO + (x % np.uint64(span))).astype(np.int64)


def host_plan(
    topo: Topology, host: str, peers: int = 16, seed: int = 0, clock: ClockModel | None = None
) -> HostPlan:
    """The plan of one host: every local NIC's peers with their source ports."""
    src, dst = peer_pairs(topo, peers, seed)
    mine = np.flatnonzero(topo.index.nic_host[src] == topo.index.host[host])
    src, dst = src[mine], dst[mine]
    counts, bases = port_counts(topo, src, dst), base_ports(src, seed)
    entries = [
        PlanEntry(
            topo.nics[s].id,
            topo.nics[d].id,
            topo.nics[d].ip,
            tuple(range(int(b), int(b) + int(c))),
        )
        for s, d, b, c in zip(src, dst, bases, counts, strict=True)
    ]
    return HostPlan(
        host, PROBE_DPORT, PERIOD_NS, WINDOW_NS, entries, clock or ClockModel.identity(host)
    )
