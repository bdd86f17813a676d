"""Flow -> link incidence, factorized so that per-window work stays linear in the flows.

A flow row crosses (a) the up access link of its source NIC, (b) the down access link of its
destination NIC and (c) the fabric links of its *route*. Routes are few (a leaf-spine has one
per (source leaf, destination leaf, spine), plus one ECMP candidate set per leaf pair), so the
incidence is kept as three integer columns per row plus a small route -> links CSR table, and
never expanded to millions of (row, link) entries except for the rows a fit actually needs:

- ``link_sums(x)``: ``A^T x`` (packets per link) in three ``bincount`` passes;
- ``entries(rows)``: the (row, link, weight) entries of a subset of rows;
- ``rows_of(links)``: the rows crossing any of ``links``, from inverse indexes built once per
  layout (the flows an agent probes are the same window after window) and dropped when a route
  changes;
- ``link_sums_of(rows, x)`` and ``row_sums(rows, per_link)``: ``A^T x`` and ``A v`` over a
  subset of rows, per route those rows take (what the loss fit needs of the rows a chosen link
  may carry, which with paths unknown are a leaf's whole share of the window);
- ``hop_factors(sent)``: per link, the hop-packets of its rows per packet of its (weighted)
  sum, what the background model of ``evidence`` scales by.
"""

from __future__ import annotations

import numpy as np

from . import _fast
from .store import unique

_MIX = np.uint64(0x9E3779B97F4A7C15)
_MAP_MAX = 1 << 20  # routes up to which RouteTable.known looks hashes up in a U64Map


class RouteTable:
    """Distinct fabric-link sequences (known paths) and ECMP candidate sets, as CSR."""

    def __init__(self, n_links: int) -> None:
        self.n_links = n_links
        self._index: dict[bytes, int] = {}  # tag -> id of routes added one by one
        # routes in blocks of (links per route, links, weights): a fat-tree has about one
        # distinct route per flow, so known paths are appended in bulk, never one by one
        self._blocks: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
        self._count = 0
        self._csr: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._by_link: tuple[np.ndarray, np.ndarray] | None = None
        # known-path routes by row hash: sorted hashes, their route ids, padded rows by id
        self._hash = np.empty(0, np.uint64)
        self._hash_id = np.empty(0, np.int64)
        self._hash_map: _fast.U64Map | None = None  # hash -> id of the first sorted match
        self._pad_blocks: list[tuple[int, np.ndarray]] = []
        self._pads: np.ndarray | None = None
        self.add(b"empty", np.empty(0, np.int64), np.empty(0))  # route 0: no fabric links

    def __len__(self) -> int:
        return self._count

    def _append(self, lens: np.ndarray, links: np.ndarray, w: np.ndarray) -> int:
        first = self._count
        self._blocks.append((np.asarray(lens, np.int64), np.asarray(links, np.int64),
                             np.asarray(w, np.float64)))  # fmt: skip
        self._count += int(lens.size)
        self._csr = self._by_link = self._pads = None
        return first

    def add(self, tag: bytes, links: np.ndarray, w: np.ndarray) -> int:
        got = self._index.get(tag)
        if got is None:
            links = np.asarray(links, np.int64)
            got = self._index[tag] = self._append(np.array([links.size]), links, w)
        return got

    def known(self, mid: np.ndarray) -> np.ndarray:
        """Route id of every row of ``mid`` (links padded with -1 at the end, weight 1)."""
        if mid.shape[0] == 0:
            return np.empty(0, np.int64)
        h = _row_hash(mid)
        if self._hash.size <= _MAP_MAX:  # one probe per path (a leaf-spine: few routes)
            if self._hash_map is None:
                self._hash_map = _fast.U64Map(self._hash, self._hash_id)
            ids = self._hash_map.get(h)  # the id of the first sorted match, -1 for none
        else:  # a fat-tree has about a route per flow: a map would cost more than it saves
            at = np.searchsorted(self._hash, h)
            found = at < self._hash.size
            found[found] = self._hash[at[found]] == h[found]
            ids = np.where(found, self._hash_id[np.minimum(at, self._hash.size - 1)], -1)
        hit = ids >= 0
        miss = ~hit
        if hit.any():  # a hash match must also be the same links (collisions are possible)
            rows = np.flatnonzero(hit)
            same = np.all(self._pad_matrix(mid.shape[1])[ids[rows]] == mid[rows], axis=1)
            miss[rows[~same]] = True
        rows = np.flatnonzero(miss)
        if rows.size:
            first, inv = _unique_rows(mid[rows])
            uniq = mid[rows[first]].astype(np.int64)
            on = uniq >= 0
            start = self._append(on.sum(axis=1), uniq[on], np.ones(int(on.sum())))
            new = start + np.arange(first.size)
            self._pad_blocks.append((start, uniq))
            ids[rows] = new[inv]
            hs = np.concatenate([self._hash, h[rows[first]]])
            order = np.argsort(hs, kind="stable")
            self._hash = hs[order]
            self._hash_id = np.concatenate([self._hash_id, new])[order]
            self._hash_map = None
        return ids

    def _pad_matrix(self, width: int) -> np.ndarray:
        got = self._pads
        if got is None or got.shape != (self._count, width):
            got = np.full((self._count, width), -2, np.int64)
            for start, block in self._pad_blocks:
                if block.shape[1] == width:
                    got[start : start + block.shape[0]] = block
            self._pads = got
        return got

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        if self._csr is None:
            lens = np.concatenate([b[0] for b in self._blocks])
            ptr = np.concatenate([[0], np.cumsum(lens)])
            link = np.concatenate([b[1] for b in self._blocks])
            w = np.concatenate([b[2] for b in self._blocks])
            self._csr = (ptr, link, w)
        return self._csr

    def hops(self) -> np.ndarray:
        """Per route, its fabric hops: the sum of its weights (an ECMP candidate set's shares
        add up to the length of each of its equal-length paths)."""
        ptr, _, w = self.csr()
        owner = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
        return np.bincount(owner, w, ptr.size - 1)

    def link_sum(self, per_route: np.ndarray, whole: bool = False) -> np.ndarray:
        """Per link: sum over routes of the route's value times the link's weight in it (1
        with ``whole``: every route that may cross the link counted in full)."""
        ptr, link, w = self.csr()
        owner = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
        return np.bincount(link, per_route[owner] if whole else w * per_route[owner], self.n_links)

    def entries_of(self, routes: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(position in ``routes``, link, weight) of every link of the given routes."""
        ptr, link, w = self.csr()
        at = _ranges(np.arange(link.size), ptr[routes], ptr[routes + 1])
        return np.repeat(np.arange(routes.size), ptr[routes + 1] - ptr[routes]), link[at], w[at]

    def longest(self) -> int:
        """The most fabric links any route has."""
        ptr = self.csr()[0]
        return int(np.diff(ptr).max(initial=0))

    def routes_of(self, links: np.ndarray) -> np.ndarray:
        """Routes containing any of ``links``."""
        if self._by_link is None:
            ptr, link, _ = self.csr()
            owner = np.repeat(np.arange(ptr.size - 1), np.diff(ptr))
            order, lptr = _fast.group_rows(_c(link, np.int64), self.n_links)
            self._by_link = (lptr, owner[order])
        lptr, routes = self._by_link
        return unique(_ranges(routes, lptr[links], lptr[links + 1]))


class Incidence:
    """The incidence of a set of flow rows (see the module doc)."""

    def __init__(
        self, up: np.ndarray, dn: np.ndarray, route: np.ndarray, routes: RouteTable, n_links: int
    ) -> None:
        # up/dn: access link number per row, ``n_links`` (a sentinel) when not on the path
        self.up, self.dn, self.route = up, dn, route
        self.routes, self.n_links = routes, n_links
        self._inverse: tuple[np.ndarray, ...] | None = None  # see _index
        self._hops: np.ndarray | None = None  # see hops
        self._factors: tuple[np.ndarray, np.ndarray] | None = None  # see hop_factors

    @property
    def n(self) -> int:
        return int(self.route.size)

    def set_rows(self, rows: np.ndarray, up: np.ndarray, dn: np.ndarray, route: np.ndarray) -> None:
        """Paths of some rows changed: update them in place (the inverse index is rebuilt)."""
        self.up[rows], self.dn[rows], self.route[rows] = up, dn, route
        self._inverse = self._hops = self._factors = None

    def take(self, rows: np.ndarray) -> Incidence:
        return Incidence(self.up[rows], self.dn[rows], self.route[rows], self.routes, self.n_links)

    def link_sums(self, x: np.ndarray, whole: bool = False) -> np.ndarray:
        """``A^T x``: the three bincounts (up, down, route) in one Cython pass; ``whole``:
        with every weight read as 1 (a row counted in full on each link it may cross)."""
        n = self.n_links
        up, dn, rt = _fast.link_sums(
            _c(self.up, np.int64), _c(self.dn, np.int64), _c(self.route, np.int64),
            _c(x, np.float64), n, len(self.routes),
        )  # fmt: skip
        return (up[:n] + dn[:n]) + self.routes.link_sum(rt, whole)

    def hops(self) -> np.ndarray:
        """Per row, the links it crosses: its access links and its route's fabric hops (kept
        while the rows' paths are)."""
        if self._hops is None:
            n = self.n_links
            h = (self.up < n).astype(np.float64) + (self.dn < n)
            self._hops = h + self.routes.hops()[self.route]
        return self._hops

    def hop_factors(self, sent: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per link, two ratios to its weighted packets ``S_l = Σ_r w_rl sent_r``, over the
        rows that may cross it (``sent`` their packets, ``h`` their hops):

        - ``Σ_r w_rl sent_r h_r / S_l``, the mean hop count of its rows (what its weighted
          lost count ``Σ_r w_rl lost_r`` is, per packet, under a loss per hop);
        - ``Σ_r sent_r h_r / S_l`` over every row with ``w_rl > 0``, counted whole: the most
          a fit can put on the link is every lost packet of those rows (with a path spread
          over N ECMP candidates the fit explains a row's loss by N times the rate on one).

        Kept while the rows' paths are (the same flows send at the same rates window after
        window, so the first counts given stand for later ones). A link without packets gets
        the mean hop count over all rows."""
        if self._factors is None:
            h = self.hops()
            s = self.link_sums(sent)
            total = float(sent.sum())
            every = float(sent @ h) / total if total > 0 else 2.0
            on = s > 0
            per = np.maximum(s, 1e-300)
            self._factors = (
                np.where(on, self.link_sums(sent * h) / per, every),
                np.where(on, self.link_sums(sent * h, whole=True) / per, every),
            )
        return self._factors

    def entries(self, rows: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(row, link, weight) entries; rows numbered by position in ``rows`` when given."""
        if rows is None:
            rows = np.arange(self.n)
        local = np.arange(rows.size)
        up, dn, route = self.up[rows], self.dn[rows], self.route[rows]
        has_up, has_dn = up < self.n_links, dn < self.n_links
        ptr, link, w = self.routes.csr()
        cnt = ptr[route + 1] - ptr[route]
        e_row = np.repeat(local, cnt)
        within = np.arange(e_row.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        at = np.repeat(ptr[route], cnt) + within
        return (
            np.concatenate([local[has_up], local[has_dn], e_row]),
            np.concatenate([up[has_up], dn[has_dn], link[at]]),
            np.concatenate([np.ones(int(has_up.sum()) + int(has_dn.sum())), w[at]]),
        )

    def link_sums_of(self, rows: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``A^T x`` over ``rows`` alone (``x`` per row of them), without expanding their
        entries: the fabric part per route those rows take, then over those routes' links
        (a fit's few links' rows take few routes: an unknown path's ECMP spread, ~16 links
        on the reference fabric, is one route per leaf pair)."""
        n = self.n_links
        up = np.bincount(self.up[rows], x, n + 1)[:n]
        dn = np.bincount(self.dn[rows], x, n + 1)[:n]
        per_route = np.bincount(self.route[rows], x, len(self.routes))
        used = np.flatnonzero(per_route)
        pos, link, w = self.routes.entries_of(used)
        return (up + dn) + np.bincount(link, w * per_route[used][pos], n)

    def row_sums(self, rows: np.ndarray, per_link: np.ndarray) -> np.ndarray:
        """Per row of ``rows``: the sum over its links of weight times ``per_link`` (a row's
        loss rate from the links' rates; its weight on one link from that link's indicator),
        per route those rows take rather than per entry."""
        v = np.append(per_link, 0.0)  # the access columns' sentinel (n_links) reads 0
        route = self.route[rows]
        used = np.zeros(len(self.routes), bool)
        used[route] = True
        ids = np.flatnonzero(used)
        pos, link, w = self.routes.entries_of(ids)
        per_route = np.zeros(len(self.routes))
        per_route[ids] = np.bincount(pos, w * v[link], ids.size)
        return (v[self.up[rows]] + v[self.dn[rows]]) + per_route[route]

    def max_links(self) -> int:
        """The most links any row may cross (both access links and the longest route)."""
        return 2 + self.routes.longest()

    def rows_of(self, links: np.ndarray) -> np.ndarray:
        """Sorted rows crossing any of ``links``."""
        links = np.asarray(links, np.int64)
        if links.size == 0:
            return np.empty(0, np.int64)
        up_o, up_p, dn_o, dn_p, rt_o, rt_p = self._index()
        routes = self.routes.routes_of(links)
        # routes added to the shared table since the index was built (another incidence's,
        # e.g. the acks'): no row of this one takes them
        routes = routes[routes < rt_p.size - 1]
        parts = [
            _ranges(up_o, up_p[links], up_p[links + 1]),
            _ranges(dn_o, dn_p[links], dn_p[links + 1]),
            _ranges(rt_o, rt_p[routes], rt_p[routes + 1]),
        ]
        return unique(np.concatenate(parts))

    def _index(self) -> tuple[np.ndarray, ...]:
        """The inverse indexes of ``rows_of``: (rows ordered by value, each value's first
        place) of the up, down and route columns."""
        if self._inverse is None:
            out: list[np.ndarray] = []
            for col, size in ((self.up, self.n_links + 1), (self.dn, self.n_links + 1),
                              (self.route, len(self.routes))):  # fmt: skip
                out += _fast.group_rows(_c(col, np.int64), size)  # a counting sort
            self._inverse = tuple(out)
        return self._inverse


def _ranges(values: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """Concatenation of ``values[s:e]`` for every (s, e), without a Python loop."""
    lens = np.maximum(ends - starts, 0)
    total = int(lens.sum())
    if total == 0:
        return np.empty(0, values.dtype)
    idx = np.arange(total) - np.repeat(np.cumsum(lens) - lens, lens) + np.repeat(starts, lens)
    return values[idx]


def _c(a: np.ndarray, dtype: type) -> np.ndarray:
    return np.ascontiguousarray(a, dtype)


def _row_hash(mid: np.ndarray) -> np.ndarray:
    """Per row ``h = (h ^ (x + 2)) * MIX`` over its columns (``_fast.route_hash``)."""
    return _fast.route_hash(_c(mid, np.int64))


def _reference_row_hash(mid: np.ndarray) -> np.ndarray:
    """The numpy definition of :func:`_row_hash` (tests compare the two)."""
    h = np.zeros(mid.shape[0], np.uint64)
    with np.errstate(over="ignore"):
        for j in range(mid.shape[1]):
            h = (h ^ (mid[:, j].astype(np.int64) + 2).astype(np.uint64)) * _MIX
    return h


def _unique_rows(mid: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(first row of each distinct row, inverse) for a small-int matrix, via a 64-bit hash
    checked for collisions (falls back to an exact row sort if two rows ever share one)."""
    _, first, inv = unique(_row_hash(mid), first=True, inverse=True)
    if not np.array_equal(mid[first[inv]], mid):
        _, first, inv = np.unique(mid, axis=0, return_index=True, return_inverse=True)
    return first, inv.reshape(-1)
