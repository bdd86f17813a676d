"""ECMP groups: the switch-to-switch links an unknown path spreads a flow over equally.

A group is the set of links leaving one switch towards the next tier (a leaf's uplinks), or
entering one switch from the same tier (the downlinks into a leaf). A flow whose path was never
reported crosses exactly one member of the groups at its ends, with the uniform ECMP prior:
end-to-end measurements cannot tell the members apart, only the group. Loss (``attribution``)
and delay (``delay``) report such faults on the whole group, each member at confidence 1/N.
"""

from __future__ import annotations

import numpy as np

from fleetlens.topology import Topology


def ecmp_groups(topo: Topology) -> list[np.ndarray]:
    """Every group with at least two members, as sorted link numbers (``topo.index``)."""
    idx = topo.index.link
    tier = {s.id: s.tier for s in topo.switches}
    group: dict[tuple, list[int]] = {}
    for lk in topo.links:
        if lk.a in tier and lk.b in tier:
            for k in (("out", lk.a, tier[lk.b]), ("in", lk.b, tier[lk.a])):
                group.setdefault(k, []).append(idx[lk.id])
    return [np.array(sorted(m), np.int64) for m in group.values() if len(m) >= 2]


def siblings(groups: list[np.ndarray], n_links: int) -> list[np.ndarray]:
    """Per link (itself included): the members of every group it belongs to."""
    out: list[set[int]] = [{i} for i in range(n_links)]
    for g in groups:
        for i in g.tolist():
            out[i].update(g.tolist())
    return [np.array(sorted(s), np.int64) for s in out]


def group_of_link(groups: list[np.ndarray], n_links: int) -> tuple[np.ndarray, np.ndarray]:
    """Per link, the number of its two groups ('out' of its tail, 'in' to its head); -1 for
    none. A switch-to-switch link is in exactly one of each kind."""
    first = np.full(n_links, -1, np.int64)
    second = np.full(n_links, -1, np.int64)
    for g, members in enumerate(groups):
        slot = np.where(first[members] < 0, 0, 1)
        first[members[slot == 0]] = g
        second[members[slot == 1]] = g
    return first, second
