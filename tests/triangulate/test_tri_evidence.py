"""Evidence before alarms (issue 28): background loss is not a fault, a fault still is.

Clean simulated traffic with per-link background loss on a 64-host, 320-link leaf-spine:
the measured false alarms per link-hour must stay within the stated
``false_alarms_per_link_hour``; a 1 % loss fault on any link (fabric or access) must still be
faulty in the first 1 s window, as before the test existed.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
from fleetlens.triangulate.config import TriangulateConfig
from fleetlens.triangulate.evidence import LossEvidence, alarm_llr, chernoff_llr, learned_floor
from fleetlens.triangulate.incidence import Incidence, RouteTable
from fleetlens.triangulate.loss import LossFit, poisson_llr
from tri_helpers import Step, drive, small

from fleetlens.topology import Topology, from_spec

FABRIC = from_spec("leafspine:hosts=64,nics=2,leaves=8,spines=4")
CFG = TriangulateConfig()


def _alarms(steps: list[Step]) -> tuple[int, int]:
    """(faulty onsets of any subject, subject-windows reported at all)."""
    onsets, reported, prev = 0, 0, set()
    for s in steps:
        now = s.faulty(("link", "switch", "nic", "host"))
        onsets += len(now - prev)
        reported += len(s.reported())
        prev = now
    return onsets, reported


def test_the_alarm_level_is_the_stated_rate_per_test() -> None:
    # three fits per 1 s window (the window, the long and the onset horizon): 10800 tests
    # per link-hour, alpha = 1e-3 / 10800
    assert alarm_llr(CFG, 1.0) == pytest.approx(math.log(10800 / 1e-3))
    assert alarm_llr(CFG, 0.1) == pytest.approx(math.log(108000 / 1e-3))


def test_the_spread_rows_null_is_poisson_without_spread_rows() -> None:
    none = np.empty(0)
    for y, mu in [(30.0, 10.0), (5.0, 0.1), (3.0, 4.0)]:
        got = chernoff_llr(y, mu, none, none, none, none)
        assert got == pytest.approx(float(poisson_llr(np.array([y]), np.array([mu]))[0]))


def test_the_spread_rows_null_bounds_the_path_draws_tail() -> None:
    """Background plus 12 rows of 1500 packets, each crossing a 1 % candidate (1 of 3) or
    not: the returned LLR is a Chernoff bound, so ``P(X >= y) <= exp(-llr)`` at every y
    (sampled tail), and far below the Poisson LLR against the same mean (which alarms at the
    level)."""
    rng = np.random.default_rng(28)
    mu, n, a, pi = 2.0, np.full(12, 1500.0), np.full(12, 0.01), np.full(12, 1 / 3)
    k = np.zeros(12)
    draws = 200_000
    via = rng.random((draws, 12)) < pi
    x = rng.poisson(mu, draws) + rng.binomial(1500, np.where(via, 0.01, 0.0)).sum(axis=1)
    for y in (80.0, 100.0, 130.0, 160.0):
        assert (x >= y).mean() <= math.exp(-chernoff_llr(y, mu, n, k, a, pi)), y
    assert chernoff_llr(130.0, mu, n, k, a, pi) < alarm_llr(CFG, 1.0)
    assert float(poisson_llr(np.array([130.0]), np.array([mu + 60.0]))[0]) > alarm_llr(CFG, 1.0)


def test_rows_through_a_dead_link_add_no_spread_to_the_null() -> None:
    """Rows whose known path crosses a link at rate 1 lose exactly their packets: 2000 of
    them, plus 40 lost beyond a background of 4, stand out (as 40 against 4 alone would),
    where a Poisson of mean 2004 would hide the 40 in its spread of ~45."""
    none = np.empty(0)
    alone = chernoff_llr(44.0, 4.0, none, none, none, none)
    dead = chernoff_llr(2044.0, 4.0, np.array([2000.0]), np.ones(1), np.zeros(1), np.zeros(1))
    assert dead == pytest.approx(alone, rel=1e-6)
    assert alone > alarm_llr(CFG, 1.0)
    assert float(poisson_llr(np.array([2044.0]), np.array([2004.0]))[0]) < 1.0


def _spread_into_one_nic(nic_loss: float) -> tuple[LossFit, LossFit]:
    """Rows into leaf2 spread over spine0..2 -> leaf2 (links 0-2), spine2 -> leaf2 losing
        1 %: 12 rows of 1500 packets into one NIC (access link 3), 7 of which really crossed
        spine2 (a third would be 4), and 300 into other NICs (link 4), a third via spine2 (and
    clean rows inside leaf2, one lost packet: the background). The
        NIC's own link loses ``nic_loss``. The fit as ``fit_incidence`` ends (spine2 -> leaf2 at
        1 %, the NIC's link at the excess its rows show beyond their third of it) and the same
        fit gated."""
    routes = RouteTable(5)
    spread = routes.add(b"leaf0-leaf2", np.arange(3), np.full(3, 1 / 3))
    n = 312 + 3000  # and 3000 clean rows inside leaf2 (route 0: no fabric link), 1 loss
    dn = np.where(np.arange(n) < 12, 3, 4)
    inc = Incidence(np.full(n, 5), dn, np.where(np.arange(n) < 312, spread, 0), routes, 5)
    sent = np.full(n, 1500.0)
    via2 = np.zeros(n, bool)
    via2[:7] = True
    via2[12:312:3] = True
    lost = 0.01 * sent * via2 + np.where(dn == 3, nic_loss * sent, 0.0)
    lost[-1] = 1.0
    S, lost_l = inc.link_sums(sent), inc.link_sums(lost)
    excess = lost[:12].sum() - 0.01 * sent[:12].sum() / 3
    fit = LossFit(np.array([2, 3]), np.array([0.01, excess / S[3]]), np.zeros(2), S, lost_l)
    return LossEvidence(CFG, 5).gate(fit, inc, sent, lost, 1.0, CFG.background_loss), fit


def test_a_spread_rows_path_draw_is_not_an_access_fault() -> None:
    gated, fit = _spread_into_one_nic(0.0)
    assert fit.rate[1] * fit.sent[3] > 30  # the excess the plain Poisson test alarmed on
    assert list(gated.links) == [2]


def test_an_access_fault_beside_a_spread_fault_is_still_found() -> None:
    gated, _ = _spread_into_one_nic(0.01)
    assert list(gated.links) == [2, 3]


def test_a_fault_that_is_the_windows_only_loss_does_not_raise_its_own_background() -> None:
    """The lab's rail 3L4S uplink in one window: 5 lost of 400 probes on one link (rows
    0-9, known path over fabric link 0), 20 clean rows elsewhere (link 1), nothing else
    lost. Against the rate of all rows those 5 read as ~0.9 expected, not heavy, and the
    background they raised hid them; against the other rows' rate (none lost) they are
    heavy, the background is 0 and the link passes against the floor."""
    routes = RouteTable(2)
    r0 = routes.add(b"via0", np.array([0]), np.ones(1))
    r1 = routes.add(b"via1", np.array([1]), np.ones(1))
    n = 30
    inc = Incidence(np.full(n, 2), np.full(n, 2), np.where(np.arange(n) < 10, r0, r1), routes, 2)
    sent = np.full(n, 40.0)
    lost = np.zeros(n)
    lost[:5] = 1.0
    S, lost_l = inc.link_sums(sent), inc.link_sums(lost)
    fit = LossFit(np.array([0]), np.array([5.0 / 400]), np.zeros(1), S, lost_l)
    ev = LossEvidence(CFG, 2)
    gated = ev.gate(fit, inc, sent, lost, 1.0, 1e-4)
    assert ev.q == 0.0
    assert list(gated.links) == [0]


@pytest.mark.parametrize(("base_loss", "seconds"), [(1e-4, 40), (1e-5, 30)])
def test_background_loss_raises_no_alarm(base_loss: float, seconds: int) -> None:
    steps = drive(FABRIC, (), seconds=seconds, seed=28, base_loss=base_loss)
    link_hours = len(FABRIC.links) * len(steps) / 3600
    onsets, reported = _alarms(steps)
    assert onsets / link_hours <= CFG.false_alarms_per_link_hour, (onsets, link_hours)
    assert reported == 0, [s.bad for s in steps if s.bad][:2]


# 1024 hosts on 2-3 leaves (the simulator sweep's small shapes): a fabric link carries only
# inter-leaf rows of 4 hops, 1e5-1e6 packets a window and ~1e7 on the long horizon, where a
# background taken per row (2-hop intra-leaf rows averaged in) made whole ECMP groups, and on
# 2 spines whole switches, faulty; per hop it is each link's own. Paths unknown (a row per
# source port, spread over the ECMP candidates) and known; 25 s, so the long horizon's ~30 s
# of counts builds up (the known 2-leaf alarms came 15-20 s in).
# The default run takes the case that alarmed first (2 x 2, paths unknown: the 4th clean
# window); ``-m sweep`` runs all three (~27 CPU-s each).
FEW_LEAVES = [
    ("leafspine:hosts=1024,nics=1,leaves=2,spines=2", "unknown"),
    pytest.param("leafspine:hosts=1024,nics=1,leaves=2,spines=2", "known", marks=pytest.mark.sweep),
    pytest.param(
        "leafspine:hosts=1024,nics=1,leaves=3,spines=3", "unknown", marks=pytest.mark.sweep
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize(("spec", "paths"), FEW_LEAVES)
def test_background_loss_on_few_leaves_at_1024_hosts_raises_no_alarm(spec: str, paths: str):
    topo = from_spec(spec)
    steps = drive(topo, (), seconds=25, seed=28, paths=paths, base_loss=1e-5)
    every = ("link", "switch", "nic", "host")
    faulty = {s.window.index: s.faulty(every) for s in steps if s.faulty(every)}
    assert not faulty, faulty


def test_without_the_test_the_same_traffic_alarms() -> None:
    """The traffic above is hard: with the level disabled the same fits call links lossy."""
    loose = TriangulateConfig(false_alarms_per_link_hour=1e12)
    steps = drive(FABRIC, (), seconds=8, seed=28, base_loss=1e-4, config=loose)
    assert _alarms(steps)[1] > 0


def test_a_one_percent_fault_is_faulty_in_the_first_window() -> None:
    topo = small()
    rng = np.random.default_rng(28)
    links = [lk.id for lk in topo.links]
    for i, lk in enumerate(rng.choice(links, 8, replace=False)):
        steps = drive(topo, (f"{lk}:loss=0.01",), seconds=4, seed=i, base_loss=1e-5)
        assert lk in steps[0].faulty(), (lk, steps[0].bad)
        for s in steps:
            assert s.faulty() <= {lk}, (lk, s.window.index, s.bad)
            assert 0.005 <= s.bad[lk].loss_rate <= 0.02


RAIL3L4S = from_spec("leafspine:hosts=8,nics=1,leaves=3,spines=4,wiring=rail")


@pytest.mark.parametrize("seed", [1, 2, 3, 4])
def test_a_weak_fault_after_a_clean_minute_is_found_within_seconds(seed: int) -> None:
    """The lab sweep's rail 3L4S uplink: ~450 probes a second, 1 % loss from 40 s on (4-5
    lost a window, not significant in one) with the lab's ``background_loss`` of 1e-3. On
    the long horizon alone its 30 s of clean past diluted the fault: faulty 12-14 s in (11.1
    s on the lab); the onset horizon's three-window sums found it in 3-6 windows against
    the 1e-3 floor, and in 2 once the clean minute bounds the background far below it
    (``learned_floor``): the lab's 5 s is that and a window of lag."""
    link, start = "leaf2->spine3", 40
    steps = drive(
        RAIL3L4S, (f"{link}:loss=0.01:start_s={start}",), seconds=start + 8, seed=seed,
        config=TriangulateConfig(background_loss=1e-3),
    )  # fmt: skip
    first = next(s.window.index for s in steps if link in s.faulty())
    assert first - start <= 2, first - start
    assert all(link in s.faulty() for s in steps[first:])
    assert set().union(*(s.faulty() for s in steps)) == {link}


def test_the_floor_is_lowered_only_as_far_as_the_counts_bound_the_background() -> None:
    cfg = TriangulateConfig(background_loss=1e-3)
    assert learned_floor(cfg, 0.0, 0.0) == 1e-3  # nothing counted yet: the configured floor
    assert learned_floor(cfg, 0.0, 1e4) == 1e-3  # too few packets to bound it lower
    assert learned_floor(cfg, 0.0, 1e9) == cfg.background_loss_min  # never below the minimum
    # 100 lost of 1e6 hop-packets: a rate of 1e-4, bounded above it, well below 1e-3
    assert 1e-4 < learned_floor(cfg, 100.0, 1e6) < 2e-4
    # the default configuration keeps its floor whatever the counts
    default = TriangulateConfig()
    assert learned_floor(default, 0.0, 1e9) == learned_floor(default, 0.0, 0.0) == 1e-6


@pytest.mark.parametrize(
    "spec", [RAIL3L4S, from_spec("leafspine:hosts=8,nics=2,leaves=3,spines=3,wiring=host")]
)
@pytest.mark.parametrize("base_loss", [1e-5, 3e-4])
def test_a_learned_floor_raises_nothing_on_clean_lab_shapes(spec: Topology, base_loss: float):
    """With the lab's configuration (1e-3) and every link losing 1e-5 or 3e-4 of its
    packets, a minute of clean traffic reports no subject at all, not even ``suspect``,
    once the floor follows the background down (or stays above it)."""
    steps = drive(
        spec, (), seconds=60, seed=7, base_loss=base_loss,
        config=TriangulateConfig(background_loss=1e-3),
    )  # fmt: skip
    reported = {s.window.index: sorted(s.bad) for s in steps if s.bad}
    assert not reported, reported
