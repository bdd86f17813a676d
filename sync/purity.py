"""Pure probes: which coded pairs and which windows the clock solve may trust.

A coded pair is two probes sent ``gap`` apart; if neither met a queue (or both met the same
one) the receive gap equals the send gap. A pair whose gaps differ by more than the threshold
was queued or stamped late: its one-way delay is inflated by an unknown amount, so it must not
shape the hull.

Thresholds (``SyncConfig.purity_ns``): software stamps on idle paths show gap errors of a
few hundred ns, queues add µs, so 800 ns keeps idle pairs and drops queued ones; PHC/hardware
stamps jitter by a few ns, so 40 ns. The simulator uses the same defaults.

Windows: the agents already filter pairs and send, per flow, only its pure points on the lower
hull of its NIC pair's pure points (``fleetlens.summary``; agents before that sent the flow's
whole hull: the pair hulls, all the solve fits, are the same). Here we drop window rows that
cannot carry sync information or are malformed (no pure pair, hull arrays of different
lengths, unparsable NIC ids, a host probing itself) and count them. A row with pure pairs and
an empty hull is left out uncounted: its flow has no point on its pair's hull, which is no
fault (it is most rows of a pair with many paths).
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens._strindex import StrIndex

from ._csr import ListColumn, RowLists, flatten_points, generation_runs, row_pair_hulls
from .scratch import Scratch


def pure_mask(
    tx0: np.ndarray, tx1: np.ndarray, rx0: np.ndarray, rx1: np.ndarray, threshold: int
) -> np.ndarray:
    """True where a coded pair's receive gap equals its send gap within ``threshold`` ns."""
    tx0, tx1, rx0, rx1 = (np.asarray(a, np.int64) for a in (tx0, tx1, rx0, rx1))
    return np.abs((rx1 - rx0) - (tx1 - tx0)) <= threshold


@dataclass
class HullPoints:
    """Every hull point of the usable rows, flattened (one entry per point), or only each
    directed NIC pair's lower hull of them (``reduced``: pairs in ascending ``src·n + dst``,
    a pair's hull in t order): all any fit reads, the soft-margin fits of overlapping edges
    included, so that an agent's rows cut to their pair's hull give the same fits.

    NICs are numbered in sorted id order, so ``src < dst`` compares ids as strings.
    """

    nics: list[str]  # sorted NIC ids that occur
    nic_host: list[str]  # host of each NIC
    src: np.ndarray  # (n,) int64 NIC number of the sender
    dst: np.ndarray
    t_raw: np.ndarray  # (n,) int64, sender's raw clock
    owd_raw: np.ndarray  # (n,) int64, rx0_raw - tx0_raw
    dropped: dict[str, int] = field(default_factory=dict)
    reduced: bool = False


@dataclass
class _KeptRows:
    """A window's rows as the solve reads them: which are kept, their NIC numbers, and
    their hull lists read in place (:func:`_list_column`) as the kernels read them."""

    keep: np.ndarray  # (rows,) bool
    src: np.ndarray  # (rows,) int64 NIC number, -1 where invalid
    dst: np.ndarray
    lists: RowLists

    def flatten(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """The kept rows' points, null points left out, and how many were null
        (:func:`flatten_points`)."""
        total = int(np.asarray(self.lists.t.n)[self.keep].sum())
        return flatten_points(self._mask(self.keep), self.lists, total)

    def pair_hulls(
        self, n_nic: int, scratch: Scratch | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]:
        """Each directed pair's lower hull of the kept rows' points (:func:`row_pair_hulls`,
        through ``scratch``'s buffers where given)."""
        out = scratch.of("pair_hulls", (np.int64,) * 4) if scratch is not None else None
        return row_pair_hulls(self._mask(self.keep), self.lists, n_nic, out)

    @staticmethod
    def _mask(keep: np.ndarray) -> np.ndarray:
        return np.ascontiguousarray(keep).view(np.uint8)


def complete_generations(
    windows: pa.Table, after: int | None = None, quorum: float = 0.8
) -> list[tuple[pa.Table, int]]:
    """The window generations to solve, oldest first, each with its rows.

    The collector hands the solve everything within a look-back (2 s by default), called every
    second, so a table holds two or three windows per flow and the same window on consecutive
    calls. A generation is ``round(start_ns / duration_ns)`` (agents align windows to their
    fleet-time clock; even unsynchronized raw clocks within ±50 ms round to the same one). The
    newest generations may still be arriving: a generation counts as complete when it has at
    least ``quorum`` of the rows of the fullest one, and every generation before the newest
    complete one is final. Returned: the complete generations newer than ``after`` (only the
    newest one when ``after`` is None, i.e. on the first call).
    """
    if windows.num_rows == 0:
        return []
    start = _ints(windows["start_ns"])
    one = _one_length(windows["duration_ns"])
    if one:
        # agents share one window length: each generation's rows counted and located in
        # two passes, no per-row generation array or masks (:func:`generation_runs`)
        runs = generation_runs(start, one)
        if runs is not None:
            ids, counts, first, last = runs
            return [
                (_run_rows(windows, start, one, g, int(first[i]), int(last[i]), int(counts[i])), g)
                for i, g in _wanted(ids, counts, after, quorum)
            ]
        gen = np.floor_divide(start + (one >> 1), one)
        ids, counts = _counts(gen)
    else:
        dur = _ints(windows["duration_ns"])
        ok = dur > 0
        if not ok.any():
            return []
        gen = np.where(ok, np.floor_divide(start + (dur >> 1), np.maximum(dur, 1)), -1)
        ids, counts = _counts(gen[ok])
    return [(_rows(windows, gen == g), g) for _, g in _wanted(ids, counts, after, quorum)]


def _wanted(
    ids: np.ndarray, counts: np.ndarray, after: int | None, quorum: float
) -> list[tuple[int, int]]:
    """The generations to solve (:func:`complete_generations`), each with its place in
    ``ids``."""
    newest = int(ids[counts >= quorum * counts.max()].max())
    lo = newest - 1 if after is None else after
    return [(i, g) for i, g in enumerate(ids.tolist()) if lo < g <= newest]


def _run_rows(
    windows: pa.Table, start: np.ndarray, one: int, gen: int, first: int, last: int, n: int
) -> pa.Table:
    """Generation ``gen``'s ``n`` rows, ``first`` to ``last`` among them: a zero-copy slice
    where they are all its rows, else a filtered copy."""
    if last - first + 1 == n:
        return windows.slice(first, n)
    return windows.filter(pa.array(np.floor_divide(start + (one >> 1), one) == gen))


def _one_length(dur: pa.ChunkedArray) -> int:
    """The window length every row shares (no null, positive), else 0: read per chunk in
    place, not from a combined copy of the look-back's ~3,000 chunks."""
    mm = pc.min_max(dur)
    lo, hi = mm["min"].as_py(), mm["max"].as_py()
    return int(lo) if not dur.null_count and lo is not None and lo == hi and lo > 0 else 0


def _ints(col: pa.ChunkedArray) -> np.ndarray:
    """An integer column as int64, nulls as 0 (copied only where it must be)."""
    col = pc.fill_null(col, 0) if col.null_count else col
    return np.asarray(col.to_numpy(), np.int64)


def _counts(gen: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The distinct generations and their row counts: a look-back spans a few consecutive
    generations, so by counting, not sorting (millions of rows at fleet scale)."""
    lo, hi = int(gen.min()), int(gen.max())
    if hi - lo > 4 * gen.size:  # wild start times: sort
        return np.unique(gen, return_counts=True)
    counts = np.bincount(gen - lo)
    ids = np.flatnonzero(counts)
    return ids + lo, counts[ids]


def _rows(windows: pa.Table, mask: np.ndarray) -> pa.Table:
    """The rows of ``mask``: a zero-copy slice where they are contiguous (a look-back read
    in arrival order holds each generation together), else a filtered copy."""
    idx = np.flatnonzero(mask)
    if idx.size and idx[-1] - idx[0] + 1 == idx.size:
        return windows.slice(int(idx[0]), int(idx.size))
    return windows.filter(pa.array(mask))


def hull_points(
    windows: pa.Table,
    reduce: bool = False,
    scratch: Scratch | None = None,
    known: KnownNics | None = None,
) -> HullPoints:
    """Flatten the hulls of the rows worth using; count what was dropped and why (each row
    for the first reason that applies, in the order below). The rows are tested in place and
    the kept rows' points copied out of the list buffers in one pass (:func:`flatten_points`),
    null points left out. ``reduce``: only each directed pair's lower hull of those points,
    read from the buffers in one pass without the flattened copy (:func:`row_pair_hulls`),
    what the solve fits (``HullPool.window_hulls``), through ``scratch``'s buffers where
    given (a solver's, :mod:`.scratch`). ``known``: the NIC ids of earlier windows (a
    solver's, :class:`KnownNics`), so that only ids new to it are hashed twice."""
    rows, names, hosts, dropped = _kept_rows(windows, known)
    if reduce:
        src_p, dst_p, ht, hy, nulls = rows.pair_hulls(len(names), scratch)
    else:
        src_p, dst_p, ht, hy, nulls = rows.flatten()
    if nulls:
        dropped["null_hull_point"] = nulls
    return HullPoints(names, hosts, src_p, dst_p, ht, hy, dropped, reduce)


def _kept_rows(
    windows: pa.Table, known: KnownNics | None = None
) -> tuple[_KeptRows, list[str], list[str], dict[str, int]]:
    """The rows' tests (:func:`hull_points`): the kept rows, the NIC ids they name (sorted)
    and those NICs' hosts, and the dropped rows counted per reason."""
    dropped: dict[str, int] = {}
    keep = _count(None, _bool(pc.greater(windows["pure"], 0)), "no_pure_pair", dropped)
    t, y = _list_column(windows["hull_t_ns"]), _list_column(windows["hull_owd_ns"])
    n_t = np.where(t.null, -1, t.n)  # a null list's length -1 (t) or -2 (y): a mismatch
    n_y = np.where(y.null, -2, y.n)
    keep = _count(keep, n_t == n_y, "hull_length_mismatch", dropped)
    keep &= n_t > 0  # no point on its pair's hull: nothing to use, nothing wrong (uncounted)
    # Ids are validated once per distinct NIC, not per row or point; the names are those of
    # the rows kept so far.
    known = known or KnownNics()
    valid, src, dst = known.index(windows["src_nic"], windows["dst_nic"])
    seen = np.zeros(len(valid) + 1, bool)
    seen[src[keep]] = seen[dst[keep]] = True
    names, hosts, host_of, renum = known.named(seen[:-1])
    src, dst = renum[src], renum[dst]
    ok = (src >= 0) & (dst >= 0) & (host_of[src] != host_of[dst])
    keep = _count(keep, ok, "bad_nic_or_self_probe", dropped)
    return _KeptRows(keep, src, dst, RowLists(src, dst, t, y)), names, hosts, dropped


class KnownNics:
    """The valid NIC ids seen so far, sorted, kept from window to window (one per solver):
    a window's id columns are looked up in them (:class:`StrIndex`: a hash of the bytes
    read in place, a row whose id repeats the row before's not hashed again), and only the
    ids they lack (a new NIC, a bad id) are collected and validated, instead of the
    distinct ids of every row's two columns hashed once more each window (~15 ms of ~0.9 M
    rows at 1024 hosts; Arrow's ``index_in`` hashed every row: ~15 ms a column). Ids of
    NICs gone stay: the list is every NIC the solver has seen, a few per host."""

    def __init__(self) -> None:
        self.ids: list[str] = []
        self._index = StrIndex([])
        self._named: tuple[list[str], np.ndarray, tuple] | None = None  # :meth:`named`'s last

    def index(
        self, src: pa.ChunkedArray, dst: pa.ChunkedArray
    ) -> tuple[list[str], np.ndarray, np.ndarray]:
        """Sorted valid ids covering both columns' valid ids, and each row's position in
        them (-1: a null or invalid id)."""
        src, dst = (c if c.type == pa.string() else c.cast(pa.string()) for c in (src, dst))
        if self.ids:
            at = [self._index.of(col) for col in (src, dst)]
            new = {n for col, i in zip((src, dst), at, strict=True) for n in _missed(col, i)}
        else:  # nothing known yet: every distinct id at once
            new = set(pc.unique(pa.chunked_array([*src.chunks, *dst.chunks], src.type)).to_pylist())
        new = {n for n in new if _nic_ok(n)}
        if new or not self.ids:  # NICs not seen before: renumber (positions follow sorted ids)
            self.ids = sorted({*self.ids, *new})
            self._index = StrIndex(self.ids)
            at = [self._index.of(col) for col in (src, dst)]
        s, d = (np.maximum(i, -1) for i in at)  # null (-2) or unknown: -1
        return self.ids, s, d

    def named(self, seen: np.ndarray) -> tuple[list[str], list[str], np.ndarray, np.ndarray]:
        """The ids ``seen`` (a mask over :attr:`ids`) as a window's NICs: their ids, their
        hosts, each one's host number (and -1 after the last: an invalid id) and each id's
        number among them (-1: not seen; and -1 after the last). A window naming the NICs
        the last one named gets the same objects back, so that what is derived per NIC from
        them (stable NIC numbers, latencies, host numbers) is derived once, not per window."""
        last = self._named
        if last is not None and last[0] is self.ids and np.array_equal(last[1], seen):
            return last[2]
        names = [n for n, s in zip(self.ids, seen, strict=True) if s]
        hosts = [n.partition("/")[0] for n in names]
        number = {h: i for i, h in enumerate(dict.fromkeys(hosts))}
        host_of = np.array([*(number[h] for h in hosts), -1], np.int64)  # [-1]: invalid id
        renum = np.append(np.where(seen, np.cumsum(seen) - 1, -1), -1)  # -1 (invalid) stays
        self._named = (self.ids, seen.copy(), (names, hosts, host_of, renum))
        return names, hosts, host_of, renum


def _missed(col: pa.ChunkedArray, at: np.ndarray) -> list[str]:
    """The distinct ids of ``col`` whose look-up ``at`` found nothing (-1; nulls are -2)."""
    miss = at == -1
    if not miss.any():
        return []
    return pc.unique(pc.filter(col, pa.array(miss))).to_pylist()


def _bool(x: pa.ChunkedArray | pa.Array) -> np.ndarray:
    return np.asarray(pc.fill_null(x, False).to_numpy(zero_copy_only=False), bool)


_LIST_I64 = pa.list_(pa.int64())


def _list_column(col: pa.ChunkedArray) -> ListColumn:
    """A list<int64> column as the kernels read it, each chunk's buffers in place
    (:class:`ListColumn`). The look-back holds a chunk per host's batch: combining them
    copied every point into fresh memory each round (~60 MB at 1024 hosts, up to 0.1 s of
    page faults), and reading each chunk's buffers from Python cost ~6 µs a chunk."""
    return ListColumn(col if col.type == _LIST_I64 else col.cast(_LIST_I64))


def _count(
    keep: np.ndarray | None, test: np.ndarray, reason: str, dropped: dict[str, int]
) -> np.ndarray:
    """Rows kept so far that also pass ``test``; the ones it drops counted under ``reason``."""
    out = test if keep is None else keep & test
    n = (test.size if keep is None else int(keep.sum())) - int(out.sum())
    if n:
        dropped[reason] = dropped.get(reason, 0) + n
    return out


def _nic_ok(nic: object) -> bool:
    if not isinstance(nic, str):
        return False
    host, sep, ifname = nic.partition("/")
    return bool(sep and host and ifname and "/" not in ifname)
