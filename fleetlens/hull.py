"""Lower convex hulls of many small point sets at once.

Rows are flow-windows (or an edge's pooled points), columns their points. The hull is Andrew's
monotone chain, row by row in Cython (:mod:`fleetlens._hull`). The result equals
:func:`fleetlens.records.lower_hull` row by row (same tie rules: collinear points dropped,
equal ``t`` keeps the lowest ``y``).

:func:`keep_group_hull_points` prunes rows to the points on their group's hull: the lower hull
of a union of point sets is the hull of the union of their hulls' vertices that are its
vertices, so each row keeps only those (see :mod:`fleetlens.summary`).
"""

from __future__ import annotations

import numpy as np

from fleetlens._hull import hull_rows, keep_group_hull


def lower_hull_rows(
    t: np.ndarray, y: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Hulls of the points ``(t, y)`` where ``mask``, per row of (rows, m) int64 arrays.

    Returns ``(size, hull_t, hull_y)``: the hull of row i is ``hull_t[i, :size[i]]`` (sorted by
    t) and ``hull_y[i, :size[i]]``.
    """
    t, y, mask = _sorted_rows(t, y, mask)
    rows, m = t.shape
    ht = np.zeros((rows, max(m, 1)), np.int64)
    hy = np.zeros((rows, max(m, 1)), np.int64)
    size = np.zeros(rows, np.int64)
    hull_rows(
        np.ascontiguousarray(t, np.int64),
        np.ascontiguousarray(y, np.int64),
        np.ascontiguousarray(mask, bool).view(np.uint8),
        ht, hy, size,
    )  # fmt: skip
    return size, ht, hy


def _sorted_rows(
    t: np.ndarray, y: np.ndarray, mask: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Sort rows whose masked points are not already in (t, y) order (e.g. after a clock step)."""
    if t.shape[1] < 2:
        return t, y, mask
    lo = np.iinfo(np.int64).min
    tm = np.where(mask, t, lo)
    prev = np.maximum.accumulate(tm, axis=1)[:, :-1]
    bad_t = mask[:, 1:] & (t[:, 1:] < prev)
    ym = np.where(mask, y, lo)  # equal t: y must not decrease either
    same = mask[:, 1:] & (t[:, 1:] == prev)
    bad = np.flatnonzero(
        (bad_t | (same & (y[:, 1:] < np.maximum.accumulate(ym, axis=1)[:, :-1]))).any(axis=1)
    )
    if not bad.size:
        return t, y, mask
    t, y, mask = t.copy(), y.copy(), mask.copy()
    order = np.lexsort((y[bad], t[bad], ~mask[bad]), axis=-1)
    t[bad] = np.take_along_axis(t[bad], order, axis=1)
    y[bad] = np.take_along_axis(y[bad], order, axis=1)
    mask[bad] = np.take_along_axis(mask[bad], order, axis=1)
    return t, y, mask


def keep_group_hull_points(
    group: np.ndarray, size: np.ndarray, ht: np.ndarray, hy: np.ndarray
) -> None:
    """In place: each row's hull ``ht[i, :size[i]]``, ``hy[i, :size[i]]`` (as
    :func:`lower_hull_rows` returns it) cut to its points that are vertices of the lower
    hull of all the points of the rows of its ``group`` (an int64 key per row), in order;
    ``size`` updated (0 where none is). The rows' hulls of a group then have exactly the
    group's hull as the hull of their union, and each row only points it had."""
    if group.size == 0:
        return
    order = np.argsort(group, kind="stable")
    g = group[order]
    bounds = np.r_[np.flatnonzero(np.r_[True, g[1:] != g[:-1]]), g.size].astype(np.int64)
    keep_group_hull(order.astype(np.int64), bounds, ht, hy, size)
