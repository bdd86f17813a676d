"""Drain decisions and job impact from verdicts (pure functions the collector calls)."""

from __future__ import annotations

from fleetlens.triangulate.decisions import _nic_exposure, decisions, decisions_by_nic, job_impact
from tri_helpers import drive, small

from fleetlens.records import Decision, Verdict
from fleetlens.topology import fat_tree

TOPO = small()  # hosts h00-h07: eth0 on leaf0, eth1 on leaf4; h08-h15: leaf1/leaf5; ...


def _v(subject: str, kind: str = "link", state: str = "faulty") -> Verdict:
    return Verdict(subject, kind, state, 123, 0.0, 0.01, 0.99, 10)


def _drained(ds: list[Decision]) -> dict[str, list[str]]:
    return {d.host_id: [e.nic_id for e in d.drain] for d in ds if d.drain}


def test_fabric_link_drains_the_nics_on_its_leaf_only() -> None:
    ds = decisions([_v("leaf1->spine0")], TOPO, 5)
    assert len(ds) == len(TOPO.hosts)
    assert set(_drained(ds)) == {n.host for n in TOPO.nics_by_leaf["leaf1"]}
    for host, nics in _drained(ds).items():
        assert all(TOPO.nic_by_id[n].leaf == "leaf1" for n in nics), host


def test_suspect_drains_nothing_and_faulty_nic_drains_itself() -> None:
    assert not _drained(decisions([_v("leaf1->spine0", state="suspect")], TOPO, 5))
    ds = _drained(decisions([_v("h03/eth1", "nic")], TOPO, 5))
    assert ds == {"h03": ["h03/eth1"]}


def test_never_drain_every_nic_of_a_host() -> None:
    # both rails of h00 hit by fabric faults: equally bad -> nothing drained
    ds = _drained(decisions([_v("leaf0->spine1"), _v("spine2->leaf4")], TOPO, 5))
    assert "h00" not in ds
    # NIC eth0 itself faulty, eth1 only behind a fabric link: keep eth1 up
    ds = _drained(decisions([_v("h00/eth0", "nic"), _v("spine2->leaf4")], TOPO, 5))
    assert ds["h00"] == ["h00/eth0"]
    # the whole host is down: nothing to fail over to
    assert "h00" not in _drained(decisions([_v("h00", "host")], TOPO, 5))


def test_fat_tree_core_link_reaches_its_pod() -> None:
    ft = fat_tree(4, nics=2)
    exposed = _nic_exposure(ft, [_v("agg0->core0")])
    pods = {ft.switch_by_id[ft.nic_by_id[n].leaf].pod for n in exposed}
    assert pods == {0} and len(exposed) == 8  # agg0 serves pod 0: 4 hosts x 2 NICs
    # both NICs of a fat-tree host share its leaf: equally exposed, so none is drained
    assert not _drained(decisions([_v("agg0->core0")], ft, 5))


def test_job_impact_lists_only_what_the_job_crosses() -> None:
    vs = [_v("leaf0->spine1"), _v("leaf3->spine0"), _v("h01/eth1", "nic"), _v("spine3", "switch")]
    imp = job_impact(vs, TOPO, ["h00", "h01", "h09", "nohost"])  # leaves 0, 4, 1, 5
    assert [v.subject for v in imp.links] == ["leaf0->spine1"]
    assert [v.subject for v in imp.nics] == ["h01/eth1"]
    assert [v.subject for v in imp.switches] == ["spine3"]
    assert imp.unknown_hosts == ["nohost"] and imp.impacted
    assert not job_impact(vs, TOPO, ["h16", "h17"]).links


def test_without_a_topology_a_nic_drains_for_itself_or_its_access_links() -> None:
    """No inventory: NICs known by id (registered), links only from reported paths."""
    nics = ["h00/eth0", "h00/eth1", "h01/eth0"]
    vs = [_v("h00/eth0->sw7"), _v("sw7->sw9"), _v("h00/eth1->sw8", state="suspect"),
          _v("h01/eth0", "nic"), _v("h05/eth3->sw7")]  # fmt: skip
    ds = decisions_by_nic(vs, nics, 5)
    assert [d.host_id for d in ds] == ["h00", "h01", "h05"]  # every known host, then others
    # h01's only NIC would drain: kept up; h05 is not known, so nothing caps it
    assert _drained(ds) == {"h00": ["h00/eth0"], "h05": ["h05/eth3"]}
    assert ds[0].drain[0].reason == "link h00/eth0->sw7 faulty (loss 1.0%, evidence 10)"


def test_job_impact_without_a_topology_reads_the_nics_and_observed_paths() -> None:
    vs = [_v("h00/eth0->sw7"), _v("sw7->sw9"), _v("sw3->sw4"), _v("h00/eth1", "nic")]
    imp = job_impact(vs, None, ["h00", "h01", "h09"], nics=["h00/eth0", "h00/eth1", "h01/eth0"],
                     observed={"h00/eth0->sw7", "sw7->sw9", "sw9->h01/eth0"})  # fmt: skip
    assert imp.hosts == ["h00", "h01"] and imp.unknown_hosts == ["h09"]
    assert sorted(v.subject for v in imp.links) == ["h00/eth0->sw7", "sw7->sw9"]
    assert [v.subject for v in imp.nics] == ["h00/eth1"]
    assert imp.crossed == {"h00/eth0->sw7", "sw7->sw9", "sw9->h01/eth0"}


def test_end_to_end_black_hole_drains_leaf_nics() -> None:
    steps = drive(TOPO, ("leaf2->spine1:blackhole:start_s=1",), seconds=2)
    ds = _drained(decisions(steps[-1].verdicts, TOPO, 0))
    assert ds and all(TOPO.nic_by_id[n].leaf == "leaf2" for nics in ds.values() for n in nics)
