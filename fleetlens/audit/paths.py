"""Per-flow totals as rows over topology indices, with (row, link, weight) incidence.

A flow with a learned path crosses its links with weight 1. A flow whose path was never
learned crosses its two access links for certain, and each fabric link with the share of its
leaf pair's equal-cost paths that use it (ECMP spreads flows evenly: a uniform prior). Rows
naming NICs or links outside the topology, or impossible counts, are dropped and counted.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.topology import Topology


@dataclass
class FlowRows:
    src: np.ndarray  # NIC numbers (topology order)
    dst: np.ndarray
    sent: np.ndarray  # float64
    lost: np.ndarray
    owd: np.ndarray  # float64 typical one-way delay, NaN when nothing arrived
    known: np.ndarray  # bool: path learned
    ent_row: np.ndarray
    ent_link: np.ndarray
    ent_w: np.ndarray
    dropped: dict[str, int] = field(default_factory=dict)

    @property
    def n(self) -> int:
        return int(self.src.size)


class TopoIndex:
    """The topology's numbering (:attr:`Topology.index`: NICs, links, each NIC's access links
    and host), and the leaves numbered among themselves for the per-leaf-pair ECMP priors."""

    def __init__(self, topo: Topology) -> None:
        ix = topo.index
        self.topo = topo
        self.nic_ids, self.link_ids = ix.nic_ids, ix.link_ids
        self.n_nics, self.n_links = len(ix.nic_ids), len(ix.link_ids)
        self.nic_index, self.link_index = ix.nic, ix.link
        self.nic_up, self.nic_down, self.nic_host = ix.nic_up, ix.nic_down, ix.nic_host
        leaves = sorted({n.leaf for n in topo.nics})
        self.leaves = leaves
        self.nic_leaf = np.array([leaves.index(n.leaf) for n in topo.nics], np.int64)

    def lookup(self, names: pa.Array, index: Mapping[str, int]) -> np.ndarray:
        """Names -> numbers (-1 unknown or null), one dictionary lookup per distinct name."""
        enc = pc.dictionary_encode(names)
        lut = np.array([index.get(v, -1) for v in enc.dictionary.to_pylist()] + [-1], np.int64)
        return lut[enc.indices.fill_null(len(enc.dictionary)).to_numpy(zero_copy_only=False)]

    def candidates(self, leaf_a: int, leaf_b: int) -> tuple[np.ndarray, np.ndarray]:
        """Fabric links between two leaves with their share of the equal-cost paths."""
        a, b = self.leaves[leaf_a], self.leaves[leaf_b]
        shares = {self.link_index[lk]: w for lk, w in self.topo.link_shares(a, b).items()}
        links = np.array(sorted(shares), np.int64)
        return links, np.array([shares[i] for i in links.tolist()], np.float64)


def flow_rows(
    ix: TopoIndex, src: pa.Array, dst: pa.Array, sent: np.ndarray, received: np.ndarray,
    owd: np.ndarray, path: pa.Array,
) -> FlowRows:  # fmt: skip
    s, d = ix.lookup(src, ix.nic_index), ix.lookup(dst, ix.nic_index)
    ok = (s >= 0) & (d >= 0) & (s != d)
    dropped = {"unknown_nic": int((~ok).sum())}
    bad = ok & ((sent <= 0) | (received < 0) | (received > sent))
    dropped["bad_counts"] = int(bad.sum())
    keep = np.flatnonzero(ok & ~bad)
    p_row, p_link, has = _paths(ix, path, dropped)
    sel = np.zeros(s.size, bool)
    sel[keep] = True
    renum = np.cumsum(sel) - 1  # old row -> new row
    known = has[keep]
    on = sel[p_row] & has[p_row]
    rows = [renum[p_row[on]]]
    links = [p_link[on]]
    weights = [np.ones(int(on.sum()))]
    unk = np.flatnonzero(~known)
    us, ud = s[keep][unk], d[keep][unk]
    rows += [unk, unk]
    links += [ix.nic_up[us], ix.nic_down[ud]]
    weights += [np.ones(unk.size), np.ones(unk.size)]
    la, lb = ix.nic_leaf[us], ix.nic_leaf[ud]
    pair = la * len(ix.leaves) + lb
    for p in np.unique(pair).tolist():  # one step per leaf pair, not per flow
        r = unk[pair == p]
        c_link, c_w = ix.candidates(p // len(ix.leaves), p % len(ix.leaves))
        rows.append(np.repeat(r, c_link.size))
        links.append(np.tile(c_link, r.size))
        weights.append(np.tile(c_w, r.size))
    e_link = np.concatenate(links)
    e_ok = e_link >= 0
    return FlowRows(
        s[keep], d[keep], sent[keep].astype(np.float64),
        (sent[keep] - received[keep]).astype(np.float64), owd[keep], known,
        np.concatenate(rows)[e_ok], e_link[e_ok], np.concatenate(weights)[e_ok], dropped,
    )  # fmt: skip


def _paths(ix: TopoIndex, path: pa.Array, dropped: dict[str, int]) -> tuple[np.ndarray, ...]:
    """(row, link) of every learned path's links, and per row whether its path is usable."""
    path = path.combine_chunks() if isinstance(path, pa.ChunkedArray) else path
    n = len(path)
    valid = np.asarray(path.is_valid().to_numpy(zero_copy_only=False), bool)
    lens = np.asarray(pc.list_value_length(path).fill_null(0).to_numpy(), np.int64)
    flat = path.flatten()
    links = ix.lookup(flat, ix.link_index) if len(flat) else np.empty(0, np.int64)
    row = np.repeat(np.arange(n), lens)
    bad = np.zeros(n, bool)
    np.logical_or.at(bad, row, links < 0)
    has = valid & (lens > 0) & ~bad
    dropped["bad_path"] = int((valid & ~has).sum())
    return row, links, has
