"""Which of a window's evidence triangulation may use, given the agents' clocks and start.

A host's one-way delays are in fleet time only once its agent applies a trusted clock model: a
synced model whose error bound is at most ``CLOCK_TRUST_BOUND_NS``, fetched by the agent (it
polls every control interval) and applied to a whole window, ``CLOCK_ADOPTION_NS`` after the
model was published. Before that a raw clock is off by up to milliseconds, and a per-flow
baseline taken from it would hide delay faults long after sync converges: those delays are
blanked (the flows' losses still count).

A host answers probes from the first window its agent sent; flows towards a host whose agent
was not running yet are dropped (agents start one by one, and probes nobody could answer are
not a fabric fault), with a whole window of margin as windows of different hosts are not
aligned.
"""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.records import ClockModel, nic_hosts

# From a host's first trusted model until its windows are in fleet time: the agent's control
# interval (1 s) to fetch it, plus one window, plus slack (a saturated 2-core lab needed more
# than 2 s).
CLOCK_ADOPTION_NS = 4_000_000_000
# A model is trusted once its error bound is below this: a first solve on a partial window
# publishes "synced" models with a loose bound whose offsets still move by microseconds as
# the other hosts join the fleet mean.
CLOCK_TRUST_BOUND_NS = 1_000.0


class ClockGate:
    """Per host: from when its agent answers probes, and from when its delays are trusted.
    Both maps are copied, updated and swapped: the triangulation thread reads them while the
    clock loop updates them."""

    def __init__(self) -> None:
        self.live_from_ns: dict[str, int] = {}  # host -> first window its agent sent
        self.trusted_from_ns: dict[str, int] = {}  # host -> when its delays are in fleet time

    def trust(self, hosts: dict[str, int]) -> None:
        """Trust each host's delays from the given time (e.g. 0: a model stored before a
        restart, which its agent already runs with)."""
        self.trusted_from_ns = {**self.trusted_from_ns, **hosts}

    def note_models(self, clocks: list[ClockModel], now_ns: int) -> None:
        """Published models: a host's first tight synced one is trusted once adopted."""
        new = {
            c.host_id: now_ns + CLOCK_ADOPTION_NS
            for c in clocks
            if c.synced
            and c.error_bound_ns is not None
            and c.error_bound_ns <= CLOCK_TRUST_BOUND_NS
            and c.host_id not in self.trusted_from_ns
        }
        if new:
            self.trust(new)

    def note_live(self, first_windows: dict[str, int]) -> None:
        """Host -> the first window it sent (of some recent span): the earliest is kept."""
        live = dict(self.live_from_ns)
        for h, t in first_windows.items():
            live[h] = min(t, live.get(h, t))
        self.live_from_ns = live

    def judgeable(self, one: pa.Table) -> pa.Table:
        """One window's rows without flows towards hosts not yet live, and with the one-way
        delays of flows whose ends are not both trusted blanked."""
        live, trusted = self.live_from_ns, self.trusted_from_ns
        first, dst_trusted = _per_nic(one["dst_nic"], live, trusted)
        (src_trusted,) = _per_nic(one["src_nic"], trusted)
        ok = pc.less_equal(pc.add(first, one["duration_ns"]), one["start_ns"])
        timed = pc.and_(
            pc.less_equal(src_trusted, one["start_ns"]),
            pc.less_equal(dst_trusted, one["start_ns"]),
        )
        owd = pc.if_else(
            pc.fill_null(timed, False), one["owd_min_ns"], pa.scalar(None, pa.float64())
        )
        one = one.set_column(one.schema.get_field_index("owd_min_ns"), "owd_min_ns", owd)
        keep = pc.fill_null(ok, False)
        # Nearly always every row is kept, and a filter copies the whole window anyway (1.7 s
        # for a reference-fleet window, path lists and all).
        return one if pc.all(keep).as_py() else one.filter(keep)


def _lookup(hosts: pa.Array, table: dict[str, int]) -> pa.Array:
    """``table[host]`` per row, null where the host is missing."""
    idx = pc.index_in(hosts, value_set=pa.array(list(table), pa.string()))
    return pc.take(pa.array(list(table.values()), pa.int64()), idx)


def _per_nic(nics: pa.ChunkedArray, *tables: dict[str, int]) -> list[pa.ChunkedArray]:
    """Per table, ``table[host of the NIC]`` per row, null where the host is missing: looked
    up once per distinct NIC (splitting millions of NIC ids into hosts cost ~0.5 s a column),
    and the rows' place among the distinct NICs found once for all the tables."""
    distinct = pc.unique(nics)
    at = pc.index_in(nics, value_set=distinct)
    hosts = nic_hosts(distinct)
    return [pc.take(_lookup(hosts, t), at) for t in tables]
