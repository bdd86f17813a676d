# cython: language_level=3, boundscheck=False, wraparound=False, cdivision=True, initializedcheck=False
"""Hot per-row loops of the triangulation engine (one pass each, no numpy temporaries).

A 1 s window of the reference fabric holds ~6 M flow rows; numpy spends most of its time
there on full-size temporaries (a mask, then a gather, then a cast ...). Each function here
is one typed loop over the rows that computes exactly what the numpy code it replaces did,
in the same order of floating-point operations, so results are bit-identical (checked against
numpy references in tests/triangulate/test_tri_fast.py).

- :class:`FlowIndex`: flow key -> position in the layout (keys in key order), by a small hash
  of the (src, dst) pair and the source port's place inside the pair's run — O(n), no sort;
- :func:`decode_batch`: the window decode of a record batch in one pass (keys, their
  layout positions, counts gathered into layout order, time span); :func:`compose_keys`
  for a new layout, :func:`span` for the kept rows when some were dropped;
  and :func:`first_rows` (a flow's first table row) only when needed;
- :func:`path_matrix`, :func:`strip_access`: reported paths (list<string>) -> padded link
  numbers -> fabric links and whether the access links are implied;
- :func:`route_hash`, :class:`U64Map`: the row hash of ``incidence._row_hash`` and hash -> route;
- :func:`link_sums`, :func:`decay_add`: per-window sums and the long-horizon decay;
- :func:`to_bins`, :func:`grouped_quantile`: the grouped histogram quantiles of ``quantile``;
- :func:`group_rows`: a counting sort for the link -> rows inverse indexes.

The machine is shared and memory-bound loops dominate: fresh multi-MB arrays page-fault, so
callers keep work arrays across windows, and random accesses are prefetched a few pair runs
ahead.
"""

from libc.math cimport floor, log, fabs, fmin, isfinite, NAN
from libc.stdint cimport int16_t, int32_t, int64_t, uint8_t, uint64_t
from libc.string cimport memcmp

import numpy as np

from fleetlens._strindex cimport StrIndex, table_size

cdef uint64_t _MIX = 0x9E3779B97F4A7C15ULL

ctypedef fused offs_t:
    int32_t
    int64_t

ctypedef fused ints_t:
    int32_t
    int64_t


def compose_keys(const int64_t[::1] src, const int64_t[::1] dst, const ints_t[::1] sport,
                 valid, int64_t n_nics, int64_t[::1] out) -> int:
    """``(src * n_nics + dst) * 65536 + sport`` per row, -1 where the row is unusable
    (unknown NIC, src == dst, null or out-of-range port); returns the unusable count."""
    cdef const uint8_t[::1] ok
    cdef bint has_valid = valid is not None
    if has_valid:
        ok = valid
    cdef int64_t i, n = out.shape[0], bad = 0, sp
    with nogil:
        for i in range(n):
            sp = sport[i]
            if (src[i] < 0 or dst[i] < 0 or src[i] == dst[i] or sp < 0 or sp >= 65536
                    or (has_valid and not ok[i])):
                out[i] = -1
                bad += 1
            else:
                out[i] = (src[i] * n_nics + dst[i]) * 65536 + sp
    return bad


cdef extern from *:
    """
    #define TRI_PREFETCH(p) __builtin_prefetch((const void *) (p))
    """
    void TRI_PREFETCH(const void* p) noexcept nogil


cdef enum:
    _SLOT = 5  # int64 fields per FlowIndex slot


cdef class FlowIndex:
    """Position of a flow key in a sorted array of unique non-negative keys.

    Keys are ``pair * 65536 + sport``; a flow pair's keys are one run of the sorted array.
    The pairs (hundreds of thousands) are hashed; inside a run the port is usually at
    ``start + (sport - first sport)`` (agents use consecutive ports), else found by binary
    search. Rows of one pair arrive together, so the cost is one hash lookup and one cache
    miss per pair run, and those misses are prefetched a few runs ahead (they dominate: the
    rows' pair order is not the key order).
    """

    cdef int64_t[::1] keys
    # per slot: pair (-1: empty), first position, count, first port, ports consecutive
    cdef int64_t[::1] _slots
    cdef int64_t _mask

    def __init__(self, int64_t[::1] keys):
        self.keys = keys
        cdef int64_t n = keys.shape[0], i, runs = 0
        for i in range(n):
            if i == 0 or (keys[i] >> 16) != (keys[i - 1] >> 16):
                runs += 1
        size = table_size(runs)
        slots = np.zeros(_SLOT * size, np.int64)
        slots[0::_SLOT] = -1
        self._slots = slots
        self._mask = size - 1
        cdef int64_t s = 0, p
        for i in range(n):
            p = keys[i] >> 16
            if i == 0 or p != (keys[i - 1] >> 16):
                s = self._slot_of(p)
                self._slots[_SLOT * s] = p
                self._slots[_SLOT * s + 1] = i
                self._slots[_SLOT * s + 3] = keys[i] & 0xFFFF
            self._slots[_SLOT * s + 2] += 1
            # consecutive ports: a port's place is known without reading the keys
            self._slots[_SLOT * s + 4] = (
                keys[i] - keys[self._slots[_SLOT * s + 1]] == self._slots[_SLOT * s + 2] - 1)

    cdef inline int64_t _home(self, int64_t pair) noexcept nogil:
        return <int64_t> ((((<uint64_t> pair) * _MIX) >> 32) & <uint64_t> self._mask)

    cdef inline int64_t _slot_of(self, int64_t pair) noexcept nogil:
        cdef int64_t s = self._home(pair)
        while self._slots[_SLOT * s] >= 0 and self._slots[_SLOT * s] != pair:
            s = (s + 1) & self._mask
        return s

    cdef inline int64_t _in_run(self, int64_t k, int64_t start, int64_t ln) noexcept nogil:
        cdef int64_t at = start + (k & 0xFFFF) - (self.keys[start] & 0xFFFF)
        if start <= at < start + ln and self.keys[at] == k:
            return at
        cdef int64_t lo = start, hi = start + ln, mid
        while lo < hi:
            mid = (lo + hi) >> 1
            if self.keys[mid] < k:
                lo = mid + 1
            else:
                hi = mid
        if lo < start + ln and self.keys[lo] == k:
            return lo
        return -1


def span(const int64_t[::1] start, start_ok, const int64_t[::1] dur, dur_ok, rows):
    """(first start, last start + duration, found a start, found an end): over every row
    skipping nulls (``rows`` None: Arrow's min/max semantics), else over ``rows`` with nulls
    read as 0; 0 where nothing was found."""
    cdef const uint8_t[::1] s_ok, d_ok
    cdef const int64_t[::1] rw
    cdef bint hs = start_ok is not None, hd = dur_ok is not None, all_rows = rows is None
    if hs:
        s_ok = start_ok
    if hd:
        d_ok = dur_ok
    if not all_rows:
        rw = rows
    cdef int64_t n = start.shape[0] if all_rows else rw.shape[0]
    cdef int64_t i, r, a, b, lo = 0, hi = 0
    cdef bint any_lo = False, any_hi = False, sv, dv
    with nogil:
        for i in range(n):
            r = i if all_rows else rw[i]
            sv = not hs or s_ok[r]
            dv = not hd or d_ok[r]
            if all_rows and not sv:
                continue
            a = start[r] if sv else 0
            if not any_lo or a < lo:
                lo, any_lo = a, True
            if all_rows and not dv:
                continue
            b = a + (dur[r] if dv else 0)
            if not any_hi or b > hi:
                hi, any_hi = b, True
    return lo, hi, any_lo, any_hi


def path_matrix(const offs_t[::1] list_off, list_ok, const int32_t[::1] str_off,
                const uint8_t[::1] data, str_ok, StrIndex links, int64_t width):
    """Reported paths (an Arrow list<string> array: its list offsets and validity, its child
    strings' offsets, bytes and validity) as (lens, links padded with -1 to ``width``, bad):
    a path is bad when empty, longer than ``width`` or naming a link not in the topology."""
    cdef int64_t n = list_off.shape[0] - 1, i, j, a, b, s, ln, lk
    lens_a = np.zeros(n, np.int64)
    pad_a = np.full((n, width), -1, np.int64)
    bad_a = np.zeros(n, np.bool_)
    cdef int64_t[::1] lens = lens_a
    cdef int64_t[:, ::1] pad = pad_a
    cdef uint8_t[::1] bad = bad_a.view(np.uint8)
    cdef const uint8_t[::1] l_ok, s_ok
    cdef bint hl = list_ok is not None, hs = str_ok is not None
    if hl:
        l_ok = list_ok
    if hs:
        s_ok = str_ok
    cdef const uint8_t* base = &data[0]
    # per hop, the last string seen there and its number: paths of one flow pair share their
    # access links and most fabric links, so most lookups are one short memcmp
    prev_a = np.full((width + 1, 3), -1, np.int64)
    cdef int64_t[:, ::1] prev = prev_a
    cdef int64_t h
    with nogil:
        for i in range(n):
            if hl and not l_ok[i]:
                bad[i] = 1
                continue
            a, b = list_off[i], list_off[i + 1]
            lens[i] = b - a
            if b == a or b - a > width:
                bad[i] = 1
            for j in range(a, b):
                h = j - a if j - a < width else width
                if hs and not s_ok[j]:
                    lk = -1
                else:
                    s = str_off[j]
                    ln = str_off[j + 1] - s
                    if ln == prev[h, 1] and memcmp(base + s, base + prev[h, 0], ln) == 0:
                        lk = prev[h, 2]
                    else:
                        lk = links.find(base + s, ln)
                        prev[h, 0], prev[h, 1], prev[h, 2] = s, ln, lk
                if lk < 0:
                    bad[i] = 1
                if j - a < width:
                    pad[i, j - a] = lk
    return lens_a, pad_a, bad_a


def route_hash(const int64_t[:, ::1] mid):
    """``incidence._row_hash``: per row ``h = (h ^ (x + 2)) * MIX`` over its columns."""
    cdef int64_t n = mid.shape[0], w = mid.shape[1], i, j
    out_a = np.empty(n, np.uint64)
    cdef uint64_t[::1] out = out_a
    cdef uint64_t h
    with nogil:
        for i in range(n):
            h = 0
            for j in range(w):
                h = (h ^ <uint64_t> (mid[i, j] + 2)) * _MIX
            out[i] = h
    return out_a


def link_sums(const int64_t[::1] up, const int64_t[::1] dn, const int64_t[::1] route,
              const double[::1] x, int64_t n_links, int64_t n_routes):
    """Per access link (up, down; index ``n_links`` is the no-link sentinel) and per route,
    the sum of ``x`` over the rows — the three ``bincount``s of ``Incidence.link_sums`` in one
    pass. Rows come grouped by flow pair (a NIC's flows are adjacent), so the access links
    repeat for long runs: a run is summed in a register and added once (adding into the same
    array slot row after row waited on the slot's last store every row, twice as slow).
    Equal to the bincounts for the integer packet counts; for other values the rounding
    follows the run sums."""
    cdef int64_t i, n = x.shape[0], cu = -1, cd = -1
    up_a = np.zeros(n_links + 1)
    dn_a = np.zeros(n_links + 1)
    rt_a = np.zeros(n_routes)
    cdef double[::1] su = up_a, sd = dn_a, sr = rt_a
    cdef double au = 0.0, ad = 0.0, v
    with nogil:
        for i in range(n):
            v = x[i]
            if up[i] != cu:
                if cu >= 0:
                    su[cu] += au
                cu, au = up[i], 0.0
            au = au + v
            if dn[i] != cd:
                if cd >= 0:
                    sd[cd] += ad
                cd, ad = dn[i], 0.0
            ad = ad + v
            sr[route[i]] += v
        if cu >= 0:
            su[cu] += au
        if cd >= 0:
            sd[cd] += ad
    return up_a, dn_a, rt_a


def baseline_update(double[::1] base, int64_t[::1] t, const int64_t[::1] at,
                    const double[::1] obs, int64_t end_ns, double slack_ns_per_s):
    """Trailing-min baselines, in place, for the stored rows ``at`` (distinct) of this
    window's flows: where ``obs`` is finite, the old minimum crept up by ``slack`` per second
    since its last probe (``t``; not creeping before the first), then the lower of it and
    ``obs``, and ``t`` becomes ``end_ns``. A window without a probe (``obs`` NaN) changes
    nothing: the creep since the last probe is applied once, when the next one comes (adding
    it every silent window compounded it: a flow black-holed for 65 s came back 4.2 us under
    a baseline crept that far, where one creep is 130 ns). The numpy form is
    ``delay._reference_update_baselines``."""
    cdef int64_t i, a, n = at.shape[0], dt
    cdef double crept, new
    with nogil:
        for i in range(n):
            if not isfinite(obs[i]):
                continue
            a = at[i]
            dt = end_ns - t[a]
            if dt < 0:
                dt = 0
            crept = base[a] + slack_ns_per_s * ((<double> dt) * 1e-9 if t[a] > 0 else 0.0)
            base[a] = fmin(crept, obs[i]) if isfinite(crept) else obs[i]
            t[a] = end_ns
    return None


def decay_add(double[::1] sent, double[::1] lost, const double[::1] f_sent,
              const double[::1] f_lost, double gamma, double floor_lost, double keep_sent,
              int64_t[::1] lossy_now, int64_t[::1] lossy_all):
    """``sent = sent * gamma + f_sent`` and the same for ``lost`` (lost below ``floor_lost``
    set to 0), in place. Returns (every flow still has ``sent >= keep_sent``, rows with
    ``f_lost > 0``, rows with ``lost > 0`` after): those rows, in order, are written to the
    start of ``lossy_now`` / ``lossy_all`` (each sized like ``sent``) — the lossy rows both
    loss fits start from, found in this pass rather than in two more over the flows."""
    cdef int64_t i, n = sent.shape[0], k_now = 0, k_all = 0
    cdef bint keep_all = True
    cdef double s, v
    if lossy_now.shape[0] < n or lossy_all.shape[0] < n:
        raise ValueError("lossy row buffers too small")
    with nogil:
        for i in range(n):
            s = sent[i] * gamma
            s = s + f_sent[i]
            v = lost[i] * gamma
            v = v + f_lost[i]
            if v < floor_lost:
                v = 0.0
            sent[i] = s
            lost[i] = v
            if not (s >= keep_sent):
                keep_all = False
            if f_lost[i] > 0:
                lossy_now[k_now] = i
                k_now += 1
            if v > 0:
                lossy_all[k_all] = i
                k_all += 1
    return keep_all, k_now, k_all


def decay(double[::1] sent, double[::1] lost, double gamma) -> None:
    """``sent *= gamma; lost *= gamma`` in one pass."""
    cdef int64_t i, n = sent.shape[0]
    with nogil:
        for i in range(n):
            sent[i] = sent[i] * gamma
            lost[i] = lost[i] * gamma


def to_bins(const double[::1] v, double lin_ns, int64_t lin_bins, double log_growth,
            int64_t half):
    """``quantile.bins_of``: signed log-linear bin per value (int16: 2 * half + 1 bins), -1
    for NaN and infinities."""
    cdef int64_t i, n = v.shape[0]
    out_a = np.empty(n, np.int16)
    cdef int16_t[::1] out = out_a
    cdef double a, lin, t, top = half - 1e-9, x, lg, m
    with nogil:
        for i in range(n):
            x = v[i]
            if not isfinite(x):
                out[i] = -1
                continue
            a = fabs(x)
            lin = a / lin_ns
            if lin < lin_bins:
                t = lin
            else:
                m = a if a > 1.0 else 1.0
                lg = log(m / (lin_ns * lin_bins))
                t = lin_bins + lg / log_growth
            if t > top:
                t = top
            t = floor(t + 0.5)
            if x > 0:
                out[i] = <int16_t> (<int64_t> t + half)
            elif x < 0:
                out[i] = <int16_t> (<int64_t> (-t) + half)
            else:
                out[i] = half
    return out_a


def grouped_quantile(const int64_t[::1] ptr, const int64_t[::1] item, const double[::1] weight,
                     const int16_t[::1] bins, int64_t n_bins, double q):
    """Per group (its items ``ptr[g] .. ptr[g + 1]`` of ``item`` / ``weight``, listed group by
    group): the histogram of ``bins[item]`` (items with bin < 0 skipped), then the first bin
    whose running sum reaches ``q`` of the total. Returns (bin, running sum through the bin
    before it, its weight, total, target) per group — what ``quantile.Groups.quantile``
    interpolates; equal to numpy's cumsum/argmax over the items in this order (the reference
    in ``quantile``). Items listed by group keep each histogram in one small array (the bins
    are int16: a window's bins fit in cache), where scattering into all groups' histograms
    missed the cache on every row."""
    cdef int64_t n_groups = ptr.shape[0] - 1, g, k, b, lo, hi, hit, bad = 0
    hist_a = np.zeros(max(n_bins, 1))
    at_a = np.zeros(n_groups, np.int64)
    before_a, inside_a = np.zeros(n_groups), np.zeros(n_groups)
    tot_a, target_a = np.zeros(n_groups), np.zeros(n_groups)
    cdef double[::1] hist = hist_a
    cdef int64_t[::1] at = at_a
    cdef double[::1] before = before_a, inside = inside_a, tot = tot_a, target = target_a
    cdef double c, goal
    with nogil:
        for g in range(n_groups):
            lo, hi = n_bins, -1
            for k in range(ptr[g], ptr[g + 1]):
                b = bins[item[k]]
                if b < 0:
                    continue
                if b >= n_bins:
                    bad += 1
                    continue
                hist[b] += weight[k]
                if b < lo:
                    lo = b
                if b > hi:
                    hi = b
            c = 0.0
            for b in range(lo, hi + 1):
                c = c + hist[b]
            tot[g] = c
            target[g] = q * c
            goal = target[g] - 1e-12
            hit = -1
            if 0.0 >= goal:  # bin 0's running sum is its weight, >= 0: argmax finds bin 0
                hit = 0
            else:
                c = 0.0
                for b in range(lo, hi + 1):
                    c = c + hist[b]
                    if c >= goal:
                        hit = b
                        break
            if hit <= 0:  # bin 0 (or never reached, NaN weights: argmax of all-False)
                hit = 0
                inside[g] = hist[0] if lo == 0 and hi >= 0 else 0.0
                c = inside[g]
            else:
                inside[g] = hist[hit]
            at[g] = hit
            before[g] = c - inside[g]
            for b in range(lo, hi + 1):
                hist[b] = 0.0
    if bad:
        raise ValueError(f"{bad} bins out of range (n_bins {n_bins})")
    return at_a, before_a, inside_a, tot_a, target_a


def strip_access(const int64_t[:, ::1] pad, const int64_t[::1] lens, const int64_t[::1] up,
                 const int64_t[::1] down):
    """Reported paths -> (fabric links padded with -1, access links implied): a path that
    starts at its source NIC's up link and ends at its destination NIC's down link (``up``,
    ``down``: per row) loses those two; any other path is kept whole (``PathModel._store``)."""
    cdef int64_t n = pad.shape[0], w = pad.shape[1], i, j, ln
    mid_a = np.empty((n, w), np.int64)
    acc_a = np.zeros(n, np.bool_)
    cdef int64_t[:, ::1] mid = mid_a
    cdef uint8_t[::1] acc = acc_a.view(np.uint8)
    cdef bint inner
    with nogil:
        for i in range(n):
            ln = lens[i]
            inner = (ln >= 2 and pad[i, 0] == up[i]
                     and pad[i, (ln - 1 if ln >= 1 else 0)] == down[i])
            acc[i] = inner
            if not inner:
                for j in range(w):
                    mid[i, j] = pad[i, j]
                continue
            for j in range(w - 1):
                mid[i, j] = pad[i, j + 1]
            mid[i, w - 1] = -1
            mid[i, ln - 2] = -1  # the last (access) link, now one place to the left
    return mid_a, acc_a


def group_rows(const int64_t[::1] col, int64_t n_groups):
    """(rows ordered by group, stably; per group its first place in that order, n_groups+1
    entries) for values in [0, n_groups): a counting sort, the ``argsort(kind="stable")`` +
    ``searchsorted`` of the inverse indexes in two linear passes."""
    cdef int64_t n = col.shape[0], i, g
    ptr_a = np.zeros(n_groups + 1, np.int64)
    order_a = np.empty(n, np.int64)
    cdef int64_t[::1] ptr = ptr_a, order = order_a
    for i in range(n):  # checked: an out-of-range value must raise, not corrupt memory
        g = col[i]
        if g < 0 or g >= n_groups:
            raise ValueError(f"value {g} outside [0, {n_groups})")
        ptr[g + 1] += 1
    fill_a = np.empty(n_groups, np.int64)
    cdef int64_t[::1] fill = fill_a
    with nogil:
        for g in range(n_groups):
            ptr[g + 1] += ptr[g]
            fill[g] = ptr[g]
        for i in range(n):
            g = col[i]
            order[fill[g]] = i
            fill[g] += 1
    return order_a, ptr_a



cdef class U64Map:
    """Open-addressing map uint64 -> int64 (first value wins for a repeated key): the route
    hash -> route id lookups, one probe instead of a binary search per path."""

    cdef uint64_t[::1] _keys
    cdef int64_t[::1] _vals
    cdef int64_t _mask

    def __init__(self, const uint64_t[::1] keys, const int64_t[::1] vals):
        cdef int64_t n = keys.shape[0], size = table_size(n), i, s
        self._keys = np.zeros(size, np.uint64)
        self._vals = np.full(size, -1, np.int64)
        self._mask = size - 1
        for i in range(n):
            s = self._slot(keys[i])
            if self._vals[s] < 0:
                self._keys[s] = keys[i]
                self._vals[s] = vals[i]

    cdef inline int64_t _slot(self, uint64_t k) noexcept nogil:
        cdef int64_t s = <int64_t> (((k * _MIX) >> 32) & <uint64_t> self._mask)
        while self._vals[s] >= 0 and self._keys[s] != k:
            s = (s + 1) & self._mask
        return s

    def get(self, const uint64_t[::1] query):
        """Value per query key, -1 where absent."""
        cdef int64_t n = query.shape[0], i
        out_a = np.empty(n, np.int64)
        cdef int64_t[::1] out = out_a
        with nogil:
            for i in range(n):
                out[i] = self._vals[self._slot(query[i])]
        return out_a


def decode_batch(FlowIndex index, const int64_t[::1] src, const int64_t[::1] dst,
                 const ints_t[::1] sport, sport_ok, const ints_t[::1] sent, sent_ok,
                 const ints_t[::1] recv, recv_ok, const double[::1] owd, owd_ok,
                 const int64_t[::1] start, start_ok, const int64_t[::1] dur, dur_ok,
                 int64_t n_nics, int64_t first_row, int64_t[::1] pos, uint64_t[::1] seen,
                 double[::1] sent_out, double[::1] lost_out, double[::1] owd_out,
                 int64_t[:, ::1] scratch):
    """One record batch (table rows ``first_row ..``) in one pass: the flow key of each row
    (as :func:`compose_keys`), its layout position (``pos``), and for a flow's first row
    (``seen``: a bit per flow, zeroed by the caller) its counts gathered into layout order,
    plus the time span of every row (as :func:`span`). The columns are read once; per row,
    the random accesses are the three outputs (the pair table is small, ``seen`` is 1/64 of
    the flows, a flow's port place comes from its pair's slot). Returns (unusable keys, rows
    not in the layout, duplicates, flows filled, unusable counts, first start, last end,
    found a start, found an end). ``scratch``: 6 x (rows + 1) int64 work space, kept by the
    caller across windows (fresh arrays of this size page-fault every 4 KiB)."""
    cdef int64_t n = src.shape[0]
    if scratch.shape[0] < 6 or scratch.shape[1] < n + 1:
        raise ValueError("scratch too small")
    cdef int64_t[::1] key = scratch[0], run_row = scratch[1], run_start = scratch[2]
    cdef int64_t[::1] run_len = scratch[3], run_port = scratch[4], run_dense = scratch[5]
    cdef const uint8_t[::1] p_ok, s_ok, r_ok, o_ok, a_ok, d_ok
    cdef bint hp = sport_ok is not None, hs = sent_ok is not None, hr = recv_ok is not None
    cdef bint ho = owd_ok is not None, ha = start_ok is not None, hd = dur_ok is not None
    if hp:
        p_ok = sport_ok
    if hs:
        s_ok = sent_ok
    if hr:
        r_ok = recv_ok
    if ho:
        o_ok = owd_ok
    if ha:
        a_ok = start_ok
    if hd:
        d_ok = dur_ok
    cdef int64_t i, k, p, r, s, t, runs = 0, prev = -1, lo_run = 0, ln = 0, nxt, sp, sv, rv
    cdef int64_t port0 = 0, dense = 0, at
    cdef int64_t bad_key = 0, missing = 0, dup = 0, filled = 0, bad_counts = 0
    cdef int64_t lo = 0, hi = 0, a, b
    cdef uint64_t bit
    cdef bint any_lo = False, any_hi = False
    with nogil:
        for i in range(n):  # keys and pair runs
            sp = sport[i]
            if (src[i] < 0 or dst[i] < 0 or src[i] == dst[i] or sp < 0 or sp >= 65536
                    or (hp and not p_ok[i])):
                key[i] = -1
                bad_key += 1
                continue
            k = (src[i] * n_nics + dst[i]) * 65536 + sp
            key[i] = k
            if (k >> 16) != prev:
                prev = k >> 16
                run_row[runs] = i
                run_start[runs] = prev
                runs += 1
        run_row[runs] = n
        for r in range(runs):  # pair -> its slot's fields, slots prefetched ahead
            if r + 32 < runs:
                TRI_PREFETCH(&index._slots[_SLOT * index._home(run_start[r + 32])])
            s = index._slot_of(run_start[r])
            if index._slots[_SLOT * s] == run_start[r]:
                run_start[r], run_len[r] = index._slots[_SLOT * s + 1], index._slots[_SLOT * s + 2]
                run_port[r], run_dense[r] = index._slots[_SLOT * s + 3], index._slots[_SLOT * s + 4]
            else:
                run_start[r], run_len[r], run_port[r], run_dense[r] = 0, 0, 0, 0
        r = -1
        nxt = run_row[0] if runs else n
        for i in range(n):
            if not ha or a_ok[i]:  # span over every row, nulls skipped (Arrow's min/max)
                a = start[i]
                if not any_lo or a < lo:
                    lo, any_lo = a, True
                if not hd or d_ok[i]:
                    b = a + dur[i]
                    if not any_hi or b > hi:
                        hi, any_hi = b, True
            k = key[i]
            if k < 0:
                pos[first_row + i] = -1
                continue
            if i == nxt:
                r += 1
                nxt = run_row[r + 1]
                lo_run, ln, port0, dense = run_start[r], run_len[r], run_port[r], run_dense[r]
                # rows in random pair order make runs of one row: look far enough ahead
                if r + 8 < runs and run_len[r + 8]:
                    t = run_start[r + 8]
                    TRI_PREFETCH(&sent_out[t])
                    TRI_PREFETCH(&lost_out[t])
                    TRI_PREFETCH(&owd_out[t])
                    if not run_dense[r + 8]:
                        TRI_PREFETCH(&index.keys[t])
            if ln == 0:
                p = -1
            elif dense:
                at = (k & 0xFFFF) - port0
                p = lo_run + at if 0 <= at < ln else -1
            else:
                p = index._in_run(k, lo_run, ln)
            pos[first_row + i] = p
            if p < 0:
                missing += 1
                continue
            bit = (<uint64_t> 1) << (p & 63)
            if seen[p >> 6] & bit:
                dup += 1
                continue
            seen[p >> 6] |= bit
            filled += 1
            sv = sent[i] if not hs or s_ok[i] else 0
            rv = recv[i] if not hr or r_ok[i] else 0
            if sv <= 0 or rv < 0 or rv > sv:
                bad_counts += 1
            sent_out[p] = <double> sv
            lost_out[p] = <double> (sv - rv)
            owd_out[p] = owd[i] if not ho or o_ok[i] else NAN
    return bad_key, missing, dup, filled, bad_counts, lo, hi, any_lo, any_hi



def first_rows(const int64_t[::1] pos, int64_t n_flows):
    """Per flow its first table row (-1: none), from the per-row positions of
    :func:`decode_batch`; needed only on first windows, unknown paths or dropped rows."""
    cdef int64_t i, p, n = pos.shape[0]
    rows_a = np.full(n_flows, -1, np.int64)
    cdef int64_t[::1] rows = rows_a
    with nogil:
        for i in range(n):
            p = pos[i]
            if p >= 0 and rows[p] < 0:
                rows[p] = i
    return rows_a
