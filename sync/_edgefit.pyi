"""Type stub for the Cython slope bisection (_edgefit.pyx); keep in step with its ``def``."""

import numpy as np

def bisect_rows(
    tu: np.ndarray,
    yu: np.ndarray,
    nu: np.ndarray,
    tl: np.ndarray,
    yl: np.ndarray,
    nl: np.ndarray,
    b_prior: np.ndarray,
    bracket: np.ndarray,
    bisections: int,
    out: np.ndarray,
) -> None: ...
