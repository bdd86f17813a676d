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
negative counts, received > sent, acks_lost > received, hull lengths, id syntax, in one pass
over the Arrow buffers (``fleetlens._batchscan``). Errors are :class:`BatchError`, which names
the offending field and, for a value, the first offending row and how many rows offend. A
column a batch lacks is null (or its default): agents older than a column (``acks_lost``) are
still accepted. An agent's Arrow body (one record batch of ``WINDOW_SCHEMA``'s columns, or of
its first ones) is taken as it is, without converting column by column; a hostile one whose
buffers are too small or whose offsets do not ascend is refused as undecodable (``decode``).
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

from fleetlens import _batchscan
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
# The schemas of senders' bodies read without conversion: WINDOW_SCHEMA's first k columns,
# every required one among them (a newer column is added at the end; the others default).
_PREFIXES = {
    k: pa.schema(list(WINDOW_SCHEMA)[:k]) for k in range(len(REQUIRED), len(WINDOW_SCHEMA) + 1)
}
_FIELDS = list(WINDOW_SCHEMA)
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
class LayoutIds:
    """A batch's strings as ids of the collector's storage dictionaries, found by an ingest
    worker so that the writer process need not hash them (``fleetlens.api.codec``): per row the
    source and destination NIC ids and the ts_source id (int32, -1: null), and its path as link
    indices (``links[path_off[i]:path_off[i + 1]]``, int32; ``path_valid``: uint8 per row, None
    when no path is null) and, when the writer has told the worker, its path's id (``path``:
    int32 per row, negative where it is null; the writer then looks no path up). Only entries
    the writer has committed are used, so the ids hold for good: the writer's dictionaries only
    grow, and a rolled-back group's entries never leave it."""

    src: np.ndarray
    dst: np.ndarray
    ts: np.ndarray
    path_off: np.ndarray
    links: np.ndarray
    path_valid: np.ndarray | None
    path: np.ndarray | None = None


@dataclass
class Batch:
    batch_id: str
    host_id: str
    windows: pa.Table  # exactly WINDOW_SCHEMA
    # The distinct source and destination NIC ids, when decoding found them: the collector's
    # checks reuse them instead of asking Arrow again (each kernel call gives the GIL up).
    nics: tuple[list[str], list[str]] | None = None
    # The largest start_ns + duration_ns (int64, wrapping as numpy adds), when decoding found
    # it: the collector's not-from-the-future check.
    window_end: int | None = None
    # The rows' storage ids when an ingest worker found them (None: the writer numbers them).
    layout: LayoutIds | None = None
    # The ids the writer found for them, once committed (a batch given without): the ingest
    # link hands them back to the worker, for the host's next batch.
    numbered: LayoutIds | None = None

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
        batch_id, host, windows = _read_arrow(body)
    else:
        batch_id, host, table = _read_document(body, fmt)
        windows = _one_batch(table)
    batch_id, host = check_id("batch_id", batch_id), check_host("host_id", host)
    s = _scan(windows)
    return Batch(batch_id, host, pa.Table.from_batches([windows]), (s.src, s.dst), s.end_max)


def check_id(name: str, value: object) -> str:
    """``value`` if it is a well-formed batch id, else ``BatchError`` naming ``name``."""
    return _checked(name, value, _ID_RE)


def check_host(name: str, value: object) -> str:
    """``value`` if it is a well-formed host id, else ``BatchError`` naming ``name``."""
    return _checked(name, value, _HOST_RE)


def _checked(name: str, value: object, pattern: re.Pattern[str]) -> str:
    if not isinstance(value, str) or not pattern.fullmatch(value):
        raise BatchError(name, f"missing or malformed ({value!r}); want {pattern.pattern}")
    return value


def _read_arrow(body: bytes | pa.Buffer) -> tuple[object, object, pa.RecordBatch]:
    """The batch and host ids (None when missing) and the windows, one record batch."""
    try:
        reader = pa.ipc.open_stream(body, options=_IPC_READ)
        batches = list(reader)
    except (pa.ArrowInvalid, pa.ArrowException, OSError) as e:
        raise BatchError("body", f"not a complete Arrow IPC stream: {e}", "decode") from e
    try:
        for rb in batches:
            rb.validate()  # buffer sizes, first and last offsets (the reader does not check)
    except pa.ArrowInvalid as e:
        raise BatchError("body", f"not a valid Arrow record batch: {e}", "decode") from e
    schema = reader.schema
    meta = schema.metadata or {}
    batch_id = meta.get(META_BATCH_ID, b"").decode("utf-8", "replace") or None
    host = meta.get(META_HOST_ID, b"").decode("utf-8", "replace") or None
    prefix = _PREFIXES.get(len(schema))
    if len(batches) == 1 and prefix is not None and schema.equals(prefix):
        # An agent's body: one record batch of WINDOW_SCHEMA's columns (an older agent's:
        # the first ones), taken as it is. No per-column wrapper: each costs ~1 us of GIL.
        # Names and types compared, not metadata (a field's is carried along; every reader
        # compares schemas without it): comparing the metadata too cost ~13 us a body.
        rb = batches[0]
        for f in _FIELDS[len(schema) :]:
            rb = rb.append_column(f, _default_column(f, rb.num_rows))
        return batch_id, host, rb.replace_schema_metadata()
    table = pa.Table.from_batches(batches, schema)
    try:
        names = table.column_names
    except UnicodeDecodeError as e:  # Arrow does not check the names' text
        raise BatchError("body", f"a column name is not UTF-8: {e}", "decode") from e
    cols = {n: table.column(i) for i, n in enumerate(names)}
    return batch_id, host, _one_batch(conform(cols, table.num_rows))


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


def _one_chunk(col: pa.ChunkedArray) -> pa.Array:
    # An IPC stream of one record batch (what agents send) needs no combining: every Arrow
    # call gives the GIL up and, on a busy collector, waits to win it back.
    return col.chunk(0) if col.num_chunks == 1 else col.combine_chunks()


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


# ---- context-free checks (one pass: fleetlens._batchscan) ------------------------------------
def _fail_where(bad: np.ndarray, field: str, what: str, reason: str) -> None:
    if bad.any():
        row = int(np.flatnonzero(bad)[0])
        raise BatchError(field, f"{what} (row {row}, {int(bad.sum())} rows)", reason)


_OWD = ("owd_min_ns", "owd_p50_ns", "owd_p99_ns", "owd_max_ns")
_OFFSETS = ("src_nic", "dst_nic", "hull_t_ns", "hull_owd_ns", "ts_source", "path", "path")
# What each of _batchscan's checks means, in its numbering: (field, what, reason). Raised in
# this order (the NIC ids' syntax, checked here on the distinct ids, after the nulls), which
# is the order the checks ran in as numpy and Arrow calls: the same error for the same batch.
_CHECKS: tuple[tuple[str, str, str], ...] = (
    *((f, "offsets not ascending", "decode") for f in _OFFSETS),
    *((f, "null", "type") for f in REQUIRED),
    ("dst_nic", "equals src_nic", "invalid"),
    ("sport", "outside 1..65535", "invalid"),
    ("duration_ns", "must be > 0", "negative"),
    ("start_ns", "negative", "negative"),
    *((f, "negative count", "negative") for f in ("sent", "received", "pure", "acks_lost")),
    ("received", "greater than sent", "invalid"),
    # a pair's ack counts as lost only once a later ack says a probe of it arrived
    ("acks_lost", "greater than received", "invalid"),
    *((f, what, "nan") for f in _OWD for what in ("NaN", "infinite")),
    *((hi, f"smaller than {lo}", "invalid") for lo, hi in itertools.pairwise(_OWD)),
    ("hull_owd_ns", "length differs from hull_t_ns", "invalid"),
    *((f, "null element in list", "type") for f in ("hull_t_ns", "hull_owd_ns", "path")),
    ("ts_source", f"want {TS_SOFTWARE!r} or {TS_HARDWARE!r}", "invalid"),
    ("path", "a link id is not UTF-8", "type"),
)
_BEFORE_IDS = len(_OFFSETS) + len(REQUIRED)  # the checks raised before the NIC ids' syntax


def _one_batch(t: pa.Table) -> pa.RecordBatch:
    """A WINDOW_SCHEMA table as one record batch (combined when it is in chunks)."""
    if t.schema != WINDOW_SCHEMA:
        raise TypeError(f"not a WINDOW_SCHEMA table: {t.schema}")
    batches = t.to_batches()
    if len(batches) == 1:
        return batches[0]
    if not batches:
        return pa.RecordBatch.from_pylist([], WINDOW_SCHEMA)
    return t.combine_chunks().to_batches()[0]


def check_windows(t: pa.Table) -> tuple[list[str], list[str]]:
    """Checks needing no collector state; raises BatchError on the first offending field.
    Returns the distinct source and destination NIC ids."""
    s = _scan(_one_batch(t))
    return s.src, s.dst


def _scan(windows: pa.RecordBatch) -> _batchscan.Scan:
    s = _batchscan.scan(windows)
    failed = np.flatnonzero(s.count) if s.failed else ()
    for k in failed:
        if k < _BEFORE_IDS:
            _raise(s, int(k))
    for name, ids, codes in (("src_nic", s.src, s.src_code), ("dst_nic", s.dst, s.dst_code)):
        # The pattern runs on the distinct ids (a batch names a few hundred NICs at most) not
        # seen before, the rows are looked up only when one is malformed.
        if _well_formed.issuperset(ids):
            continue
        fresh = [n for n in ids if n not in _well_formed]
        malformed = {n for n in fresh if not _NIC_RE.fullmatch(n)}
        if malformed:
            bad = [i for i, n in enumerate(ids) if n in malformed]
            _fail_where(np.isin(codes, bad), name, "not a NIC id HOST/IFNAME", "type")
        if len(_well_formed) + len(fresh) > _WELL_FORMED_MAX:
            _well_formed.clear()
        _well_formed.update(fresh)
    for k in failed:
        _raise(s, int(k))  # the first failed check after the NIC ids
    return s


def _raise(s: _batchscan.Scan, k: int) -> None:
    field, what, reason = _CHECKS[k]
    raise BatchError(field, f"{what} (row {s.first[k]}, {s.count[k]} rows)", reason)
