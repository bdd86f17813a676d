"""Triangulation: path model, link tomography, verdicts, host/NIC attribution, job impact.

The collector plugs in :class:`Triangulator` (a ``fleetlens.engines.Triangulate`` that keeps
state across windows) and derives drain decisions (:func:`decisions`, or
:func:`decisions_by_nic` without a topology) and a job's impact (:func:`job_impact`) from its
verdicts; see ``triangulate/README.md``.
"""

from .config import TriangulateConfig
from .decisions import JobImpact, decisions, decisions_by_nic, job_impact
from .engine import Triangulator

__all__ = [
    "JobImpact",
    "TriangulateConfig",
    "Triangulator",
    "decisions",
    "decisions_by_nic",
    "job_impact",
]
