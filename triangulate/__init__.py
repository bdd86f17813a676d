"""Triangulation: path model, link tomography, verdicts, host/NIC attribution, job impact.

The collector plugs in :class:`Triangulator` (a ``Triangulate`` callable that keeps state
across windows), :func:`decisions` and :func:`job_impact`; see ``triangulate/README.md``.
"""

from .config import TriangulateConfig
from .decisions import JobImpact, decisions, job_impact
from .engine import Triangulator

__all__ = ["JobImpact", "TriangulateConfig", "Triangulator", "decisions", "job_impact"]
