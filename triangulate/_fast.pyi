"""Type stub for the triangulation loops (_fast.pyx); keep in step with its ``def``s.

Typed memoryviews take any contiguous buffer; the callers pass numpy arrays of the dtype named
here. Validity arguments are uint8 per row, or None when a column has no nulls.
"""

import numpy as np
import numpy.typing as npt

from fleetlens._strindex import StrIndex

_I64 = npt.NDArray[np.int64]
_F64 = npt.NDArray[np.float64]
_U8 = npt.NDArray[np.uint8]
_Ints = npt.NDArray[np.int32] | npt.NDArray[np.int64]  # the fused ``ints_t`` / ``offs_t``
_Valid = _U8 | None

class FlowIndex:
    def __init__(self, keys: _I64) -> None: ...

class U64Map:
    def __init__(self, keys: npt.NDArray[np.uint64], vals: _I64) -> None: ...
    def get(self, query: npt.NDArray[np.uint64]) -> _I64: ...

def compose_keys(
    src: _I64, dst: _I64, sport: _Ints, valid: _Valid, n_nics: int, out: _I64
) -> int: ...
def span(
    start: _I64, start_ok: _Valid, dur: _I64, dur_ok: _Valid, rows: _I64 | None
) -> tuple[int, int, bool, bool]: ...
def path_matrix(
    list_off: _Ints,
    list_ok: _Valid,
    str_off: npt.NDArray[np.int32],
    data: _U8,
    str_ok: _Valid,
    links: StrIndex,
    width: int,
) -> tuple[_I64, _I64, npt.NDArray[np.bool_]]: ...
def route_hash(mid: _I64) -> npt.NDArray[np.uint64]: ...
def link_sums(
    up: _I64, dn: _I64, route: _I64, x: _F64, n_links: int, n_routes: int
) -> tuple[_F64, _F64, _F64]: ...
def baseline_update(
    base: _F64, t: _I64, at: _I64, obs: _F64, end_ns: int, slack_ns_per_s: float
) -> None: ...
def decay_add(
    sent: _F64,
    lost: _F64,
    f_sent: _F64,
    f_lost: _F64,
    gamma: float,
    floor_lost: float,
    keep_sent: float,
    lossy_now: _I64,
    lossy_all: _I64,
) -> tuple[bool, int, int]: ...
def decay(sent: _F64, lost: _F64, gamma: float) -> None: ...
def to_bins(
    v: _F64, lin_ns: float, lin_bins: int, log_growth: float, half: int
) -> npt.NDArray[np.int16]: ...
def grouped_quantile(
    ptr: _I64, item: _I64, weight: _F64, bins: npt.NDArray[np.int16], n_bins: int, q: float
) -> tuple[_I64, _F64, _F64, _F64, _F64]: ...
def strip_access(
    pad: _I64, lens: _I64, up: _I64, down: _I64
) -> tuple[_I64, npt.NDArray[np.bool_]]: ...
def group_rows(col: _I64, n_groups: int) -> tuple[_I64, _I64]: ...
def decode_batch(
    index: FlowIndex,
    src: _I64,
    dst: _I64,
    sport: _Ints,
    sport_ok: _Valid,
    sent: _Ints,
    sent_ok: _Valid,
    recv: _Ints,
    recv_ok: _Valid,
    owd: _F64,
    owd_ok: _Valid,
    start: _I64,
    start_ok: _Valid,
    dur: _I64,
    dur_ok: _Valid,
    n_nics: int,
    first_row: int,
    pos: _I64,
    seen: npt.NDArray[np.uint64],
    sent_out: _F64,
    lost_out: _F64,
    owd_out: _F64,
    scratch: _I64,
) -> tuple[int, int, int, int, int, int, int, bool, bool]: ...
def first_rows(pos: _I64, n_flows: int) -> _I64: ...
