"""The triangulation a collector runs without an inventory: lossy flows on reported paths.

Without a topology there is no link model to fit, only the paths agents discovered
(traceroute). A link that every flow crossing it sees lossy is the simplest honest reading of
that evidence; it says nothing about delay and cannot tell apart links that always appear
together. With an inventory the collector runs ``fleetlens.triangulate.Triangulator``.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.records import Verdict
from fleetlens.topology import Topology


@dataclass(frozen=True)
class LossyPathFallback:
    """A :class:`~fleetlens.engines.Triangulate` over the paths agents report, for a
    collector without an inventory (no topology to run tomography on)."""

    lossy_threshold: float  # a flow's loss rate above this makes it lossy

    def __call__(
        self, windows: pa.Table, topology: Topology | None, prev: dict[str, Verdict], /
    ) -> list[Verdict]:
        return lossy_path_verdicts(windows, prev, self.lossy_threshold)


def lossy_path_verdicts(
    windows: pa.Table, prev: dict[str, Verdict], lossy_threshold: float
) -> list[Verdict]:
    """A link crossed only by lossy flows whose path is known is ``faulty`` when two or more
    flows say so, ``suspect`` with one; every other link crossed by a known path is
    ``healthy``. Delay is not examined. Links with no evidence this round keep their previous
    verdict."""
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
