"""Path model: every flow row of a window becomes weighted (row, link) incidence entries.

A flow's path is the ordered list of directed links it crosses. Three cases:

- the record carries the path (the agent discovered it): weight 1 on each of its links, and the
  path is remembered for the flow key (ECMP mapping is stable while routing is);
- the path is null but was reported for the same flow before: the remembered path is used;
- the path was never seen: it is a hidden variable over the topology's ECMP candidates. The
  access links are certain (weight 1); each fabric link gets the share of candidate paths that
  cross it (uniform prior — ECMP hashing spreads flows evenly), so the evidence of the flow is
  spread over the links it may have crossed instead of guessing one path.

Everything is indexed by topology link number; rows naming NICs or links that are not in the
topology are dropped and counted (bad input never raises).
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.ids import is_nic_id
from fleetlens.topology import Topology

from .store import FlowStore

SPORT_SPAN = 1 << 16
_RECHECK = 16


@dataclass
class FlowBatch:
    """One window's flows, as arrays over rows, plus the incidence entries."""

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


class PathModel:
    """Topology indexes, the remembered path of every flow, and ECMP candidate spreading."""

    def __init__(self, topo: Topology) -> None:
        self.topo = topo
        self.nic_ids = [n.id for n in topo.nics]
        self.link_ids = [lk.id for lk in topo.links]
        self.nic_index = {n: i for i, n in enumerate(self.nic_ids)}
        self.link_index = {lk: i for i, lk in enumerate(self.link_ids)}
        self.n_nics, self.n_links = len(self.nic_ids), len(self.link_ids)
        self.nic_up = np.full(self.n_nics, -1, np.int64)
        self.nic_down = np.full(self.n_nics, -1, np.int64)
        for i, lk in enumerate(topo.links):
            if is_nic_id(lk.a) and lk.a in self.nic_index:
                self.nic_up[self.nic_index[lk.a]] = i
            if is_nic_id(lk.b) and lk.b in self.nic_index:
                self.nic_down[self.nic_index[lk.b]] = i
        leaves = sorted({n.leaf for n in topo.nics})
        self.leaf_names = leaves
        leaf_no = {lf: i for i, lf in enumerate(leaves)}
        self.nic_leaf = np.array([leaf_no[n.leaf] for n in topo.nics], np.int64)
        self.nic_host_name = [n.host for n in topo.nics]
        self._cand: dict[int, tuple[np.ndarray, np.ndarray]] = {}
        self.max_hops = 2 + 2 * max(1, _depth(topo))
        self.paths = FlowStore({"links": (np.int32, -1, self.max_hops)})
        self.version = 0  # bumped whenever a remembered path is added or changes
        self._last: tuple | None = None  # (keys, version, incidence) of the last batch
        self._tick = 0

    # ---- keys -----------------------------------------------------------------------------
    def flow_key(self, src: np.ndarray, dst: np.ndarray, sport: np.ndarray) -> np.ndarray:
        return (src * self.n_nics + dst) * SPORT_SPAN + (sport % SPORT_SPAN)

    def flow_label(self, key: int) -> str:
        pair, sport = divmod(int(key), SPORT_SPAN)
        s, d = divmod(pair, self.n_nics)
        return f"{self.nic_ids[s]}>{self.nic_ids[d]}:{sport}"

    # ---- decoding -------------------------------------------------------------------------
    def _nics(self, col: pa.ChunkedArray) -> np.ndarray:
        enc = pc.dictionary_encode(col).combine_chunks()
        lut = np.array([self.nic_index.get(v, -1) for v in enc.dictionary.to_pylist()] + [-1])
        idx = enc.indices.fill_null(len(enc.dictionary)).to_numpy()
        return lut[idx]

    def batch(self, table: pa.Table) -> FlowBatch:
        """Decode a WINDOW_SCHEMA table; drop (and count) rows it cannot use."""
        dropped: dict[str, int] = {}
        src, dst = self._nics(table["src_nic"]), self._nics(table["dst_nic"])
        sport = _ints(table["sport"], -1)
        sent = _ints(table["sent"], 0).astype(np.float64)
        recv = _ints(table["received"], 0).astype(np.float64)
        ok = (src >= 0) & (dst >= 0) & (src != dst) & (sport >= 0)
        dropped["unknown_nic_or_bad_key"] = int((~ok).sum())
        bad_counts = ok & ((sent <= 0) | (recv < 0) | (recv > sent))
        dropped["bad_counts"] = int(bad_counts.sum())
        ok &= ~bad_counts
        rows = np.flatnonzero(ok)
        key = self.flow_key(src[rows], dst[rows], sport[rows])
        # Rows in key order: the same flows then give the same arrays window after window,
        # so flow positions and incidence are reused instead of recomputed.
        order = np.argsort(key, kind="stable")
        rows, key = rows[order], key[order]
        owd = table["owd_min_ns"].combine_chunks().to_numpy(zero_copy_only=False)
        owd = np.asarray(owd, np.float64)[rows]
        starts = _ints(table["start_ns"], 0)[rows]
        ends = starts + _ints(table["duration_ns"], 0)[rows]
        self._remember(table, rows, key, dropped)
        last = self._last
        if (
            last is not None
            and last[0].size == key.size
            and last[1] == self.version
            and np.array_equal(last[0], key)
        ):  # same flows in the same order, no path changed: same incidence
            known, e_row, e_link, e_w = last[2]
        else:
            known_links, known = self._recall(key)
            e_row, e_link, e_w = self._incidence(src[rows], dst[rows], known_links, known)
            self._last = (key.copy(), self.version, (known, e_row, e_link, e_w))
        return FlowBatch(
            key, src[rows], dst[rows], sport[rows], sent[rows], sent[rows] - recv[rows],
            owd, known, e_row, e_link, e_w,
            int(starts.min()) if rows.size else 0, int(ends.max()) if rows.size else 0, dropped,
        )  # fmt: skip

    def _remember(self, table: pa.Table, rows: np.ndarray, key: np.ndarray, dropped) -> None:
        """Store the paths the records carry (only rows whose every link is in the topology)."""
        # Paths are stable per flow: decode only flows not remembered yet, plus a rotating
        # 1/16 of the others so a re-learned (changed) path is picked up within 16 windows.
        self._tick += 1
        recheck = key % _RECHECK == self._tick % _RECHECK
        last = self._last
        same = last is not None and last[0].size == key.size and np.array_equal(last[0], key)
        # a flow of the last batch whose path was unknown is still unknown unless reported now
        unseen = ~last[2][0] if same else self.paths.find(key) < 0
        need = unseen | recheck
        if not need.any():
            return
        rows, key = rows[need], key[need]
        col = table["path"].combine_chunks().take(pa.array(rows))
        has = np.asarray(col.is_valid().to_numpy(zero_copy_only=False), bool)
        if not has.any():
            return
        sub = col.filter(pa.array(has))
        lens = np.diff(sub.offsets.to_numpy())
        flat = pc.dictionary_encode(sub.flatten())
        lut = np.array([self.link_index.get(v, -1) for v in flat.dictionary.to_pylist()] + [-1])
        links = lut[flat.indices.fill_null(len(flat.dictionary)).to_numpy()]
        owner = np.repeat(np.arange(lens.size), lens)
        bad = np.zeros(lens.size, bool)
        np.logical_or.at(bad, owner, links < 0)
        bad |= (lens == 0) | (lens > self.max_hops)
        dropped["bad_path"] = int(bad.sum())
        good = ~bad
        pad = np.full((lens.size, self.max_hops), -1, np.int32)
        col_in_row = np.arange(links.size) - np.repeat(np.cumsum(lens) - lens, lens)
        fits = col_in_row < self.max_hops
        pad[owner[fits], col_in_row[fits]] = links[fits]
        k = key[has][good]
        at = self.paths.locate(k)
        if k.size and not np.array_equal(self.paths.cols["links"][at], pad[good]):
            self.version += 1
        self.paths.cols["links"][at] = pad[good]

    def _recall(self, key: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        at = self.paths.find(key)
        known = at >= 0
        links = np.full((key.size, self.max_hops), -1, np.int32)
        links[known] = self.paths.cols["links"][at[known]]
        return links, known

    # ---- incidence ------------------------------------------------------------------------
    def incidence_for_keys(self, key: np.ndarray) -> tuple[np.ndarray, ...]:
        """Incidence entries of stored flows (rows = positions in ``key``)."""
        pair = key // SPORT_SPAN
        src, dst = pair // self.n_nics, pair % self.n_nics
        known_links, known = self._recall(key)
        return self._incidence(src, dst, known_links, known)

    def _incidence(self, src, dst, known_links, known) -> tuple[np.ndarray, ...]:
        r_k, c_k = np.nonzero(known_links >= 0)
        rows_k = r_k
        links_k = known_links[r_k, c_k].astype(np.int64)
        unk = np.flatnonzero(~known)
        parts_r, parts_l, parts_w = [rows_k], [links_k], [np.ones(rows_k.size)]
        if unk.size:
            r, lk, w = self._candidates(unk, src[unk], dst[unk])
            parts_r.append(r)
            parts_l.append(lk)
            parts_w.append(w)
        return np.concatenate(parts_r), np.concatenate(parts_l), np.concatenate(parts_w)

    def _candidates(self, rows, src, dst) -> tuple[np.ndarray, ...]:
        """Access links with weight 1, fabric links weighted by their share of ECMP paths."""
        n_leaf = len(self.leaf_names)
        pair = self.nic_leaf[src] * n_leaf + self.nic_leaf[dst]
        uniq, inv = np.unique(pair, return_inverse=True)
        cands = [self._leaf_pair(int(p)) for p in uniq]
        lens = np.array([c[0].size for c in cands], np.int64)
        ptr = np.concatenate([[0], np.cumsum(lens)])
        all_l = np.concatenate([c[0] for c in cands] + [np.empty(0, np.int64)])
        all_w = np.concatenate([c[1] for c in cands] + [np.empty(0)])
        cnt = lens[inv]
        e_row = np.repeat(rows, cnt)
        within = np.arange(e_row.size) - np.repeat(np.cumsum(cnt) - cnt, cnt)
        at = np.repeat(ptr[inv], cnt) + within
        acc_r = np.concatenate([rows, rows])
        acc_l = np.concatenate([self.nic_up[src], self.nic_down[dst]])
        return (
            np.concatenate([acc_r, e_row]),
            np.concatenate([acc_l, all_l[at]]),
            np.concatenate([np.ones(acc_r.size), all_w[at]]),
        )

    def _leaf_pair(self, pair: int) -> tuple[np.ndarray, np.ndarray]:
        if pair not in self._cand:
            n_leaf = len(self.leaf_names)
            a, b = self.leaf_names[pair // n_leaf], self.leaf_names[pair % n_leaf]
            paths = self.topo.switch_paths(a, b) if a != b else [(a,)]
            counts: dict[int, int] = {}
            for p in paths:
                for u, v in itertools.pairwise(p):
                    i = self.link_index[f"{u}->{v}"]
                    counts[i] = counts.get(i, 0) + 1
            links = np.array(sorted(counts), np.int64)
            w = np.array([counts[i] / len(paths) for i in links.tolist()], np.float64)
            self._cand[pair] = (links, w)
        return self._cand[pair]


def _ints(col: pa.ChunkedArray, fill: int) -> np.ndarray:
    arr = col.combine_chunks()
    return np.asarray(arr.fill_null(fill).to_numpy(zero_copy_only=False), np.int64)


def _depth(topo: Topology) -> int:
    """Switch tiers above the leaves (1 for leaf-spine, 2 for a 3-tier fat-tree)."""
    return max(s.tier for s in topo.switches) - 1 if topo.switches else 1
