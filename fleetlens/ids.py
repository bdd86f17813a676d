"""Stable string ids shared by every component.

- host ids: ``h00``, ``h0042`` (zero-padded to the fleet's width, at least two digits)
- NIC ids: ``h03/eth1`` (host id, a slash, the interface name)
- switch ids: ``leaf1``, ``spine0``, ``agg3``, ``core12``
- directed link ids: ``a->b`` between two node ids (a NIC id or a switch id)
"""

from __future__ import annotations

LINK_ARROW = "->"


def host_id(index: int, fleet_size: int) -> str:
    width = max(2, len(str(max(fleet_size - 1, 0))))
    return f"h{index:0{width}d}"


def nic_id(host: str, ifname: str) -> str:
    return f"{host}/{ifname}"


def split_nic_id(nic: str) -> tuple[str, str]:
    """``'h03/eth1'`` -> ``('h03', 'eth1')``; raises ValueError on anything else."""
    host, sep, ifname = nic.partition("/")
    if not sep or not host or not ifname or "/" in ifname:
        raise ValueError(f"not a NIC id (want HOST/IFNAME): {nic!r}")
    return host, ifname


def is_nic_id(node: str) -> bool:
    return "/" in node


def link_id(a: str, b: str) -> str:
    return f"{a}{LINK_ARROW}{b}"


def split_link_id(link: str) -> tuple[str, str]:
    """``'leaf1->spine0'`` -> ``('leaf1', 'spine0')``; raises ValueError on anything else."""
    a, sep, b = link.partition(LINK_ARROW)
    if not sep or not a or not b or LINK_ARROW in b:
        raise ValueError(f"not a directed link id (want A->B): {link!r}")
    return a, b


def reverse_link(link: str) -> str:
    a, b = split_link_id(link)
    return link_id(b, a)
