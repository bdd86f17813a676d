"""Pure probes: which coded pairs and which windows the clock solve may trust.

A coded pair is two probes sent ``gap`` apart; if neither met a queue (or both met the same
one) the receive gap equals the send gap. A pair whose gaps differ by more than the threshold
was queued or stamped late: its one-way delay is inflated by an unknown amount, so it must not
shape the hull.

Thresholds (why): software stamps (``SO_TIMESTAMPING`` on veth/loopback) showed
``|rx gap - tx gap|`` with median ≈ 130 ns and p99 ≈ 500 ns on idle paths here
(lab-notes), so 800 ns keeps idle pairs and drops queued ones (queues are µs). PHC/hardware
stamps jitter by a few ns, so 40 ns. The simulator uses the same defaults.

Windows: the agents already filter pairs and send only the lower hull of the pure points. Here
we drop window rows that cannot carry sync information or are malformed (no pure pair, hull
arrays of different lengths, unparsable NIC ids, a host probing itself) and count them.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.records import TS_HARDWARE

THRESHOLD_SOFTWARE_NS = 800
THRESHOLD_HARDWARE_NS = 40


def threshold_ns(ts_source: str) -> int:
    return THRESHOLD_HARDWARE_NS if ts_source == TS_HARDWARE else THRESHOLD_SOFTWARE_NS


def pure_mask(
    tx0: np.ndarray, tx1: np.ndarray, rx0: np.ndarray, rx1: np.ndarray, threshold: int
) -> np.ndarray:
    """True where a coded pair's receive gap equals its send gap within ``threshold`` ns."""
    tx0, tx1, rx0, rx1 = (np.asarray(a, np.int64) for a in (tx0, tx1, rx0, rx1))
    return np.abs((rx1 - rx0) - (tx1 - tx0)) <= threshold


@dataclass
class HullPoints:
    """Every hull point of the usable rows, flattened (one entry per point)."""

    src_nic: np.ndarray  # (n,) object: NIC id of the sender
    dst_nic: np.ndarray
    t_raw: np.ndarray  # (n,) int64, sender's raw clock
    owd_raw: np.ndarray  # (n,) int64, rx0_raw - tx0_raw
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def src_host(self) -> np.ndarray:
        return _hosts(self.src_nic)

    @property
    def dst_host(self) -> np.ndarray:
        return _hosts(self.dst_nic)


def _hosts(nics: np.ndarray) -> np.ndarray:
    return np.array([n.partition("/")[0] for n in nics], dtype=object)


def hull_points(windows: pa.Table) -> HullPoints:
    """Flatten the hulls of the rows worth using; count what was dropped and why."""
    dropped: dict[str, int] = {}
    t = windows.select(["src_nic", "dst_nic", "pure", "hull_t_ns", "hull_owd_ns"])
    t = _drop(t, pc.fill_null(pc.greater(t["pure"], 0), False), "no_pure_pair", dropped)
    n_t = pc.fill_null(pc.list_value_length(t["hull_t_ns"]), -1)
    n_y = pc.fill_null(pc.list_value_length(t["hull_owd_ns"]), -2)
    t = _drop(t, pc.equal(n_t, n_y), "hull_length_mismatch", dropped)
    t = _drop(t, pc.greater(pc.list_value_length(t["hull_t_ns"]), 0), "empty_hull", dropped)
    src = t["src_nic"].to_numpy(zero_copy_only=False).astype(object)
    dst = t["dst_nic"].to_numpy(zero_copy_only=False).astype(object)
    ok = np.array([_nic_ok(s) and _nic_ok(d) for s, d in zip(src, dst, strict=True)], bool)
    ok &= _hosts(np.where(ok, src, "x/y")) != _hosts(np.where(ok, dst, "z/y"))
    t = _drop(t, pa.array(ok), "bad_nic_or_self_probe", dropped)
    src, dst = src[ok], dst[ok]
    ft, fy = pc.list_flatten(t["hull_t_ns"]), pc.list_flatten(t["hull_owd_ns"])
    row = pc.list_parent_indices(t["hull_t_ns"]).to_numpy()
    good = pc.and_(pc.is_valid(ft), pc.is_valid(fy)).to_numpy(zero_copy_only=False)
    if not good.all():
        dropped["null_hull_point"] = int((~good).sum())
    ht = pc.fill_null(ft, 0).to_numpy().astype(np.int64)[good]
    hy = pc.fill_null(fy, 0).to_numpy().astype(np.int64)[good]
    row = row[good]
    return HullPoints(src[row], dst[row], ht, hy, dropped)


def _nic_ok(nic: object) -> bool:
    if not isinstance(nic, str):
        return False
    host, sep, ifname = nic.partition("/")
    return bool(sep and host and ifname and "/" not in ifname)


def _drop(t: pa.Table, keep: pa.Array, reason: str, dropped: dict[str, int]) -> pa.Table:
    keep = pc.fill_null(keep, False)
    n = t.num_rows - int(pc.sum(keep).as_py() or 0)
    if n:
        dropped[reason] = dropped.get(reason, 0) + n
    return t.filter(keep)
