"""The agent's own /metrics: probes, losses, late rounds, upload buffer, timestamp source.

Values are read from a snapshot callback at scrape time, so the hot path never updates a
Prometheus object. Counters exist from 0; units are base units.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from typing import TYPE_CHECKING, TypedDict

import pyarrow as pa
import pyarrow.compute as pc
from fleetlens.probe.nics import LocalNic
from prometheus_client import CollectorRegistry, start_http_server
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily, Metric

if TYPE_CHECKING:
    from fleetlens.probe.upload import UploadStats

_DROP_REASONS = {
    "bad_length": "bad_length",
    "bad_header": "bad_header",
    "bad_mac": "bad_mac",
    "bad_version": "bad_version",  # another wire format version (see packet.pxd)
    "replayed_probes": "replayed_probe",
    "stale_acks": "stale_ack",
}


class AgentSnapshot(TypedDict, total=False):
    """The agent's state read at scrape time; a missing key reads as zero."""

    engine: dict[str, int]  # the fast path's counters
    upload: UploadStats | None
    depth: tuple[int, int]  # batches waiting in memory, on disk
    rounds_skipped: int


class AgentMetrics:
    def __init__(self, host_id: str) -> None:
        self.host_id = host_id
        self.lost_packets = 0
        self.windows = 0
        self.nics: dict[str, LocalNic] = {}
        self._snapshot: Callable[[], AgentSnapshot] = AgentSnapshot
        self.registry = CollectorRegistry()
        self.registry.register(self)

    def set_nics(self, nics: dict[str, LocalNic]) -> None:
        self.nics = nics

    def observe_windows(self, table: pa.Table) -> None:
        self.windows += table.num_rows
        self.lost_packets += int(pc.sum(pc.subtract(table["sent"], table["received"])).as_py() or 0)

    def serve(self, addr: str, port: int, snapshot: Callable[[], AgentSnapshot]) -> None:
        self._snapshot = snapshot
        start_http_server(port, addr=addr, registry=self.registry)

    def collect(self) -> Iterator[Metric]:
        snap = self._snapshot()
        eng = snap.get("engine", {})

        def counter(name: str, doc: str, value: float) -> CounterMetricFamily:
            m = CounterMetricFamily(f"fleetlens_agent_{name}", doc)
            m.add_metric([], value)
            return m

        yield counter("probe_packets_sent", "Probe packets sent.", eng.get("packets_sent", 0))
        yield counter(
            "probe_primers_sent",
            "Primer datagrams sent ahead of probe pairs (NICs with software timestamps).",
            eng.get("primers_sent", 0),
        )
        yield counter(
            "probe_packets_lost",
            "Probe packets whose ack says they never arrived.",
            self.lost_packets,
        )
        yield counter("acks_sent", "Acks sent for probes received.", eng.get("acks_sent", 0))
        yield counter(
            "acks_lost",
            "Acks lost on their way back (the pair answered by a later ack): reverse-path "
            "loss, never counted as lost probes.",
            eng.get("acks_lost", 0),
        )
        yield counter(
            "pairs_expired",
            "Probe pairs with no ack within the timeout.",
            eng.get("pairs_expired", 0),
        )
        late = eng.get("late_rounds", 0) + snap.get("rounds_skipped", 0)
        yield counter("late_rounds", "Probe rounds started after their deadline or skipped.", late)
        yield counter("windows", "Window records produced.", self.windows)
        dropped = CounterMetricFamily(
            "fleetlens_agent_dropped_packets",
            "Received packets dropped, by reason.",
            labels=["reason"],
        )
        for key, reason in _DROP_REASONS.items():
            dropped.add_metric([reason], eng.get(key, 0))
        yield dropped
        up = snap.get("upload")
        for field in ("uploaded_windows", "spilled_batches", "dropped_windows", "rejected_batches"):
            yield counter(
                f"upload_{field}", f"Upload: {field.replace('_', ' ')}.", getattr(up, field, 0)
            )
        depth = GaugeMetricFamily(
            "fleetlens_agent_upload_buffer_batches", "Batches waiting to be sent.", labels=["where"]
        )
        mem, disk = snap.get("depth", (0, 0))
        depth.add_metric(["memory"], mem)
        depth.add_metric(["disk"], disk)
        yield depth
        ts = GaugeMetricFamily(
            "fleetlens_agent_timestamp_source",
            "1 for the timestamp source each NIC uses.",
            labels=["nic", "source"],
        )
        for nid, nic in self.nics.items():
            ts.add_metric([nid, nic.ts_source], 1)
        yield ts
