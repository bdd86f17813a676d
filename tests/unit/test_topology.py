from __future__ import annotations

import pytest

from fleetlens.ids import link_id, reverse_link, split_link_id, split_nic_id
from fleetlens.topology import TIER_CORE, Topology, fat_tree, from_spec, leaf_spine


def test_rail_wiring_puts_nic_k_on_leaf_group_k() -> None:
    t = leaf_spine(hosts=8, nics=2, leaves=4, spines=2)
    leaf_of = {n.id: n.leaf for n in t.nics}
    assert leaf_of["h00/eth0"] == "leaf0" and leaf_of["h07/eth0"] == "leaf1"
    assert leaf_of["h00/eth1"] == "leaf2" and leaf_of["h07/eth1"] == "leaf3"
    assert len({n.ip for n in t.nics}) == 16


def test_host_wiring_keeps_a_host_on_one_leaf() -> None:
    t = leaf_spine(hosts=8, nics=4, leaves=4, spines=2, wiring="host")
    for host, nics in t.nics_by_host.items():
        assert len({n.leaf for n in nics}) == 1, host


def test_leaf_spine_ecmp_paths_cross_every_spine_once() -> None:
    t = leaf_spine(hosts=8, nics=2, leaves=4, spines=3)
    paths = t.ecmp_paths("h00/eth0", "h07/eth1")
    assert len(paths) == 3
    assert {p[1] for p in paths} == {"leaf0->spine0", "leaf0->spine1", "leaf0->spine2"}
    for p in paths:
        assert p[0] == "h00/eth0->leaf0" and p[-1] == "leaf3->h07/eth1"
        assert all(lk in t.link_by_id for lk in p)
    assert t.ecmp_paths("h00/eth0", "h01/eth0") == [["h00/eth0->leaf0", "leaf0->h01/eth0"]]


def test_fat_tree_counts_and_cross_pod_paths() -> None:
    t = fat_tree(k=4)
    assert len(t.hosts) == 16 and len(t.switches_of_tier(TIER_CORE)) == 4
    cross = t.ecmp_paths(t.nics[0].id, t.nics[-1].id)
    assert len(cross) == 4 and all(len(p) == 6 for p in cross)
    same_pod = t.ecmp_paths(t.nics[0].id, t.nics[2].id)
    assert len(same_pod) == 2


def test_round_trip_through_json_and_yaml(tmp_path) -> None:  # type: ignore[no-untyped-def]
    t = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)
    for name in ("t.json", "t.yaml"):
        t.save(tmp_path / name)
        assert Topology.load(tmp_path / name).to_dict() == t.to_dict()


def test_specs_and_bad_input() -> None:
    assert len(from_spec("leafspine:hosts=16,nics=2,leaves=4,spines=2").nics) == 32
    assert from_spec("fattree:k=4").kind == "fattree"
    with pytest.raises(ValueError, match="divisible"):
        leaf_spine(hosts=4, nics=3, leaves=4, spines=2)
    with pytest.raises(ValueError, match="unknown topology"):
        from_spec("torus:k=3")
    with pytest.raises(ValueError, match="key=value"):
        from_spec("leafspine:hosts")
    with pytest.raises(ValueError, match="malformed"):
        Topology.from_dict({"kind": "x"})


def test_ids() -> None:
    assert split_nic_id("h03/eth1") == ("h03", "eth1")
    assert split_link_id(link_id("h03/eth1", "leaf1")) == ("h03/eth1", "leaf1")
    assert reverse_link("leaf1->spine0") == "spine0->leaf1"
    for bad in ("h03", "/eth0", "h03/eth0/x"):
        with pytest.raises(ValueError):
            split_nic_id(bad)
    with pytest.raises(ValueError):
        split_link_id("leaf1-spine0")
