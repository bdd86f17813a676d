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
