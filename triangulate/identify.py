"""Ambiguity groups of the flows the engine observes, and findings widened to them.

Links crossed by exactly the same observed flows (``fleetlens.ties``: the same incidence
column) cannot be told apart by any fit: the loss fit picks one of them arbitrarily (and may
pick another next window). So a finding on any member is reported on every member with the
group's evidence (the hysteresis judges the group: overwhelming evidence makes every member
faulty at once), and each member's verdict carries the group's id and size and a confidence
of at most 1/N (which member it is stays unknown).

A flow with a known path (reported or remembered) crosses its path's links; a flow whose path
was never reported *may* cross every ECMP candidate (``paths``), and counts as crossing each:
the uplinks of a leaf whose flows have no known path are one group, as no end-to-end method
can tell them apart. Groups are recomputed when the window's layout changes (new flows or a
newly learned path), never per window.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from fleetlens.ties import flow_values, group_id, tie_groups

from . import _fast
from .attribution import Finding
from .incidence import Incidence


@dataclass
class Ambiguity:
    """Groups of links (numbers) the observed flows cannot tell apart."""

    members: list[np.ndarray] = field(default_factory=list)
    ids: list[str] = field(default_factory=list)
    group_of: np.ndarray = field(default_factory=lambda: np.empty(0, np.int64))

    @classmethod
    def of(cls, groups: list[np.ndarray], link_ids: list[str]) -> Ambiguity:
        n = len(link_ids)
        group_of = np.full(n, -1, np.int64)
        for i, g in enumerate(groups):
            group_of[g] = i
        ids = [group_id(link_ids[m] for m in g.tolist()) for g in groups]
        return cls(groups, ids, group_of)

    def named(self, link_ids: list[str]) -> list[list[str]]:
        return [[link_ids[m] for m in g.tolist()] for g in self.members]


def observed_groups(inc: Incidence, keys: np.ndarray, link_ids: list[str]) -> Ambiguity:
    """The ambiguity groups of a window's flow rows (``keys``: their flow keys)."""
    n = inc.n_links
    cols = []
    for x in (np.ones(keys.size), *flow_values(keys)):
        up, dn, rt = _fast.link_sums(
            _c(inc.up), _c(inc.dn), _c(inc.route), np.ascontiguousarray(x, np.float64),
            n, len(inc.routes),
        )  # fmt: skip
        ptr, link, _ = inc.routes.csr()  # a candidate link counts whatever its share
        owner = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
        cols.append(up[:n] + dn[:n] + np.bincount(link, rt[owner], n))
    return Ambiguity.of(tie_groups(*cols), link_ids)


def widen(findings: list[Finding], amb: Ambiguity, link_ids: list[str]) -> list[Finding]:
    """Every link finding on a group member becomes a finding on each member: the group's
    strongest loss, delay and evidence. Members already folded into a device finding (a
    switch, a NIC, a host) stay folded."""
    if not amb.members:
        return findings
    folded = {lk for f in findings if f.kind != "link" for lk in f.links}
    hit: dict[int, list[Finding]] = {}
    rest: list[Finding] = []
    for f in findings:
        g = int(amb.group_of[f.links[0]]) if f.kind == "link" and f.links else -1
        (hit.setdefault(g, []) if g >= 0 else rest).append(f)
    for g, found in hit.items():
        members = [m for m in amb.members[g].tolist() if m not in folded]
        size = int(amb.members[g].size)
        s = max(f.strength for f in found)
        loss, delay = max(f.loss for f in found), max(f.delay_ns for f in found)
        note = f"one of {size} links the probe set cannot tell apart (group {amb.ids[g]})"
        rest += [Finding(link_ids[m], "link", loss, delay, s, [m], note) for m in members]
    return rest


def _c(a: np.ndarray) -> np.ndarray:
    return np.ascontiguousarray(a, np.int64)
