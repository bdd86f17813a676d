from collections.abc import Callable

import numpy as np
import pyarrow as pa

_Out = Callable[[int], list[np.ndarray]] | None

def group_points(
    edge: np.ndarray, upper: np.ndarray, t: np.ndarray, y: np.ndarray, n_edges: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
def run_gaps(
    edge: np.ndarray,
    upper: np.ndarray,
    t: np.ndarray,
    y: np.ndarray,
    line0: np.ndarray,
    carry: np.ndarray,
    lo_gap: np.ndarray,
    hi_gap: np.ndarray,
) -> None: ...
def hull_groups(
    off: np.ndarray, order: np.ndarray, t: np.ndarray, y: np.ndarray
) -> tuple[np.ndarray, np.ndarray, np.ndarray]: ...
def slope_edges(
    off: np.ndarray,
    t: np.ndarray,
    y: np.ndarray,
    b_prior: np.ndarray,
    bracket: np.ndarray,
    out: np.ndarray,
    span: np.ndarray,
) -> None: ...
def floors(
    off: np.ndarray, t: np.ndarray, y: np.ndarray, b: np.ndarray, f: np.ndarray, g: np.ndarray
) -> None: ...
def pair_hulls(
    src: np.ndarray, dst: np.ndarray, t: np.ndarray, y: np.ndarray, n_nic: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None: ...

class ListColumn:
    col: pa.ChunkedArray
    ch: np.ndarray
    at: np.ndarray
    n: np.ndarray
    null: np.ndarray
    def __init__(self, col: pa.ChunkedArray) -> None: ...

class RowLists:
    src: np.ndarray
    dst: np.ndarray
    t: ListColumn
    y: ListColumn
    def __init__(self, src: np.ndarray, dst: np.ndarray, t: ListColumn, y: ListColumn) -> None: ...

def row_pair_hulls(
    keep: np.ndarray, lists: RowLists, n_nic: int, scratch: _Out = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]: ...
def union_hulls(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    cur: np.ndarray,
    scratch: _Out = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None: ...
def union_edge_points(
    parts: list[tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]],
    cur: np.ndarray,
    key_codes: np.ndarray,
    n_nic: int,
    nic_h: np.ndarray,
    theta: np.ndarray,
    drift: np.ndarray,
    t_ref: int,
    lat: np.ndarray,
    scratch: _Out = None,
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None: ...
def flatten_points(
    keep: np.ndarray, lists: RowLists, total: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, int]: ...
def generation_runs(
    start: np.ndarray, one: int
) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray] | None: ...
def shifted_median(t: np.ndarray, host: np.ndarray, shift: np.ndarray) -> float: ...
def fleet_times(
    t_raw: np.ndarray,
    src: np.ndarray,
    nic_h: np.ndarray,
    theta: np.ndarray,
    drift: np.ndarray,
    t_ref: int,
) -> np.ndarray: ...
def edge_delays(
    owd_raw: np.ndarray, src: np.ndarray, dst: np.ndarray, lat: np.ndarray
) -> tuple[np.ndarray, np.ndarray]: ...
