"""Output buffers of the merges, kept from round to round.

A merge (a window's pair hulls from its rows, a span's union) writes up to every point it
reads (3-4 M at 1024 hosts) and keeps a fifth to a third of them. Buffers allocated fresh
each round were faulted in again each time: most of the merges' kernel time, and the page
faults of their allocations were taken holding the GIL. One ``Scratch`` per solver
(``HuygensSync``), each buffer named by its use, grown by a quarter more than asked when a
round needs more; a result written to one is valid until its use comes round again.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial

import numpy as np


class Scratch:
    """Named sets of buffers, grown on demand."""

    def __init__(self) -> None:
        self._bufs: dict[object, list[np.ndarray]] = {}

    def get(self, key: object, n: int, dtypes: tuple[type, ...]) -> list[np.ndarray]:
        """Arrays of ``dtypes`` of at least ``n`` elements, the same ones each time they do."""
        have = self._bufs.get(key)
        if have is None or have[0].size < n:
            have = [np.empty(n + n // 4 + 1, d) for d in dtypes]
            self._bufs[key] = have
        return have

    def of(self, key: object, dtypes: tuple[type, ...]) -> Callable[[int], list[np.ndarray]]:
        """:meth:`get` for ``key`` as the kernels take it (``n`` -> arrays)."""
        return partial(self.get, key, dtypes=dtypes)
