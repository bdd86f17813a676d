"""The window summary: what one flow (or path group) reports for one window.

Agents (``probe/windows.py``) and the simulator (``fixtures/sim``) both summarise through
:func:`summarize`, so the simulator emits exactly what agents emit. The input is a matrix: one
row per flow-window, one column per probe pair (cells beyond a row's pairs are padding, masked
out by zero counts and ``False`` flags; :func:`pad_rows` builds it from grouped samples). Per row:

- ``sent`` / ``received``: probe packets sent, and those the receiver's ack says arrived;
- ``pure``: pairs whose receive gap equals the send gap (the caller judges purity);
- one-way delay in fleet time as min/p50/p99/max over the valid OWD cells, by nearest rank: the
  ``ceil(q·n)``-th smallest of the ``n`` values, so every statistic is a delay some probe
  actually had (no interpolation between two probes); NaN (null on the wire) when none;
- the lower convex hull of the pure ``(t, owd_raw)`` points (:mod:`fleetlens.hull`), cut to
  the points on its NIC pair's hull where the rows' ``pair`` keys are given.

Why the cut: clock sync only ever reads, per directed NIC pair and window, the lower hull of
the union of the pair's flows' hulls. All of a directed pair's flows are in its sender's
batch, so the sender can drop every flow-hull point that is not a vertex of the pair's hull,
exactly: the pair's hull is a subset of the kept points, so the hull of their union is the
pair's hull; and a row still holds only its own flow's points (none, where its flow has no
point on the pair's hull). The hull lists are most of a row's bytes on the wire and in the
collector's store (figures: docs/figures.md).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa

from fleetlens.hull import keep_group_hull_points, lower_hull_rows

QUANTILES = (0.0, 0.50, 0.99, 1.0)  # owd_min_ns, owd_p50_ns, owd_p99_ns, owd_max_ns
OWD_COLUMNS = ("owd_min_ns", "owd_p50_ns", "owd_p99_ns", "owd_max_ns")


@dataclass(frozen=True)
class WindowSummary:
    """Per row: counts, OWD statistics and hull; :meth:`columns` gives the window records."""

    sent: np.ndarray  # (rows,) packets sent
    received: np.ndarray  # (rows,) packets received
    pure: np.ndarray  # (rows,) pure pairs
    owd: np.ndarray  # (rows, len(QUANTILES)) float64, NaN where nothing was received
    hull_size: np.ndarray  # (rows,) the hull of row i is hull_t[i, :hull_size[i]]
    hull_t: np.ndarray  # (rows, width) int64
    hull_y: np.ndarray  # (rows, width) int64

    def columns(self, rows: np.ndarray | None = None) -> dict[str, pa.Array]:
        """The ``sent`` … ``hull_owd_ns`` columns of WINDOW_SCHEMA for ``rows`` (default all)."""
        sel = slice(None) if rows is None else rows
        size = self.hull_size[sel]
        offsets = pa.array(np.concatenate([[0], np.cumsum(size)]).astype(np.int32))
        in_hull = np.arange(self.hull_t.shape[1])[None, :] < size[:, None]
        owd = self.owd[sel]
        return {
            "sent": pa.array(self.sent[sel].astype(np.int32)),
            "received": pa.array(self.received[sel].astype(np.int32)),
            "pure": pa.array(self.pure[sel].astype(np.int32)),
            **{
                name: pa.array(owd[:, k], mask=np.isnan(owd[:, k]))
                for k, name in enumerate(OWD_COLUMNS)
            },
            "hull_t_ns": pa.ListArray.from_arrays(offsets, pa.array(self.hull_t[sel][in_hull])),
            "hull_owd_ns": pa.ListArray.from_arrays(offsets, pa.array(self.hull_y[sel][in_hull])),
        }


def summarize(
    sent: np.ndarray,
    received: np.ndarray,
    pure: np.ndarray,
    t_ns: np.ndarray,
    owd_raw_ns: np.ndarray,
    owd_ns: np.ndarray,
    owd_valid: np.ndarray,
    pair: np.ndarray | None = None,
) -> WindowSummary:
    """Summarise (rows, pairs) matrices of probe pairs.

    ``sent``/``received``: packets per pair (0–2); ``pure``: bool; ``t_ns``/``owd_raw_ns``: the
    int64 hull point of each pair (the first probe's raw send stamp, ``rx0 - tx0`` raw);
    ``owd_ns``/``owd_valid``: fleet-time OWDs, any number of columns per row. ``pair``: per
    row, an int64 key equal for the rows of one directed NIC pair and window: each row's hull
    is then only its points on the pair's hull (None: the flow's whole hull).
    """
    size, ht, hy = lower_hull_rows(t_ns, owd_raw_ns, pure)
    if pair is not None:
        keep_group_hull_points(np.asarray(pair, np.int64), size, ht, hy)
    return WindowSummary(
        sent.sum(axis=1),
        received.sum(axis=1),
        pure.sum(axis=1),
        nearest_rank(owd_ns, owd_valid),
        size,
        ht,
        hy,
    )


def nearest_rank(v: np.ndarray, valid: np.ndarray, qs: tuple[float, ...] = QUANTILES) -> np.ndarray:
    """Per row, the nearest-rank ``qs`` quantiles of ``v`` where ``valid`` ((rows, len(qs))
    float64; NaN for rows with no valid value)."""
    if v.shape[1] == 0:
        return np.full((v.shape[0], len(qs)), np.nan)
    s = np.sort(np.where(valid, v, np.inf).astype(np.float64), axis=1)
    n = valid.sum(axis=1)
    rank = np.maximum(np.ceil(np.outer(n, qs)).astype(np.int64) - 1, 0)
    out = np.take_along_axis(s, rank, axis=1)
    out[n == 0] = np.nan
    return out


def pad_rows(group: np.ndarray, n: int, *arrays: np.ndarray) -> tuple[np.ndarray, list[np.ndarray]]:
    """Samples with group numbers ``0 <= group < n`` as (n, width) matrices, one row per group
    (sample order kept within a row, padding zero/False): ``(mask, [matrix of each array])``."""
    order = np.argsort(group, kind="stable")
    grp = group[order]
    count = np.bincount(grp, minlength=n)
    width = max(int(count.max()) if count.size else 0, 1)
    col = np.arange(grp.size) - np.concatenate([[0], np.cumsum(count)[:-1]])[grp]
    mask = np.zeros((n, width), bool)
    mask[grp, col] = True
    out = []
    for a in arrays:
        m = np.zeros((n, width), a.dtype)
        m[grp, col] = a[order]
        out.append(m)
    return mask, out
