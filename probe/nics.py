"""NIC discovery and probe sockets: addresses, link state, timestamping capability.

Hardware timestamps are used where the NIC has a PTP hardware clock: ``ETHTOOL_GET_TS_INFO``
says whether it can stamp in hardware, ``SIOCSHWTSTAMP`` turns stamping on; anything else
(veth, loopback, a driver without PHC) falls back to software stamps, and each NIC reports
which source it uses.
"""

from __future__ import annotations

import array
import fcntl
import fnmatch
import socket
import struct
from dataclasses import dataclass

from fleetlens.probe import netlink

from fleetlens.records import TS_HARDWARE, TS_SOFTWARE

SIOCETHTOOL, SIOCSHWTSTAMP = 0x8946, 0x89B0
ETHTOOL_GET_TS_INFO = 0x41
HWTSTAMP_TX_ON, HWTSTAMP_FILTER_ALL = 1, 1
SOF_TX_HARDWARE, SOF_TX_SOFTWARE, SOF_RX_HARDWARE, SOF_RX_SOFTWARE = 1, 2, 4, 8
SOF_SOFTWARE, SOF_RAW_HARDWARE, SOF_OPT_ID, SOF_OPT_TSONLY = 16, 64, 128, 2048
SO_TIMESTAMPING = 37
SO_RCVBUFFORCE = 33
ROCE_DSCP = 26  # the common RoCEv2 traffic class (TC 106): probes share RDMA's queues


@dataclass
class LocalNic:
    ifname: str
    ip: str
    up: bool
    ts_source: str = TS_SOFTWARE


def discover(pattern: str = "eth*") -> list[LocalNic]:
    """Interfaces matching ``pattern`` that have an IPv4 address, in name order."""
    addrs = netlink.ipv4_addresses()
    return sorted(
        (
            LocalNic(ln.name, addrs[ln.index], ln.carrier)
            for ln in netlink.links()
            if ln.index in addrs and fnmatch.fnmatch(ln.name, pattern)
        ),
        key=lambda n: n.ifname,
    )


def link_states() -> dict[str, bool]:
    """Interface name -> admin up with carrier, for every interface of this namespace."""
    return {ln.name: ln.carrier for ln in netlink.links()}


def hardware_timestamping(ifname: str) -> bool:
    """True when the NIC has a PHC and accepted ``SIOCSHWTSTAMP`` (TX on, RX all)."""
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        # struct ethtool_ts_info: cmd, so_timestamping, phc_index, tx_types, 3 reserved,
        # rx_filters, 3 reserved (44 bytes)
        info = array.array("B", struct.pack("=IIiI3II3I", ETHTOOL_GET_TS_INFO, *[0] * 10))
        ifr = struct.pack("16sP", ifname.encode(), info.buffer_info()[0])
        try:
            fcntl.ioctl(s.fileno(), SIOCETHTOOL, ifr)
        except OSError:
            return False
        _, caps, phc = struct.unpack_from("=IIi", info)
        if phc < 0 or not caps & SOF_RAW_HARDWARE:
            return False
        cfg = array.array("B", struct.pack("=iii", 0, HWTSTAMP_TX_ON, HWTSTAMP_FILTER_ALL))
        try:
            fcntl.ioctl(
                s.fileno(),
                SIOCSHWTSTAMP,
                struct.pack("16sP", ifname.encode(), cfg.buffer_info()[0]),
            )
        except OSError:
            return False
    return True


def probe_socket(nic: LocalNic, port: int, dscp: int, tx_stamps: bool = True) -> socket.socket:
    """A UDP socket on ``nic``'s address and device, DSCP set, kernel timestamps on (TX ones
    only where someone reads them: a responder's acks need none)."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    try:
        s.setsockopt(socket.SOL_SOCKET, socket.SO_BINDTODEVICE, nic.ifname.encode())
        s.setsockopt(socket.IPPROTO_IP, socket.IP_TOS, dscp << 2)
        s.setsockopt(socket.SOL_SOCKET, SO_RCVBUFFORCE, 4 << 20)
        flags = SOF_RX_SOFTWARE | SOF_SOFTWARE
        if tx_stamps:
            flags |= SOF_TX_SOFTWARE | SOF_OPT_ID | SOF_OPT_TSONLY
        if nic.ts_source == TS_HARDWARE:
            flags |= SOF_RX_HARDWARE | SOF_RAW_HARDWARE | (SOF_TX_HARDWARE if tx_stamps else 0)
        s.setsockopt(socket.SOL_SOCKET, SO_TIMESTAMPING, flags)
        s.bind((nic.ip, port))
        s.setblocking(False)
    except OSError:
        s.close()
        raise
    return s
