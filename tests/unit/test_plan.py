from __future__ import annotations

import numpy as np

from fleetlens.plan import MAX_PORTS_PER_PEER, host_plan, peer_pairs, ports_needed
from fleetlens.topology import leaf_spine


def test_probe_graph_is_symmetric_connected_and_skips_own_host() -> None:
    t = leaf_spine(hosts=32, nics=4, leaves=8, spines=4)
    src, dst = peer_pairs(t, peers=16, seed=3)
    edges = set(zip(src.tolist(), dst.tolist(), strict=True))
    assert all((d, s) in edges for s, d in edges)
    assert all(t.nics[s].host != t.nics[d].host for s, d in edges)
    # connected over hosts (clock sync needs one component)
    host = {n.id: n.host for n in t.nics}
    seen, frontier = {t.hosts[0]}, [t.hosts[0]]
    adj: dict[str, set[str]] = {}
    for s, d in edges:
        adj.setdefault(host[t.nics[s].id], set()).add(host[t.nics[d].id])
    while frontier:
        for nxt in adj[frontier.pop()] - seen:
            seen.add(nxt)
            frontier.append(nxt)
    assert seen == set(t.hosts)
    per_nic = np.bincount(src, minlength=len(t.nics))
    assert per_nic.min() >= 12 and per_nic.max() <= 16


def test_ports_cover_every_ecmp_path_with_high_probability() -> None:
    assert ports_needed(1) == 1
    for paths in (2, 4, 8, 16):
        m = ports_needed(paths)
        assert paths * (1 - 1 / paths) ** m <= 0.01 or m == MAX_PORTS_PER_PEER


def test_host_plan_is_deterministic_and_each_nic_uses_one_port_range() -> None:
    t = leaf_spine(hosts=32, nics=4, leaves=8, spines=4)
    a, b = host_plan(t, "h03", seed=1), host_plan(t, "h03", seed=1)
    assert a.entries == b.entries and a.entries
    for nic in {e.src_nic for e in a.entries}:
        ports = {p for e in a.entries if e.src_nic == nic for p in e.sports}
        assert len(ports) <= MAX_PORTS_PER_PEER
        assert ports == set(range(min(ports), max(ports) + 1))
    for e in a.entries:
        assert e.src_nic.startswith("h03/") and not e.dst_nic.startswith("h03/")
        assert e.dst_ip == t.nic_by_id[e.dst_nic].ip
        assert len(set(e.sports)) == len(e.sports) and all(1024 < p < 65536 for p in e.sports)
