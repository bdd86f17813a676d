"""Build hook for the Cython fast path; metadata lives in pyproject.toml."""

from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup

# Source directory -> the package its .pyx modules belong to (the package-dir mapping).
CYTHON_PACKAGES = {
    "fleetlens": "fleetlens",
    "probe": "fleetlens.probe",
    "fixtures/lab": "fleetlens.fixtures.lab",
    "triangulate": "fleetlens.triangulate",
    "sync": "fleetlens.sync",
}


def _extensions() -> list[Extension]:
    return [
        Extension(
            f"{package}.{pyx.stem}",
            [str(pyx)],
            include_dirs=[numpy.get_include(), src],
            extra_compile_args=["-O2"],
        )
        for src, package in CYTHON_PACKAGES.items()
        for pyx in sorted(Path(src).glob("*.pyx"))
    ]


# include_path: the .pyx files cimport their sibling .pxd files by plain name.
setup(ext_modules=cythonize(_extensions(), include_path=list(CYTHON_PACKAGES), language_level=3))
