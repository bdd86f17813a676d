"""Prometheus metrics on the collector's own registry.

Conventions: base units (seconds, ratios), ``_total`` counters whose label values are created
up front so they exist from 0, one-way-delay histograms per leaf, rail and path tier
(``owdhist.py``: bounded by the fabric's shape, not its NIC count; per NIC only with
``--per-nic-metrics``; per-pair data stays in DuckDB), a gauge per faulty link bounded to the
top K (with the ambiguity group of each that has one: links the probes cannot tell apart),
ingest counters, writer depth and lag, sync quality per host.
"""

from __future__ import annotations

from collections.abc import Callable, Iterable

from fleetlens.api.owdhist import OwdHistograms
from prometheus_client import (
    CONTENT_TYPE_LATEST,
    CollectorRegistry,
    Counter,
    Gauge,
    Histogram,
    disable_created_metrics,
    generate_latest,
)
from prometheus_client.core import CounterMetricFamily, GaugeMetricFamily
from prometheus_client.registry import Collector

from fleetlens.records import STATES, ClockModel, Verdict
from fleetlens.topology import Topology

EXPOSITION_TYPE = CONTENT_TYPE_LATEST
# The collector's own process: the *_created series only double the scrape size.
disable_created_metrics()

REJECT_REASONS = (
    "auth",
    "content_type",
    "too_large",
    "decode",
    "type",
    "invalid",
    "nan",
    "negative",
    "unknown_nic",
    "wrong_host",
    "future",
    "backpressure",
    "write_error",
)
LOOPS = ("clocks", "triangulate", "retention")


class StateCollector(Collector):
    """Gauges read from the collector's in-memory state at scrape time."""

    def __init__(
        self,
        verdicts: Callable[[], list[Verdict]],
        clocks: Callable[[], list[ClockModel]],
        top_k: int,
    ) -> None:
        self._verdicts, self._clocks, self._k = verdicts, clocks, top_k

    def collect(self) -> Iterable[GaugeMetricFamily]:
        links = [v for v in self._verdicts() if v.kind == "link"]
        by_state = GaugeMetricFamily("fleetlens_links", "Links by verdict state", labels=["state"])
        for s in STATES:
            by_state.add_metric([s], sum(v.state == s for v in links))
        yield by_state
        faulty = sorted(
            (v for v in links if v.state == "faulty"),
            key=lambda v: (v.confidence, v.loss_rate, v.excess_delay_ns),
            reverse=True,
        )[: self._k]
        loss = GaugeMetricFamily(
            "fleetlens_faulty_link_loss_ratio",
            f"Loss ratio of the top {self._k} faulty links (bounded cardinality)",
            labels=["link"],
        )
        delay = GaugeMetricFamily(
            "fleetlens_faulty_link_excess_delay_seconds",
            f"Excess one-way delay of the top {self._k} faulty links",
            labels=["link"],
        )
        group = GaugeMetricFamily(
            "fleetlens_faulty_link_group_size",
            f"Ambiguity group of the top {self._k} faulty links that have one (links the "
            "probes cannot tell apart, reported together): its size",
            labels=["link", "group"],
        )
        for v in faulty:
            loss.add_metric([v.subject], v.loss_rate)
            delay.add_metric([v.subject], v.excess_delay_ns * 1e-9)
            if v.group_id is not None:
                group.add_metric([v.subject, v.group_id], v.group_size)
        yield loss
        yield delay
        yield group
        yield from self._clock_families(self._clocks())

    @staticmethod
    def _clock_families(clocks: list[ClockModel]) -> Iterable[GaugeMetricFamily]:
        err = GaugeMetricFamily(
            "fleetlens_clock_error_bound_seconds",
            "Sync quality: error bound of the host's clock model (absent when unknown)",
            labels=["host"],
        )
        synced = GaugeMetricFamily(
            "fleetlens_clock_synced", "1 if the host's clock model is synchronized", labels=["host"]
        )
        offset = GaugeMetricFamily(
            "fleetlens_clock_offset_seconds", "Host raw clock minus fleet time", labels=["host"]
        )
        for c in clocks:
            if c.error_bound_ns is not None:
                err.add_metric([c.host_id], c.error_bound_ns * 1e-9)
            synced.add_metric([c.host_id], 1.0 if c.synced else 0.0)
            offset.add_metric([c.host_id], c.offset_ns * 1e-9)
        yield from (err, synced, offset)


class WriterCounters(Collector):
    """Monotonic writer figures read at scrape time (they live on the Writer)."""

    def __init__(self, busy_cpu_s: Callable[[], float], rows: Callable[[], float]) -> None:
        self._busy, self._rows = busy_cpu_s, rows

    def collect(self) -> Iterable[CounterMetricFamily]:
        yield CounterMetricFamily(
            "fleetlens_writer_busy_cpu_seconds",
            "CPU time the writer thread spent inside write transactions (saturation: rate ~ 1)",
            value=self._busy(),
        )
        yield CounterMetricFamily(
            "fleetlens_writer_rows", "Window rows committed by the writer", value=self._rows()
        )


class MemoryGauges(Collector):
    """``fleetlens_memory_bytes{part}``: where the resident memory goes (``memory.py``)."""

    def __init__(self, parts: Callable[[], dict[str, int]]) -> None:
        self._parts = parts

    def collect(self) -> Iterable[GaugeMetricFamily]:
        g = GaugeMetricFamily("fleetlens_memory_bytes",
                              "Collector memory by part (rss: the whole process)",
                              labels=["part"])  # fmt: skip
        for part, value in self._parts().items():
            g.add_metric([part], value)
        yield g


class Metrics:
    def __init__(
        self,
        queue_depth: Callable[[], float],
        queue_rows: Callable[[], float],
        writer_lag: Callable[[], float],
        judged_age: Callable[[], float],
        topology: Topology | None = None,
        per_nic: bool = False,
    ) -> None:
        r = self.registry = CollectorRegistry(auto_describe=True)
        self.batches = Counter(
            "fleetlens_ingest_batches", "Batches acknowledged", ["result"], registry=r
        )
        for res in ("stored", "duplicate"):
            self.batches.labels(res)
        self.windows = Counter("fleetlens_ingest_windows", "Window rows stored", registry=r)
        self.bytes = Counter("fleetlens_ingest_bytes", "Ingest request body bytes", registry=r)
        self.rejected = Counter(
            "fleetlens_ingest_rejected_batches",
            "Batches rejected, by reason",
            ["reason"],
            registry=r,
        )
        for reason in REJECT_REASONS:
            self.rejected.labels(reason)
        self.registrations = Counter(
            "fleetlens_registrations", "Agent registrations accepted", registry=r
        )
        self.commit_seconds = Histogram(
            "fleetlens_writer_commit_seconds", "Time to write and commit one batch", registry=r,
            buckets=(1e-4, 3e-4, 1e-3, 3e-3, 1e-2, 3e-2, 0.1, 0.3, 1.0, 3.0, 10.0),
        )  # fmt: skip
        self.commit_group = Histogram(
            "fleetlens_writer_commit_group_batches", "Batches committed in one transaction",
            registry=r, buckets=(1, 2, 4, 8, 16, 32, 64, 128, 256, 512),
        )  # fmt: skip
        Gauge("fleetlens_writer_queue_depth", "Items waiting for the writer", registry=r
              ).set_function(queue_depth)  # fmt: skip
        Gauge("fleetlens_writer_queue_rows", "Window rows waiting for the writer", registry=r
              ).set_function(queue_rows)  # fmt: skip
        Gauge("fleetlens_writer_lag_seconds", "Age of the oldest item waiting for the writer",
              registry=r).set_function(writer_lag)  # fmt: skip
        self.loop_runs = Counter(
            "fleetlens_loop_runs", "Background loop rounds", ["loop"], registry=r
        )
        self.loop_errors = Counter(
            "fleetlens_loop_errors", "Background loop rounds that failed", ["loop"], registry=r
        )
        self.loop_seconds = Histogram(
            "fleetlens_loop_duration_seconds", "Duration of one loop round", ["loop"], registry=r
        )
        for loop in LOOPS:
            self.loop_runs.labels(loop)
            self.loop_errors.labels(loop)
        self.verdict_lag = Histogram(
            "fleetlens_verdict_lag_seconds",
            "From the end of a window to the verdicts on it being published", registry=r,
            buckets=(0.5, 1.0, 1.5, 2.0, 3.0, 5.0, 10.0, 30.0, 60.0, 300.0),
        )  # fmt: skip
        Gauge("fleetlens_triangulated_window_age_seconds",
              "Time since the end of the newest window triangulation has judged (NaN: none)",
              registry=r).set_function(judged_age)  # fmt: skip
        self.owd = OwdHistograms(topology, per_nic)
        r.register(self.owd)

    def add_collector(self, collector: Collector) -> None:
        self.registry.register(collector)

    def add_state(self, state: StateCollector) -> None:
        self.registry.register(state)

    def reject(self, reason: str) -> None:
        """Count one refused ingest or registration request (``REJECT_REASONS``)."""
        self.rejected.labels(reason).inc()

    def received(self, body_bytes: int) -> None:
        """Count the bytes of one ingest request body read."""
        self.bytes.inc(body_bytes)

    def exposition(self) -> bytes:
        """The registry in the Prometheus text format (``EXPOSITION_TYPE``)."""
        return generate_latest(self.registry)
