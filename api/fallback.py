"""The engines the background loops call, and the simplest honest placeholders for them.

Clock sync is ``fleetlens.sync.HuygensSync``; the triangulation engine plugs in here too, by
matching these signatures:

- ``SolveClocks(windows, topology, prev) -> list[ClockModel]``
- ``Triangulate(windows, topology, prev_verdicts) -> list[Verdict]``

``windows`` is an Arrow table in ``WINDOW_SCHEMA`` holding the newest windows; ``prev`` maps a
host (or a verdict subject) to the previous output. Until then the collector runs the
PLACEHOLDER triangulation below, which does not pretend to be more than it is.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.ids import is_nic_id, split_link_id, split_nic_id
from fleetlens.records import ClockModel, Decision, DrainEntry, Verdict
from fleetlens.topology import Topology

SolveClocks = Callable[[pa.Table, Topology | None, dict[str, ClockModel]], list[ClockModel]]
Triangulate = Callable[[pa.Table, Topology | None, dict[str, Verdict]], list[Verdict]]


def hosts_in(windows: pa.Table) -> set[str]:
    nics = pc.unique(pa.concat_arrays([_flat(windows["src_nic"]), _flat(windows["dst_nic"])]))
    return {split_nic_id(n)[0] for n in nics.to_pylist()}


def _flat(col: pa.ChunkedArray) -> pa.Array:
    return col.combine_chunks() if col.num_chunks else pa.array([], col.type)


def placeholder_lossy_path_triangulation(
    windows: pa.Table,
    topology: Topology | None,
    prev: dict[str, Verdict],
    lossy_threshold: float = 0.05,
) -> list[Verdict]:
    """PLACEHOLDER for tomography: a link crossed only by lossy flows (loss above the threshold)
    whose path is known is ``faulty`` when two or more flows say so, ``suspect`` with one;
    every other link crossed by a known path is ``healthy``. Delay is not examined. Links with
    no evidence this round keep their previous verdict."""
    t = windows.filter(pc.and_(pc.is_valid(windows["path"]), pc.greater(windows["sent"], 0)))
    if t.num_rows == 0:
        return list(prev.values())
    now = int(pc.max(pc.add(t["start_ns"], t["duration_ns"])).as_py())
    path = t["path"].combine_chunks()
    parent = pc.list_parent_indices(path).to_numpy()
    links = pc.list_flatten(path).dictionary_encode()
    idx = links.indices.to_numpy()
    sent = t["sent"].to_numpy().astype(np.float64)
    lost = sent - t["received"].to_numpy()
    lossy = (lost / sent) > lossy_threshold
    n_links = len(links.dictionary)
    flows = np.bincount(idx, minlength=n_links)
    bad = np.bincount(idx, weights=lossy[parent], minlength=n_links)
    loss = np.bincount(idx, weights=lost[parent], minlength=n_links) / np.maximum(
        np.bincount(idx, weights=sent[parent], minlength=n_links), 1.0
    )
    all_lossy = bad == flows
    state = np.where(all_lossy, np.where(flows >= 2, "faulty", "suspect"), "healthy")
    confidence = np.where(all_lossy, bad / flows, 1 - bad / flows)
    evidence = _evidence(t, idx, parent, np.flatnonzero(all_lossy))
    out = dict(prev)
    for i, link in enumerate(links.dictionary.to_pylist()):
        st = str(state[i])
        old = prev.get(link)
        since = old.since_ns if old is not None and old.state == st else now
        out[link] = Verdict(
            link, "link", st, since, 0.0, float(loss[i]), float(confidence[i]), int(flows[i]),
            evidence.get(i, []),
        )  # fmt: skip
    return list(out.values())


def _evidence(
    t: pa.Table, idx: np.ndarray, parent: np.ndarray, links: np.ndarray, keep: int = 32
) -> dict[int, list[str]]:
    """Up to ``keep`` flow ids (src>dst:sport) per flagged link; strings only for those."""
    if links.size == 0:
        return {}
    order = np.argsort(idx, kind="stable")
    lo = np.searchsorted(idx[order], links, side="left")
    out = {}
    for i, a in zip(links.tolist(), lo.tolist(), strict=True):
        rows = parent[order[a : a + keep]]
        rows = rows[idx[order[a : a + keep]] == i]
        sub = t.take(pa.array(rows))
        out[i] = [
            f"{s}>{d}:{p}"
            for s, d, p in zip(
                sub["src_nic"].to_pylist(),
                sub["dst_nic"].to_pylist(),
                sub["sport"].to_pylist(),
                strict=True,
            )
        ]
    return out


def decisions_from_verdicts(
    verdicts: list[Verdict], hosts: list[str], now_ns: int
) -> list[Decision]:
    """Drain a NIC when its own verdict or one of its access links is faulty. Never drains every
    NIC of a host: with nothing healthy left to fail over to, draining only hurts."""
    drain: dict[str, dict[str, DrainEntry]] = {h: {} for h in hosts}
    for v in verdicts:
        if v.state != "faulty":
            continue
        for nic in _nics_of(v):
            host = split_nic_id(nic)[0]
            reason = f"{v.kind} {v.subject} faulty (loss {v.loss_rate:.1%}, evidence {v.evidence})"
            drain.setdefault(host, {}).setdefault(nic, DrainEntry(nic, reason, v.since_ns))
    return [
        Decision(h, now_ns, sorted(d.values(), key=lambda e: e.nic_id)) for h, d in drain.items()
    ]


def _nics_of(v: Verdict) -> list[str]:
    if v.kind == "nic":
        return [v.subject]
    if v.kind == "link":
        try:
            return [n for n in split_link_id(v.subject) if is_nic_id(n)]
        except ValueError:
            return []
    return []


def cap_drain(decisions: list[Decision], nics_per_host: dict[str, int]) -> list[Decision]:
    """Apply the never-drain-everything rule once the host's NIC count is known."""
    out = []
    for d in decisions:
        total = nics_per_host.get(d.host_id, 0)
        drains_all = total > 0 and len(d.drain) >= total
        out.append(Decision(d.host_id, d.generated_ns, []) if drains_all else d)
    return out
