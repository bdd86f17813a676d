"""Per-flow state kept across windows, addressed by an int64 flow key (no Python dicts).

At fleet scale there are millions of flows; keys are stored in arrival order (new flows are
appended, so a flow keeps its row) with a sorted index beside them for vectorized lookups.
Agents send the same flows in the same order window after window, so after the first window
the rows of a window *are* the store's rows (``aligned``) and state is read and written
without any gather or scatter.
"""

from __future__ import annotations

import numpy as np


class FlowStore:
    """Columns of per-flow state; rows in arrival order, grown when unseen keys arrive."""

    def __init__(self, columns: dict[str, tuple[np.dtype | type, object, int]]) -> None:
        # name -> (dtype, fill value, width); width 0 means a 1-D column
        self.spec = columns
        self.keys = np.empty(0, np.int64)
        self._sorted = np.empty(0, np.int64)  # keys, sorted
        self._order = np.empty(0, np.int64)  # row of each sorted key
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # last locate() (keys, rows)
        self.cols: dict[str, np.ndarray] = {name: self._blank(0, name) for name in columns}

    def _blank(self, n: int, name: str) -> np.ndarray:
        dtype, fill, width = self.spec[name]
        shape = (n, width) if width else (n,)
        return np.full(shape, fill, dtype=dtype)

    def __len__(self) -> int:
        return int(self.keys.size)

    def aligned(self, keys: np.ndarray) -> bool:
        """True when ``keys`` are exactly the stored keys in row order (rows = positions)."""
        return keys.size == self.keys.size and (
            keys is self.keys or bool(np.array_equal(keys, self.keys))
        )

    def locate(self, keys: np.ndarray) -> np.ndarray:
        """Row of every key, inserting the keys not stored yet (with the fill values)."""
        last = self._last
        if last is not None and last[0].size == keys.size and np.array_equal(last[0], keys):
            return last[1]  # agents send the same flows window after window
        pos = self.find(keys)
        miss = pos < 0
        if miss.any():  # new flows become rows in the order they arrive
            new, first = np.unique(keys[miss], return_index=True)
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
        n0 = self.keys.size
        self.keys = np.concatenate([self.keys, new])
        for name, col in self.cols.items():
            self.cols[name] = np.concatenate([col, self._blank(new.size, name)])
        order = np.argsort(new, kind="stable")
        at = np.searchsorted(self._sorted, new[order])
        self._sorted = np.insert(self._sorted, at, new[order])
        self._order = np.insert(self._order, at, n0 + order)

    def drop(self, keep: np.ndarray) -> None:
        """Forget the rows where ``keep`` is False (flows not seen for a long time)."""
        if keep.all():
            return
        self._last = None
        self.keys = self.keys[keep]
        self.cols = {name: col[keep] for name, col in self.cols.items()}
        order = np.argsort(self.keys, kind="stable")
        self._sorted, self._order = self.keys[order], order
