"""Path model: every flow row of a window gets its links (a factorized incidence, ``incidence``).

A flow's path is the ordered list of directed links it crosses. Three cases:

- the record carries the path (the agent discovered it): weight 1 on each of its links, and the
  path is remembered for the flow key (ECMP mapping is stable while routing is);
- the path is null but was reported for the same flow before: the remembered path is used;
- the path was never seen: it is a hidden variable over the topology's ECMP candidates. The
  access links are certain (weight 1); each fabric link gets the share of candidate paths that
  cross it (uniform prior — ECMP hashing spreads flows evenly), so the evidence of the flow is
  spread over the links it may have crossed instead of guessing one path.

The flows an agent probes are the same window after window, so the decoded *layout* (flow
keys in key order, their remembered routes, the incidence and its inverse indexes) is kept
and reused while the window's (src, dst, sport) columns are unchanged; reported paths are
decoded only for flows whose path is unknown plus a rotating 1/64 of the others (a re-learned
path is picked up within 64 windows), and a changed path updates its rows in place.

Everything is indexed by topology link number; rows naming NICs or links that are not in the
topology are dropped and counted (bad input never raises).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.ids import is_nic_id
from fleetlens.topology import Topology

from .incidence import Incidence, RouteTable
from .store import FlowStore

SPORT_SPAN = 1 << 16
_RECHECK = 64


@dataclass
class FlowBatch:
    """One window's flows, as arrays over rows, plus the expanded incidence entries (the
    interface of ``PathModel.batch``, for callers that want plain (row, link, weight) lists)."""

    key: np.ndarray  # int64 flow key
    src: np.ndarray  # NIC numbers
    dst: np.ndarray
    sport: np.ndarray
    sent: np.ndarray  # float64 probe packets
    lost: np.ndarray
    owd_min: np.ndarray  # float64, NaN when nothing arrived
    known: np.ndarray  # bool: path known (reported now or remembered)
    ent_row: np.ndarray  # incidence: row, link, weight
    ent_link: np.ndarray
    ent_w: np.ndarray
    start_ns: int
    end_ns: int
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.key.size)


@dataclass
class Frame:
    """One window's flows in table order, with the factorized incidence (what the engine
    uses); the engine's per-flow stores are aligned with these rows after the first window."""

    key: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    sport: np.ndarray
    sent: np.ndarray
    lost: np.ndarray
    owd_min: np.ndarray
    known: np.ndarray
    inc: Incidence
    start_ns: int
    end_ns: int
    dropped: dict[str, int]
    token: object  # the same object while the flows and their paths stay the same

    @property
    def n(self) -> int:
        return int(self.key.size)

    def batch(self, rows: np.ndarray | None = None) -> FlowBatch:
        """A :class:`FlowBatch` of some rows (all by default) with expanded entries."""
        if rows is None:
            rows = np.arange(self.n)
        e_row, e_link, e_w = self.inc.entries(rows)
        return FlowBatch(
            self.key[rows], self.src[rows], self.dst[rows], self.sport[rows], self.sent[rows],
            self.lost[rows], self.owd_min[rows], self.known[rows], e_row, e_link, e_w,
            self.start_ns, self.end_ns, self.dropped,
        )  # fmt: skip


@dataclass
class _Layout:
    """The decoded flow columns of the last window, reused while they repeat."""

    raw: np.ndarray  # flow key per table row (-1: unusable row)
    rows: np.ndarray | None  # table row of each flow, in key order (None: the table is)
    key: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    sport: np.ndarray
    known: np.ndarray
    inc: Incidence
    dropped: dict[str, int]
    token: object = field(default_factory=object)


class PathModel:
    """Topology indexes, the remembered path of every flow, and ECMP candidate spreading."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.nic_ids = [n.id for n in topo.nics]
        self.link_ids = [lk.id for lk in topo.links]
        self.nic_index = {n: i for i, n in enumerate(self.nic_ids)}
        self.link_index = {lk: i for i, lk in enumerate(self.link_ids)}
        self.n_nics, self.n_links = len(self.nic_ids), len(self.link_ids)
        self._nic_set = pa.array(self.nic_ids, pa.string())
        self._link_set = pa.array(self.link_ids, pa.string())
        self.nic_up = np.full(self.n_nics, -1, np.int64)
        self.nic_down = np.full(self.n_nics, -1, np.int64)
        for i, lk in enumerate(topo.links):
            if is_nic_id(lk.a) and lk.a in self.nic_index:
                self.nic_up[self.nic_index[lk.a]] = i
            if is_nic_id(lk.b) and lk.b in self.nic_index:
                self.nic_down[self.nic_index[lk.b]] = i
        # access link per NIC, with the sentinel n_links where a NIC has none
        self._up = np.where(self.nic_up >= 0, self.nic_up, self.n_links)
        self._dn = np.where(self.nic_down >= 0, self.nic_down, self.n_links)
        leaves = sorted({n.leaf for n in topo.nics})
        self.leaf_names = leaves
        leaf_no = {lf: i for i, lf in enumerate(leaves)}
        self.nic_leaf = np.array([leaf_no[n.leaf] for n in topo.nics], np.int64)
        self.nic_host_name = [n.host for n in topo.nics]
        self.routes = RouteTable(self.n_links)
        self._cand: dict[int, int] = {}  # leaf pair -> candidate route id
        self.max_hops = 2 + 2 * max(1, _depth(topo))
        self.paths = FlowStore({"route": (np.int64, -1, 0), "acc": (np.bool_, True, 0)})
        self.version = 0  # bumped whenever a remembered path is added or changes
        self._layout: _Layout | None = None
        self._decoded: dict[str, tuple[pa.ChunkedArray, np.ndarray]] = {}
        self._tick = 0

    # ---- keys -----------------------------------------------------------------------------
    def flow_key(self, src: np.ndarray, dst: np.ndarray, sport: np.ndarray) -> np.ndarray:
        return (src * self.n_nics + dst) * SPORT_SPAN + (sport % SPORT_SPAN)

    def flow_label(self, key: int) -> str:
        pair, sport = divmod(int(key), SPORT_SPAN)
        s, d = divmod(pair, self.n_nics)
        return f"{self.nic_ids[s]}>{self.nic_ids[d]}:{sport}"

    # ---- decoding -------------------------------------------------------------------------
    def _nics(self, col: pa.ChunkedArray, which: str) -> np.ndarray:
        """NIC number per row (-1: unknown); a column equal to the last window's (a cheap
        buffer compare) is not decoded again."""
        last = self._decoded.get(which)
        if last is not None and last[0].equals(col):
            return last[1]
        idx = pc.index_in(col, value_set=self._nic_set)
        out = np.asarray(idx.fill_null(-1).to_numpy(), np.int64)
        self._decoded[which] = (col, out)
        return out

    def batch(self, table: pa.Table) -> FlowBatch:
        """Decode a WINDOW_SCHEMA table into rows with expanded incidence entries."""
        return self.frame(table).batch()

    def frame(self, table: pa.Table) -> Frame:
        """Decode a WINDOW_SCHEMA table; drop (and count) rows it cannot use."""
        src, dst = self._nics(table["src_nic"], "src"), self._nics(table["dst_nic"], "dst")
        sport = _ints(table["sport"], -1)
        lay = self._layout
        base, pair_bad = self._pair_base(src, dst)
        raw = base + sport
        if pair_bad or (sport.size and (sport.min() < 0 or sport.max() >= SPORT_SPAN)):
            bad = (src < 0) | (dst < 0) | (src == dst) | (sport < 0) | (sport >= SPORT_SPAN)
            raw[bad] = -1
        if lay is None or not np.array_equal(lay.raw, raw):
            lay = self._layout = self._arrange(raw, lay)
        dropped = dict(lay.dropped)
        sent, recv = _ints(table["sent"], 0), _ints(table["received"], 0)
        owd = np.asarray(
            table["owd_min_ns"].combine_chunks().to_numpy(zero_copy_only=False), np.float64
        )
        if lay.rows is not None:
            sent, recv, owd = sent[lay.rows], recv[lay.rows], owd[lay.rows]
        dropped["bad_counts"] = 0
        if sent.size and (sent.min() <= 0 or recv.min() < 0 or bool(np.any(recv > sent))):
            bad = (sent <= 0) | (recv < 0) | (recv > sent)
            dropped["bad_counts"] = int(bad.sum())
        lost = (sent - recv).astype(np.float64)
        sent = sent.astype(np.float64)
        self._remember(table, lay, dropped)
        start, end = _span(table, None if lay.key.size == table.num_rows else lay.rows)
        f = Frame(
            lay.key, lay.src, lay.dst, lay.sport, sent, lost, owd, lay.known, lay.inc,
            start, end, dropped, (lay.token, self.version),
        )  # fmt: skip
        if dropped["bad_counts"]:  # rare: a one-off frame without those rows
            keep = np.flatnonzero(~bad)
            f = Frame(
                f.key[keep], f.src[keep], f.dst[keep], f.sport[keep], f.sent[keep],
                f.lost[keep], f.owd_min[keep], f.known[keep], f.inc.take(keep),
                f.start_ns, f.end_ns, dropped, object(),
            )  # fmt: skip
        return f

    def _pair_base(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, bool]:
        """``(src * n_nics + dst) * SPORT_SPAN`` per row and whether any pair is unusable;
        reused while the decoded NIC columns are the same arrays as last window's."""
        got = getattr(self, "_base", None)
        if got is not None and got[0] is src and got[1] is dst:
            return got[2], got[3]
        base = src * self.n_nics
        base += dst
        base *= SPORT_SPAN
        pair_bad = bool(src.size) and bool(src.min() < 0 or dst.min() < 0 or np.any(src == dst))
        self._base = (src, dst, base, pair_bad)
        return base, pair_bad

    def _arrange(self, raw: np.ndarray, lay: _Layout | None) -> _Layout:
        """Flows in key order; the same flows in another row order keep the layout (only the
        row map changes), anything else builds a new one."""
        n = raw.size
        if n < 2 or bool(np.all(raw[1:] > raw[:-1])):  # already in key order, no duplicates
            order, key = np.arange(n), raw
        else:
            order = np.argsort(raw, kind="stable")  # cheap: agents send nearly sorted runs
            key = raw[order]
        first = int(np.searchsorted(key, 0))
        dropped = {"unknown_nic_or_bad_key": first, "bad_counts": 0, "bad_path": 0}
        rows, key = order[first:], key[first:]
        dup = key[1:] == key[:-1]
        if dup.any():  # the same flow twice in one window: keep its first row
            keep = np.concatenate([[True], ~dup])
            dropped["duplicate_flow"] = int(dup.sum())
            rows, key = rows[keep], key[keep]
        if rows.size == n and bool(np.all(rows == np.arange(n))):
            rows = None
        if lay is not None and np.array_equal(lay.key, key):
            lay.raw, lay.rows, lay.dropped = raw, rows, dropped
            return lay
        pair = key // SPORT_SPAN
        s, d, sp = pair // self.n_nics, pair % self.n_nics, key % SPORT_SPAN
        route, acc, known = self._recall(key, s, d)
        inc = Incidence(
            np.where(acc, self._up[s], self.n_links), np.where(acc, self._dn[d], self.n_links),
            route, self.routes, self.n_links,
        )  # fmt: skip
        return _Layout(raw, rows, key, s, d, sp, known, inc, dropped)

    def _recall(self, key, src, dst) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(route, access-links-implied, known) per flow: remembered or ECMP candidates."""
        at = self.paths.find(key)
        known = at >= 0
        route = np.empty(key.size, np.int64)
        acc = np.ones(key.size, bool)
        route[known] = self.paths.cols["route"][at[known]]
        acc[known] = self.paths.cols["acc"][at[known]]
        unk = np.flatnonzero(~known)
        if unk.size:
            route[unk] = self._candidate_routes(src[unk], dst[unk])
        return route, acc, known

    def _remember(self, table: pa.Table, lay: _Layout, dropped: dict[str, int]) -> None:
        """Store the paths the records carry (only rows whose every link is in the topology).

        Decoded: the rows of flows whose path is unknown, and a rotating 1/_RECHECK slice of
        the table (a zero-copy slice: a re-learned path is picked up within _RECHECK windows).
        """
        self._tick += 1
        col = table["path"]
        n = table.num_rows
        if col.null_count == n or lay.key.size == 0:
            return
        unknown = np.flatnonzero(~lay.known)
        if unknown.size * 4 > lay.key.size:  # mostly unknown (a first window): every row
            pos = np.full(n, -1, np.int64)
            pos[np.arange(n) if lay.rows is None else lay.rows] = np.arange(lay.key.size)
            parts, where, mask = [col], [pos[pos >= 0]], [pos >= 0]
            unknown = unknown[:0]
        else:
            step = -(-n // _RECHECK)
            lo = (self._tick % _RECHECK) * step
            sl = slice(lo, min(lo + step, n))
            k = lay.raw[sl]
            pos = np.searchsorted(lay.key, k)
            ok = (k >= 0) & (pos < lay.key.size)
            ok[ok] = lay.key[np.minimum(pos[ok], lay.key.size - 1)] == k[ok]
            parts, where, mask = [col.slice(sl.start, sl.stop - sl.start)], [pos[ok]], [ok]
            trows = unknown if lay.rows is None else lay.rows[unknown]
            outside = (trows < sl.start) | (trows >= sl.stop)
            unknown, trows = unknown[outside], trows[outside]
        if unknown.size:
            parts.append(col.take(pa.array(trows)))
            where.append(unknown)
            mask.append(np.ones(unknown.size, bool))
        sub = pa.chunked_array([c for p in parts for c in p.chunks], col.type).combine_chunks()
        keep = np.concatenate(mask)
        pos = np.concatenate(where)
        has = np.asarray(sub.is_valid().to_numpy(zero_copy_only=False), bool)
        use = keep & has
        if not use.any():
            return
        pos, sub = pos[has[keep]], sub.filter(pa.array(use))
        lens = np.diff(np.asarray(sub.offsets.to_numpy(), np.int64))
        flat = sub.flatten()
        links = np.asarray(pc.index_in(flat, value_set=self._link_set).fill_null(-1)
                           .to_numpy(), np.int64)  # fmt: skip
        owner = np.repeat(np.arange(lens.size), lens)
        bad = np.bincount(owner[links < 0], minlength=lens.size) > 0
        bad |= (lens == 0) | (lens > self.max_hops)
        dropped["bad_path"] = int(bad.sum())
        good = ~bad
        if not good.any():
            return
        width = self.max_hops
        pad = np.full((lens.size, width), -1, np.int64)
        col_in_row = np.arange(links.size) - np.repeat(np.cumsum(lens) - lens, lens)
        fits = col_in_row < width
        pad[owner[fits], col_in_row[fits]] = links[fits]
        self._store(lay, pos[good], pad[good], lens[good])

    def _store(self, lay: _Layout, pos, pad, lens) -> None:
        s, d = lay.src[pos], lay.dst[pos]
        last = pad[np.arange(lens.size), np.maximum(lens - 1, 0)]
        acc = (lens >= 2) & (pad[:, 0] == self.nic_up[s]) & (last == self.nic_down[d])
        mid = pad.copy()
        inner = np.flatnonzero(acc)
        mid[inner, :-1] = pad[inner, 1:]
        mid[inner, -1] = -1
        mid[inner, lens[inner] - 2] = -1  # drop the last (access) link
        route = self.routes.known(mid)
        k = lay.key[pos]
        at = self.paths.locate(k)
        old_r, old_a = self.paths.cols["route"][at], self.paths.cols["acc"][at]
        changed = (old_r != route) | (old_a != acc) | ~lay.known[pos]
        if not changed.any():
            return
        self.version += 1
        self.paths.cols["route"][at], self.paths.cols["acc"][at] = route, acc
        c = np.flatnonzero(changed)
        p = pos[c]
        up = np.where(acc[c], self._up[s[c]], self.n_links)
        dn = np.where(acc[c], self._dn[d[c]], self.n_links)
        lay.inc.set_rows(p, up, dn, route[c])
        lay.known[p] = True

    # ---- incidence ------------------------------------------------------------------------
    def incidence(self, key: np.ndarray) -> Incidence:
        """Incidence of stored flows given by their keys."""
        pair = key // SPORT_SPAN
        src, dst = pair // self.n_nics, pair % self.n_nics
        route, acc, _ = self._recall(key, src, dst)
        up = np.where(acc, self._up[src], self.n_links)
        dn = np.where(acc, self._dn[dst], self.n_links)
        return Incidence(up, dn, route, self.routes, self.n_links)

    def incidence_for_keys(self, key: np.ndarray) -> tuple[np.ndarray, ...]:
        """Incidence entries of stored flows (rows = positions in ``key``)."""
        return self.incidence(key).entries()

    def _candidate_routes(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Access links with weight 1, fabric links weighted by their share of ECMP paths."""
        n_leaf = len(self.leaf_names)
        pair = self.nic_leaf[src] * n_leaf + self.nic_leaf[dst]
        uniq, inv = np.unique(pair, return_inverse=True)
        ids = np.array([self._leaf_pair(int(p)) for p in uniq.tolist()], np.int64)
        return ids[inv.reshape(-1)]

    def _leaf_pair(self, pair: int) -> int:
        if pair not in self._cand:
            n_leaf = len(self.leaf_names)
            a, b = self.leaf_names[pair // n_leaf], self.leaf_names[pair % n_leaf]
            shares = {self.link_index[lk]: w for lk, w in self.topo.link_shares(a, b).items()}
            links = np.array(sorted(shares), np.int64)
            w = np.array([shares[i] for i in links.tolist()], np.float64)
            self._cand[pair] = self.routes.add(b"c%d" % pair, links, w)
        return self._cand[pair]


def _span(table: pa.Table, rows: np.ndarray | None) -> tuple[int, int]:
    """(first start, last end) over the kept rows."""
    if rows is None:  # every row kept: Arrow's kernels, no conversion
        if table.num_rows == 0:
            return 0, 0
        start = pc.min(table["start_ns"]).as_py()
        end = pc.max(pc.add(table["start_ns"], table["duration_ns"])).as_py()
        return int(start or 0), int(end or 0)
    starts = _ints(table["start_ns"], 0)[rows]
    ends = starts + _ints(table["duration_ns"], 0)[rows]
    if starts.size == 0:
        return 0, 0
    return int(starts.min()), int(ends.max())


def _ints(col: pa.ChunkedArray, fill: int) -> np.ndarray:
    arr = col.combine_chunks()
    return np.asarray(arr.fill_null(fill).to_numpy(zero_copy_only=False), np.int64)


def _depth(topo: Topology) -> int:
    """Switch tiers above the leaves (1 for leaf-spine, 2 for a 3-tier fat-tree)."""
    return max(s.tier for s in topo.switches) - 1 if topo.switches else 1
