"""FleetLens: fabric telemetry for GPU clusters.

The shared vocabulary lives here (ids, topology, wire records, the probe planner) and is
imported by every component; see ../shared/design.md for the contracts.
"""

__version__ = "0.1.0"
