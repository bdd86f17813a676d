import numpy as np
import numpy.typing as npt
import pyarrow as pa

class StrIndex:
    size: int
    def __init__(self, strings: list[str]) -> None: ...
    def lookup(
        self,
        off: npt.NDArray[np.int32] | npt.NDArray[np.int64],
        data: npt.NDArray[np.uint8],
        valid: npt.NDArray[np.uint8] | None,
        out: npt.NDArray[np.int64],
    ) -> int: ...
    def of(self, col: pa.ChunkedArray) -> npt.NDArray[np.int64]: ...
