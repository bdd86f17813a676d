"""Accuracy against the simulator's ground truth on a small leaf-spine (issue 7 targets).

Fabric: 32 hosts x 2 NICs, 8 leaves, 4 spines, 16 peers per NIC at 10 ms (the reference
fabric's density per leaf is higher, so these are the harder case per link). Sub-second
requirements use the simulator's own window length (``window_ns``): a 30 ms window is exactly
three probing rounds, a 100 ms window ten.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest
from tri_helpers import drive, fabric_links, prf, score, small, truth_links

TOPO = small()
LINKS = fabric_links(TOPO)


def test_black_hole_from_three_rounds_100_trials() -> None:
    rng = np.random.default_rng(7)
    tp = fp = fn = 0
    for trial in range(100):
        link = LINKS[rng.integers(len(LINKS))]
        steps = drive(TOPO, (f"{link}:blackhole",), seconds=0.03, window_s=0.03, seed=trial)
        a, b, c = score(steps[-1].faulty(), {link})
        tp, fp, fn = tp + a, fp + b, fn + c
    p, r, _ = prf(tp, fp, fn)
    assert p >= 0.99 and r >= 0.99, (p, r, tp, fp, fn)


@pytest.mark.parametrize(("rate", "within_s"), [(0.001, 3), (0.0001, 30)])
def test_low_loss_localized_in_time(rate: float, within_s: int) -> None:
    rng = np.random.default_rng(int(rate * 1e5))
    trials = 5 if within_s < 10 else 2
    for trial in range(trials):
        link = LINKS[rng.integers(len(LINKS))]
        steps = drive(TOPO, (f"{link}:loss={rate}",), seconds=within_s, seed=100 + trial)
        assert steps[-1].faulty() == {link}, (link, steps[-1].bad)
        est = steps[-1].bad[link].loss_rate
        assert rate / 3 <= est <= rate * 3, est


def test_multiple_lossy_links_f1_within_10s() -> None:
    rng = np.random.default_rng(11)
    tp = fp = fn = 0
    for trial in range(6):
        k = int(rng.integers(1, 11))
        bad = rng.choice(LINKS, k, replace=False)
        faults = tuple(f"{lk}:loss={rng.uniform(0.002, 0.02):.4f}" for lk in bad)
        steps = drive(TOPO, faults, seconds=10, seed=200 + trial)
        a, b, c = score(steps[-1].faulty(), set(bad))
        tp, fp, fn = tp + a, fp + b, fn + c
    assert prf(tp, fp, fn)[2] >= 0.95, (tp, fp, fn)


def _delay_trials(us: float, window_s: float, warm_s: float, n: int, seed: int):
    rng = np.random.default_rng(seed)
    found, est, false = 0, [], 0
    first = round(warm_s / window_s)
    for trial in range(n):
        link = LINKS[rng.integers(len(LINKS))]
        spec = f"{link}:delay_us={us}:start_s={warm_s}"
        steps = drive(TOPO, (spec,), seconds=warm_s + window_s, window_s=window_s, seed=trial)
        hit = steps[first].bad.get(link)
        found += hit is not None
        if hit is not None:
            est.append(hit.excess_delay_ns / (us * 1e3))
        false += len(steps[first].reported() - {link})
    return found / n, np.array(est), false


def test_delay_10us_found_within_100ms() -> None:
    recall, est, false = _delay_trials(10, 0.1, 2.0, 20, 31)
    assert recall >= 0.95 and false == 0, (recall, false)
    assert np.all(np.abs(est - 1) <= 0.2), est


def test_delay_2us_found_within_1s() -> None:
    recall, est, false = _delay_trials(2, 1.0, 3.0, 20, 32)
    assert recall >= 0.95 and false == 0, (recall, false)
    assert np.all(np.abs(est - 1) <= 0.2), est


def test_failed_switch_is_one_device() -> None:
    for sw in ("spine2", "leaf3"):
        steps = drive(TOPO, (f"{sw}:fail:start_s=1",), seconds=3, seed=5)
        assert steps[-1].reported() == {sw}, steps[-1].bad
        assert steps[-1].bad[sw].kind == "switch" and steps[-1].bad[sw].state == "faulty"


def test_flapping_link_shows_as_flapping_then_heals() -> None:
    link = "leaf1->spine0"
    steps = drive(
        TOPO, (f"{link}:flap_ms=500:start_s=1,end_s=7",), seconds=20, window_s=0.1, seed=3
    )
    at_6s = steps[59].bad.get(link)
    assert at_6s is not None and at_6s.flapping and at_6s.state == "faulty"
    assert steps[59].reported() == {link}
    assert link not in steps[-1].bad  # healed and clean for longer than the hold time


def test_heal_clears_verdict() -> None:
    link = "spine1->leaf2"
    steps = drive(TOPO, (f"{link}:loss=0.01:start_s=0,end_s=3",), seconds=10, seed=9)
    assert steps[2].faulty() == {link}
    assert not steps[-1].bad, steps[-1].bad


def test_unknown_but_stable_paths_keep_f1() -> None:
    """Paths reported once (agent traceroute) then null: the engine remembers the mapping."""
    rng = np.random.default_rng(12)
    results = {}
    for mode in ("known", "first"):
        tp = fp = fn = 0
        for trial in range(4):
            bad = rng.choice(LINKS, 3, replace=False)
            faults = tuple(f"{lk}:loss=0.005:start_s=1" for lk in bad)
            steps = drive(TOPO, faults, seconds=6, seed=300 + trial, paths=mode)
            a, b, c = score(steps[-1].faulty(), set(bad))
            tp, fp, fn = tp + a, fp + b, fn + c
        results[mode] = prf(tp, fp, fn)[2]
    assert results["first"] >= results["known"] - 0.05, results


def test_no_fault_no_alarm() -> None:
    steps = drive(TOPO, (), seconds=20, seed=21)
    alarms = sum(len(s.reported()) for s in steps)
    assert alarms == 0, [s.bad for s in steps if s.bad]
    assert all(not truth_links(s) for s in steps)


def test_restart_adopts_previous_verdicts_then_clears() -> None:
    """A fresh engine seeded with the collector's previous verdicts keeps them until clean."""
    from fleetlens.triangulate.engine import Triangulator

    from fleetlens.records import Verdict

    tri = Triangulator(TOPO)
    old = Verdict("leaf2->spine3", "link", "faulty", 42, 0.0, 0.02, 0.99, 50)
    steps = drive(TOPO, (), seconds=1, seed=2)
    t = steps[0].window.windows.drop(["window"])
    first = {v.subject: v for v in tri(t, TOPO, {old.subject: old})}
    assert first["leaf2->spine3"].state == "faulty" and first["leaf2->spine3"].since_ns == 42
    later = drive(TOPO, (), seconds=7, seed=2)
    for s in later:
        out = {v.subject: v for v in tri(s.window.windows.drop(["window"]), TOPO, first)}
    assert out["leaf2->spine3"].state == "healthy"


def test_fat_tree_sampled_delay_names_no_extra_links() -> None:
    """Regression (k=32 finding): with delay judged on a hash-sample of the flows (~40 per
    core link here), a link's *median* excess flipped to the queueing mode whenever half its
    few sampled flows had queued, and healthy core/agg links were reported in the first
    windows where delay may judge. The statistic is now a low quantile of the flows' excess:
    a delay fault moves every flow, queueing only some."""
    from fleetlens.triangulate.config import TriangulateConfig

    from fleetlens.topology import from_spec

    ft = from_spec("fattree:k=8")  # 101k flow rows per window
    cfg = TriangulateConfig(delay_sample_rows=10_000)  # forces a 1/16 sample
    lossy = "leaf0->agg0"
    for seed in (0, 1):
        steps = drive(ft, (f"{lossy}:loss=0.01",), seconds=6, seed=seed, config=cfg)
        for i, s in enumerate(steps):
            assert s.reported() <= {lossy}, (seed, i, s.bad)
        assert steps[-1].faulty() == {lossy}
    core = "agg5->core4"
    steps = drive(ft, (f"{core}:delay_us=3:start_s=3",), seconds=4, seed=2, config=cfg)
    assert all(not s.bad for s in steps[:3]), [s.bad for s in steps[:3]]
    assert steps[3].reported() == {core}, steps[3].bad
    assert abs(steps[3].bad[core].excess_delay_ns / 3_000 - 1) <= 0.2, steps[3].bad[core]
    # its evidence: late flows of the sample, every one of them through the link
    t = steps[3].window.windows
    path = {f"{s}>{d}:{p}": x for s, d, p, x in zip(*(t[c].to_pylist() for c in
            ("src_nic", "dst_nic", "sport", "path")), strict=True)}  # fmt: skip
    ev = steps[3].bad[core]
    assert ev.flows and all(core in path[f] for f in ev.flows), ev.flows


def test_never_reported_paths_give_the_ecmp_set_not_a_confident_pick() -> None:
    """No path ever reported: loss on one uplink of a leaf is spread evenly over all of the
    leaf's uplinks (uniform ECMP prior), so the engine must not name one of them with full
    confidence (it used to name spine0's link for a fault on spine3's): it reports every
    uplink with the same evidence, each with confidence 1/N. With paths: exactly the link."""
    from fleetlens.topology import from_spec

    topo = from_spec("leafspine:hosts=64,nics=1,leaves=8,spines=4")  # the 64-host demo
    for link, group in (("leaf6->spine3", [f"leaf6->spine{i}" for i in range(4)]),
                        ("spine1->leaf2", [f"spine{i}->leaf2" for i in range(4)])):  # fmt: skip
        steps = drive(topo, (f"{link}:loss=0.05:start_s=1",), seconds=4, seed=1, paths="unknown")
        got = steps[-1].bad
        assert set(got) == set(group), got
        assert all(v.kind == "link" and v.confidence <= 0.26 for v in got.values()), got
        assert all(0.03 <= v.loss_rate <= 0.07 for v in got.values()), got
        known = drive(topo, (f"{link}:loss=0.05:start_s=1",), seconds=4, seed=1)
        assert known[-1].faulty() == {link} and known[-1].bad[link].confidence > 0.99


def test_never_reported_paths_delay_gives_the_ecmp_group() -> None:
    """No path ever reported: a delayed uplink (or downlink) makes exactly the flows hashed
    onto it late, window after window — a share 1/N of its group's flows. The group is
    reported, every member at confidence 1/N, with the delay; with paths it is exactly the
    link. The lab's 2-spine fabric too (a group of two), and the verdict clears after heal."""
    from fleetlens.topology import from_spec

    topo = from_spec("leafspine:hosts=64,nics=1,leaves=8,spines=4")
    for link, group in (("leaf6->spine3", [f"leaf6->spine{i}" for i in range(4)]),
                        ("spine1->leaf2", [f"spine{i}->leaf2" for i in range(4)])):  # fmt: skip
        steps = drive(topo, (f"{link}:delay_us=2:start_s=2",), seconds=5, seed=3, paths="unknown")
        assert all(not s.bad for s in steps[:3]), [s.bad for s in steps[:3]]
        got = steps[-1].bad
        assert steps[-1].faulty() == set(group) == set(got), got
        assert all(v.confidence <= 0.26 for v in got.values()), got
        assert all(abs(v.excess_delay_ns / 2_000 - 1) <= 0.2 for v in got.values()), got
        known = drive(topo, (f"{link}:delay_us=2:start_s=2",), seconds=5, seed=3)
        assert known[-1].faulty() == {link} and known[-1].bad[link].confidence > 0.99
    lab = from_spec("leafspine:hosts=8,nics=2,leaves=4,spines=2")
    steps = drive(lab, ("leaf2->spine1:delay_us=200:start_s=2,end_s=5",), seconds=12, seed=1,
                  paths="unknown")  # fmt: skip
    assert steps[4].faulty() == {"leaf2->spine0", "leaf2->spine1"}, steps[4].bad
    assert not steps[-1].bad, steps[-1].bad


def test_never_reported_paths_no_delay_alarm_under_load() -> None:
    """The group test against queueing: busy links make flows late, but not the same flows
    window after window. Nor does a delayed core link of a fat-tree, which no ECMP group of
    unknown paths pins down (a flow crosses one of 16 core links, spread over 4 groups), get
    blamed on an edge group."""
    from fleetlens.topology import from_spec

    windows = 0
    for seed, load in ((0, 0.2), (1, 0.5), (2, 0.5)):
        steps = drive(TOPO, (), seconds=10, seed=seed, paths="unknown", load=load)
        windows += len(steps)
        assert not any(s.reported() for s in steps), [s.bad for s in steps if s.bad]
    ft = from_spec("fattree:k=8")
    steps = drive(ft, ("core2->agg0:delay_us=20:start_s=2",), seconds=5, seed=1, paths="unknown")
    assert not any(s.reported(("link", "switch")) for s in steps), [s.bad for s in steps]


def _null_some_paths(share: float):
    """A window mutator: the path of a fixed ``share`` of the flows is never reported (path
    discovery failed for them, as ICMP policing does in the lab). Use with per-port rows
    (``merge_paths=False``): the agent reports each flow whose path it lacks on a row of its
    own."""
    import pyarrow as pa
    import pyarrow.compute as pc

    def mutate(t: pa.Table) -> pa.Table:
        sport = t["sport"].to_numpy().astype("int64")
        drop = (sport * 2654435761 % 1000) < share * 1000  # fixed per flow, any row order
        path = pc.if_else(pa.array(drop), pa.nulls(t.num_rows, t["path"].type), t["path"])
        return t.set_column(t.schema.get_field_index("path"), "path", path)

    return mutate


def test_delay_with_some_paths_unknown_is_the_link() -> None:
    """The lab's 2-spine fabric with most flows' paths never discovered (80 %): the flows with a
    known path decide a link's delay (unknown ones are spread over both spines, and only half
    of them really crossed the delayed link, which hid the fault from the low quantile)."""
    from fleetlens.topology import from_spec

    topo = from_spec("leafspine:hosts=8,nics=2,leaves=4,spines=2")
    link = "leaf2->spine1"
    steps = drive(topo, (f"{link}:delay_us=200:start_s=3",), seconds=5, seed=1,
                  mutate=_null_some_paths(0.8), merge_paths=False)  # fmt: skip
    assert all(not s.bad for s in steps[:3]), [s.bad for s in steps[:3]]
    assert steps[-1].faulty() == {link} and steps[-1].reported() == {link}, steps[-1].bad
    assert abs(steps[-1].bad[link].excess_delay_ns / 200_000 - 1) <= 0.2


def test_a_delayed_link_explained_away_is_not_learned_as_healthy() -> None:
    """The lab at start-up, when some hosts' clocks are not trusted yet: the delay on an uplink
    shows only on flows that also cross one downlink, and the downlink wins the tie. The uplink
    must not learn those windows as its healthy level: it did (on the lab its level rose to
    57 us and its spread to 92 us in 12 windows), and the same delay, injected again once every
    clock was trusted, went unreported. Here the timed flows are made an exact tie (leaf2 to
    leaf0, and flows touching neither end) for the first 16 windows. Nothing tells the two
    links apart then: both are reported, each at confidence 1/2, not one of them confidently."""
    from fleetlens.topology import from_spec

    topo = from_spec("leafspine:hosts=8,nics=2,leaves=4,spines=2")
    link = "leaf2->spine1"
    ids, leaf = pa.array([n.id for n in topo.nics]), pa.array([n.leaf for n in topo.nics])
    seen = iter(range(10**6))

    def tie_first(t: pa.Table) -> pa.Table:
        if next(seen) >= 16:  # every clock trusted from here on
            return t
        src = pc.take(leaf, pc.index_in(t["src_nic"], ids))
        dst = pc.take(leaf, pc.index_in(t["dst_nic"], ids))
        both = pc.and_(pc.equal(src, "leaf2"), pc.equal(dst, "leaf0"))
        neither = pc.and_(pc.not_equal(src, "leaf2"), pc.not_equal(dst, "leaf0"))
        owd = pc.if_else(pc.or_(both, neither), t["owd_min_ns"], pa.scalar(None, pa.float64()))
        return t.set_column(t.schema.get_field_index("owd_min_ns"), "owd_min_ns", owd)

    faults = (f"{link}:delay_us=20:start_s=4,end_s=14", f"{link}:delay_us=20:start_s=20")
    steps = drive(topo, faults, seconds=24, seed=3, mutate=tie_first)
    for s in steps[5:14]:  # the tie: both sides, neither one confidently
        assert s.reported() == s.faulty() == {link, "spine1->leaf0"}, s.bad
        assert all(abs(v.confidence - 0.5) < 1e-6 for v in s.bad.values()), s.bad
        assert all(abs(v.excess_delay_ns / 20_000 - 1) <= 0.2 for v in s.bad.values()), s.bad
    assert not steps[19].faulty(), steps[19].bad  # healed, and cleared
    for s in steps[20:]:  # without the fix: nothing reported
        assert s.faulty() == {link} and s.bad[link].confidence > 0.99, s.bad
        assert abs(s.bad[link].excess_delay_ns / 20_000 - 1) <= 0.2


def test_a_rise_of_every_flow_is_no_link_and_hides_no_fault() -> None:
    """Every flow 1.5 us slower for four windows (on the lab: both cores busy while a fault
    is injected, ~1.1 us): no link, switch, NIC or host is reported for it (dozens were), and
    a 20 us delay starting inside it is found and sized."""
    seen = iter(range(10**6))

    def slower_for_a_while(t: pa.Table) -> pa.Table:
        if not 4 <= next(seen) < 8:
            return t
        owd = pc.add(t["owd_min_ns"], 1500.0)
        return t.set_column(t.schema.get_field_index("owd_min_ns"), "owd_min_ns", owd)

    link = "leaf3->spine2"
    steps = drive(TOPO, (f"{link}:delay_us=20:start_s=6",), seconds=10, seed=2,
                  mutate=slower_for_a_while)  # fmt: skip
    assert all(not s.bad for s in steps[:6]), [s.bad for s in steps[:6]]
    for s in steps[6:]:
        assert s.reported() == {link}, s.bad
        assert abs(s.bad[link].excess_delay_ns / 20_000 - 1) <= 0.2
