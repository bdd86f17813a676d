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

from fleetlens._strindex import StrIndex
from fleetlens.topology import Topology

from . import _fast
from .incidence import Incidence, RouteTable
from .store import FlowStore, unique

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
    # per row: acks the receiver sent (one per pair it heard, at least half the received
    # packets) and those lost on the way back; None when no row lost an ack
    acks: tuple[np.ndarray, np.ndarray] | None = None

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

    index: _fast.FlowIndex  # flow key -> position in ``key``
    key: np.ndarray  # flow keys, sorted
    src: np.ndarray
    dst: np.ndarray
    sport: np.ndarray
    known: np.ndarray
    inc: Incidence
    pending: bool = False  # unknown flows still lack their candidate routes
    token: object = field(default_factory=object)


class PathModel:
    """Topology indexes, the remembered path of every flow, and ECMP candidate spreading."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        ix = topo.index
        self.nic_ids, self.link_ids = list(ix.nic_ids), list(ix.link_ids)
        self.nic_index, self.link_index = ix.nic, ix.link
        self.n_nics, self.n_links = len(self.nic_ids), len(self.link_ids)
        self._nic_str = StrIndex(self.nic_ids)
        self._nic_set = pa.array(self.nic_ids, pa.string())
        self._link_str = StrIndex(self.link_ids)
        self.nic_up, self.nic_down = ix.nic_up, ix.nic_down  # -1: no access link
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
        self._work: dict[str, np.ndarray] = {}  # see _scratch
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
        """NIC number per row (-1: unknown or null); a column equal to the last window's (a
        cheap buffer compare) is not decoded again."""
        last = self._decoded.get(which)
        if last is not None and _same_strings(last[0], col):
            return last[1]
        out = np.empty(len(col), np.int64)
        at, ours = 0, True
        for chunk in _strings(col).chunks:
            part = out[at : at + len(chunk)]
            if ours:  # rows of a flow pair come together: mostly the same id as the row before
                off, data, ok = _string_buffers(chunk)
                ours = 2 * self._nic_str.lookup(off, data, ok, part) >= len(chunk)
            else:  # rows in random order: Arrow's hashing does better than ours there
                idx = pc.index_in(chunk, value_set=self._nic_set).fill_null(-1)
                part[:] = idx.to_numpy(zero_copy_only=False)
            at += len(chunk)
        self._decoded[which] = (col, out)
        return out

    def batch(self, table: pa.Table) -> FlowBatch:
        """Decode a WINDOW_SCHEMA table into rows with expanded incidence entries."""
        return self.frame(table).batch()

    def frame(self, table: pa.Table) -> Frame:
        """Decode a WINDOW_SCHEMA table; drop (and count) rows it cannot use."""
        src, dst = self._nics(table["src_nic"], "src"), self._nics(table["dst_nic"], "dst")
        batches = table.select(_COUNTS).to_batches()  # the columns chunked alike, zero-copy
        lay = self._layout
        got = self._decode(lay, batches, src, dst) if lay is not None else None
        if lay is None or got is None:  # new or vanished flows: a new layout (sorts the keys once)
            lay = self._layout = self._arrange(self._keys(batches, src, dst), lay)
            got = self._decode(lay, batches, src, dst)
            assert got is not None  # the layout is made of exactly these keys
        pos, dropped, sent, lost, owd, span = got
        rows = _Rows(pos, lay.key.size)
        self._remember(table, lay, pos, rows, dropped)
        if lay.pending:
            self._fill_candidates(lay)
        if lay.key.size != table.num_rows:  # rows dropped: the span of the kept ones
            span = _span_of_rows(table, rows.get())
        acks = _acks(table, pos, lay.key.size)
        f = Frame(
            lay.key, lay.src, lay.dst, lay.sport, sent, lost, owd, lay.known, lay.inc,
            *span, dropped, (lay.token, self.version), acks,
        )  # fmt: skip
        if dropped["bad_counts"]:  # rare: a one-off frame without those rows
            keep = np.flatnonzero((sent > 0) & (lost >= 0) & (lost <= sent))
            f = Frame(
                f.key[keep], f.src[keep], f.dst[keep], f.sport[keep], f.sent[keep],
                f.lost[keep], f.owd_min[keep], f.known[keep], f.inc.take(keep),
                f.start_ns, f.end_ns, dropped, object(),
                None if acks is None else (acks[0][keep], acks[1][keep]),
            )  # fmt: skip
        return f

    def _scratch(self, name: str, size: int) -> np.ndarray:
        """An int64 work array of ``size`` kept across windows (only used inside ``frame``):
        new arrays of millions of entries are fresh pages, a page fault every 4 KiB."""
        got = self._work.get(name)
        if got is None or got.size < size:
            got = self._work[name] = np.empty(size, np.int64)
        return got[:size]

    def _keys(self, batches: list[pa.RecordBatch], src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Flow key per table row, -1 where the row is unusable."""
        raw = np.empty(src.size, np.int64)
        at = 0
        for b in batches:
            sport, ok = _numbers(b.column(0))
            sl = slice(at, at + b.num_rows)
            _fast.compose_keys(src[sl], dst[sl], sport, ok, self.n_nics, raw[sl])
            at += b.num_rows
        return raw

    def _decode(
        self, lay: _Layout, batches: list[pa.RecordBatch], src: np.ndarray, dst: np.ndarray
    ) -> _Decoded | None:
        """Every batch in one fused pass (``_fast.decode_batch``): (layout position per table
        row, dropped counts, sent, lost, owd_min per flow, span of all rows) when the window's
        usable keys are exactly the layout's (in any row order); else None."""
        n_flows = lay.key.size
        pos = self._scratch("pos", src.size)
        seen = self._scratch("seen", (n_flows + 63) // 64).view(np.uint64)
        seen.fill(0)
        out = np.empty(n_flows), np.empty(n_flows), np.empty(n_flows)
        most = max((b.num_rows for b in batches), default=0)
        work = self._scratch("batch", 6 * (most + 1)).reshape(6, most + 1)
        bad_key = dup = filled = bad_counts = at = 0
        lo: int | None = None
        hi: int | None = None
        for b in batches:
            cols = _batch_columns(b)
            sl = slice(at, at + b.num_rows)
            got = _fast.decode_batch(lay.index, src[sl], dst[sl], *cols, self.n_nics, at,
                                     pos, seen, *out, work)  # fmt: skip
            if got[1]:  # a flow the layout does not have
                return None
            bad_key, dup = bad_key + got[0], dup + got[2]
            filled, bad_counts = filled + got[3], bad_counts + got[4]
            lo = got[5] if got[7] and (lo is None or got[5] < lo) else lo
            hi = got[6] if got[8] and (hi is None or got[6] > hi) else hi
            at += b.num_rows
        if filled != n_flows:  # a layout flow is not in this window
            return None
        dropped = {"unknown_nic_or_bad_key": bad_key, "bad_counts": bad_counts, "bad_path": 0}
        if dup:  # the same flow twice in one window: its first row counts
            dropped["duplicate_flow"] = dup
        return pos, dropped, *out, (int(lo or 0), int(hi or 0))

    def _arrange(self, raw: np.ndarray, lay: _Layout | None) -> _Layout:
        """The flows in key order (unusable rows and repeats left out); the same key set as
        the last layout keeps it (remembered routes, incidence, inverse indexes)."""
        key = unique(raw[raw >= 0])
        if lay is not None and np.array_equal(lay.key, key):
            return lay
        pair = key // SPORT_SPAN
        s, d, sp = pair // self.n_nics, pair % self.n_nics, key % SPORT_SPAN
        # unknown flows get their ECMP candidates after this window's paths are read (in
        # ``_fill_candidates``): on a first window with paths nearly every flow is learned,
        # and the candidate sets of a fat-tree's leaf pairs took a minute to build
        route, acc, known = self._recall(key, s, d, candidates=False)
        inc = Incidence(
            np.where(acc, self._up[s], self.n_links), np.where(acc, self._dn[d], self.n_links),
            route, self.routes, self.n_links,
        )  # fmt: skip
        return _Layout(_fast.FlowIndex(key), key, s, d, sp, known, inc, pending=True)

    def _recall(
        self, key: np.ndarray, src: np.ndarray, dst: np.ndarray, candidates: bool = True
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(route, access-links-implied, known) per flow: remembered or ECMP candidates
        (``candidates=False``: route 0, no links, until ``_fill_candidates``)."""
        at = self.paths.find(key)
        known = at >= 0
        route = np.empty(key.size, np.int64)
        acc = np.ones(key.size, bool)
        route[known] = self.paths.cols["route"][at[known]]
        acc[known] = self.paths.cols["acc"][at[known]]
        unk = np.flatnonzero(~known)
        if unk.size:
            route[unk] = self._candidate_routes(src[unk], dst[unk]) if candidates else 0
        return route, acc, known

    def _fill_candidates(self, lay: _Layout) -> None:
        """ECMP candidate routes for the layout's flows still without a path."""
        lay.pending = False
        unk = np.flatnonzero(~lay.known)
        if unk.size:
            s, d = lay.src[unk], lay.dst[unk]
            route = self._candidate_routes(s, d)
            lay.inc.set_rows(unk, self._up[s], self._dn[d], route)

    def _remember(
        self, table: pa.Table, lay: _Layout, pos: np.ndarray, rows: _Rows, dropped: dict[str, int]
    ) -> None:
        """Store the paths the records carry (only rows whose every link is in the topology).

        Decoded: the rows of flows whose path is unknown, and a rotating 1/_RECHECK slice of
        the table (a zero-copy slice: a re-learned path is picked up within _RECHECK windows).
        ``pos``: layout position per table row; ``rows``: table row per layout flow.
        """
        self._tick += 1
        col = table["path"]
        n = table.num_rows
        if col.null_count == n or lay.key.size == 0:
            return
        unknown = self._unknown(lay)
        if unknown.size * 4 > lay.key.size:  # mostly unknown (a first window): every row
            first = np.zeros(n, bool)
            first[rows.get()] = True
            parts, where, mask = [col], [pos[first]], [first]
            unknown = unknown[:0]
        else:
            step = -(-n // _RECHECK)
            lo = (self._tick % _RECHECK) * step
            sl = slice(lo, min(lo + step, n))
            at = pos[sl]
            ok = at >= 0
            parts, where, mask = [col.slice(sl.start, sl.stop - sl.start)], [at[ok]], [ok]
            trows = rows.get()[unknown] if unknown.size else unknown
            outside = (trows < sl.start) | (trows >= sl.stop)
            unknown, trows = unknown[outside], trows[outside]
        if unknown.size:
            parts.append(col.take(pa.array(trows)))
            where.append(unknown)
            mask.append(np.ones(unknown.size, bool))
        # each chunk decoded where it lies (no combine / filter copies of the list column)
        mats = [self._path_matrix(c) for p in parts for c in p.chunks]
        if not mats:
            return
        keep = np.concatenate(mask)
        at = np.concatenate(where)
        has = np.concatenate([m[3] for m in mats])
        use = keep & has
        if not use.any():
            return
        at = at[has[keep]]
        lens, pad, bad = (np.concatenate([m[i] for m in mats]) for i in range(3))
        if not use.all():
            lens, pad, bad = lens[use], pad[use], bad[use]
        dropped["bad_path"] = int(bad.sum())
        good = ~bad
        if not good.any():
            return
        if not good.all():
            at, pad, lens = at[good], pad[good], lens[good]
        self._store(lay, at, pad, lens)

    def _path_matrix(self, arr: pa.Array) -> tuple[np.ndarray, ...]:
        """(links per path, link numbers padded with -1 to max_hops, bad, valid) of a
        list<string> array (a null path: not valid)."""
        if not pa.types.is_list(arr.type) or not pa.types.is_string(arr.type.value_type):
            arr = arr.cast(pa.list_(pa.string()))
        off = np.frombuffer(arr.buffers()[1], np.int32)[arr.offset : arr.offset + len(arr) + 1]
        s_off, data, s_ok = _string_buffers(arr.values)
        ok = _valid(arr)
        lens, pad, bad = _fast.path_matrix(
            off, ok, s_off, data, s_ok, self._link_str, self.max_hops
        )
        valid = np.ones(len(arr), bool) if ok is None else ok.view(bool)
        return lens, pad, bad, valid

    def _unknown(self, lay: _Layout) -> np.ndarray:
        """Layout flows without a known path; cached while no path is learned (``known``
        only changes in ``_store``, which bumps ``version``)."""
        got = getattr(self, "_unknown_cache", None)
        if got is None or got[0] is not lay.token or got[1] != self.version:
            got = self._unknown_cache = (lay.token, self.version, np.flatnonzero(~lay.known))
        return got[2]

    def _store(self, lay: _Layout, pos: np.ndarray, pad: np.ndarray, lens: np.ndarray) -> None:
        s, d = lay.src[pos], lay.dst[pos]
        mid, acc = _fast.strip_access(pad, lens, self.nic_up[s], self.nic_down[d])
        route = self.routes.known(mid)
        if self.paths.aligned(lay.key):  # the usual case: layout positions are store rows
            at = pos
        else:  # in key order (stable: a repeated flow's last row still wins), so an empty
            # store fills without sorting and lookups walk the sorted keys in order
            order, _ = _fast.group_rows(pos, lay.key.size)
            pos, acc, route, s, d = pos[order], acc[order], route[order], s[order], d[order]
            n_before = len(self.paths)
            at = self.paths.locate(lay.key[pos])
            grown = len(self.paths) == lay.key.size > n_before  # it holds the layout's flows:
            if grown and not self.paths.aligned(lay.key):  # key order, so that the next
                self.paths.sort()  # windows index it by layout position
                at = self.paths.find(lay.key[pos])
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

    def ack_incidence(self, f: Frame) -> Incidence:
        """The incidence of the frame's acks: each row's reverse flow, from its destination's
        probe port to its source port, through the destination's up-link, the fabric links of
        the reverse direction and the source's down-link. The agents never learn that fabric
        path, so it is always the ECMP candidates' spread, as for an unknown forward path."""
        up, dn = self._up[f.dst], self._dn[f.src]
        return Incidence(up, dn, self._candidate_routes(f.dst, f.src), self.routes, self.n_links)

    def _candidate_routes(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """Access links with weight 1, fabric links weighted by their share of ECMP paths."""
        n_leaf = len(self.leaf_names)
        pair = self.nic_leaf[src] * n_leaf + self.nic_leaf[dst]
        uniq, inv = unique(pair, inverse=True)
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


def _acks(table: pa.Table, pos: np.ndarray, n_flows: int) -> tuple[np.ndarray, np.ndarray] | None:
    """(acks sent, acks lost) per layout flow from the rows that carry ``acks_lost`` (records
    of older agents do not: their flows count no acks); None when no row lost an ack (the
    engine then fits the probes alone: one kernel call instead of decoding the columns)."""
    if "acks_lost" not in table.column_names:
        return None
    col = table["acks_lost"]
    if not (pc.max(col).as_py() or 0) > 0:
        return None
    lost = pc.fill_null(col, 0).to_numpy().astype(np.float64)
    on = pos >= 0
    if col.null_count:
        on &= pc.is_valid(col).to_numpy(zero_copy_only=False)
    received = pc.fill_null(table["received"], 0).to_numpy().astype(np.float64)
    at = pos[on]
    return (
        np.bincount(at, np.ceil(received[on] / 2), n_flows),
        np.bincount(at, lost[on], n_flows),
    )


_COUNTS = ["sport", "sent", "received", "owd_min_ns", "start_ns", "duration_ns"]
_Column = tuple[np.ndarray, np.ndarray | None]  # values, validity as uint8 (None: no nulls)
# the _COUNTS columns' (values, validity), flat, in ``decode_batch``'s argument order
_CountColumns = tuple[
    np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None,
    np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None, np.ndarray, np.ndarray | None,
]  # fmt: skip
# ``PathModel._decode``: layout position per table row, dropped counts, sent, lost, owd_min per
# flow, (first start, last end) of the rows
_Decoded = tuple[np.ndarray, dict[str, int], np.ndarray, np.ndarray, np.ndarray, tuple[int, int]]


def _span_of_rows(table: pa.Table, rows: np.ndarray) -> tuple[int, int]:
    """(first start, last end) over the kept rows, nulls read as 0 (when rows were dropped:
    the engine's semantics since its first version)."""
    start, start_ok = _numbers(table["start_ns"], np.int64)
    dur, dur_ok = _numbers(table["duration_ns"], np.int64)
    return _fast.span(start, start_ok, dur, dur_ok, rows)[:2]


class _Rows:
    """Table row of each layout flow, computed only when asked (first windows, unknown
    paths, dropped rows): the steady-state decode keeps a seen-bit per flow instead."""

    def __init__(self, pos: np.ndarray, n_flows: int) -> None:
        self.pos, self.n_flows = pos, n_flows
        self._rows: np.ndarray | None = None

    def get(self) -> np.ndarray:
        if self._rows is None:
            self._rows = _fast.first_rows(self.pos, self.n_flows)
        return self._rows


def _batch_columns(b: pa.RecordBatch) -> _CountColumns:
    """(values, validity) of the _COUNTS columns of a batch, as ``decode_batch`` reads them
    (the three integer columns of one integer type)."""
    ints = [_numbers(b.column(i)) for i in range(3)]
    if len({v.dtype for v, _ in ints}) > 1:
        ints = [(v.astype(np.int64), ok) for v, ok in ints]
    (sport, sport_ok), (sent, sent_ok), (recv, recv_ok) = ints
    owd, owd_ok = _numbers(b.column(3), np.float64)
    start, start_ok = _numbers(b.column(4), np.int64)
    dur, dur_ok = _numbers(b.column(5), np.int64)
    return sport, sport_ok, sent, sent_ok, recv, recv_ok, owd, owd_ok, start, start_ok, dur, dur_ok


_FORCED: dict[type | None, pa.DataType] = {np.int64: pa.int64(), np.float64: pa.float64()}


def _numbers(col: pa.ChunkedArray | pa.Array, dtype: type | None = None) -> _Column:
    """(values, validity as uint8 or None) of a numeric column, without copying when it is
    one chunk; integers stay int32/int64 (``dtype`` forces one), anything else is cast."""
    arr = col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col
    want = _FORCED.get(dtype)
    if want is None and arr.type not in (pa.int32(), pa.int64()):
        want = pa.int64()
    if want is not None and arr.type != want:
        arr = arr.cast(want, safe=False)
    np_type = np.dtype(arr.type.to_pandas_dtype())
    buf = arr.buffers()[1]
    if buf is None or len(arr) == 0:
        return np.zeros(len(arr), np_type), _valid(arr)
    vals = np.frombuffer(buf, np_type)[arr.offset : arr.offset + len(arr)]
    return vals, _valid(arr)


def _valid(arr: pa.Array) -> np.ndarray | None:
    """Validity as uint8 per row, None when there are no nulls."""
    if arr.null_count == 0:
        return None
    return np.asarray(arr.is_valid().to_numpy(zero_copy_only=False), bool).view(np.uint8)


def _same_strings(a: pa.ChunkedArray, b: pa.ChunkedArray) -> bool:
    """``a.equals(b)``, by comparing the used part of each chunk's offset and byte buffers
    whole when both are string columns chunked alike without nulls or slicing (half the time
    of Arrow's compare: the NIC-id columns are ~100 MB a window). Buffers equal there means
    equal values; any difference or other layout is left to ``equals``."""
    if a.type != b.type or len(a) != len(b):
        return False
    if a.num_chunks != b.num_chunks or not pa.types.is_string(a.type):
        return a.equals(b)
    for x, y in zip(a.chunks, b.chunks, strict=True):
        if len(x) != len(y) or x.offset or y.offset or x.null_count or y.null_count:
            return a.equals(b)
        n_off = 4 * (len(x) + 1)
        bx, by = x.buffers(), y.buffers()
        if not bx[1].slice(0, n_off).equals(by[1].slice(0, n_off)):
            return a.equals(b)
        end = int(np.frombuffer(bx[1], np.int32, 1, n_off - 4)[0])
        if end and not bx[2].slice(0, end).equals(by[2].slice(0, end)):
            return a.equals(b)
    return True


def _strings(col: pa.ChunkedArray) -> pa.ChunkedArray:
    if pa.types.is_string(col.type) or pa.types.is_large_string(col.type):
        return col
    return col.cast(pa.string())


def _string_buffers(arr: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """(offsets, bytes, validity) of a string array, as the views ``_fast`` reads."""
    off_type = np.int64 if pa.types.is_large_string(arr.type) else np.int32
    bufs = arr.buffers()
    off = np.frombuffer(bufs[1], off_type)[arr.offset : arr.offset + len(arr) + 1]
    data = np.frombuffer(bufs[2], np.uint8) if bufs[2] is not None and bufs[2].size else _ZERO
    return off, data, _valid(arr)


_ZERO = np.zeros(1, np.uint8)


def _depth(topo: Topology) -> int:
    """Switch tiers above the leaves (1 for leaf-spine, 2 for a 3-tier fat-tree)."""
    return max(s.tier for s in topo.switches) - 1 if topo.switches else 1
