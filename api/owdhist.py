"""One-way-delay histograms for Prometheus: per leaf, per rail and per path tier, and (opt-in,
for small fleets) per NIC.

Model: every stored window with a median one-way delay is one observation, that median in
seconds. Per leaf and per rail it counts twice: under the sending NIC's group
(``direction="tx"``) and under the receiving NIC's (``direction="rx"``). Per tier it counts
once, under the highest switch tier its path climbs: ``leaf`` (both NICs on one leaf),
``spine`` (two leaves of a leaf-spine fabric, or of one fat-tree pod), ``core`` (two pods).

Groups come from the inventory and exist from the start, so the exposition has the same
series from the first scrape on, and its size follows the fabric's leaves and rails, not its
NICs: at 8,192 NICs on 32 leaves and 8 rails, ``(32 + 8) x 2 + 2`` label sets of 22 series.
Without an inventory (or for a NIC it does not list) the leaf is ``unknown`` and the tier is
read from the window's reported path (2 links: leaf, 4: spine, 6: core) when it has one;
rails are NIC interface names, at most ``MAX_RAILS`` of them (the rest count as ``other``):
bounded whatever agents register.

The per-NIC detail stays in the REST API (``/v1/pairs/{src}/{dst}/owd`` per pair,
``/v1/flows`` per flow, ``/v1/nics`` per NIC verdict). ``per_nic`` (``--per-nic-metrics``)
adds ``fleetlens_nic_owd_seconds{nic,direction}``: 2 x 22 series per NIC.

Cost: an update adds into only the cells the batch's windows name (``np.add.at``) and looks
up only the batch's distinct NICs: O(batch), whatever the fleet. The collector's commit hook
hands the rows' NIC ids as the storage layout numbered them (``NicIds``): each row's place is
then an array lookup by id, and only ids not seen before are looked up by name (hashing the
two NIC names of every row again was most of an update: ~0.1 ms an agent batch).
"""

from __future__ import annotations

import threading
from collections.abc import Iterable
from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from prometheus_client.core import HistogramMetricFamily
from prometheus_client.registry import Collector

from fleetlens.ids import split_nic_id
from fleetlens.topology import TIER_CORE, TIER_LEAF, Topology

OWD_BUCKETS_S = (
    1e-6, 2e-6, 5e-6, 1e-5, 2e-5, 5e-5, 1e-4, 2e-4, 5e-4,
    1e-3, 2e-3, 5e-3, 1e-2, 2e-2, 5e-2, 0.1, 0.2, 0.5, 1.0,
)  # fmt: skip
_BOUNDS = np.asarray(OWD_BUCKETS_S)
_LE = [str(b) for b in OWD_BUCKETS_S] + ["+Inf"]
NB = len(OWD_BUCKETS_S) + 1  # bucket cells per label set, +Inf included
DIRECTIONS = ("tx", "rx")
MAX_RAILS = 64
UNKNOWN, OTHER = "unknown", "other"
TIERS = (UNKNOWN, "leaf", "spine", "core")  # index: switch tiers a path climbs (0: unknown)
# A NIC's place, one int per column: its leaf and pod numbers (-1: unknown / none), then its
# row in each family for each direction (-1: no per-NIC family).
LEAF, POD, LEAF_TX, LEAF_RX, RAIL_TX, RAIL_RX, NIC_TX, NIC_RX = range(8)


@dataclass(frozen=True)
class NicIds:
    """The rows' NICs as dictionary ids (one per row, in the rows' order): ``src`` and ``dst``
    index ``names``, the NIC ids of the dictionary (``codec.NameDict.ids``), which only grows:
    an id names the same NIC for the collector's life."""

    src: np.ndarray
    dst: np.ndarray
    names: pa.Array


class HistogramRows:
    """Bucket counts and sums of one histogram family, one row per label set; rows are
    appended as label sets appear (capacity doubles: appending is O(1) amortized)."""

    def __init__(self, name: str, doc: str, labels: tuple[str, ...]) -> None:
        self.name, self.doc, self.labels = name, doc, labels
        self.keys: list[tuple[str, ...]] = []
        self._row: dict[tuple[str, ...], int] = {}
        self._counts = np.zeros((8, NB), np.int64)
        self._sums = np.zeros(8)

    def row(self, key: tuple[str, ...]) -> int:
        r = self._row.get(key)
        if r is None:
            r = self._row[key] = len(self.keys)
            self.keys.append(key)
            if r == len(self._sums):
                self._counts = np.vstack([self._counts, np.zeros_like(self._counts)])
                self._sums = np.concatenate([self._sums, np.zeros_like(self._sums)])
        return r

    def add(self, rows: np.ndarray, bucket: np.ndarray, values: np.ndarray) -> None:
        """One observation per element: ``values[i]`` in bucket ``bucket[i]`` of ``rows[i]``
        (unbuffered adds: only the cells named are written)."""
        np.add.at(self._counts.reshape(-1), rows * NB + bucket, 1)
        np.add.at(self._sums, rows, values)

    def family(self) -> HistogramMetricFamily:
        fam = HistogramMetricFamily(self.name, self.doc, labels=list(self.labels))
        n = len(self.keys)
        cum = np.cumsum(self._counts[:n], axis=1).tolist()
        for key, counts, total in zip(self.keys, cum, self._sums[:n].tolist(), strict=True):
            fam.add_metric(list(key), list(zip(_LE, counts, strict=True)), total)
        return fam


class OwdHistograms(Collector):
    """The one-way-delay families (module docstring), filled from stored window batches."""

    def __init__(self, topology: Topology | None = None, per_nic: bool = False) -> None:
        self.leaf = HistogramRows(
            "fleetlens_leaf_owd_seconds",
            "One-way delay per leaf of the sending (tx) or receiving (rx) NIC: one "
            "observation per window, its median",
            ("leaf", "direction"),
        )
        self.rail = HistogramRows(
            "fleetlens_rail_owd_seconds",
            "One-way delay per rail (NIC interface name) of the sending (tx) or receiving (rx) "
            "NIC: one observation per window, its median",
            ("rail", "direction"),
        )
        self.tier = HistogramRows(
            "fleetlens_tier_owd_seconds",
            "One-way delay by the highest switch tier the flow's path climbs (leaf, spine, "
            "core): one observation per window, its median",
            ("tier",),
        )
        self.nic = (
            HistogramRows(
                "fleetlens_nic_owd_seconds",
                "One-way delay per NIC (--per-nic-metrics): one observation per window, its "
                "median, tx and rx side",
                ("nic", "direction"),
            )
            if per_nic
            else None
        )
        self._topology = topology
        self._has_core = topology is not None and any(
            s.tier == TIER_CORE for s in topology.switches
        )
        self._slot: dict[str, int] = {}  # NIC -> its row of _places
        self._slot_of_id = np.zeros(0, np.int64)  # NIC dictionary id -> its row, -1: unknown
        self._places = np.zeros((0, 8), np.int64)
        self._lock = threading.Lock()
        self._create_inventory_rows()

    @property
    def families(self) -> list[HistogramRows]:
        return [f for f in (self.leaf, self.rail, self.tier, self.nic) if f is not None]

    def _create_inventory_rows(self) -> None:
        """Every group the inventory names, up front: the series exist from 0."""
        topo = self._topology
        if topo is None:
            return
        for s in topo.switches:
            if s.tier == TIER_LEAF:
                for d in DIRECTIONS:
                    self.leaf.row((s.id, d))
        for rail in sorted({n.ifname for n in topo.nics}):
            for d in DIRECTIONS:
                self.rail.row((self._rail_name(rail), d))
        for t in TIERS[1 : 4 if self._has_core else 3]:
            self.tier.row((t,))
        for n in topo.nics:
            self._place(n.id)

    def _rail_name(self, ifname: str) -> str:
        known = {k[0] for k in self.rail.keys}
        return ifname if ifname in known or len(known) < MAX_RAILS else OTHER

    def _place(self, nic: str) -> int:
        """The NIC's row of ``_places`` (``LEAF`` ... ``NIC_RX``), resolved once per NIC."""
        slot = self._slot.get(nic)
        if slot is not None:
            return slot
        inv = self._topology.nic_by_id.get(nic) if self._topology is not None else None
        leaf = inv.leaf if inv is not None else UNKNOWN
        sw = self._topology.switch_by_id.get(leaf) if self._topology is not None else None
        rail = self._rail_name(split_nic_id(nic)[1])
        leaf_rows = [self.leaf.row((leaf, d)) for d in DIRECTIONS]
        nic_rows = [self.nic.row((nic, d)) for d in DIRECTIONS] if self.nic else [-1, -1]
        place = [
            leaf_rows[0] if sw is not None else -1,  # the leaf's number: its tx row
            sw.pod if sw is not None and sw.pod is not None else -1,
            *leaf_rows,
            *(self.rail.row((rail, d)) for d in DIRECTIONS),
            *nic_rows,
        ]  # fmt: skip
        slot = self._slot[nic] = len(self._slot)
        if slot == len(self._places):  # capacity doubles: O(1) amortized per NIC
            grown = np.zeros((max(64, 2 * slot), 8), np.int64)
            grown[:slot] = self._places
            self._places = grown
        self._places[slot] = place
        return slot

    def _slots_of(self, src: pa.Array, dst: pa.Array) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``_places`` of the NICs of two columns (one per value): the distinct
        NICs of the batch are looked up, nothing else."""
        enc = pc.dictionary_encode(pa.concat_arrays([src, dst]))
        distinct = enc.dictionary.to_pylist()
        known = list(map(self._slot.get, distinct))  # a dict lookup per NIC: the common case
        if None in known:
            known = list(map(self._place, distinct))
        slots = np.array(known, np.int64)[enc.indices.to_numpy()]
        return slots[: len(src)], slots[len(src) :]

    def _slots_by_id(self, ids: NicIds, valid: pa.Array | None) -> tuple[np.ndarray, np.ndarray]:
        """The rows of ``_places`` of the rows' NICs from their dictionary ids: an array
        lookup, and a lookup by name only for ids not seen before."""
        keep = None if valid is None else np.asarray(valid, bool)
        src, dst = (a if keep is None else a[keep] for a in (ids.src, ids.dst))
        both = np.concatenate([src, dst])
        top = int(both.max()) + 1 if len(both) else 0
        if top > len(self._slot_of_id):  # capacity doubles: O(1) amortized per NIC
            grown = np.full(max(top, 2 * len(self._slot_of_id)), -1, np.int64)
            grown[: len(self._slot_of_id)] = self._slot_of_id
            self._slot_of_id = grown
        slots = self._slot_of_id[both]
        if (slots < 0).any():
            new = np.unique(both[slots < 0])
            names = ids.names.take(pa.array(new)).to_pylist()
            self._slot_of_id[new] = list(map(self._place, names))
            slots = self._slot_of_id[both]
        return slots[: len(src)], slots[len(src) :]

    def observe(self, windows: pa.Table, ids: NicIds | None = None) -> None:
        """Count one batch's windows (``WINDOW_SCHEMA``); rows without a median are skipped.
        ``ids``: the rows' NICs as dictionary ids (else their names are looked up)."""
        owd = windows["owd_p50_ns"].combine_chunks()
        valid = pc.is_valid(owd) if owd.null_count else None
        if valid is not None and not pc.any(valid).as_py():
            return
        values = _kept(owd, valid).to_numpy() * 1e-9
        bucket = np.searchsorted(_BOUNDS, values, side="left")
        both_b, both_v = np.concatenate([bucket, bucket]), np.concatenate([values, values])
        with self._lock:
            if ids is None:
                cols = (_kept(windows[c].combine_chunks(), valid) for c in ("src_nic", "dst_nic"))
                src, dst = self._slots_of(*cols)
            else:
                src, dst = self._slots_by_id(ids, valid)
            places = self._places  # one column gathered at a time: not 8 per row

            def both(tx: int, rx: int) -> np.ndarray:
                return np.concatenate([places[src, tx], places[dst, rx]])

            self.leaf.add(both(LEAF_TX, LEAF_RX), both_b, both_v)
            self.rail.add(both(RAIL_TX, RAIL_RX), both_b, both_v)
            if self.nic is not None:
                self.nic.add(both(NIC_TX, NIC_RX), both_b, both_v)
            ends = (places[src, LEAF], places[dst, LEAF], places[src, POD], places[dst, POD])
            tiers = self._tiers(*ends, windows["path"], valid)
            row_of = np.full(len(TIERS), -1)
            seen = np.flatnonzero(np.bincount(tiers, minlength=len(TIERS)))  # not a sort
            for t in seen.tolist():  # rows for the tiers seen only
                row_of[t] = self.tier.row((TIERS[t],))
            self.tier.add(row_of[tiers], bucket, values)

    def _tiers(
        self, src_leaf: np.ndarray, dst_leaf: np.ndarray, src_pod: np.ndarray,
        dst_pod: np.ndarray, path: pa.ChunkedArray, valid: pa.Array | None,
    ) -> np.ndarray:  # fmt: skip
        """Index in ``TIERS`` of each window: from the NICs' leaves, else its path's length."""
        known = (src_leaf >= 0) & (dst_leaf >= 0)
        core = self._has_core & (src_pod != dst_pod)
        tier = np.where(src_leaf == dst_leaf, 1, np.where(core, 3, 2))
        if known.all():
            return tier
        links = pc.fill_null(pc.list_value_length(_kept(path, valid)), 0).to_numpy()
        by_path = np.where(links % 2 == 0, links // 2, 0)
        by_path[by_path >= len(TIERS)] = 0
        return np.where(known, tier, by_path)

    def collect(self) -> Iterable[HistogramMetricFamily]:
        with self._lock:
            return [f.family() for f in self.families]


def _kept(col: pa.Array | pa.ChunkedArray, valid: pa.Array | None) -> pa.Array:
    """The column's rows where ``valid`` (None: all of them), as one array."""
    kept = col if valid is None else pc.filter(col, valid)
    return kept.combine_chunks() if isinstance(kept, pa.ChunkedArray) else kept
