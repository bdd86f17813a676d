"""Faults do what they say, only where they say, and heal leaves a clean fabric."""

from __future__ import annotations

import time

import numpy as np
import pytest
from fleetlens.fixtures.lab import awake, faults, measure, netns
from fleetlens.fixtures.lab.fabric import Lab, LabError
from fleetlens.fixtures.lab.paths import flow_path
from fleetlens.fixtures.lab.state import LabState, Proc, is_ours
from fleetlens.fixtures.lab.status import link_states

from fleetlens.records import Flow

FABRIC_LINK = "leaf0->spine1"
# Delay tolerance we can hold: the delay daemon is a userspace process on a shared 2-core VM.
DELAY_TOL_US = 25.0


def _loss(lab: Lab, flows: list, count: int) -> float:  # type: ignore[type-arg]
    res = measure.udp_exchange(lab, flows, count=count, interval_s=0.0005)
    sent = sum(r.sent for r in res)
    return 1.0 - sum(r.received for r in res) / sent


def test_loss_fault_hits_only_flows_through_the_link(clean_lab: Lab) -> None:
    through = measure.flows_through(clean_lab, FABRIC_LINK, want=4)
    avoiding = measure.flows_through(clean_lab, FABRIC_LINK, want=4, avoid=True)
    faults.add_loss(clean_lab, FABRIC_LINK, 20)
    assert abs(_loss(clean_lab, through, 600) - 0.20) <= 0.05  # 4 flows × 600 = 2400 packets
    assert _loss(clean_lab, avoiding, 300) == 0.0


def test_delay_fault_adds_the_reported_delay_only_on_its_flows(clean_lab: Lab) -> None:
    through = measure.flows_through(clean_lab, FABRIC_LINK, want=2)
    avoiding = measure.flows_through(clean_lab, FABRIC_LINK, want=2, avoid=True)

    def medians() -> tuple[float, float]:
        a = measure.udp_exchange(clean_lab, through, count=300, interval_s=0.001)
        b = measure.udp_exchange(clean_lab, avoiding, count=300, interval_s=0.001)
        return measure.median_owd_ns(a) / 1e3, measure.median_owd_ns(b) / 1e3

    base_through, base_avoid = medians()
    (fault,) = faults.add_delay(clean_lab, FABRIC_LINK, 200)
    assert fault.measured_us is not None
    assert 200 - DELAY_TOL_US <= fault.measured_us <= 200 + 2 * DELAY_TOL_US
    now_through, now_avoid = medians()
    assert abs((now_through - base_through) - fault.measured_us) <= DELAY_TOL_US
    assert abs(now_avoid - base_avoid) <= DELAY_TOL_US / 2
    faults.heal(clean_lab, FABRIC_LINK)
    healed_through, _ = medians()
    assert abs(healed_through - base_through) <= DELAY_TOL_US / 2


def test_down_withdraws_the_link_and_up_restores_it(clean_lab: Lab) -> None:
    faults.add_down(clean_lab, FABRIC_LINK)
    states = link_states(clean_lab)
    assert not states[FABRIC_LINK] and not states["spine1->leaf0"]
    src = clean_lab.topo.nic_by_id["h00/eth0"]
    dst = next(n for n in clean_lab.topo.nics if n.leaf not in (src.leaf,) and n.host != src.host)
    # Routing reconverged: every source port now avoids the downed cable and still arrives.
    for sport in range(43000, 43016):
        assert FABRIC_LINK not in flow_path(clean_lab, src.id, dst.id, sport)
    assert _loss(clean_lab, [Flow(src.id, dst.id, 43000)], 50) == 0.0
    faults.heal(clean_lab, FABRIC_LINK)
    assert link_states(clean_lab)[FABRIC_LINK]
    used = {flow_path(clean_lab, src.id, dst.id, p)[1] for p in range(43000, 43032)}
    assert FABRIC_LINK in used


def test_access_link_down_cuts_that_nic_only(clean_lab: Lab) -> None:
    link = "h01/eth0->leaf0"
    faults.add_down(clean_lab, link)
    h01, h02 = clean_lab.topo.nic_by_id["h01/eth0"], clean_lab.topo.nic_by_id["h02/eth1"]
    other = clean_lab.topo.nic_by_id["h03/eth0"]
    res = measure.udp_exchange(
        clean_lab, [Flow(h02.id, h01.id, 43100), Flow(h02.id, other.id, 43100)], 5
    )
    assert res[0].received == 0 and res[1].received == 5
    faults.heal(clean_lab, link)
    res = measure.udp_exchange(clean_lab, [Flow(h02.id, h01.id, 43100)], 5)
    assert res[0].received == 5


def _fault_helpers(lab: Lab) -> list[Proc]:
    state = LabState.load(lab.name)
    assert state is not None
    return [p for p in state.procs if p.role != awake.ROLE]


def test_flap_toggles_the_cable_until_healed(clean_lab: Lab) -> None:
    faults.add_flap(clean_lab, FABRIC_LINK, 200)
    # Each edge reconverges the whole lab's routes, which takes seconds on a loaded machine:
    # the deadline is generous, and the loop ends at the first down-then-up it sees.
    states: list[bool] = []
    deadline = time.monotonic() + 30.0
    while time.monotonic() < deadline and not (False in states and states[-1]):
        up = link_states(clean_lab)[FABRIC_LINK]
        if not states or states[-1] != up:
            states.append(up)
        time.sleep(0.02)
    assert False in states and states[-1], f"cable states seen: {states}"
    (proc,) = _fault_helpers(clean_lab)
    faults.heal(clean_lab, FABRIC_LINK)
    assert not is_ours(proc)
    for _ in range(10):  # stays up: the flapper is gone
        assert link_states(clean_lab)[FABRIC_LINK]
        time.sleep(0.03)


def test_heal_all_leaves_a_clean_fabric(clean_lab: Lab) -> None:
    faults.add_loss(clean_lab, FABRIC_LINK, 50, both=True)
    faults.add_loss(clean_lab, "h03/eth1->leaf2", 10)
    faults.add_delay(clean_lab, "leaf1->spine0", 100)
    faults.add_down(clean_lab, "leaf3->spine0")
    faults.add_flap(clean_lab, "h05/eth0->leaf1", 100)
    procs = _fault_helpers(clean_lab)
    assert len(procs) == 2
    assert len(faults.heal(clean_lab)) == 6
    state = LabState.load(clean_lab.name)
    assert state is not None and not state.faults and not _fault_helpers(clean_lab)
    assert not any(is_ours(p) for p in procs)
    assert [p.role for p in state.procs if is_ours(p)] == [awake.ROLE]  # the lab's own helper
    assert all(link_states(clean_lab).values())
    for ns in state.namespaces:
        rules = netns.run(ns, ["nft", "list", "ruleset"]).stdout
        assert "fl_" not in rules and "queue" not in rules, f"{ns} keeps fault rules"
    nics = [n.id for n in clean_lab.topo.nics]
    flows = [Flow(s, d, 44000) for s in nics for d in nics if s != d]
    res = measure.udp_exchange(clean_lab, flows, count=3, interval_s=0.002)
    assert all(r.received == 3 for r in res)


def test_bad_fault_requests_are_refused(clean_lab: Lab) -> None:
    with pytest.raises(LabError, match="no such link"):
        faults.add_loss(clean_lab, "leaf0->leaf1", 10)
    with pytest.raises(LabError, match="loss must be"):
        faults.add_loss(clean_lab, FABRIC_LINK, 150)
    with pytest.raises(LabError, match="delay must be"):
        faults.add_delay(clean_lab, FABRIC_LINK, -5)
    with pytest.raises(LabError, match="flap period"):
        faults.add_flap(clean_lab, FABRIC_LINK, 1)
    assert not LabState.load(clean_lab.name).faults  # type: ignore[union-attr]


def test_owd_is_positive_and_sub_millisecond_on_a_clean_fabric(clean_lab: Lab) -> None:
    flows = measure.flows_through(clean_lab, FABRIC_LINK, want=2)
    owd = np.concatenate([r.owd_ns for r in measure.udp_exchange(clean_lab, flows, 200, 0.001)])
    assert owd.size >= 380
    assert 0 < np.median(owd) < 1_000_000
