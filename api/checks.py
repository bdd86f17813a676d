"""The checks of an ingest batch that need collector state (``fleetlens.batch`` does the
context-free ones while decoding): every row's source NIC belongs to the batch's host, both
NICs are known, and no window ends in the future beyond the allowed clock skew. A failed check
raises ``BatchError`` naming the field, the offending value and its row."""

from __future__ import annotations

import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.batch import Batch, BatchError


def check_batch(batch: Batch, known: frozenset[str], now_ns: int, max_future_ns: int) -> None:
    t = batch.windows
    own = pc.starts_with(t["src_nic"], pattern=f"{batch.host_id}/")
    _fail(pc.invert(own), "src_nic", f"not a NIC of batch host {batch.host_id!r}", "wrong_host", t)
    for col in ("src_nic", "dst_nic"):
        # Distinct NICs of the batch (C++) against the known set: hundreds of lookups,
        # not a hash table of the whole fleet's NICs per request.
        unknown = [n for n in pc.unique(t[col]).to_pylist() if n not in known]
        if unknown:
            _fail(
                pc.is_in(t[col], value_set=pa.array(unknown, pa.string())),
                col,
                "unknown NIC (not in the inventory nor registered)",
                "unknown_nic",
                t,
            )
    end = pc.add(t["start_ns"], t["duration_ns"])
    _fail(pc.greater(end, now_ns + max_future_ns), "start_ns", "window ends in the future",
          "future", t)  # fmt: skip


def _fail(mask: pa.ChunkedArray, field: str, what: str, reason: str, t: pa.Table) -> None:
    m = pc.fill_null(mask, True)
    if pc.any(m).as_py():
        row = pc.index(m, True).as_py()
        raise BatchError(field, f"{what}: {t[field][row].as_py()!r} (row {row})", reason)
