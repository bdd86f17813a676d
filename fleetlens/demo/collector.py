"""The simulated demo's collector: the fixtures' collector process on 127.0.0.1 and what the
story reads from it, every failure a :class:`SimDemoError` that says what the demo was doing
(the caller prints it as one line, with the collector log's tail when the collector died)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

from fleetlens.client import CollectorError
from fleetlens.fixtures.collector import CollectorProcess, ServerProcessError, start_collector
from fleetlens.records import ClockModel

START_TIMEOUT_S = 120.0  # a busy 2-core machine imports the collector slowly
REQUEST_TIMEOUT_S = 60.0  # a page of /v1/clocks while a round of 1024 hosts runs
STOP_TIMEOUT_S = 30.0  # its orderly exit flushes the writer


class SimDemoError(RuntimeError):
    """The story could not be told (e.g. the collector died); everything was cleaned up."""


class DemoCollector:
    """A healthy collector judging the simulated fabric of ``inventory``, stopped by PID."""

    def __init__(self, work: Path, inventory: Path, loop_interval_s: float) -> None:
        args = [
            "--insecure-no-auth", "--public-metrics", "--loop-interval", str(loop_interval_s),
            # The run is minutes long and its store is thrown away: no rollup passes in between.
            "--retention-interval", "3600",
        ]  # fmt: skip
        try:
            self.proc: CollectorProcess = start_collector(
                work / "fleetlens.duckdb", inventory, args, timeout_s=START_TIMEOUT_S
            )
        except ServerProcessError as e:
            raise SimDemoError(str(e)) from e
        self.api = self.proc.client(timeout_s=REQUEST_TIMEOUT_S)

    @property
    def url(self) -> str:
        return self.proc.url

    def check_alive(self, doing: str) -> None:
        try:
            self.proc.check_alive(doing)
        except ServerProcessError as e:
            raise SimDemoError(str(e)) from None

    def log_tail(self) -> str:
        return self.proc.log_tail()

    @contextmanager
    def answering(self, doing: str) -> Iterator[None]:
        """A failed call inside is a SimDemoError (no answer: first, did the collector die?)."""
        try:
            yield
        except CollectorError as e:
            if e.unreachable:
                self.check_alive(doing)
                raise SimDemoError(f"collector unreachable while {doing}: {e}") from e
            raise SimDemoError(f"{e} (while {doing})") from e

    def clocks(self, doing: str) -> dict[str, ClockModel]:
        """The clock model served for each host."""
        with self.answering(doing):
            return self.api.clocks()

    def faulty(self, doing: str) -> tuple[list[str], list[str]]:
        """The faulty links and the faulty NICs, each sorted."""
        with self.answering(doing):
            links = self.api.links(state="faulty")
            nics = self.api.nics(state="faulty")
        return sorted(r["link_id"] for r in links), sorted(r["nic_id"] for r in nics)

    def metrics(self, doing: str) -> dict[str, float]:
        """The loop counters and timings, from the Prometheus text of ``/metrics``."""
        with self.answering(doing):
            text = self.api.metrics_text()
        names = "runs_total|errors_total|duration_seconds_sum|duration_seconds_count"
        pat = rf'^(fleetlens_loop_(?:{names}))\{{loop="(\w+)"\}} (\S+)'
        return {f"{m[1]}:{m[2]}": float(m[3]) for m in re.finditer(pat, text, re.M)}

    def release(self) -> None:
        """Leave it running (``--keep``): only this side's connection closes."""
        self.api.close()

    def stop(self) -> None:
        self.api.close()
        self.proc.stop(timeout_s=STOP_TIMEOUT_S)
