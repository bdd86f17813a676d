"""Triangulation: path model, link tomography, verdicts, host/NIC attribution, job impact."""
