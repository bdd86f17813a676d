"""Wire a host plan to the fast path: sockets per NIC, the engine, and the flow table."""

from __future__ import annotations

import ipaddress
import logging
import secrets
import socket

import numpy as np
from fleetlens.probe.fastpath import Engine
from fleetlens.probe.nics import LocalNic, probe_socket
from fleetlens.probe.windows import FlowTable

from fleetlens.ids import nic_id
from fleetlens.records import TS_HARDWARE, HostPlan, PlanEntry

log = logging.getLogger("fleetlens.agent")

# A primer datagram before each pair (see ``fastpath``): "auto" primes the NICs that stamp in
# software, where the first datagram through a cold path is late and the pair impure.
PRIMER_MODES = ("auto", "on", "off")


class DataPath:
    """Owns every probe socket of the host and the :class:`Engine` that drives them."""

    def __init__(
        self, plan: HostPlan, nics: list[LocalNic], key: bytes, dscp: int, primer: str = "auto"
    ) -> None:
        if primer not in PRIMER_MODES:
            raise ValueError(f"primer must be one of {PRIMER_MODES}, not {primer!r}")
        self.plan = plan
        self.primer = primer
        self.host = plan.host_id
        local = {nic_id(self.host, n.ifname): n for n in nics}
        missing = sorted({e.src_nic for e in plan.entries} - set(local))
        if missing:
            log.warning("plan names NICs this host does not have (now): %s", ", ".join(missing))
        self.entries: list[PlanEntry] = [e for e in plan.entries if e.src_nic in local]
        self.engine = Engine(key, secrets.randbits(63))
        self.sockets: list[socket.socket] = []
        self.nic_index: dict[str, int] = {}
        self.nics = local
        try:
            for nid, nic in local.items():
                self.nic_index[nid] = self._add_nic(nid, nic, dscp)
        except BaseException:
            self.close()
            raise
        self.flows, self.flow_base = self._flow_table()

    def _add_nic(self, nid: str, nic: LocalNic, dscp: int) -> int:
        # The engine finds port k of a peer at sender socket k: one contiguous range per NIC.
        ports = sorted({p for e in self.entries if e.src_nic == nid for p in e.sports})
        if ports and ports != list(range(ports[0], ports[0] + len(ports))):
            raise ValueError(f"{nid}: plan source ports are not one contiguous range")
        fds = []
        for port in [self.plan.dport, *ports]:
            # kept in self.sockets for close() even if a later one fails
            self.sockets.append(probe_socket(nic, port, dscp, tx_stamps=port != self.plan.dport))
            fds.append(self.sockets[-1].fileno())
        hardware = nic.ts_source == TS_HARDWARE
        prime = self.primer == "on" or (self.primer == "auto" and not hardware)
        return self.engine.add_nic(fds[0], fds[1:], hardware, prime)

    def _flow_table(self) -> tuple[FlowTable, np.ndarray]:
        sizes = np.array([len(e.sports) for e in self.entries], dtype=np.int64)
        base = np.concatenate([[0], np.cumsum(sizes)[:-1]]).astype(np.int32)
        src = np.array([e.src_nic for e in self.entries for _ in e.sports], dtype=object)
        dst = np.array([e.dst_nic for e in self.entries for _ in e.sports], dtype=object)
        sport = np.array([p for e in self.entries for p in e.sports], dtype=np.int32)
        ts = np.array([self.nics[s].ts_source for s in src], dtype=object)
        return FlowTable(src, dst, sport, ts), base

    def apply(self, up: set[str]) -> None:
        """Probe only from NICs that are up (a NIC going down stops its sends, not the agent)."""
        keep = [i for i, e in enumerate(self.entries) if e.src_nic in up]
        self.engine.set_plan(
            self.plan.dport,
            np.array([self.nic_index[self.entries[i].src_nic] for i in keep], dtype=np.int32),
            np.array(
                [int(ipaddress.IPv4Address(self.entries[i].dst_ip)) for i in keep], dtype=np.uint32
            ),
            np.array([len(self.entries[i].sports) for i in keep], dtype=np.int32),
            self.flow_base[keep].astype(np.int32),
        )

    def close(self) -> None:
        for s in self.sockets:
            s.close()
        self.sockets.clear()
