"""Type stub for the one-pass batch checks (_batchscan.pyx); keep in step with its ``def``."""

import numpy as np
import numpy.typing as npt
import pyarrow as pa

class Scan:
    first: npt.NDArray[np.int64]
    count: npt.NDArray[np.int64]
    src: list[str]
    dst: list[str]
    src_code: npt.NDArray[np.int32]
    dst_code: npt.NDArray[np.int32]
    end_max: int
    failed: bool

N_CHECKS: int

def scan(batch: pa.RecordBatch) -> Scan: ...

class Codes:
    nics: list[str]
    ts: list[str]
    links: list[str]
    src_code: npt.NDArray[np.int32]
    dst_code: npt.NDArray[np.int32]
    ts_code: npt.NDArray[np.int32]
    link_code: npt.NDArray[np.int32]
    path_off: npt.NDArray[np.int32]
    path_valid: npt.NDArray[np.uint8] | None

def codes(batches: list[pa.RecordBatch]) -> Codes: ...
def hash_lists(
    off: npt.NDArray[np.int32], values: npt.NDArray[np.int32], mask: np.uint64 | int
) -> npt.NDArray[np.uint64]: ...
def intern_lists(
    off: npt.NDArray[np.int32],
    values: npt.NDArray[np.int32],
    valid: npt.NDArray[np.uint8] | None,
    slots: npt.NDArray[np.int32],
    hash_of: npt.NDArray[np.uint64],
    stored_off: npt.NDArray[np.int32],
    stored: npt.NDArray[np.int32],
    count: int,
    mask: np.uint64 | int,
    start: int,
    ids: npt.NDArray[np.int32],
) -> tuple[int, int]: ...
