"""The demo's summary: what the story found, its checks, and the tables that show it.

Each fabric extends :class:`Summary` with its own figures and checks (the lab's LinkPass
transfer, the simulator's fleet-wide clock statistics); ``--json`` prints :meth:`to_dict`.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import asdict, dataclass, field

from rich.console import Console
from rich.table import Table


@dataclass
class ClockRow:
    host: str
    injected_offset_ns: float
    injected_drift_ppb: float
    error_ns: float | None  # served model minus truth, common mode removed
    synced: bool


@dataclass(kw_only=True)
class Summary(ABC):
    collector: str
    clocks: list[ClockRow] = field(default_factory=list)
    sync_p99_ns: float | None = None
    sync_converged_s: float | None = None
    fault: dict[str, object] = field(default_factory=dict)
    baseline_clean_s: float | None = None  # from the baseline step's start
    localized_s: float | None = None  # from the fault until the REST API names the link
    cleared_s: float | None = None  # from the heal until the verdicts are healthy again
    faulty_links: list[str] = field(default_factory=list)  # as the fault ends
    notes: list[str] = field(default_factory=list)

    title = "FleetLens demo"
    error_digits = 0  # digits of the clock table's errors

    @property
    def clock_title(self) -> str:
        return "clock error per host vs injected truth"

    @property
    @abstractmethod
    def checks(self) -> dict[str, bool]: ...

    @abstractmethod
    def rows(self) -> list[tuple[str, str]]:
        """The result table's rows above the checks."""

    def to_dict(self) -> dict[str, object]:
        return {**asdict(self), "checks": self.checks, "passed": all(self.checks.values())}


def render(s: Summary, console: Console) -> None:
    t = Table(title=s.clock_title)
    for col in ("host", "injected offset", "injected drift", "error", "synced"):
        t.add_column(col, justify="right")
    for r in s.clocks:
        err = "—" if r.error_ns is None else f"{r.error_ns:+.{s.error_digits}f} ns"
        off, drift = r.injected_offset_ns / 1e3, r.injected_drift_ppb / 1e3
        t.add_row(r.host, f"{off:+.1f} µs", f"{drift:+.2f} ppm", err, "yes" if r.synced else "no")
    console.print(t)
    res = Table(title=s.title)
    res.add_column("check")
    res.add_column("result")
    for row in s.rows():
        res.add_row(*row)
    for name, ok in s.checks.items():
        res.add_row(name, "[green]PASS[/]" if ok else "[red]FAIL[/]")
    console.print(res)
    for n in s.notes:
        console.print(f"note: {n}")
