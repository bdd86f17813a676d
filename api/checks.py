"""The checks of an ingest batch that need collector state (``fleetlens.batch`` does the
context-free ones while decoding): every row's source NIC belongs to the batch's host, both
NICs are known, and no window ends in the future beyond the allowed clock skew. A failed check
raises ``BatchError`` naming the field, the offending value and its row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.batch import Batch, BatchError

_NO_END = -(1 << 63)  # the largest window end of no window (int64's smallest)


def check_batch(batch: Batch, known: frozenset[str], now_ns: int, max_future_ns: int) -> None:
    t = batch.windows
    # Distinct NICs of the batch (C++), then Python on those few: hundreds of lookups, not a
    # hash table of the whole fleet's NICs (nor a kernel call per check) per request. The
    # rows are searched only to name the first offending one.
    # (or as decoding found them: no kernel call, each gives the GIL up)
    src, dst = batch.nics or (pc.unique(t[c]).to_pylist() for c in ("src_nic", "dst_nic"))
    prefix = f"{batch.host_id}/"
    _fail_of(t, "src_nic", [n for n in src if not n.startswith(prefix)],
             f"not a NIC of batch host {batch.host_id!r}", "wrong_host")  # fmt: skip
    for col, distinct in (("src_nic", src), ("dst_nic", dst)):
        _fail_of(t, col, [n for n in distinct if n not in known],
                 "unknown NIC (not in the inventory nor registered)", "unknown_nic")  # fmt: skip
    # start_ns and duration_ns have no nulls (fleetlens.batch checked); their largest sum as
    # decoding found it, else numpy (no kernel call)
    end = batch.window_end
    if end is None:
        end = int((t["start_ns"].to_numpy() + t["duration_ns"].to_numpy()).max(initial=_NO_END))
    if end > now_ns + max_future_ns:
        _fail(pc.greater(pc.add(t["start_ns"], t["duration_ns"]), now_ns + max_future_ns),
              "start_ns", "window ends in the future", "future", t)  # fmt: skip


def _fail_of(t: pa.Table, field: str, bad: list[str], what: str, reason: str) -> None:
    """Fail naming the first row whose ``field`` is one of ``bad`` (nothing when empty)."""
    if bad:
        _fail(pc.is_in(t[field], value_set=pa.array(bad, pa.string())), field, what, reason, t)


def _fail(mask: pa.ChunkedArray, field: str, what: str, reason: str, t: pa.Table) -> None:
    m = pc.fill_null(mask, True)
    if pc.any(m).as_py():
        row = pc.index(m, True).as_py()
        raise BatchError(field, f"{what}: {t[field][row].as_py()!r} (row {row})", reason)
