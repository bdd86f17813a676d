"""Type stub for the Cython hull loops (_hull.pyx); keep in step with their ``def``s."""

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
def keep_group_hull(
    order: npt.NDArray[np.int64],
    bounds: npt.NDArray[np.int64],
    ht: npt.NDArray[np.int64],
    hy: npt.NDArray[np.int64],
    size: npt.NDArray[np.int64],
) -> None: ...
