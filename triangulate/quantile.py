"""Grouped weighted quantiles in one pass, through a fixed signed log-linear histogram.

Per-link and per-NIC medians of millions of per-flow delays would need a sort per window; a
2-D histogram over (group, bin) costs one pass. Bins are 100 ns wide up to 4 µs and 5 %
wide above (up to ~10 ms), for either sign, so a median is exact to 50 ns or 2.5 %.

The per-row work (binning, the histogram and the scan to the quantile's bin) runs in
``_fast``; ``to_bin`` and ``_reference_group_quantile_bins`` are the plain numpy definitions
it is tested against.
"""

from __future__ import annotations

import numpy as np

from . import _fast

_LIN_NS, _LIN_BINS, _GROWTH, _LOG_BINS = 100.0, 40, 1.05, 160
_HALF = _LIN_BINS + _LOG_BINS
N_BINS = 2 * _HALF + 1
_LOG_GROWTH = float(np.log(_GROWTH))


def to_bin(v: np.ndarray) -> np.ndarray:
    a = np.abs(v)
    lin = a / _LIN_NS
    with np.errstate(divide="ignore"):
        log = _LIN_BINS + np.log(np.maximum(a, 1.0) / (_LIN_NS * _LIN_BINS)) / np.log(_GROWTH)
    t = np.minimum(np.where(lin < _LIN_BINS, lin, log), _HALF - 1e-9)
    return (np.sign(v) * np.floor(t + 0.5)).astype(np.int64) + _HALF


def from_bin(b: np.ndarray) -> np.ndarray:
    t = np.asarray(b, np.float64) - _HALF  # may be fractional (interpolated)
    a = np.abs(t)
    val = np.where(a < _LIN_BINS, a * _LIN_NS, _LIN_NS * _LIN_BINS * _GROWTH ** (a - _LIN_BINS))
    return np.sign(t) * val


def bins_of(value: np.ndarray) -> np.ndarray:
    """Bin of each value (int16), -1 for NaN (computed once, reused when values are gathered)."""
    v = np.ascontiguousarray(value, np.float64).reshape(-1)
    out = _fast.to_bins(v, _LIN_NS, _LIN_BINS, _LOG_GROWTH, _HALF)
    return out.reshape(np.shape(value))


class Groups:
    """A fixed grouping of items (flows by NIC, judged entries by link), listed group by group
    once (a stable counting sort) so that every quantile over it (one per window and pass)
    reads each group's items together. ``item``: each member's position in the ``bins``
    arrays it is later asked about (default: its own position)."""

    def __init__(
        self,
        group: np.ndarray,
        n_groups: int,
        weight: np.ndarray | None = None,
        item: np.ndarray | None = None,
    ) -> None:
        order, self.ptr = _fast.group_rows(np.ascontiguousarray(group, np.int64), n_groups)
        self.item = order if item is None else np.asarray(item, np.int64)[order]
        w = np.ones(group.size) if weight is None else np.asarray(weight, np.float64)[order]
        self.weight = np.ascontiguousarray(w)

    def quantile(self, bins: np.ndarray, q: float = 0.5) -> tuple[np.ndarray, np.ndarray]:
        """(weighted ``q`` quantile per group, total weight per group) of the items' values,
        given by their :func:`bins_of`; NaN where a group has no weight."""
        at, before, inside, tot, target = _fast.grouped_quantile(
            self.ptr, self.item, self.weight, np.ascontiguousarray(bins, np.int16), N_BINS, q
        )
        # linear interpolation inside the bin, in bin coordinates (per group: numpy is fine)
        frac = np.clip((target - before) / np.maximum(inside, 1e-300), 0.0, 1.0)
        return np.where(tot > 0, from_bin(at - 0.5 + frac), np.nan), tot


def _reference_group_quantile_bins(
    group: np.ndarray, bins: np.ndarray, weight: np.ndarray, n_groups: int, q: float = 0.5
) -> tuple[np.ndarray, np.ndarray]:
    """The numpy definition of ``Groups(group, n_groups, weight).quantile(bins, q)`` (tests
    compare the two)."""
    ok = bins >= 0
    cell = group[ok] * N_BINS + bins[ok]
    hist = np.bincount(cell, weight[ok], n_groups * N_BINS).reshape(n_groups, N_BINS)
    cum = np.cumsum(hist, axis=1)
    tot = cum[:, -1]
    target = q * tot
    at = np.argmax(cum >= target[:, None] - 1e-12, axis=1)
    rows = np.arange(n_groups)
    inside = hist[rows, at]
    before = cum[rows, at] - inside
    # linear interpolation inside the bin, in bin coordinates
    frac = np.clip((target - before) / np.maximum(inside, 1e-300), 0.0, 1.0)
    return np.where(tot > 0, from_bin(at - 0.5 + frac), np.nan), tot
