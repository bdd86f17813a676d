"""Per-flow state kept across windows, addressed by an int64 flow key (no Python dicts).

At fleet scale there are millions of flows; a sorted key array with ``np.searchsorted`` keeps
lookups vectorized and memory at a few dozen bytes per flow.
"""

from __future__ import annotations

import numpy as np


class FlowStore:
    """Columns of per-flow state; rows sorted by key, grown when unseen keys arrive."""

    def __init__(self, columns: dict[str, tuple[np.dtype | type, object, int]]) -> None:
        # name -> (dtype, fill value, width); width 0 means a 1-D column
        self.spec = columns
        self.keys = np.empty(0, np.int64)
        self._last: tuple[np.ndarray, np.ndarray] | None = None  # last locate() (keys, rows)
        self.cols: dict[str, np.ndarray] = {name: self._blank(0, name) for name in columns}

    def _blank(self, n: int, name: str) -> np.ndarray:
        dtype, fill, width = self.spec[name]
        shape = (n, width) if width else (n,)
        return np.full(shape, fill, dtype=dtype)

    def __len__(self) -> int:
        return int(self.keys.size)

    def locate(self, keys: np.ndarray) -> np.ndarray:
        """Row of every key, inserting the keys not stored yet (with the fill values)."""
        last = self._last
        if last is not None and last[0].size == keys.size and np.array_equal(last[0], keys):
            return last[1]  # agents send the same flows window after window
        pos = self._locate(keys)
        self._last = (keys.copy(), pos)
        return pos

    def _locate(self, keys: np.ndarray) -> np.ndarray:
        pos = np.searchsorted(self.keys, keys)
        hit = pos < self.keys.size
        hit[hit] = self.keys[pos[hit]] == keys[hit]
        if not hit.all():
            self._insert(np.unique(keys[~hit]))
            pos = np.searchsorted(self.keys, keys)
        return pos

    def find(self, keys: np.ndarray) -> np.ndarray:
        """Row of every key, -1 where the key is not stored."""
        pos = np.searchsorted(self.keys, keys)
        ok = pos < self.keys.size
        ok[ok] = self.keys[pos[ok]] == keys[ok]
        return np.where(ok, pos, -1)

    def _insert(self, new: np.ndarray) -> None:
        self._last = None
        merged = np.union1d(self.keys, new)
        old_at = np.searchsorted(merged, self.keys)
        for name, col in self.cols.items():
            grown = self._blank(merged.size, name)
            grown[old_at] = col
            self.cols[name] = grown
        self.keys = merged

    def drop(self, keep: np.ndarray) -> None:
        """Forget the rows where ``keep`` is False (flows not seen for a long time)."""
        if keep.all():
            return
        self._last = None
        self.keys = self.keys[keep]
        self.cols = {name: col[keep] for name, col in self.cols.items()}
