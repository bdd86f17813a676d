# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""The slope bisection of :func:`fleetlens.sync.edgefit.fit_edges`, one pass per edge.

numpy ran each of the 48 halvings over the whole (edges, points) matrices, twice, and spent
most of a window's edge fits there (0.16 s per fit at 256 hosts × 8 NICs × 16 peers, four
or five fits a window); here each edge's halvings run over its own points only. Same
arithmetic and tie rules as the numpy form (first index among equal values), so the slopes
are bit-identical.
"""

from libc.stdint cimport int64_t


def bisect_rows(
    const double[:, ::1] tu,
    const double[:, ::1] yu,
    const int64_t[::1] nu,
    const double[:, ::1] tl,
    const double[:, ::1] yl,
    const int64_t[::1] nl,
    const double[::1] b_prior,
    const double[::1] bracket,
    int bisections,
    double[::1] out,
) -> None:
    """``out[i]``: the slope of row i's max-margin line within ``b_prior ± bracket``; rows'
    points are the first ``nu[i]`` (upper) and ``nl[i]`` (lower) columns."""
    cdef Py_ssize_t rows = tu.shape[0], i, k, iu, il
    cdef int it
    cdef double lo, hi, b, v, best
    with nogil:
        for i in range(rows):
            lo = b_prior[i] - bracket[i]
            hi = b_prior[i] + bracket[i]
            if nu[i] == 0 or nl[i] == 0:
                out[i] = 0.5 * (lo + hi)  # unusable: the caller keeps the prior
                continue
            for it in range(bisections):
                b = 0.5 * (lo + hi)
                iu = 0
                best = yu[i, 0] - b * tu[i, 0]
                for k in range(1, nu[i]):
                    v = yu[i, k] - b * tu[i, k]
                    if v < best:
                        best = v
                        iu = k
                il = 0
                best = yl[i, 0] - b * tl[i, 0]
                for k in range(1, nl[i]):
                    v = yl[i, k] - b * tl[i, k]
                    if v > best:
                        best = v
                        il = k
                if tl[i, il] > tu[i, iu]:  # supergradient > 0: the optimum is at larger b
                    lo = b
                else:
                    hi = b
            out[i] = 0.5 * (lo + hi)
