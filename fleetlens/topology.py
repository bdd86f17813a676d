"""The fabric topology: hosts, NICs, switches by tier, directed links, ECMP paths.

One record type serves the lab fabric, the simulator, the collector's inventory and the
triangulation engine. Builders:

- :func:`leaf_spine` — 2-tier Clos. ``wiring="rail"`` (default) puts NIC *k* of every host
  on leaf group *k* (the GPU-cluster rail layout: ``leaves // nics`` leaves per rail, hosts
  split over them in contiguous blocks); ``wiring="host"`` puts all NICs of a host on one
  leaf (a classic rack). Every leaf connects to every spine.
- :func:`fat_tree` — 3-tier k-ary fat-tree (k pods, k/2 leaves and k/2 aggregation switches
  per pod, (k/2)² cores, k/2 hosts per leaf).

Addressing (used by the lab and by agents' plans): leaf *l* owns the /22 starting at
``10.0.0.0 + 1024·l``; the *j*-th NIC attached to it gets ``base + 2j + 1`` on a /31 whose
other end (``base + 2j``) is the leaf's side of the access link.

``interfaces`` (optional, from the inventory) maps a switch interface address to the directed
link that arrives at that interface. A router answering a traceroute from its inbound
interface's address (``icmp_errors_use_inbound_ifaddr``) thereby names the link the probe
came in on, which is how agents turn hop addresses into paths.

:attr:`Topology.index` numbers hosts, NICs, switches and links densely (0..n-1 in topology
order), once per topology: every vectorized engine (simulator, triangulation) indexes numpy
arrays by these numbers and turns them back into ids only when it writes records.
"""

from __future__ import annotations

import ipaddress
import itertools
import json
from collections import Counter, deque
from collections.abc import Iterable, Mapping
from dataclasses import asdict, dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import yaml

from fleetlens.ids import host_id, link_id, nic_id

TIER_LEAF, TIER_SPINE, TIER_CORE = 1, 2, 3
_LEAF_BLOCK = 1024
_ADDR_BASE = int(ipaddress.IPv4Address("10.0.0.0"))


@dataclass(frozen=True)
class Nic:
    host: str
    ifname: str
    ip: str
    leaf: str

    @property
    def id(self) -> str:
        return nic_id(self.host, self.ifname)

    @property
    def gateway(self) -> str:
        """The leaf's address on this NIC's /31 access link."""
        return str(ipaddress.IPv4Address(self.ip) - 1)


@dataclass(frozen=True)
class Switch:
    id: str
    tier: int  # TIER_LEAF, TIER_SPINE (spine or aggregation) or TIER_CORE
    pod: int | None = None


@dataclass(frozen=True)
class Link:
    """A directed link; ``tier`` is 'access' (NIC<->leaf), 'fabric' (leaf<->spine/agg) or 'core'."""

    a: str
    b: str
    tier: str

    @property
    def id(self) -> str:
        return link_id(self.a, self.b)


@dataclass(frozen=True)
class DenseIndex:
    """Dense integer numbers of a topology's hosts, NICs, switches and links, and the per-NIC
    and per-link arrays built from them. -1 means "none" (e.g. a NIC without an access link,
    or the NIC end of a link in ``link_tail``/``link_head``). Arrays are read-only."""

    host_ids: tuple[str, ...]
    nic_ids: tuple[str, ...]
    switch_ids: tuple[str, ...]
    link_ids: tuple[str, ...]
    host: Mapping[str, int]  # id -> number, for each of the four kinds
    nic: Mapping[str, int]
    switch: Mapping[str, int]
    link: Mapping[str, int]
    nic_host: np.ndarray  # host number of each NIC
    nic_leaf: np.ndarray  # switch number of each NIC's leaf
    nic_up: np.ndarray  # link number of each NIC's access link towards its leaf
    nic_down: np.ndarray  # ... and from its leaf
    link_tail: np.ndarray  # switch number at each link's tail (-1: a NIC)
    link_head: np.ndarray  # switch number at each link's head (-1: a NIC)
    link_nic: np.ndarray  # the NIC of an access link (its tail if that is a NIC, else its head)

    @classmethod
    def build(cls, topo: Topology) -> DenseIndex:
        hosts, nics = tuple(topo.hosts), tuple(n.id for n in topo.nics)
        switches, links = tuple(s.id for s in topo.switches), tuple(lk.id for lk in topo.links)
        host, nic, switch, link = (_numbers(ids) for ids in (hosts, nics, switches, links))
        tail_nic = _lookup(nic, (lk.a for lk in topo.links))
        head_nic = _lookup(nic, (lk.b for lk in topo.links))
        return cls(
            hosts, nics, switches, links, host, nic, switch, link,
            nic_host=_frozen(_lookup(host, (n.host for n in topo.nics))),
            nic_leaf=_frozen(_lookup(switch, (n.leaf for n in topo.nics))),
            nic_up=_frozen(_last_link(tail_nic, len(nics))),
            nic_down=_frozen(_last_link(head_nic, len(nics))),
            link_tail=_frozen(_lookup(switch, (lk.a for lk in topo.links))),
            link_head=_frozen(_lookup(switch, (lk.b for lk in topo.links))),
            link_nic=_frozen(np.where(tail_nic >= 0, tail_nic, head_nic)),
        )  # fmt: skip


def _numbers(ids: tuple[str, ...]) -> dict[str, int]:
    return {x: i for i, x in enumerate(ids)}


def _lookup(numbers: Mapping[str, int], ids: Iterable[str]) -> np.ndarray:
    return np.array([numbers.get(x, -1) for x in ids], np.int64)


def _last_link(end_nic: np.ndarray, n_nics: int) -> np.ndarray:
    """Per NIC, the (last) link whose given end is that NIC, -1 if none."""
    out = np.full(n_nics, -1, np.int64)
    links = np.flatnonzero(end_nic >= 0)
    out[end_nic[links]] = links  # ascending links: the last one of a NIC wins
    return out


def _frozen(a: np.ndarray) -> np.ndarray:
    a.flags.writeable = False
    return a


@dataclass
class Topology:
    kind: str
    params: dict[str, object]
    hosts: list[str]
    nics: list[Nic]
    switches: list[Switch]
    links: list[Link]
    interfaces: dict[str, str] = field(default_factory=dict)  # switch interface IP -> link id
    _path_cache: dict[tuple[str, str], list[tuple[str, ...]]] = field(
        default_factory=dict, repr=False, compare=False
    )

    # ---- lookups -------------------------------------------------------------------------
    @cached_property
    def index(self) -> DenseIndex:
        """The dense numbering of this topology (built on first use; the topology's lists
        must not change afterwards)."""
        return DenseIndex.build(self)

    @cached_property
    def nic_by_id(self) -> dict[str, Nic]:
        return {n.id: n for n in self.nics}

    @cached_property
    def switch_by_id(self) -> dict[str, Switch]:
        return {s.id: s for s in self.switches}

    @cached_property
    def link_by_id(self) -> dict[str, Link]:
        return {lk.id: lk for lk in self.links}

    @cached_property
    def nics_by_host(self) -> dict[str, list[Nic]]:
        out: dict[str, list[Nic]] = {h: [] for h in self.hosts}
        for n in self.nics:
            out[n.host].append(n)
        return out

    @cached_property
    def nics_by_leaf(self) -> dict[str, list[Nic]]:
        out: dict[str, list[Nic]] = {s.id: [] for s in self.switches if s.tier == TIER_LEAF}
        for n in self.nics:
            out[n.leaf].append(n)
        return out

    @cached_property
    def _switch_adjacency(self) -> dict[str, list[str]]:
        adj: dict[str, list[str]] = {s.id: [] for s in self.switches}
        for lk in self.links:
            if lk.a in adj and lk.b in adj:
                adj[lk.a].append(lk.b)
        return adj

    def switches_of_tier(self, tier: int) -> list[Switch]:
        return [s for s in self.switches if s.tier == tier]

    def leaf_index(self, leaf: str) -> int:
        return [s.id for s in self.switches_of_tier(TIER_LEAF)].index(leaf)

    # ---- paths ---------------------------------------------------------------------------
    def switch_paths(self, leaf_a: str, leaf_b: str) -> list[tuple[str, ...]]:
        """All shortest switch sequences from one leaf to another (the ECMP set in a Clos)."""
        key = (leaf_a, leaf_b)
        if key not in self._path_cache:
            self._path_cache[key] = _all_shortest_paths(self._switch_adjacency, leaf_a, leaf_b)
        return self._path_cache[key]

    def link_shares(self, leaf_a: str, leaf_b: str) -> dict[str, float]:
        """Directed fabric links on the equal-cost paths from one leaf to another, each with
        the share of those paths crossing it (what ECMP hashing spreads over it)."""
        paths = self.switch_paths(leaf_a, leaf_b) if leaf_a != leaf_b else []
        counts = Counter(link_id(u, v) for p in paths for u, v in itertools.pairwise(p))
        return {lk: n / len(paths) for lk, n in counts.items()}

    def ecmp_paths(self, src_nic: str, dst_nic: str) -> list[list[str]]:
        """Every equal-cost path of a flow as ordered directed link ids, access links included."""
        src, dst = self.nic_by_id[src_nic], self.nic_by_id[dst_nic]
        paths = []
        for sw in self.switch_paths(src.leaf, dst.leaf):
            nodes = [src_nic, *sw, dst_nic]
            paths.append([link_id(a, b) for a, b in itertools.pairwise(nodes)])
        return paths

    # ---- files ---------------------------------------------------------------------------
    def to_dict(self) -> dict[str, object]:
        return {
            "kind": self.kind,
            "params": self.params,
            "hosts": self.hosts,
            "nics": [asdict(n) for n in self.nics],
            "switches": [asdict(s) for s in self.switches],
            "links": [asdict(lk) for lk in self.links],
            "interfaces": self.interfaces,
        }

    @classmethod
    def from_dict(cls, d: dict) -> Topology:
        try:
            return cls(
                kind=str(d["kind"]),
                params=dict(d.get("params", {})),
                hosts=[str(h) for h in d["hosts"]],
                nics=[Nic(**n) for n in d["nics"]],
                switches=[Switch(**s) for s in d["switches"]],
                links=[Link(**lk) for lk in d["links"]],
                interfaces={str(k): str(v) for k, v in (d.get("interfaces") or {}).items()},
            )
        except (KeyError, TypeError) as e:
            raise ValueError(f"malformed topology: {e}") from e

    def save(self, path: str | Path) -> None:
        path = Path(path)
        text = (
            yaml.safe_dump(self.to_dict(), sort_keys=False)
            if path.suffix in (".yaml", ".yml")
            else json.dumps(self.to_dict(), indent=1)
        )
        path.write_text(text)

    @classmethod
    def load(cls, path: str | Path) -> Topology:
        """Load a fleet inventory (YAML or JSON) or a spec string such as ``leafspine:hosts=8``."""
        p = Path(path)
        if not p.exists() and ":" in str(path):
            return from_spec(str(path))
        return cls.from_dict(yaml.safe_load(p.read_text()))


def _all_shortest_paths(adj: dict[str, list[str]], a: str, b: str) -> list[tuple[str, ...]]:
    dist = {b: 0}
    queue = deque([b])
    while queue:
        u = queue.popleft()
        for v in adj[u]:
            if v not in dist:
                dist[v] = dist[u] + 1
                queue.append(v)
    if a not in dist:
        return []
    paths: list[tuple[str, ...]] = []
    stack: list[tuple[str, ...]] = [(a,)]
    while stack:
        p = stack.pop()
        if p[-1] == b:
            paths.append(p)
            continue
        d = dist[p[-1]]
        stack.extend((*p, v) for v in reversed(adj[p[-1]]) if dist.get(v) == d - 1)
    return sorted(paths)


def nic_address(leaf_index: int, slot: int) -> str:
    if slot >= _LEAF_BLOCK // 2:
        raise ValueError(f"leaf {leaf_index} has more than {_LEAF_BLOCK // 2} NICs")
    return str(ipaddress.IPv4Address(_ADDR_BASE + _LEAF_BLOCK * leaf_index + 2 * slot + 1))


def leaf_prefix(leaf_index: int) -> str:
    return f"{ipaddress.IPv4Address(_ADDR_BASE + _LEAF_BLOCK * leaf_index)}/22"


def _attach_nics(
    hosts: list[str], nics: int, leaf_of: Iterable[tuple[int, int, int]], leaves: list[str]
) -> tuple[list[Nic], list[Link]]:
    slots = [0] * len(leaves)
    out, links = [], []
    for h, k, leaf in leaf_of:
        nic = Nic(hosts[h], f"eth{k}", nic_address(leaf, slots[leaf]), leaves[leaf])
        slots[leaf] += 1
        out.append(nic)
        links += [Link(nic.id, nic.leaf, "access"), Link(nic.leaf, nic.id, "access")]
    return out, links


def leaf_spine(
    hosts: int = 8, nics: int = 2, leaves: int = 4, spines: int = 2, wiring: str = "rail"
) -> Topology:
    if min(hosts, nics, leaves, spines) < 1:
        raise ValueError("hosts, nics, leaves and spines must all be >= 1")
    host_ids = [host_id(i, hosts) for i in range(hosts)]
    leaf_ids = [f"leaf{i}" for i in range(leaves)]
    spine_ids = [f"spine{i}" for i in range(spines)]
    if wiring == "rail":
        if leaves % nics:
            raise ValueError(f"rail wiring needs leaves ({leaves}) divisible by nics ({nics})")
        per_rail = leaves // nics
        placement = (
            (h, k, k * per_rail + h * per_rail // hosts) for h in range(hosts) for k in range(nics)
        )
    elif wiring == "host":
        placement = ((h, k, h * leaves // hosts) for h in range(hosts) for k in range(nics))
    else:
        raise ValueError(f"unknown wiring {wiring!r} (rail or host)")
    nic_list, links = _attach_nics(host_ids, nics, placement, leaf_ids)
    for lf in leaf_ids:
        for sp in spine_ids:
            links += [Link(lf, sp, "fabric"), Link(sp, lf, "fabric")]
    switches = [Switch(i, TIER_LEAF) for i in leaf_ids] + [Switch(s, TIER_SPINE) for s in spine_ids]
    params = {"hosts": hosts, "nics": nics, "leaves": leaves, "spines": spines, "wiring": wiring}
    return Topology("leafspine", params, host_ids, nic_list, switches, links)


def fat_tree(k: int = 4, nics: int = 1) -> Topology:
    if k < 2 or k % 2:
        raise ValueError("fat-tree k must be an even number >= 2")
    half = k // 2
    n_hosts = k * half * half
    host_ids = [host_id(i, n_hosts) for i in range(n_hosts)]
    leaf_ids = [f"leaf{i}" for i in range(k * half)]
    agg_ids = [f"agg{i}" for i in range(k * half)]
    core_ids = [f"core{i}" for i in range(half * half)]
    placement = ((h, j, h // half) for h in range(n_hosts) for j in range(nics))
    nic_list, links = _attach_nics(host_ids, nics, placement, leaf_ids)
    for pod in range(k):
        for e in range(half):
            for a in range(half):
                lf, ag = leaf_ids[pod * half + e], agg_ids[pod * half + a]
                links += [Link(lf, ag, "fabric"), Link(ag, lf, "fabric")]
        for a in range(half):
            for c in range(half):
                ag, co = agg_ids[pod * half + a], core_ids[a * half + c]
                links += [Link(ag, co, "core"), Link(co, ag, "core")]
    switches = (
        [Switch(s, TIER_LEAF, i // half) for i, s in enumerate(leaf_ids)]
        + [Switch(s, TIER_SPINE, i // half) for i, s in enumerate(agg_ids)]
        + [Switch(s, TIER_CORE) for s in core_ids]
    )
    return Topology("fattree", {"k": k, "nics": nics}, host_ids, nic_list, switches, links)


def from_spec(spec: str) -> Topology:
    """``leafspine:hosts=1024,nics=8,leaves=32,spines=8[,wiring=rail]`` or ``fattree:k=32``."""
    kind, _, rest = spec.partition(":")
    kv: dict[str, str] = {}
    for item in filter(None, rest.split(",")):
        key, sep, val = item.partition("=")
        if not sep:
            raise ValueError(f"topology spec item {item!r} is not key=value")
        kv[key.strip()] = val.strip()
    try:
        if kind == "leafspine":
            ints = {k: int(v) for k, v in kv.items() if k != "wiring"}
            return leaf_spine(**ints, wiring=kv.get("wiring", "rail"))
        if kind == "fattree":
            return fat_tree(**{k: int(v) for k, v in kv.items()})
    except TypeError as e:
        raise ValueError(f"bad topology spec {spec!r}: {e}") from e
    raise ValueError(f"unknown topology kind {kind!r} (leafspine or fattree)")
