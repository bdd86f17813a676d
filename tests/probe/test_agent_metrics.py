"""The agent's /metrics read from its snapshot at scrape time, and the upload queue's batches
read from memory or from their spill file (no root, no sockets)."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
from fleetlens.probe.metrics import AgentMetrics, AgentSnapshot
from fleetlens.probe.nics import LocalNic
from fleetlens.probe.upload import Pending, UploadStats
from prometheus_client import generate_latest
from prometheus_client.parser import text_string_to_metric_families

from fleetlens.records import TS_HARDWARE


def _samples(m: AgentMetrics) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    text = generate_latest(m.registry).decode()
    return {
        (s.name, tuple(sorted(s.labels.items()))): s.value
        for fam in text_string_to_metric_families(text)
        for s in fam.samples
    }


def test_a_scrape_reads_the_snapshot() -> None:
    m = AgentMetrics("h00")
    m.set_nics({"h00/eth0": LocalNic("eth0", "10.0.0.1", True, TS_HARDWARE)})
    m.observe_windows(pa.table({"sent": [10, 5], "received": [7, 5]}))
    stats = UploadStats(uploaded_windows=4, spilled_batches=2, rejected_batches=1)
    snap: AgentSnapshot = {
        "engine": {
            "packets_sent": 20,
            "late_rounds": 3,
            "bad_mac": 2,
            "bad_version": 1,
            "acks_lost": 9,
        },
        "upload": stats,
        "depth": (5, 6),
        "rounds_skipped": 4,
    }
    m._snapshot = lambda: snap
    s = _samples(m)
    assert s["fleetlens_agent_probe_packets_sent_total", ()] == 20
    assert s["fleetlens_agent_probe_packets_lost_total", ()] == 3
    assert s["fleetlens_agent_windows_total", ()] == 2
    assert s["fleetlens_agent_late_rounds_total", ()] == 3 + 4
    assert s["fleetlens_agent_dropped_packets_total", (("reason", "bad_mac"),)] == 2
    assert s["fleetlens_agent_dropped_packets_total", (("reason", "bad_version"),)] == 1
    assert s["fleetlens_agent_acks_lost_total", ()] == 9  # not in probe_packets_lost
    assert s["fleetlens_agent_upload_uploaded_windows_total", ()] == 4
    assert s["fleetlens_agent_upload_rejected_batches_total", ()] == 1
    assert s["fleetlens_agent_upload_buffer_batches", (("where", "memory"),)] == 5
    assert s["fleetlens_agent_upload_buffer_batches", (("where", "disk"),)] == 6
    key = (("nic", "h00/eth0"), ("source", TS_HARDWARE))
    assert s["fleetlens_agent_timestamp_source", key] == 1


def test_before_the_agent_serves_every_counter_reads_zero() -> None:
    s = _samples(AgentMetrics("h00"))
    assert s["fleetlens_agent_late_rounds_total", ()] == 0
    assert s["fleetlens_agent_upload_spilled_batches_total", ()] == 0
    assert s["fleetlens_agent_upload_buffer_batches", (("where", "disk"),)] == 0


def test_a_batch_is_read_from_memory_or_from_its_spill_file(tmp_path: Path) -> None:
    assert Pending(1, "b1", 3, b"in memory").payload() == b"in memory"
    spilled = tmp_path / "000000000002-3-b2.arrow"
    spilled.write_bytes(b"on disk")
    assert Pending(2, "b2", 3, None, spilled).payload() == b"on disk"
