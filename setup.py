"""Build hook for the Cython fast path; metadata lives in pyproject.toml."""

import os
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


# include_path: the .pyx files cimport their sibling .pxd files by plain name, and the shared
# ones of the vocabulary (fleetlens/*.pxd) by their package name from the root.
extensions = cythonize(_extensions(), include_path=[".", *CYTHON_PACKAGES], language_level=3)
# The C compiles run one per core (setup.sh, pip installs, images), the largest generated C
# first: triangulate/_fast is the longest (8 of 23 CPU-seconds here) and must not start last.
extensions.sort(key=lambda ext: -Path(ext.sources[0]).stat().st_size)
setup(ext_modules=extensions, options={"build_ext": {"parallel": os.cpu_count() or 1}})
