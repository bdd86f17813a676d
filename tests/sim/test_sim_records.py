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


def test_a_path_row_sums_its_ports_rows_of_the_same_run(small_topo) -> None:
    """With paths known, the ports of a pair that share a path are one row (the agent's
    ``fleetlens.pathgroups``): the same physics as a row per port, summed over the group,
    under its lowest port, with the min / max delay and the hull of all its probes."""
    import numpy as np

    from fleetlens.hull import lower_hull_rows

    faults = ("leaf0->spine0:loss=0.3",)
    runs = {
        m: Simulator(small_topo, SimConfig(faults=faults, paths_known=True, merge_paths=m),
                     seed=2).run(2).windows.to_pylist()
        for m in (True, False)
    }  # fmt: skip
    merged = {(r["window"], r["src_nic"], r["dst_nic"], r["sport"]): r for r in runs[True]}
    groups: dict[tuple, list[dict]] = {}
    for r in runs[False]:
        groups.setdefault((r["window"], r["src_nic"], r["dst_nic"], tuple(r["path"])), []).append(r)
    assert len(merged) == len(groups) < len(runs[False]) / 2
    for (w, s, d, path), ports in groups.items():
        m = merged[(w, s, d, min(r["sport"] for r in ports))]
        assert tuple(m["path"]) == path
        for col in ("sent", "received", "pure"):
            assert m[col] == sum(r[col] for r in ports)
        assert m["owd_min_ns"] == min(r["owd_min_ns"] for r in ports)
        assert m["owd_max_ns"] == max(r["owd_max_ns"] for r in ports)
        t = np.array([x for r in ports for x in r["hull_t_ns"]], np.int64)[None, :]
        y = np.array([x for r in ports for x in r["hull_owd_ns"]], np.int64)[None, :]
        size, ht, hy = lower_hull_rows(t, y, np.ones_like(t, bool))  # the hull of the hulls
        assert (m["hull_t_ns"], m["hull_owd_ns"]) == (ht[0, : size[0]].tolist(),
                                                      hy[0, : size[0]].tolist())  # fmt: skip
    lossy = [r for r in runs[True] if "leaf0->spine0" in r["path"]]
    assert lossy and sum(r["sent"] - r["received"] for r in lossy) > 0
