"""The ingest batch encoding shared by agents, the simulator and the collector.

A batch is one agent's windows (``fleetlens.records.WINDOW_SCHEMA`` rows) plus a ``host_id``
and a ``batch_id``. The collector stores a batch whole or not at all and stores a batch id only
once, so a sender that retries after a timeout re-sends the *same* batch id.

Encodings (``fmt`` → HTTP ``Content-Type``):

- ``arrow``   → ``application/vnd.apache.arrow.stream``: an Arrow IPC stream in
  ``WINDOW_SCHEMA``; batch and host id in the schema metadata. Compact and zero-copy; the
  default.
- ``msgpack`` → ``application/msgpack``: ``{"batch_id", "host_id", "columns": {name: [...]}}``
- ``json``    → ``application/json``: ``{"batch_id", "host_id", "windows": [{...}, ...]}``
  (row objects, for humans and curl). msgpack and JSON bodies may use either ``columns`` or
  ``windows``.

Every window of a batch must be sent by a NIC of the batch's host (``src_nic`` starts with
``host_id + "/"``); the collector enforces it together with its context checks (known NICs,
windows from the future). :func:`decode_batch` checks what needs no context: types, NaN,
negative counts, received > sent, acks_lost > received, hull lengths, id syntax. Errors are
:class:`BatchError`, which names the offending field. A column a batch lacks is null (or its
default): agents older than a column (``acks_lost``) are still accepted.
"""

from __future__ import annotations

import itertools
import json
import re
import uuid
from dataclasses import dataclass

import msgpack
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from fleetlens.records import TS_HARDWARE, TS_SOFTWARE, WINDOW_SCHEMA

CT_ARROW = "application/vnd.apache.arrow.stream"
CT_MSGPACK = "application/msgpack"
CT_JSON = "application/json"
CONTENT_TYPES = {"arrow": CT_ARROW, "msgpack": CT_MSGPACK, "json": CT_JSON}
_CT_ALIASES = {
    CT_ARROW: "arrow",
    "application/vnd.apache.arrow": "arrow",
    CT_MSGPACK: "msgpack",
    "application/x-msgpack": "msgpack",
    "application/vnd.msgpack": "msgpack",
    CT_JSON: "json",
}
META_BATCH_ID, META_HOST_ID = b"fleetlens.batch_id", b"fleetlens.host_id"
# An agent's batch is one ~0.2 MB record batch: Arrow's thread pool only adds hand-offs.
_IPC_READ = pa.ipc.IpcReadOptions(use_threads=False)

# Columns a sender must provide; the others default to null (or an empty hull / 'software').
REQUIRED = ("src_nic", "dst_nic", "sport", "start_ns", "duration_ns", "sent", "received", "pure")
_ID_RE = re.compile(r"^[A-Za-z0-9._:\-]{1,128}$")
_HOST_RE = re.compile(r"^[A-Za-z0-9._\-]{1,64}$")
_NIC_RE = re.compile(r"[A-Za-z0-9._\-]{1,64}/[A-Za-z0-9._:@\-]{1,32}")  # fullmatch
# NIC ids already found well formed. A fleet names a bounded set of NICs, so a batch matches
# only the ids no earlier batch named: Arrow's regex kernel compiled the pattern on every call
# (~0.1 ms, twice a batch). Cleared when it reaches _WELL_FORMED_MAX (ids sent by a
# misbehaving agent must not grow it without bound).
_well_formed: set[str] = set()
_WELL_FORMED_MAX = 1 << 20


class BatchError(ValueError):
    """A batch that cannot be accepted; ``field`` names what is wrong, ``reason`` classifies it."""

    def __init__(self, field: str, message: str, reason: str = "invalid") -> None:
        super().__init__(f"{field}: {message}")
        self.field = field
        self.message = message
        self.reason = reason


@dataclass
class Batch:
    batch_id: str
    host_id: str
    windows: pa.Table  # exactly WINDOW_SCHEMA
    # The distinct source and destination NIC ids, when decoding found them: the collector's
    # checks reuse them instead of asking Arrow again (each kernel call gives the GIL up).
    nics: tuple[list[str], list[str]] | None = None

    @property
    def rows(self) -> int:
        return self.windows.num_rows


# ---- encoding ------------------------------------------------------------------------------
def encode_batch(
    host_id: str, windows: pa.Table, batch_id: str | None = None, fmt: str = "arrow"
) -> tuple[bytes, str]:
    """Encode one host's windows; returns ``(body, content_type)`` ready for ``POST /v1/ingest``."""
    if fmt not in CONTENT_TYPES:
        raise ValueError(f"unknown batch format {fmt!r} (arrow, msgpack or json)")
    batch_id = batch_id or uuid.uuid4().hex
    table = windows.select(WINDOW_SCHEMA.names).cast(WINDOW_SCHEMA)
    if fmt == "arrow":
        meta = {META_BATCH_ID: batch_id.encode(), META_HOST_ID: host_id.encode()}
        table = table.replace_schema_metadata(meta)
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, table.schema) as writer:
            writer.write_table(table)
        return sink.getvalue().to_pybytes(), CT_ARROW
    if fmt == "msgpack":
        doc = {"batch_id": batch_id, "host_id": host_id, "columns": table.to_pydict()}
        return msgpack.packb(doc, use_bin_type=True), CT_MSGPACK
    doc = {"batch_id": batch_id, "host_id": host_id, "windows": table.to_pylist()}
    return json.dumps(doc, separators=(",", ":")).encode(), CT_JSON


# ---- decoding ------------------------------------------------------------------------------
def content_format(content_type: str) -> str:
    base = content_type.split(";", 1)[0].strip().lower()
    if base not in _CT_ALIASES:
        raise BatchError(
            "content-type",
            f"unsupported {base!r}; use {CT_ARROW}, {CT_MSGPACK} or {CT_JSON}",
            "content_type",
        )
    return _CT_ALIASES[base]


def decode_batch(body: bytes, content_type: str) -> Batch:
    """Decode and check a batch; raises :class:`BatchError` naming the offending field."""
    fmt = content_format(content_type)
    if fmt == "arrow":
        batch_id, host, table = _read_arrow(body)
    else:
        batch_id, host, table = _read_document(body, fmt)
    batch = Batch(
        _check_id("batch_id", batch_id, _ID_RE), _check_id("host_id", host, _HOST_RE), table
    )
    batch.nics = check_windows(batch.windows)
    return batch


def read_checked_arrow(body: bytes | pa.Buffer) -> Batch:
    """An Arrow body :func:`decode_batch` and the collector's checks already accepted (an
    ingest worker hands it on as it came), decoded to the same batch without checking again."""
    batch_id, host, table = _read_arrow(body)
    return Batch(str(batch_id), str(host), table)


def _check_id(name: str, value: object, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.match(value):
        raise BatchError(name, f"missing or malformed ({value!r}); want {pattern.pattern}")
    return value


def _read_arrow(body: bytes | pa.Buffer) -> tuple[object, object, pa.Table]:
    try:
        table = pa.ipc.open_stream(body, options=_IPC_READ).read_all()
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise BatchError("body", f"not a complete Arrow IPC stream: {e}", "decode") from e
    meta = table.schema.metadata or {}
    batch_id = meta.get(META_BATCH_ID, b"").decode("utf-8", "replace") or None
    host = meta.get(META_HOST_ID, b"").decode("utf-8", "replace") or None
    return batch_id, host, conform({n: table.column(n) for n in table.column_names}, table.num_rows)


def _read_document(body: bytes, fmt: str) -> tuple[object, object, pa.Table]:
    try:
        doc = json.loads(body) if fmt == "json" else msgpack.unpackb(body, raw=False)
    except (ValueError, msgpack.ExtraData, msgpack.FormatError, msgpack.StackError) as e:
        raise BatchError("body", f"not valid {fmt}: {e}", "decode") from e
    if not isinstance(doc, dict):
        raise BatchError(
            "body",
            f"want an object with batch_id, host_id and windows, got {type(doc).__name__}",
            "decode",
        )
    if isinstance(doc.get("columns"), dict):
        cols = doc["columns"]
        lengths = {len(v) for v in cols.values() if isinstance(v, list)}
        if len(lengths) > 1 or any(not isinstance(v, list) for v in cols.values()):
            raise BatchError("columns", "every column must be a list of the same length", "type")
        n = lengths.pop() if lengths else 0
    elif isinstance(doc.get("windows"), list):
        rows = doc["windows"]
        if any(not isinstance(r, dict) for r in rows):
            raise BatchError("windows", "every window must be an object", "type")
        names = {k for r in rows for k in r}
        cols = {k: [r.get(k) for r in rows] for k in names}
        n = len(rows)
    else:
        raise BatchError(
            "windows", "missing: give 'windows' (list of objects) or 'columns'", "decode"
        )
    return doc.get("batch_id"), doc.get("host_id"), conform(cols, n)


def conform(cols: dict[str, object], n: int) -> pa.Table:
    """Build a WINDOW_SCHEMA table from named columns, naming any column of the wrong type."""
    arrays = []
    for fld in WINDOW_SCHEMA:
        if fld.name not in cols:
            if fld.name in REQUIRED:
                raise BatchError(fld.name, "required column is missing", "type")
            arrays.append(_default_column(fld, n))
            continue
        arrays.append(_typed(fld, cols[fld.name]))
    return pa.Table.from_arrays(arrays, schema=WINDOW_SCHEMA)


def _default_column(fld: pa.Field, n: int) -> pa.Array:
    if fld.name == "ts_source":
        return pa.array([TS_SOFTWARE] * n, pa.string())
    if fld.name in ("hull_t_ns", "hull_owd_ns"):
        return pa.array([[]] * n, fld.type)
    return pa.nulls(n, fld.type)


def _typed(fld: pa.Field, col: object) -> pa.Array:
    try:
        if isinstance(col, pa.ChunkedArray):
            col = _one_chunk(col)
        # Infer first, then cast *safely*: pa.array(..., type=int32) would truncate 1.5 to 1.
        arr = col if isinstance(col, pa.Array) else pa.array(col)
        if arr.type != fld.type:
            if not _castable(arr.type, fld.type):
                raise pa.ArrowInvalid(f"got {arr.type}")
            arr = arr.cast(fld.type, safe=True)
        return arr
    except (
        pa.ArrowInvalid,
        pa.ArrowTypeError,
        pa.ArrowNotImplementedError,
        TypeError,
        OverflowError,
    ) as e:
        raise BatchError(fld.name, f"wrong type, want {fld.type}: {e}", "type") from e


def _kind(t: pa.DataType) -> str:
    if pa.types.is_null(t):
        return "null"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "string"
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        return "list:" + _kind(t.value_type)
    if pa.types.is_integer(t) or pa.types.is_floating(t):
        return "number"
    return str(t)


def _castable(src: pa.DataType, dst: pa.DataType) -> bool:
    """Same kind (numbers to numbers, strings to strings, lists of those); nulls fit anything."""
    a, b = _kind(src), _kind(dst)
    return (
        a == b
        or a == "null"
        or (a.startswith("list:") and a.endswith("null") and b.startswith("list:"))
    )


# ---- context-free checks (vectorized) ------------------------------------------------------
def _fail_if(mask: pa.Array | pa.ChunkedArray, field: str, what: str, reason: str) -> None:
    # One kernel call when the batch is clean (nulls skipped: a null comparison is no
    # failure); the offending row is looked for only when there is one.
    if not pc.any(mask).as_py():
        return
    m = pc.fill_null(mask, False).to_numpy(zero_copy_only=False)
    if m.any():
        row = int(np.flatnonzero(m)[0])
        raise BatchError(field, f"{what} (row {row}, {int(m.sum())} rows)", reason)


def _fail_where(bad: np.ndarray, field: str, what: str, reason: str) -> None:
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise BatchError(field, f"{what} (row {row}, {int(bad.sum())} rows)", reason)


_OWD = ("owd_min_ns", "owd_p50_ns", "owd_p99_ns", "owd_max_ns")
_NUMBERS = ("sport", "duration_ns", "start_ns", "sent", "received", "pure", "acks_lost", *_OWD)


def _one_chunk(col: pa.ChunkedArray) -> pa.Array:
    # An IPC stream of one record batch (what agents send) needs no combining: every Arrow
    # call gives the GIL up and, on a busy collector, waits to win it back.
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


def _numbers(col: pa.ChunkedArray) -> tuple[np.ndarray, np.ndarray]:
    """A numeric column's values (nulls as 0) and where they are not null."""
    arr = _one_chunk(col)
    if arr.null_count == 0:
        return arr.to_numpy(), np.ones(len(arr), bool)
    return pc.fill_null(arr, 0).to_numpy(), pc.is_valid(arr).to_numpy(zero_copy_only=False)


def _lengths(col: pa.ChunkedArray) -> np.ndarray:
    """A list column's lengths (nulls as 0), from its offsets: no kernel call."""
    arr = _one_chunk(col)
    offsets = np.asarray(arr.offsets)
    lengths = offsets[1:] - offsets[:-1]
    if arr.null_count:
        lengths[~arr.is_valid().to_numpy(zero_copy_only=False)] = 0
    return lengths


def check_windows(t: pa.Table) -> tuple[list[str], list[str]]:
    """Checks needing no collector state; raises BatchError on the first offending field.
    Returns the distinct source and destination NIC ids."""
    for name in REQUIRED:
        if t[name].null_count:
            _fail_if(pc.is_null(t[name]), name, "null", "type")
    distinct = []
    for name in ("src_nic", "dst_nic"):
        # The pattern runs on the distinct ids (a batch names a few hundred NICs at most) not
        # seen before, the rows are looked up only when one is malformed.
        ids = pc.unique(t[name]).to_pylist()
        fresh = [n for n in ids if n not in _well_formed]
        malformed = [n for n in fresh if not _NIC_RE.fullmatch(n)]
        if malformed:
            _fail_if(pc.is_in(t[name], value_set=pa.array(malformed, pa.string())), name,
                     "not a NIC id HOST/IFNAME", "type")  # fmt: skip
        if len(_well_formed) + len(fresh) > _WELL_FORMED_MAX:
            _well_formed.clear()
        _well_formed.update(fresh)
        distinct.append(ids)
    src, dst = distinct
    if not set(src).isdisjoint(dst):  # else no row can name one NIC twice: no kernel call
        _fail_if(pc.equal(t["src_nic"], t["dst_nic"]), "dst_nic", "equals src_nic", "invalid")
    # The numbers in numpy: an Arrow kernel call costs ~12 us whatever the batch's size, and
    # ~40 of them were half of decoding an agent's ~910-row batch (issue 29).
    v = {name: _numbers(t[name]) for name in _NUMBERS}
    _fail_where((v["sport"][0] < 1) | (v["sport"][0] > 65535), "sport", "outside 1..65535",
                "invalid")  # fmt: skip
    _fail_where(v["duration_ns"][0] <= 0, "duration_ns", "must be > 0", "negative")
    _fail_where(v["start_ns"][0] < 0, "start_ns", "negative", "negative")
    for name in ("sent", "received", "pure", "acks_lost"):
        _fail_where(v[name][0] < 0, name, "negative count", "negative")  # nulls hold 0
    _fail_where(v["received"][0] > v["sent"][0], "received", "greater than sent", "invalid")
    # a pair's ack counts as lost only once a later ack says a probe of it arrived
    _fail_where(v["acks_lost"][0] > v["received"][0], "acks_lost", "greater than received",
                "invalid")  # fmt: skip
    for name in _OWD:
        _fail_where(np.isnan(v[name][0]), name, "NaN", "nan")  # nulls hold 0: no failure
        _fail_where(np.isinf(v[name][0]), name, "infinite", "nan")
    for lo, hi in itertools.pairwise(_OWD):
        (a, a_ok), (b, b_ok) = v[lo], v[hi]
        _fail_where((a > b) & a_ok & b_ok, hi, f"smaller than {lo}", "invalid")
    _fail_where(_lengths(t["hull_t_ns"]) != _lengths(t["hull_owd_ns"]), "hull_owd_ns",
                "length differs from hull_t_ns", "invalid")  # fmt: skip
    for name in ("hull_t_ns", "hull_owd_ns", "path"):
        # No null in the list's whole value buffer: none in its elements (no kernel call).
        if any(c.values.null_count for c in t[name].chunks):
            values = pc.list_flatten(t[name])
            if values.null_count:
                _fail_if(pc.is_null(values), name, "null element in list", "type")
    if set(pc.unique(t["ts_source"]).to_pylist()) - {TS_SOFTWARE, TS_HARDWARE}:
        ts_ok = pc.is_in(t["ts_source"], value_set=pa.array([TS_SOFTWARE, TS_HARDWARE]))
        _fail_if(pc.invert(ts_ok), "ts_source", f"want {TS_SOFTWARE!r} or {TS_HARDWARE!r}",
                 "invalid")  # fmt: skip
    return src, dst
