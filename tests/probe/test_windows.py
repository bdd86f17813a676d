"""A window closes as soon as every pair sent in it has been reported, never before, and each
window is uploaded once (synthetic engine samples; no sockets needed)."""

from __future__ import annotations

import numpy as np
from fleetlens.probe.fastpath import (
    FLAG_ACK_LOST,
    FLAG_ACKED,
    FLAG_HEARD0,
    FLAG_HEARD1,
    FLAG_RX0,
    FLAG_RX1,
    FLAG_SENT0,
    FLAG_SENT1,
    FLAG_TX0,
    FLAG_TX1,
)
from fleetlens.probe.windows import FlowTable, PairLedger, WindowBuilder

from fleetlens.records import ClockModel

SEC = 1_000_000_000
T0 = 1_800_000_000 * SEC
ALL = FLAG_SENT0 | FLAG_SENT1 | FLAG_TX0 | FLAG_TX1 | FLAG_RX0 | FLAG_RX1 | FLAG_ACKED
CLOCK = ClockModel.identity("h00")


def _flows(*dsts: str) -> FlowTable:
    """Flows from h00/eth0 to each of ``dsts`` (default h01/eth0), source ports 40000, 40001, ..."""
    dsts = dsts or ("h01/eth0",)
    obj = lambda *v: np.array(v, dtype=object)  # noqa: E731
    n = len(dsts)
    return FlowTable(obj(*["h00/eth0"] * n), obj(*dsts), 40000 + np.arange(n, dtype=np.int32),
                     obj(*["software"] * n))  # fmt: skip


def _samples(
    pairs: list[int], tx: list[int], flags: int | list[int] = ALL, flows: list[int] | None = None
) -> dict[str, np.ndarray]:
    n = len(pairs)
    t = np.array(tx, np.int64)
    return {
        "flow": np.array(flows or [0] * n, np.uint32), "pair": np.array(pairs, np.uint32),
        "tx0": t, "tx1": t + 20_000, "rx0": t + 300, "rx1": t + 20_300,
        "rx0_fleet": t + 300, "rx1_fleet": t + 20_300,
        "flags": np.broadcast_to(np.asarray(flags, np.uint16), n).copy(),  # 16-bit since wire v2
    }  # fmt: skip


def test_the_ledger_counts_contiguous_pairs_and_survives_the_uint32_wrap() -> None:
    led = PairLedger()
    led.add(np.array([0, 1, 3], np.uint32))
    assert led.done_below == 2  # 2 is still waiting for its ack
    led.add(np.array([2], np.uint32))
    assert led.done_below == 4
    led.done_below = (1 << 32) - 2
    led.add(np.array([0, (1 << 32) - 2], np.uint32))
    assert led.done_below == (1 << 32) - 1
    led.add(np.array([(1 << 32) - 1, 1], np.uint32))
    assert led.done_below == (1 << 32) + 2


def test_a_window_closes_when_its_last_pair_is_reported_not_before() -> None:
    b = WindowBuilder(_flows(), SEC)
    # Pairs 0-2 sent in the window [T0, T0+1s); pair 1 still waits for its ack.
    b.add(_samples([0, 2], [T0 + 100, T0 + 900_000_000]), CLOCK, T0 + SEC)
    b.mark_end(T0 // SEC, pairs_sent=3)
    assert b.pop_complete(T0 + SEC + 1_000_000, grace_ns=700_000_000) is None
    assert b.ended()
    b.add(_samples([3], [T0 + SEC + 5_000_000]), CLOCK, T0 + SEC + 6_000_000)  # next window
    assert b.pop_complete(T0 + SEC + 6_000_000, grace_ns=700_000_000) is None
    lost = FLAG_SENT0 | FLAG_SENT1 | FLAG_TX0 | FLAG_TX1  # stamped, never acked: timed out
    b.add(_samples([1], [T0 + 500_000_000], flags=lost), CLOCK, T0 + SEC)
    t = b.pop_complete(T0 + SEC + 7_000_000, grace_ns=700_000_000)  # 7 ms after the end
    assert t is not None and t["start_ns"].to_pylist() == [T0]
    assert t["sent"].to_pylist() == [6] and t["received"].to_pylist() == [4]
    assert not b.ended()
    # The next window's pair is kept for it, and a straggler of the closed window (a clock
    # model that moved fleet time back) lands there too instead of a second row for T0.
    b.add(_samples([4], [T0 + SEC - 1_000]), CLOCK, T0 + SEC + 8_000_000)
    t2 = b.pop_complete(T0 + 3 * SEC, grace_ns=700_000_000)
    assert t2 is not None and t2["start_ns"].to_pylist() == [T0 + SEC]
    assert t2["sent"].to_pylist() == [4]


def test_without_an_end_mark_the_grace_still_closes_windows() -> None:
    b = WindowBuilder(_flows(), SEC)
    b.add(_samples([0], [T0 + 100]), CLOCK, T0 + SEC)
    assert b.pop_complete(T0 + SEC + 699_000_000, grace_ns=700_000_000) is None
    t = b.pop_complete(T0 + SEC + 700_000_000, grace_ns=700_000_000)
    assert t is not None and t["start_ns"].to_pylist() == [T0]


def test_flows_of_a_pair_on_one_path_are_one_record_over_all_their_probes() -> None:
    obj = lambda *v: np.array(v, dtype=object)  # noqa: E731
    flows = FlowTable(
        obj("h00/eth0", "h00/eth0", "h00/eth0", "h00/eth0", "h00/eth0"),
        obj("h01/eth0", "h01/eth0", "h01/eth0", "h01/eth0", "h02/eth0"),
        np.array([40003, 40001, 40002, 40004, 40001], np.int32),
        obj(*["software"] * 5),
    )
    b = WindowBuilder(flows, SEC)
    up0 = ["h00/eth0->leaf0", "leaf0->spine0", "spine0->leaf1", "leaf1->h01/eth0"]
    up1 = ["h00/eth0->leaf0", "leaf0->spine1", "spine1->leaf1", "leaf1->h01/eth0"]
    # flows 0 and 1 share a path, flow 2 takes the other spine, flow 3's path is not known;
    # flow 4 reports the same path as 0 and 1 but is another pair: a row of its own
    b.learn_paths({0: up0, 1: up0, 2: up1, 4: up0})
    s = _samples(list(range(5)), [T0 + 100 + i * 1_000_000 for i in range(5)])
    s["flow"] = np.arange(5, dtype=np.uint32)
    s["rx0_fleet"] = s["rx0_fleet"] + np.array([0, 500, 0, 0, 0])  # flow 1 arrived later
    b.add(s, CLOCK, T0 + SEC)
    t = b.pop_complete(T0 + 3 * SEC, grace_ns=700_000_000)
    assert t is not None
    rows = sorted(t.select(["dst_nic", "sport", "sent", "owd_min_ns", "owd_max_ns"]).to_pylist(),
                  key=lambda r: (r["dst_nic"], r["sport"]))  # fmt: skip
    assert [(r["dst_nic"], r["sport"], r["sent"]) for r in rows] == [
        ("h01/eth0", 40001, 4),  # flows 0 and 1, under the lower port
        ("h01/eth0", 40002, 2),
        ("h01/eth0", 40004, 2),
        ("h02/eth0", 40001, 2),
    ]
    assert (rows[0]["owd_min_ns"], rows[0]["owd_max_ns"]) == (300, 800)
    paths = {r["sport"]: r["path"] for r in t.to_pylist() if r["dst_nic"] == "h01/eth0"}
    assert paths == {40001: up0, 40002: up1, 40004: None}
    hulls = {(r["dst_nic"], r["sport"]): r["hull_t_ns"] for r in t.to_pylist()}
    # One delay on every probe: the pair's hull is its first and last point, each row keeps
    # only its points on it (the record of flows 0 and 1 its first, flow 2 none)
    assert hulls == {
        ("h01/eth0", 40001): [T0 + 100],
        ("h01/eth0", 40002): [],
        ("h01/eth0", 40004): [T0 + 3_000_100],
        ("h02/eth0", 40001): [T0 + 4_000_100],
    }


def test_each_row_keeps_its_points_on_its_pair_hull_per_window() -> None:
    """Two flows of one NIC pair and a flow of another, over two windows: a row keeps its
    flow's hull points that are on its pair's hull in that window, no other pair's or
    window's points count."""
    b = WindowBuilder(_flows("h01/eth0", "h01/eth0", "h02/eth0"), SEC)
    ms = 1_000_000
    tx = [T0 + 100 * ms, T0 + 500 * ms, T0 + 900 * ms,  # flow 0: a V of delays
          T0 + 300 * ms, T0 + 700 * ms,  # flow 1: under flow 0's middle, above its ends
          T0 + 400 * ms, T0 + SEC + 300 * ms, T0 + SEC + 600 * ms]  # fmt: skip
    s = _samples(list(range(8)), tx, flows=[0, 0, 0, 1, 1, 2, 0, 1])
    delay = np.array([600, 900, 600, 400, 400, 50, 900, 200])
    s["rx0"] = s["tx0"] + delay
    s["rx1"] = s["tx1"] + delay
    b.add(s, CLOCK, T0 + 2 * SEC)
    t = b.pop_complete(T0 + 4 * SEC, grace_ns=700_000_000)
    assert t is not None
    got = {(r["start_ns"], r["dst_nic"], r["sport"]): (r["pure"], r["hull_t_ns"])
           for r in t.to_pylist()}  # fmt: skip
    assert got == {
        (T0, "h01/eth0", 40000): (3, [T0 + 100 * ms, T0 + 900 * ms]),  # its middle is above 1's
        (T0, "h01/eth0", 40001): (2, [T0 + 300 * ms, T0 + 700 * ms]),
        (T0, "h02/eth0", 40002): (1, [T0 + 400 * ms]),  # lower than any h01 point: its own pair
        (T0 + SEC, "h01/eth0", 40000): (1, [T0 + SEC + 300 * ms]),  # another window: its own
        (T0 + SEC, "h01/eth0", 40001): (1, [T0 + SEC + 600 * ms]),
    }


def test_lost_acks_are_counted_per_flow_and_never_as_lost_probes() -> None:
    """A pair whose own ack was lost (a later ack answered for it) counts in ``acks_lost`` and,
    its probes having arrived, as received."""
    sent = FLAG_SENT0 | FLAG_SENT1 | FLAG_TX0 | FLAG_TX1
    recovered = ALL | FLAG_ACK_LOST  # a later ack's records
    heard = sent | FLAG_HEARD0 | FLAG_HEARD1 | FLAG_ACKED | FLAG_ACK_LOST  # a later bitmap only
    timed_out = sent  # never answered: its probes count as lost, no ack as lost
    b = WindowBuilder(_flows("h01/eth0", "h02/eth0"), SEC)
    t = T0 + 1_000 * np.arange(6)
    flags = [ALL, recovered, heard, timed_out, ALL, ALL]
    b.add(_samples(list(range(6)), list(t), flags, [0, 0, 0, 0, 1, 1]), CLOCK, T0 + SEC)
    b.mark_end(T0 // SEC, pairs_sent=6)
    out = b.pop_complete(T0 + SEC + 1, grace_ns=SEC).sort_by("dst_nic")
    assert out["acks_lost"].to_pylist() == [2, 0]
    assert out["sent"].to_pylist() == [8, 4] and out["received"].to_pylist() == [6, 4]
