"""The NICs and hosts the collector accepts windows from: the inventory's ∪ registered ones.

Agents register the NICs they discover; the inventory (when given) names the fleet's NICs up
front. A batch naming any other NIC is rejected (``checks.py``). The set is swapped whole on
refresh (after a registration), so readers on other threads never see it half built.
"""

from __future__ import annotations

import threading
from collections.abc import Iterable

import pyarrow as pa

from fleetlens.ids import split_nic_id
from fleetlens.topology import Topology


class KnownNics:
    def __init__(self, topology: Topology | None) -> None:
        self._topology = topology
        self._lock = threading.Lock()
        self._array = pa.array([], pa.string())
        self._set: frozenset[str] = frozenset()
        self.version = 0  # counts refreshes: ingest workers copy the set when it changes

    def refresh(self, registered: Iterable[str]) -> None:
        """Known = the inventory's NICs ∪ ``registered`` (every NIC agents registered)."""
        inventory = [n.id for n in self._topology.nics] if self._topology else []
        known = set(inventory) | set(registered)
        with self._lock:
            self._array = pa.array(sorted(known), pa.string())
            self._set = frozenset(known)
            self.version += 1

    def nics(self) -> pa.Array:
        """Every known NIC id, sorted."""
        with self._lock:
            return self._array

    def nic_set(self) -> frozenset[str]:
        return self._set

    def __contains__(self, nic: str) -> bool:
        return nic in self._set

    def hosts(self) -> list[str]:
        """Hosts of the known NICs and of the inventory, sorted."""
        hosts = {split_nic_id(n)[0] for n in self.nics().to_pylist()}
        if self._topology:
            hosts |= set(self._topology.hosts)
        return sorted(hosts)
