"""Build hook for the Cython fast path; metadata lives in pyproject.toml."""

from pathlib import Path

import numpy
from Cython.Build import cythonize
from setuptools import Extension, setup


def _extensions() -> list[Extension]:
    # Every .pyx under probe/ becomes fleetlens.probe.<name>.
    return [
        Extension(
            f"fleetlens.probe.{pyx.stem}",
            [str(pyx)],
            include_dirs=[numpy.get_include(), "probe"],
            extra_compile_args=["-O2"],
        )
        for pyx in sorted(Path("probe").glob("*.pyx"))
    ]


# include_path: the .pyx files cimport their sibling .pxd files by plain name.
setup(ext_modules=cythonize(_extensions(), include_path=["probe"], language_level=3))
