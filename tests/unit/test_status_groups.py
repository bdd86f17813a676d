"""``fleetlens lab status`` names the links the collector's default plan cannot tell apart
(pure functions: no lab needed)."""

from __future__ import annotations

from fleetlens.fixtures.lab.status import render_groups, unidentifiable

from fleetlens.topology import leaf_spine


def test_two_leaf_lab_lists_its_groups() -> None:
    lines = render_groups(unidentifiable(leaf_spine(hosts=8, nics=2, leaves=2, spines=2)))
    assert lines[0].startswith("unidentifiable links: 8 in 4 groups")
    assert "  leaf0->spine0 = spine0->leaf1" in lines
    assert len(lines) == 5


def test_four_leaf_lab_has_none() -> None:
    groups = unidentifiable(leaf_spine(hosts=8, nics=2, leaves=4, spines=2))
    assert groups == []
    assert render_groups(groups) == [
        "unidentifiable links: none (the probe plan tells every link apart)"
    ]
