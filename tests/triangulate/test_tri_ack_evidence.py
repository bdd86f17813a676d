"""Lost acks as evidence for the reverse path (issue 28, "Acks cannot fake loss").

A spine->leaf link drops 5 % of what crosses it. Its forward flows' records are withheld, so
the only evidence left is the acks it drops: those of senders on that leaf, whose ack paths'
fabric part the engine never learns (spread over the ECMP candidates). The engine must name
that link, and nothing else, from the lost acks alone; without ack evidence (or with the
records of agents older than the column) it sees nothing.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pyarrow as pa
from fleetlens.triangulate.config import TriangulateConfig
from tri_helpers import Step, drive, small

LINK, LOSS = "spine1->leaf2", 0.05


def _without_its_flows(t: pa.Table) -> pa.Table:
    """The window without the rows whose forward path crosses LINK."""
    keep = np.array([LINK not in (p or ()) for p in t["path"].to_pylist()])
    return t.filter(pa.array(keep))


def _old_agents(t: pa.Table) -> pa.Table:
    t = _without_its_flows(t)
    at = t.schema.get_field_index("acks_lost")
    return t.set_column(at, "acks_lost", pa.nulls(t.num_rows, pa.int32()))


ACKS_ON = TriangulateConfig(ack_evidence=True)  # off by default (see config.py)


def _run(
    mutate: Callable[[pa.Table], pa.Table] | None, config: TriangulateConfig = ACKS_ON
) -> list[Step]:
    return drive(small(), (f"{LINK}:loss={LOSS}",), seconds=4, seed=3, base_loss=1e-5,
                 config=config, mutate=mutate)  # fmt: skip


def test_lost_acks_alone_name_the_link_and_nothing_else() -> None:
    steps = _run(_without_its_flows)
    for s in steps:
        lost = s.window.windows["acks_lost"].to_numpy().sum()
        assert lost > 0
        assert set(s.bad) == {LINK}, (s.window.index, s.bad)
        assert s.bad[LINK].state == "faulty"
        assert abs(s.bad[LINK].loss_rate - LOSS) < 0.02, s.bad[LINK]


def test_without_ack_evidence_the_same_records_show_nothing() -> None:
    for s in _run(_without_its_flows, TriangulateConfig(ack_evidence=False)):
        assert not s.bad, s.bad
    for s in _run(_old_agents):  # records without the column: no acks known, none counted
        assert not s.bad, s.bad


def test_with_every_flow_the_link_alone_is_faulty() -> None:
    """Forward losses and lost acks on the same link: one finding, no reverse-path alarm."""
    for s in _run(None):
        assert set(s.bad) == {LINK} and s.bad[LINK].state == "faulty", s.bad
