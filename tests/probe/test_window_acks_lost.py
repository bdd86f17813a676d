"""A pair whose own ack was lost (a later ack answered for it) counts in the window's
``acks_lost`` and, its probes having arrived, as received (synthetic engine samples)."""

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
from fleetlens.probe.windows import FlowTable, WindowBuilder

from fleetlens.records import ClockModel

SEC = 1_000_000_000
T0 = 1_800_000_000 * SEC
SENT = FLAG_SENT0 | FLAG_SENT1 | FLAG_TX0 | FLAG_TX1
ACKED = SENT | FLAG_RX0 | FLAG_RX1 | FLAG_ACKED  # its own ack came back
RECOVERED = SENT | FLAG_RX0 | FLAG_RX1 | FLAG_ACKED | FLAG_ACK_LOST  # a later ack's records
HEARD = SENT | FLAG_HEARD0 | FLAG_HEARD1 | FLAG_ACKED | FLAG_ACK_LOST  # a later bitmap only
TIMED_OUT = SENT  # never answered: its probes count as lost, no ack as lost


def test_lost_acks_are_counted_per_flow_and_never_as_lost_probes() -> None:
    obj = lambda *v: np.array(v, dtype=object)  # noqa: E731
    flows = FlowTable(obj("h00/eth0", "h00/eth0"), obj("h01/eth0", "h02/eth0"),
                      np.array([40000, 40001], np.int32), obj("software", "software"))  # fmt: skip
    b = WindowBuilder(flows, SEC)
    flow = np.array([0, 0, 0, 0, 1, 1], np.uint32)
    flags = np.array([ACKED, RECOVERED, HEARD, TIMED_OUT, ACKED, ACKED], np.uint16)
    t = T0 + 1_000 * np.arange(6, dtype=np.int64)
    s = {"flow": flow, "pair": np.arange(6, dtype=np.uint32), "tx0": t, "tx1": t + 20_000,
         "rx0": t + 300, "rx1": t + 20_300, "rx0_fleet": t + 300, "rx1_fleet": t + 20_300,
         "flags": flags}  # fmt: skip
    b.add(s, ClockModel.identity("h00"), T0 + SEC)
    b.mark_end(T0 // SEC, pairs_sent=6)
    out = b.pop_complete(T0 + SEC + 1, grace_ns=SEC).sort_by("dst_nic")
    assert out["acks_lost"].to_pylist() == [2, 0]
    assert out["sent"].to_pylist() == [8, 4] and out["received"].to_pylist() == [6, 4]
