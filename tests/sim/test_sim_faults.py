"""Every fault shows in the windows where, and only where, the truth says it is."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import SimResult, Simulator
from sim_helpers import column, crosses, touches

from fleetlens.topology import from_spec

SECONDS = 4


def _run(topo, *faults: str, seconds: float = SECONDS, **kw) -> tuple[Simulator, SimResult]:
    cfg = SimConfig(faults=faults, paths_known=True, load=kw.pop("load", 0.1), **kw)
    sim = Simulator(topo, cfg, seed=kw.pop("seed", 4))
    return sim, sim.run(seconds)


def _excess(sim: Simulator, t: pa.Table) -> np.ndarray:
    """owd_min above the flow's true fixed path delay (clock='truth' makes OWD true)."""
    fab = sim.fabric
    index = {
        (fab.nic_ids[s], fab.nic_ids[d], int(p)): i
        for i, (s, d, p) in enumerate(zip(sim.flow_src, sim.flow_dst, sim.flow_sport, strict=True))
    }
    keys = zip(*(t.column(c).to_pylist() for c in ("src_nic", "dst_nic", "sport")), strict=True)
    base = sim.flow_base[[index[k] for k in keys]]
    return column(t, "owd_min_ns") - base


def _truth(res: SimResult, link: str) -> dict[int, dict]:
    rows = res.truth_links.filter(pa.compute.equal(res.truth_links["link_id"], link)).to_pylist()
    return {r["window"]: r for r in rows}


def _loss(t: pa.Table) -> np.ndarray:
    return 1.0 - column(t, "received") / column(t, "sent")


def _window(t: pa.Table, w: int) -> pa.Table:
    return t.filter(pa.compute.equal(t["window"], w))


def test_no_fault_no_loss_no_excess(small_topo) -> None:
    sim, res = _run(small_topo)
    assert (_loss(res.windows) == 0).all()
    assert (_excess(sim, res.windows) < 15_000).all()
    assert not any(res.truth_links.column("faulty").to_pylist())
    assert res.truth_devices.num_rows == 0


def test_link_delay_only_on_its_flows_and_only_while_active(small_topo) -> None:
    link = "leaf1->spine0"
    sim, res = _run(small_topo, f"{link}:delay_us=20:start_s=1,end_s=3")
    truth = _truth(res, link)
    for w in range(SECONDS):
        t = _window(res.windows, w)
        on, ex = crosses(t, link), _excess(sim, t)
        assert truth[w]["faulty"] == (1 <= w < 3)
        if truth[w]["faulty"]:
            assert truth[w]["added_delay_ns"] == 20_000
            assert (ex[on] >= 20_000 - 1).all() and on.sum() > 10
        else:
            assert (ex[on] < 15_000).all()
        assert (ex[~on] < 15_000).all()


@pytest.mark.parametrize(
    ("spec", "rate", "seconds"),
    [("leafspine:hosts=8,nics=2,leaves=4,spines=2", 0.02, 2),
     ("leafspine:hosts=64,nics=2,leaves=4,spines=2", 0.0001, 5)],  # ~100 k packets cross it
)  # fmt: skip
def test_link_loss_rate_only_on_its_flows(spec: str, rate: float, seconds: int) -> None:
    link = "spine1->leaf2"
    _, res = _run(from_spec(spec), f"{link}:loss={rate}", seconds=seconds)
    t = res.windows
    on = crosses(t, link)
    lost = (column(t, "sent") - column(t, "received"))[on].sum()
    sent = column(t, "sent")[on].sum()
    mean, sd = rate * sent, np.sqrt(rate * sent)
    assert mean >= 5  # enough packets that the rate is visible, even at 0.01%
    assert lost > 0 and abs(lost - mean) <= 4 * sd + 1
    assert (_loss(t)[~on] == 0).all()
    assert all(r["loss_rate"] == pytest.approx(rate) for r in _truth(res, link).values())


def test_blackhole_eats_everything_on_its_flows(small_topo) -> None:
    link = "leaf0->spine1"
    _sim, res = _run(small_topo, f"{link}:blackhole", seconds=1)
    t = res.windows
    on = crosses(t, link)
    assert on.sum() > 10
    assert (column(t, "received")[on] == 0).all()
    assert (
        column(t, "owd_min_ns")[on].tolist() == [None] * on.sum()
        or np.isnan(column(t, "owd_min_ns")[on].astype(float)).all()
    )
    assert (_loss(t)[~on] == 0).all()
    assert _truth(res, link)[0]["down_fraction"] == 1.0


def test_flapping_link_alternates_with_truth(small_topo) -> None:
    link = "spine0->leaf3"
    _, res = _run(small_topo, f"{link}:flap_ms=1000")
    truth = _truth(res, link)
    for w in range(SECONDS):
        t = _window(res.windows, w)
        on = crosses(t, link)
        down = truth[w]["down_fraction"]
        assert down == (1.0 if w % 2 == 0 else 0.0)
        assert truth[w]["faulty"]  # a flapping link is faulty even while up
        assert (_loss(t)[on] == down).all()
        assert (_loss(t)[~on] == 0).all()
    # Half-period inside a window: about half the packets lost.
    _sim, res = _run(small_topo, f"{link}:flap_ms=250", seconds=1)
    on = crosses(res.windows, link)
    assert 0.35 < _loss(res.windows)[on].mean() < 0.65


def test_switch_failure_kills_every_path_through_it(small_topo) -> None:
    _sim, res = _run(small_topo, "spine1:fail:start_s=1", seconds=2)
    for w in range(2):
        t = _window(res.windows, w)
        on = np.array([any("spine1" in hop for hop in p) for p in t.column("path").to_pylist()])
        assert on.sum() > 10
        assert (_loss(t)[on] == (1.0 if w == 1 else 0.0)).all()
        assert (_loss(t)[~on] == 0).all()
    faulty = res.truth_links.filter(res.truth_links["faulty"]).to_pylist()
    assert {r["window"] for r in faulty} == {1}
    assert all("spine1" in r["link_id"] for r in faulty) and len(faulty) == 2 * 4
    assert res.truth_devices.to_pylist()[0]["device"] == "spine1"


def test_nic_drop_is_host_side_loss_on_all_its_paths(small_topo) -> None:
    nic = "h02/eth1"
    _sim, res = _run(small_topo, f"{nic}:drop=0.3", seconds=2)
    t = res.windows
    mine = touches(t, nic)
    lost = (column(t, "sent") - column(t, "received"))[mine].sum() / column(t, "sent")[mine].sum()
    assert 0.25 < lost < 0.35
    assert (_loss(t)[~mine] == 0).all()
    assert not any(res.truth_links.column("faulty").to_pylist())  # not the network
    dev = res.truth_devices.to_pylist()
    assert {(d["device"], d["kind"]) for d in dev} == {(nic, "nic")}
    # Every path of that NIC suffers, not one link's.
    paths = {tuple(p) for p, m in zip(t.column("path").to_pylist(), mine, strict=True) if m}
    assert len({hop for p in paths for hop in p[1:-1]}) >= 4


def test_host_stall_silences_and_delays_only_that_host(small_topo) -> None:
    host = "h05"
    sim, res = _run(small_topo, f"{host}:stall:start_s=1,end_s=2", seconds=3)
    for w in range(3):
        t = _window(res.windows, w)
        src_h = np.char.startswith(column(t, "src_nic").astype(str), host + "/")
        dst_h = np.char.startswith(column(t, "dst_nic").astype(str), host + "/")
        if w == 1:
            assert src_h.sum() == 0  # a stalled host sends nothing: no windows at all
            # arrivals are stamped at wake-up or lost past the ack timeout
            ex = _excess(sim, t)[dst_h]
            assert (_loss(t)[dst_h] > 0.5).all() and np.nanmin(ex) > 1_000
        else:
            assert src_h.sum() > 0
            assert (_loss(t)[src_h | dst_h] == 0).all()
        other = ~(src_h | dst_h)
        assert (_loss(t)[other] == 0).all() and (_excess(sim, t)[other] < 15_000).all()
    dev = res.truth_devices.to_pylist()
    assert [(d["window"], d["device"], d["kind"]) for d in dev] == [(1, host, "host")]
    assert not any(res.truth_links.column("faulty").to_pylist())


def test_clock_step_moves_that_hosts_raw_owd_only(small_topo) -> None:
    host, step = "h06", 1_000_000
    _, res = _run(small_topo, f"{host}:clock_step_us=1000:start_s=2", clock="identity")
    t = res.windows
    truth = {(c["window"], c["host_id"]): c for c in res.truth_clocks.to_pylist()}
    assert truth[(2, host)]["step_ns"] == step
    assert sum(c["step_ns"] != 0 for c in truth.values()) == 1

    def offset(w: int, nic: str, with_steps: bool = True) -> float:
        c = truth[(w, nic.split("/")[0])]
        before = sum(truth[(v, c["host_id"])]["step_ns"] for v in range(w + 1))
        return c["offset_ns"] + 0.5 * c["drift_ppb"] - (0 if with_steps else before)

    def tol(r: dict) -> float:
        # p50's sample sits anywhere in the window: allow half the drift difference over 1 s.
        d = [truth[(r["window"], r[k].split("/")[0])]["drift_ppb"] for k in ("src_nic", "dst_nic")]
        return 30_000 + 0.6 * abs(d[1] - d[0])

    rows = t.to_pylist()
    # With identity clock models, fleet OWD = true OWD + (offset_dst - offset_src).
    for r in rows:
        true_owd = r["owd_p50_ns"] - (
            offset(r["window"], r["dst_nic"]) - offset(r["window"], r["src_nic"])
        )
        assert -tol(r) < true_owd < tol(r)
    # The step shows exactly on the stepped host's flows from window 2 on.
    for r in rows:
        naive = r["owd_p50_ns"] - (
            offset(r["window"], r["dst_nic"], False) - offset(r["window"], r["src_nic"], False)
        )
        sign = (r["dst_nic"].startswith(host + "/")) - (r["src_nic"].startswith(host + "/"))
        expect = sign * step if r["window"] >= 2 else 0
        assert abs(naive - expect) < tol(r)
    dev = res.truth_devices.to_pylist()
    assert [(d["window"], d["device"]) for d in dev] == [(2, host)]


def test_link_load_truth_tracks_queueing(small_topo) -> None:
    """Flows over links the truth calls busier see more queueing (p50 above min)."""
    _, res = _run(small_topo, load=0.3, seconds=2)
    tl = res.truth_links.to_pylist()
    busy = {(r["window"], r["link_id"]): r["mean_queue_ns"] for r in tl}
    assert all(0 <= r["busy_fraction"] <= 1 for r in tl)
    assert max(busy.values()) > 0
    t = res.windows
    excess_p50 = column(t, "owd_p50_ns") - (column(t, "owd_min_ns"))
    expected = np.array(
        [sum(busy[(w, lk)] for lk in p) for w, p in
         zip(column(t, "window"), t.column("path").to_pylist(), strict=True)]
    )  # fmt: skip
    assert np.corrcoef(expected, excess_p50)[0, 1] > 0.3


def test_faults_on_a_three_tier_fat_tree() -> None:
    topo = from_spec("fattree:k=4")
    sim, res = _run(topo, "core1:fail", "agg3->core2:delay_us=50", seconds=1)
    t = res.windows
    paths = t.column("path").to_pylist()
    via_core1 = np.array([any("core1" in hop for hop in p) for p in paths])
    slow = crosses(t, "agg3->core2")
    assert via_core1.sum() > 10 and slow.sum() > 10
    assert (_loss(t)[via_core1] == 1).all() and (_loss(t)[~via_core1] == 0).all()
    ex = _excess(sim, t)
    assert (ex[slow] >= 50_000 - 1).all() and (ex[~slow & ~via_core1] < 15_000).all()
    faulty = {r["link_id"] for r in res.truth_links.to_pylist() if r["faulty"]}
    assert faulty == {lk.id for lk in topo.links if "core1" in lk.id} | {"agg3->core2"}


def test_switch_failure_with_reroute_moves_flows_after_convergence(small_topo) -> None:
    fault = "spine1:fail:start_s=1,end_s=2.5,reroute_ms=300"
    # a row per port: each moved flow's own loss (a path's row would mix moved and staying ones)
    cfg = SimConfig(faults=(fault,), paths_known=True, merge_paths=False, load=0.1)
    sim = Simulator(small_topo, cfg, seed=4)
    wins = list(sim.stream(3))
    base = {
        (r["src_nic"], r["dst_nic"], r["sport"]): r["path"] for r in sim.truth_paths().to_pylist()
    }

    def via_spine1(path: list[str]) -> bool:
        return any("spine1" in hop for hop in path)

    moved_loss, other_loss = [], []
    for win in wins:
        rows = win.windows.to_pylist()
        for r in rows:
            key = (r["src_nic"], r["dst_nic"], r["sport"])
            loss = 1 - r["received"] / r["sent"]
            if win.index == 1 and via_spine1(base[key]):
                moved_loss.append(loss)
                assert not via_spine1(r["path"])  # at the window's end: routed around
            else:
                other_loss.append(loss)
                if not via_spine1(base[key]):
                    assert r["path"] == base[key]  # resilient hashing: others stay put
        assert win.routed_around == (["spine1"] if win.index == 1 else [])
    # Black-holed for the first 300 ms of the failure only, then no loss at all.
    assert 0.2 < np.mean(moved_loss) < 0.4 and max(other_loss) == 0
    dev = {d["window"]: d for d in pa.concat_tables([w.truth_devices for w in wins]).to_pylist()}
    assert dev[1]["rerouted_fraction"] == pytest.approx(0.7)
    assert dev[2]["active_fraction"] == pytest.approx(0.5)
    assert dev[2]["rerouted_fraction"] == pytest.approx(0.5)
    # In window 2 routing is back to normal by the end: every path is the planned one.
    assert all(r["path"] == base[(r["src_nic"], r["dst_nic"], r["sport"])]
               for r in wins[2].windows.to_pylist())  # fmt: skip


def test_reroute_with_no_alternative_keeps_the_black_hole() -> None:
    topo = from_spec("leafspine:hosts=8,nics=2,leaves=4,spines=1")
    _, res = _run(topo, "spine0:fail:reroute_ms=0", seconds=1)
    t = res.windows
    cross = np.array([len(p) > 2 for p in t.column("path").to_pylist()])
    assert cross.sum() > 10
    assert (_loss(t)[cross] == 1).all() and (_loss(t)[~cross] == 0).all()


def test_reroute_only_for_switch_failures(small_topo) -> None:
    with pytest.raises(ValueError, match="reroute_ms"):
        Simulator(small_topo, SimConfig(faults=("leaf0->spine0:blackhole,reroute_ms=5",)))
