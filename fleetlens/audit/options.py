"""The ``fleetlens audit`` command line: its options, their checks, the judgement's thresholds.

Imports nothing heavy: a usage error is reported before scipy, DuckDB or matplotlib load.
"""

from __future__ import annotations

import argparse
import math
import os
from dataclasses import dataclass
from pathlib import Path

import fleetlens.audit
from fleetlens.secrets import READ_TOKEN_ENV, read_secret

MAX_MINUTES = 24 * 60
# Probe loss the judgement's fit treats as normal: the measurement's own. (The lab mode's
# collector runs with the lab's value, LAB_BACKGROUND_LOSS; the judgement uses this one.)
AUDIT_BACKGROUND_LOSS = 1e-4


class UsageError(ValueError):
    pass


@dataclass(frozen=True)
class Thresholds:
    max_loss: float = 2e-3  # a link losing this share of probes fails
    max_delay_ns: float = 20_000.0  # a fabric link adding this much one-way delay fails
    background_loss: float = AUDIT_BACKGROUND_LOSS
    loss_llr: float = 12.0  # log-likelihood ratio a loss estimate needs
    min_flows: int = 4  # flows a link needs for a delay statistic
    min_probes: float = 1000.0  # probes a link/NIC needs to be validated at all


def parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetlens audit", description=fleetlens.audit.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )  # fmt: skip
    p.add_argument("--minutes", type=float, required=True,
                   help="audit period in minutes (fractions allowed, e.g. 0.5)")  # fmt: skip
    p.add_argument("--report", type=Path, required=True, help="directory for the report")
    where = p.add_mutually_exclusive_group(required=True)
    where.add_argument("--collector", help="URL of a running collector, e.g. http://c:8470")
    where.add_argument("--lab", action="store_true", help="build and audit the lab fabric")
    p.add_argument("--token-file", type=Path,
                   help="read token (default: $FLEETLENS_READ_TOKEN)")  # fmt: skip
    p.add_argument("--db", type=Path,
                   help="the collector's DuckDB file, on its machine (copied): per-flow totals "
                   "from it instead of GET /v1/flows, host stalls left out")  # fmt: skip
    p.add_argument("--inventory", type=Path,
                   help="fleet inventory (default: the one the collector serves)")  # fmt: skip
    g = p.add_argument_group("thresholds")
    g.add_argument("--max-loss", type=float, default=0.2,
                   help="percent loss that fails a link (default %(default)s)")  # fmt: skip
    g.add_argument("--max-delay-us", type=float, default=20.0,
                   help="excess one-way delay failing a link (default %(default)s)")  # fmt: skip
    g.add_argument("--background-loss", type=float, default=AUDIT_BACKGROUND_LOSS,
                   help="probe loss of the measurement itself (default %(default)s)")  # fmt: skip
    g.add_argument("--warmup", type=float, default=None,
                   help="seconds left out first (default 10 with --lab, else 0)")  # fmt: skip
    g.add_argument("--live-fraction", type=float, default=0.5,
                   help="without per-flow data: share of the period the collector must have "
                   "called a link faulty to fail it (default %(default)s)")  # fmt: skip
    lab = p.add_argument_group("lab (--lab)")
    lab.add_argument("--name", default="audit", help="lab name, <= 6 chars (default %(default)s)")
    lab.add_argument("--hosts", type=int, default=8)
    lab.add_argument("--nics", type=int, default=2)
    lab.add_argument("--leaves", type=int, default=4)
    lab.add_argument("--spines", type=int, default=2)
    lab.add_argument("--inject", action="append", default=[],
                     help="hide a fault on a random leaf-spine link: loss:PCT%% or delay:USus; "
                     "repeat for more faults, each on a different link")  # fmt: skip
    lab.add_argument("--seed", type=int, default=1, help="picks the faulted link and clocks")
    lab.add_argument("--keep-workdir", action="store_true",
                     help="keep the collector DB and logs (path in report.json)")  # fmt: skip
    return p


def validate(a: argparse.Namespace) -> None:
    if not math.isfinite(a.minutes) or not 0 < a.minutes <= MAX_MINUTES:
        raise UsageError(f"--minutes must be > 0 and <= {MAX_MINUTES}, got {a.minutes:g}")
    if not 0 < a.max_loss < 100:
        raise UsageError(f"--max-loss is a percentage in (0, 100), got {a.max_loss:g}")
    if not 0 < a.max_delay_us < 1e6:
        raise UsageError(f"--max-delay-us must be in (0, 1e6), got {a.max_delay_us:g}")
    if not 0 <= a.background_loss < a.max_loss / 100:
        raise UsageError("--background-loss must be >= 0 and below --max-loss")
    if a.warmup is not None and not 0 <= a.warmup <= 600:
        raise UsageError(f"--warmup must be in [0, 600] seconds, got {a.warmup:g}")
    if not 0 < a.live_fraction <= 1:
        raise UsageError(f"--live-fraction must be in (0, 1], got {a.live_fraction:g}")
    if a.collector is not None:
        if not a.collector.startswith(("http://", "https://")):
            raise UsageError(f"--collector wants an http(s):// URL, got {a.collector!r}")
        if a.inject:
            raise UsageError("--inject only works with --lab (it faults the lab fabric)")
    if a.lab:
        from fleetlens.audit.lab import parse_inject

        try:
            for text in a.inject:
                parse_inject(text)
        except ValueError as e:
            raise UsageError(str(e)) from None
        if len(a.name) > 6 or not a.name.isalnum():
            raise UsageError(f"--name: 1-6 letters/digits, got {a.name!r}")
        if min(a.hosts, a.nics, a.leaves, a.spines) < 1 or a.hosts < 2:
            raise UsageError("--hosts >= 2 and --nics/--leaves/--spines >= 1")
        if a.leaves % a.nics:
            raise UsageError(f"rail wiring needs --leaves ({a.leaves}) divisible by --nics")
        if os.geteuid() != 0:
            raise UsageError("--lab needs root (it builds network namespaces)")
    try:
        a.report.mkdir(parents=True, exist_ok=True)
    except OSError as e:
        raise UsageError(f"--report {a.report}: {e.strerror}") from None


def read_token(a: argparse.Namespace) -> str | None:
    """--token-file, else $FLEETLENS_READ_TOKEN (:func:`fleetlens.secrets.read_secret`)."""
    try:
        return read_secret(READ_TOKEN_ENV, a.token_file)
    except OSError as e:
        raise UsageError(f"--token-file {a.token_file}: {e.strerror}") from None


def thresholds(a: argparse.Namespace) -> Thresholds:
    return Thresholds(
        max_loss=a.max_loss / 100, max_delay_ns=a.max_delay_us * 1e3,
        background_loss=a.background_loss,
    )  # fmt: skip
