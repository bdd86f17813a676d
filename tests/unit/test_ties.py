"""Ambiguity groups of a probe plan (``fleetlens.ties``) against a brute-force check, and the
planner's tie-breaking pairs."""

from __future__ import annotations

import itertools

import numpy as np
import pytest

from fleetlens.plan import _offset_pairs, peer_pairs
from fleetlens.ties import group_id, plan_groups, tie_breakers, tie_groups
from fleetlens.topology import Topology, fat_tree, leaf_spine

SMALL = {
    "2 leaves rail": lambda: leaf_spine(hosts=8, nics=2, leaves=2, spines=2),
    "2 leaves host": lambda: leaf_spine(hosts=8, nics=2, leaves=2, spines=3, wiring="host"),
    "3 leaves host": lambda: leaf_spine(hosts=6, nics=1, leaves=3, spines=2, wiring="host"),
    "4 leaves rail": lambda: leaf_spine(hosts=8, nics=2, leaves=4, spines=3),
    "4 leaves host": lambda: leaf_spine(hosts=8, nics=2, leaves=4, spines=2, wiring="host"),
    "fat-tree k=4": lambda: fat_tree(4),
}


def brute_groups(topo: Topology, pairs: list[tuple[int, int]]) -> set[frozenset[str]]:
    """Links grouped by the set of (pair, path) flows crossing them, with Python sets."""
    crossing: dict[str, set[tuple[int, int, int]]] = {}
    for s, d in pairs:
        for k, path in enumerate(topo.ecmp_paths(topo.nics[s].id, topo.nics[d].id)):
            for lk in path:
                crossing.setdefault(lk, set()).add((s, d, k))
    by_flows: dict[frozenset, set[str]] = {}
    for lk, flows in crossing.items():
        by_flows.setdefault(frozenset(flows), set()).add(lk)
    return {frozenset(g) for g in by_flows.values() if len(g) >= 2}


def every_pair(topo: Topology) -> list[tuple[int, int]]:
    host = topo.index.nic_host
    n = len(topo.nics)
    return [(s, d) for s, d in itertools.permutations(range(n), 2) if host[s] != host[d]]


def as_sets(groups: list[list[str]] | None) -> set[frozenset[str]]:
    assert groups is not None
    return {frozenset(g) for g in groups}


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("peers", [2, 4, 16])
def test_plan_groups_match_brute_force(name: str, peers: int) -> None:
    topo = SMALL[name]()
    for src, dst in (_offset_pairs(topo, peers, 0), peer_pairs(topo, peers, 0)):
        pairs = list(zip(src.tolist(), dst.tolist(), strict=True))
        assert as_sets(plan_groups(topo, src, dst)) == brute_groups(topo, pairs)


@pytest.mark.parametrize("name", SMALL)
@pytest.mark.parametrize("peers", [2, 4])
def test_the_planner_breaks_every_tie_the_topology_allows(name: str, peers: int) -> None:
    """After the planner's extra pairs, the plan's groups are exactly those that even every
    NIC pair of the fabric leaves (brute force): no tie it could break is left."""
    topo = SMALL[name]()
    src, dst = peer_pairs(topo, peers, 0)
    assert as_sets(plan_groups(topo, src, dst)) == brute_groups(topo, every_pair(topo))
    edges = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert all((d, s) in edges for s, d in edges)  # still symmetric (clock sync)
    assert all(topo.nics[s].host != topo.nics[d].host for s, d in edges)


def test_sparse_plan_gets_tie_breaking_pairs() -> None:
    topo = SMALL["4 leaves rail"]()
    src, dst = _offset_pairs(topo, 2, 0)
    assert plan_groups(topo, src, dst)  # one peer each way: access links tied
    s2, d2 = tie_breakers(topo, src, dst)
    assert s2.size > src.size and plan_groups(topo, s2, d2) == []
    old = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert old <= set(zip(s2.tolist(), d2.tolist(), strict=True))  # only ever adds


def test_two_leaves_uplink_and_next_downlink_cannot_be_separated() -> None:
    """The issue's case: every flow up leaf0->spineK comes down spineK->leaf1, whatever the
    NIC pairs; even probing every pair leaves the tie."""
    topo = SMALL["2 leaves rail"]()
    groups = as_sets(plan_groups(topo, *peer_pairs(topo)))
    assert frozenset({"leaf0->spine0", "spine0->leaf1"}) in groups
    assert groups == brute_groups(topo, every_pair(topo))
    assert len(groups) == 4  # 2 spines x 2 directions


def test_four_leaves_default_plan_identifies_every_link() -> None:
    topo = leaf_spine(hosts=8, nics=2, leaves=4, spines=2)
    assert plan_groups(topo, *peer_pairs(topo)) == []


def test_tie_groups_and_ids() -> None:
    count = np.array([2.0, 2.0, 0.0, 0.0, 3.0, 2.0])
    s1 = np.array([5.0, 5.0, 0.0, 0.0, 5.0, 6.0])
    s2 = np.array([7.0, 7.0, 0.0, 0.0, 7.0, 7.0])
    groups = tie_groups(count, s1, s2)
    assert [g.tolist() for g in groups] == [[0, 1]]  # unseen links (2, 3) are no group
    assert group_id(["b", "a"]) == group_id(["a", "b"]) != group_id(["a", "c"])
