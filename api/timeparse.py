"""Query-string times and durations: integer ns, ISO 8601 instants, ``10s``/``1m``/``500ms``."""

from __future__ import annotations

import re
from datetime import datetime

_UNITS = {"ns": 1, "us": 1_000, "ms": 1_000_000, "s": 10**9, "m": 60 * 10**9, "h": 3600 * 10**9,
          "d": 86400 * 10**9}  # fmt: skip
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(ns|us|ms|s|m|h|d)$")


class TimeParamError(ValueError):
    def __init__(self, name: str, message: str) -> None:
        super().__init__(f"{name}: {message}")
        self.field = name


def parse_instant(name: str, value: str | None, now_ns: int) -> int | None:
    """``None`` stays None; ``now``; integer ns since the epoch; ISO 8601 with a time zone;
    ``-1h`` style offsets from now."""
    if value is None or value == "":
        return None
    v = value.strip()
    if v == "now":
        return now_ns
    if re.fullmatch(r"\d{1,19}", v):
        return int(v)
    if v.startswith("-") and _DURATION.match(v[1:]):
        return now_ns - parse_duration(name, v[1:])
    try:
        dt = datetime.fromisoformat(v)
    except ValueError:
        raise TimeParamError(
            name, f"{value!r} is not ns since the epoch, an ISO 8601 time, 'now' or '-1h'"
        ) from None
    if dt.tzinfo is None:
        raise TimeParamError(name, f"{value!r} has no time zone (add Z or +00:00)")
    return int(dt.timestamp()) * 10**9 + dt.microsecond * 1000


def parse_duration(name: str, value: str) -> int:
    v = value.strip()
    if re.fullmatch(r"\d{1,19}", v):
        return int(v)
    m = _DURATION.match(v)
    if not m:
        raise TimeParamError(name, f"{value!r} is not a duration (ns, or e.g. 500ms, 10s, 1m, 1h)")
    return int(float(m.group(1)) * _UNITS[m.group(2)])
