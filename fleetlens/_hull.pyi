"""Type stub for the Cython hull loop (_hull.pyx); keep in step with its ``def``."""

import numpy as np
import numpy.typing as npt

def hull_rows(
    t: npt.NDArray[np.int64],
    y: npt.NDArray[np.int64],
    mask: npt.NDArray[np.bool_] | npt.NDArray[np.uint8],
    ht: npt.NDArray[np.int64],
    hy: npt.NDArray[np.int64],
    size: npt.NDArray[np.int64],
) -> None: ...
