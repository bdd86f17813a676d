"""Per-flow state kept across windows, addressed by an int64 flow key (no Python dicts).

At fleet scale there are millions of flows; keys are stored in arrival order (new flows are
appended, so a flow keeps its row) with a sorted index beside them for vectorized lookups.
Agents send the same flows in the same order window after window, so after the first window
the rows of a window *are* the store's rows (``aligned``) and state is read and written
without any gather or scatter.
"""

from __future__ import annotations

import numpy as np


def unique(a: np.ndarray, first: bool = False, inverse: bool = False):
    """``np.unique(a, return_index=first, return_inverse=inverse)`` for 1-D integer arrays by
    a stable (radix) sort: numpy 2's hash-based unique took seconds on millions of keys."""
    a = np.asarray(a).reshape(-1)
    if not (first or inverse):
        s = np.sort(a, kind="stable")
        return s[_starts(s)]
    order = np.argsort(a, kind="stable")
    s = a[order]
    new = _starts(s)
    out: list[np.ndarray] = [s[new]]
    if first:
        out.append(order[new])
    if inverse:
        inv = np.empty(a.size, np.int64)
        inv[order] = np.cumsum(new) - 1
        out.append(inv)
    return tuple(out)


def _increasing(a: np.ndarray) -> bool:
    return a.ndim == 1 and (a.size < 2 or bool(np.all(a[1:] > a[:-1])))


def _starts(s: np.ndarray) -> np.ndarray:
    """True where a sorted array's value differs from the one before (and at 0)."""
    new = np.empty(s.size, bool)
    new[:1] = True
    np.not_equal(s[1:], s[:-1], out=new[1:])
    return new


class FlowStore:
    """Columns of per-flow state; rows in arrival order, grown when unseen keys arrive."""

    def __init__(self, columns: dict[str, tuple[np.dtype | type, object, int]]) -> None:
        # name -> (dtype, fill value, width); width 0 means a 1-D column
        self.spec = columns
        self.keys = np.empty(0, np.int64)
        self._sorted = np.empty(0, np.int64)  # keys, sorted
        self._order = np.empty(0, np.int64)  # row of each sorted key
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # last locate() (keys, rows)
        # (keys array found aligned, store generation then): the engine passes the same
        # layout key array window after window, so the 6 M-key compare runs once per layout
        self._aligned_with: tuple[np.ndarray, int] | None = None
        self._gen = 0  # bumped whenever rows are inserted or dropped
        self.cols: dict[str, np.ndarray] = {name: self._blank(0, name) for name in columns}

    def _blank(self, n: int, name: str) -> np.ndarray:
        dtype, fill, width = self.spec[name]
        shape = (n, width) if width else (n,)
        return np.full(shape, fill, dtype=dtype)

    def __len__(self) -> int:
        return int(self.keys.size)

    def aligned(self, keys: np.ndarray) -> bool:
        """True when ``keys`` are exactly the stored keys in row order (rows = positions).
        ``keys`` must not be modified in place afterwards (the answer is cached for it)."""
        got = self._aligned_with
        if got is not None and got[0] is keys and got[1] == self._gen:
            return True
        ok = keys.size == self.keys.size and (
            keys is self.keys or bool(np.array_equal(keys, self.keys))
        )
        if ok:
            self._aligned_with = (keys, self._gen)
        return ok

    def locate(self, keys: np.ndarray) -> np.ndarray:
        """Row of every key, inserting the keys not stored yet (with the fill values)."""
        last = self._last
        if last is not None and last[0].size == keys.size and np.array_equal(last[0], keys):
            return last[1]  # agents send the same flows window after window
        if not self.keys.size and _increasing(keys):  # an empty store filled in key order
            self._insert_sorted(keys)
            self._last = (keys.copy(), np.arange(keys.size))
            return self._last[1]
        pos = self.find(keys)
        miss = pos < 0
        if miss.any():  # new flows become rows in the order they arrive
            new, first = unique(keys[miss], first=True)
            self._insert(new[np.argsort(first)])
            pos = self.find(keys)
        self._last = (keys.copy(), pos)
        return pos

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Row of every key, -1 where the key is not stored."""
        if self._sorted.size == 0:
            return np.full(keys.shape, -1, np.int64)
        at = np.searchsorted(self._sorted, keys)
        ok = at < self._sorted.size
        ok[ok] = self._sorted[at[ok]] == keys[ok]
        return np.where(ok, self._order[np.minimum(at, self._sorted.size - 1)], -1)

    def _insert(self, new: np.ndarray) -> None:
        """Append ``new`` (unique, not stored) as rows at the end."""
        self._last = None
        self._gen += 1
        n0 = self.keys.size
        self.keys = np.concatenate([self.keys, new])
        for name, col in self.cols.items():
            self.cols[name] = np.concatenate([col, self._blank(new.size, name)])
        order = np.argsort(new, kind="stable")
        at = np.searchsorted(self._sorted, new[order])
        self._sorted = np.insert(self._sorted, at, new[order])
        self._order = np.insert(self._order, at, n0 + order)

    def _insert_sorted(self, keys: np.ndarray) -> None:
        """Rows for ``keys`` (strictly increasing) in an empty store: no sorting needed."""
        self._gen += 1
        self.keys = keys.copy()
        self.cols = {name: self._blank(keys.size, name) for name in self.cols}
        self._sorted, self._order = self.keys, np.arange(keys.size)

    def sort(self) -> None:
        """Put the rows in key order (then ``aligned`` holds for the sorted keys)."""
        self._last = None
        self._gen += 1
        order = self._order
        self.keys = self._sorted.copy()
        self.cols = {name: col[order] for name, col in self.cols.items()}
        self._order = np.arange(self.keys.size)

    def drop(self, keep: np.ndarray) -> None:
        """Forget the rows where ``keep`` is False (flows not seen for a long time)."""
        if keep.all():
            return
        self._last = None
        self._gen += 1
        self.keys = self.keys[keep]
        self.cols = {name: col[keep] for name, col in self.cols.items()}
        order = np.argsort(self.keys, kind="stable")
        self._sorted, self._order = self.keys[order], order
