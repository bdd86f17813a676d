# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The per-row loop of :func:`fleetlens.hull.lower_hull_rows`: Andrew's monotone chain.

numpy could only run the chain column by column over all rows, paying its per-call overhead
once per column and pop step: cheap for an agent's window (many rows, a few points each),
but the collector's pooled clock fits have a few hundred rows of up to ~300 points each, and
there it spent ~70 % of the solve (0.1-0.4 s a window on the 8-host lab, seconds on a loaded
box). Here each row is one pass, with the same float cross product and tie rules, so the
hulls are bit-identical.
"""

from libc.stdint cimport int64_t


def hull_rows(
    const int64_t[:, ::1] t,
    const int64_t[:, ::1] y,
    const unsigned char[:, ::1] mask,
    int64_t[:, ::1] ht,
    int64_t[:, ::1] hy,
    int64_t[::1] size,
) -> None:
    """Fill ``ht``/``hy``/``size`` with each row's lower hull; rows sorted by (t, y)."""
    cdef Py_ssize_t rows = t.shape[0], m = t.shape[1], i, k
    cdef Py_ssize_t n
    cdef int64_t pt, py, ot, oy, at, ay
    cdef double cross
    with nogil:
        for i in range(rows):
            n = 0
            for k in range(m):
                if not mask[i, k]:
                    continue
                pt = t[i, k]
                py = y[i, k]
                while n >= 2:
                    ot = ht[i, n - 2]
                    oy = hy[i, n - 2]
                    at = ht[i, n - 1]
                    ay = hy[i, n - 1]
                    cross = <double>(at - ot) * <double>(py - oy) - <double>(ay - oy) * <double>(pt - ot)
                    if cross > 0:
                        break
                    n -= 1
                if n > 0 and ht[i, n - 1] == pt:
                    continue  # same t, larger y: never on the lower hull
                ht[i, n] = pt
                hy[i, n] = py
                n += 1
            size[i] = n
