"""Links a probe set cannot tell apart (ambiguity groups), and the probes that separate them.

End-to-end probes see a link only through the flows that cross it. Two links crossed by
exactly the same set of flows (the same incidence column) can share a loss or a delay in any
split and every flow reads the same: no method working from end-to-end counts or delays can
tell them apart. Such links form an *ambiguity group*; a fault on any member is reported as
the whole group (``fleetlens.triangulate.identify``).

Columns are compared by hashing: each flow gets two pseudo-random 26-bit integers
(splitmix64 of its key) and a link's column is summarised by its flow count and the two sums
(exact in float64 up to 2^27 flows per link). Links with equal summaries are one group; two
different flow sets collide with probability about 2^-52.

For a *plan* (NIC pairs), every equal-cost path between the pair's leaves counts as probed
(the planner gives each pair enough source ports to hit all of them, ``plan.ports_needed``).
In a two-leaf leaf-spine, ``leaf0->spineK`` and ``spineK->leaf1`` carry exactly the flows
from leaf0 to leaf1 through spineK, whatever the NIC pairs: no host-to-host probe set can
separate them (only hop-limited probes or switch counters could). With three or more
leaves a pair between two other leaves separates them; :func:`tie_breakers` finds such
pairs for every group of a plan the topology can split.
"""

from __future__ import annotations

import hashlib
import itertools
from collections.abc import Iterable

import numpy as np

from fleetlens.topology import Topology

MAX_PLAN_FLOWS = 1 << 24  # (pair, path) classes enumerated at most (a k=32 fat-tree has more)
_MASK = np.uint64((1 << 26) - 1)


def _splitmix(x: np.ndarray) -> np.ndarray:
    with np.errstate(over="ignore"):
        x = x.astype(np.uint64) + np.uint64(0x9E3779B97F4A7C15)
        x = (x ^ (x >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
        x = (x ^ (x >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
        return x ^ (x >> np.uint64(31))


def flow_values(keys: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Two independent 26-bit integers per flow key, as float64 (exact sums)."""
    h = _splitmix(np.asarray(keys))
    return (h & _MASK).astype(np.float64), ((h >> np.uint64(32)) & _MASK).astype(np.float64)


def tie_groups(count: np.ndarray, s1: np.ndarray, s2: np.ndarray) -> list[np.ndarray]:
    """Links (numbers) with flows and equal column summaries, groups of two or more, each
    sorted, groups in order of their first member."""
    seen = np.flatnonzero(count > 0)
    if seen.size < 2:
        return []
    cols = np.stack([count[seen], s1[seen], s2[seen]], axis=1)
    _, inv, sizes = np.unique(cols, axis=0, return_inverse=True, return_counts=True)
    inv = inv.reshape(-1)
    tied = sizes[inv] >= 2
    order = np.lexsort((seen[tied], inv[tied]))
    links, label = seen[tied][order], inv[tied][order]
    cuts = np.flatnonzero(np.diff(label)) + 1
    return sorted(np.split(links, cuts), key=lambda g: int(g[0])) if links.size else []


def group_id(members: Iterable[str]) -> str:
    """A stable short id of a group, from its sorted member link ids."""
    text = ",".join(sorted(members)).encode()
    return "g" + hashlib.blake2b(text, digest_size=4).hexdigest()


class _PlanPaths:
    """The equal-cost switch paths of a topology's leaf pairs, numbered, as link CSR."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        ix = topo.index
        self.n_links, self.n_sw = len(ix.link_ids), len(ix.switch_ids)
        self.first: dict[int, tuple[int, int]] = {}  # leaf pair key -> (first path, count)
        self.links: list[np.ndarray] = []

    def of(self, la: int, lb: int) -> tuple[int, int]:
        key = la * self.n_sw + lb
        got = self.first.get(key)
        if got is None:
            ids, link = self.topo.index.switch_ids, self.topo.index.link
            seqs = [()] if la == lb else self.topo.switch_paths(ids[la], ids[lb])
            got = self.first[key] = (len(self.links), len(seqs))
            for seq in seqs:
                hops = itertools.pairwise(seq)
                self.links.append(np.array([link[f"{u}->{v}"] for u, v in hops], np.int64))
        return got

    def csr(self) -> tuple[np.ndarray, np.ndarray]:
        lens = np.array([p.size for p in self.links], np.int64)
        return np.repeat(np.arange(lens.size), lens), np.concatenate([*self.links, [0]])[:-1]


def plan_columns(
    topo: Topology, src: np.ndarray, dst: np.ndarray, paths: _PlanPaths | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray] | None:
    """Per link: (flow count, sum1, sum2) over the plan's (pair, path) classes; None when
    the plan has more than ``MAX_PLAN_FLOWS`` of them."""
    ix = topo.index
    paths = paths or _PlanPaths(topo)
    leaf = ix.nic_leaf
    lp = leaf[src] * paths.n_sw + leaf[dst]
    uniq, inv = np.unique(lp, return_inverse=True)
    spans = np.array([paths.of(int(k) // paths.n_sw, int(k) % paths.n_sw) for k in uniq])
    first, per = spans[inv.reshape(-1), 0], spans[inv.reshape(-1), 1]
    if int(per.sum()) > MAX_PLAN_FLOWS:
        return None
    pair = np.repeat(np.arange(src.size), per)
    path = np.repeat(first, per) + (np.arange(pair.size) - np.repeat(np.cumsum(per) - per, per))
    n_nics = len(ix.nic_ids)
    keys = (src[pair] * n_nics + dst[pair]) * max(len(paths.links), 1) + path
    v = np.ones(pair.size), *flow_values(keys)
    owner, plink = paths.csr()
    up, dn = ix.nic_up[src[pair]], ix.nic_down[dst[pair]]
    out = []
    for x in v:
        col = np.bincount(up[up >= 0], x[up >= 0], paths.n_links)
        col += np.bincount(dn[dn >= 0], x[dn >= 0], paths.n_links)
        per_path = np.bincount(path, x, len(paths.links))
        col += np.bincount(plink, per_path[owner], paths.n_links)
        out.append(col)
    return out[0], out[1], out[2]


def plan_groups(topo: Topology, src: np.ndarray, dst: np.ndarray) -> list[list[str]] | None:
    """The ambiguity groups of a plan's NIC pairs, as link ids (None: too big to enumerate)."""
    cols = plan_columns(topo, src, dst)
    if cols is None:
        return None
    ids = topo.index.link_ids
    return [[ids[i] for i in g] for g in tie_groups(*cols)]


def _splits(paths: _PlanPaths, s: int, d: int, group: set[int]) -> bool:
    """Whether probing NIC ``s`` -> ``d`` crosses some but not all of ``group`` on a path."""
    ix = paths.topo.index
    first, count = paths.of(int(ix.nic_leaf[s]), int(ix.nic_leaf[d]))
    ends = {int(ix.nic_up[s]), int(ix.nic_down[d])}
    for p in paths.links[first : first + count]:
        hit = len(group & (ends | set(p.tolist())))
        if 0 < hit < len(group):
            return True
    return False


def _candidates(topo: Topology, group: np.ndarray) -> Iterable[tuple[int, int]]:
    """NIC pairs that might split ``group``: one pair per ordered leaf pair (the first NICs
    on different hosts), then pairs from or to a member access link's NIC."""
    ix = topo.index
    by_leaf: dict[int, list[int]] = {}
    for n, lf in enumerate(ix.nic_leaf.tolist()):
        by_leaf.setdefault(lf, []).append(n)
    host = ix.nic_host
    for a_nics in by_leaf.values():
        for b_nics in by_leaf.values():
            s = a_nics[0]
            d = next((n for n in b_nics if host[n] != host[s]), None)
            if d is not None:
                yield s, d
    for lk in group.tolist():
        nic = int(ix.link_nic[lk])
        if nic < 0:
            continue
        outgoing = int(ix.nic_up[nic]) == lk
        for nics in by_leaf.values():
            for other in nics:
                if host[other] != host[nic]:
                    yield (nic, other) if outgoing else (other, nic)
                    break


def tie_breakers(topo: Topology, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The plan's pairs plus, in both directions, a pair per ambiguity group the topology can
    split, until none is left (each added pair splits a group, so this ends). Plans too big
    to enumerate (``MAX_PLAN_FLOWS``) come back unchanged."""
    paths = _PlanPaths(topo)
    for _ in range(len(topo.links) + 1):  # each round splits a group: at most a link each
        cols = plan_columns(topo, src, dst, paths)
        if cols is None:
            return src, dst
        extra: set[tuple[int, int]] = set()
        for g in tie_groups(*cols):
            members = set(g.tolist())
            hit = next((c for c in _candidates(topo, g) if _splits(paths, *c, members)), None)
            if hit is not None:
                extra |= {hit, hit[::-1]}
        if not extra:
            return src, dst
        add = np.array(sorted(extra), np.int64)
        pairs = np.unique(np.concatenate([np.stack([src, dst], 1), add]), axis=0)
        src, dst = pairs[:, 0], pairs[:, 1]
    return src, dst
