"""Lower hulls per row: the Cython chain (``fleetlens.hull``) against numpy's column loop.

The baseline is the vectorized-over-rows monotone chain the package used before (one numpy
pass per column and pop step), run in the same process on the same arrays. Two shapes:

- an agent's window: many flow rows with a few pure points each (the simulator's shape too);
- the collector's pooled clock fits: a few hundred edge rows of up to ~300 points (32 windows
  of hulls), where the column loop cost 70 % of a clock solve.

    .venv/bin/python bench/hull_bench.py [--repeat 5]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from fleetlens.hull import _sorted_rows, lower_hull_rows


def column_loop_hulls(t: np.ndarray, y: np.ndarray, mask: np.ndarray) -> tuple[np.ndarray, ...]:
    t, y, mask = _sorted_rows(t, y, mask)
    rows, m = t.shape
    ht = np.zeros((rows, max(m, 1)), np.int64)
    hy = np.zeros((rows, max(m, 1)), np.int64)
    size = np.zeros(rows, np.int64)
    for k in range(m):
        act = np.flatnonzero(mask[:, k])
        pt, py = t[act, k], y[act, k]
        rows_, px, pyy = act, pt, py
        while rows_.size:  # pop the rows whose last turn is not strictly convex
            sz = size[rows_]
            two = sz >= 2
            rows_, px, pyy, sz = rows_[two], px[two], pyy[two], sz[two]
            ot, oy = ht[rows_, sz - 2], hy[rows_, sz - 2]
            at, ay = ht[rows_, sz - 1], hy[rows_, sz - 1]
            cross = (at - ot).astype(float) * (pyy - oy) - (ay - oy).astype(float) * (px - ot)
            pop = cross <= 0
            rows_, px, pyy = rows_[pop], px[pop], pyy[pop]
            size[rows_] -= 1
        sz = size[act]
        push = ~((sz > 0) & (ht[act, np.maximum(sz - 1, 0)] == pt))
        act, sz = act[push], sz[push]
        ht[act, sz], hy[act, sz] = pt[push], py[push]
        size[act] += 1
    return size, ht, hy


def _shape(rng: np.random.Generator, rows: int, cols: int, span_ns: int) -> tuple[np.ndarray, ...]:
    t = np.sort(rng.integers(0, span_ns, (rows, cols)), axis=1)
    return t, rng.integers(300, 5_000, (rows, cols)), rng.random((rows, cols)) < 0.9


def _best(fn, args: tuple[np.ndarray, ...], repeat: int) -> float:  # type: ignore[no-untyped-def]
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn(*args)
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--repeat", type=int, default=5)
    a = ap.parse_args()
    rng = np.random.default_rng(0)
    cases = {
        "agent window (200k rows x 8)": _shape(rng, 200_000, 8, 10**9),
        "pooled fits (200 rows x 300)": _shape(rng, 200, 300, 32 * 10**9),
    }
    for name, args in cases.items():
        new, old = lower_hull_rows(*args), column_loop_hulls(*args)
        keep = np.arange(new[1].shape[1]) < new[0][:, None]
        same = np.array_equal(new[0], old[0]) and all(
            np.array_equal(n[keep], o[keep]) for n, o in zip(new[1:], old[1:], strict=True)
        )
        c, n = _best(lower_hull_rows, args, a.repeat), _best(column_loop_hulls, args, a.repeat)
        print(f"{name}: cython {c * 1e3:.1f} ms, numpy column loop {n * 1e3:.1f} ms, "
              f"{n / c:.1f}x; identical hulls: {same}")  # fmt: skip


if __name__ == "__main__":
    main()
