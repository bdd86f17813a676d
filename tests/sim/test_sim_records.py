"""Simulated windows are valid collector input; bad fault specs give clear errors."""

from __future__ import annotations

import pyarrow as pa
import pytest
from fleetlens.fixtures.sim.config import SimConfig
from fleetlens.fixtures.sim.engine import Simulator

from fleetlens.batch import check_windows, decode_batch, encode_batch
from fleetlens.records import WINDOW_SCHEMA, table_to_windows


def test_windows_pass_the_collector_checks(small_topo) -> None:
    faults = ("leaf0->spine0:blackhole", "h01:stall:start_s=0.3,end_s=0.6")
    res = Simulator(small_topo, SimConfig(faults=faults, paths_known=True), seed=1).run(1)
    t = res.windows.select(WINDOW_SCHEMA.names)
    check_windows(t)
    host = small_topo.hosts[0]
    mine = t.filter(pa.compute.starts_with(t["src_nic"], host + "/"))
    body, ctype = encode_batch(host, mine, "b1")
    back = decode_batch(body, ctype)
    assert back.windows.equals(mine)
    w = table_to_windows(mine)[0]
    assert w.flow.src_nic.startswith(host) and w.received <= w.sent


@pytest.mark.parametrize(
    ("spec", "msg"),
    [
        ("leaf9->spine0:delay_us=5", "no link"),
        ("leaf0->spine0:fail", "takes"),
        ("spine0:delay_us=5", "takes"),
        ("h01/eth0:drop=1.5", "in (0, 1]"),
        ("h01:stall:start_s=3,end_s=2", "start_s < end_s"),
        ("h01:clock_step_us=abc", "number"),
        ("nobody:stall", "no link, switch, NIC or host"),
        ("leaf0->spine0", "want TARGET:ACTION"),
        ("leaf0->spine0:loss=0.1,delay_us=3", "exactly one action"),
        ("leaf0->spine0:flap_ms=5", "below the 10 ms round"),
    ],
)
def test_bad_fault_specs_are_rejected_clearly(small_topo, spec: str, msg: str) -> None:
    with pytest.raises(ValueError, match=msg.replace("(", r"\(").replace(")", r"\)")):
        Simulator(small_topo, SimConfig(faults=(spec,)), seed=1)


def test_bad_config_is_rejected(small_topo) -> None:
    for kw in ({"clock": "ntp"}, {"ts_source": "gps"}, {"load": 1.5}, {"window_ns": 12_345}):
        with pytest.raises(ValueError):
            SimConfig(**kw)
