"""The context-free checks as one pass over the Arrow buffers (``fleetlens._batchscan``):
hostile bodies the numpy/Arrow checks crashed on or let through as an internal error are
refused naming the field, rows are counted the same in slices and chunks, and what the pass
finds for the collector's checks (NIC ids, the latest window end) is right."""

from __future__ import annotations

import struct
import time

import numpy as np
import pyarrow as pa
import pytest
from collector_helpers import INGEST, Server, make_windows

from fleetlens.batch import (
    CT_ARROW,
    META_BATCH_ID,
    META_HOST_ID,
    BatchError,
    check_windows,
    decode_batch,
    encode_batch,
)
from fleetlens.topology import leaf_spine

TOPO = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)


@pytest.fixture
def table() -> pa.Table:
    return make_windows(TOPO, "h01", time.time_ns() - 10**10, n_windows=2)


def _ipc(t: pa.Table) -> pa.Buffer:
    t = t.replace_schema_metadata({META_BATCH_ID: "b", META_HOST_ID: "h01"})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, t.schema) as w:
        w.write_table(t)
    return sink.getvalue()


def _with_offset(t: pa.Table, column: str, child: bool, at: int, value: int) -> bytes:
    """The table's Arrow body with one offset of ``column`` (of its strings, for ``path``'s
    ``child``) set to ``value``: Arrow's reader checks only the first and the last."""
    buf = _ipc(t)
    arr = pa.ipc.open_stream(buf).read_next_batch().column(column)  # views of buf
    if child:
        arr = arr.values
    body = bytearray(buf.to_pybytes())
    np.frombuffer(body, np.int32, len(arr) + 1, arr.buffers()[1].address - buf.address)[at] = value
    return bytes(body)


@pytest.mark.parametrize(
    ("column", "child"),
    [("src_nic", False), ("dst_nic", False), ("ts_source", False), ("hull_t_ns", False),
     ("hull_owd_ns", False), ("path", False), ("path", True)],
)  # fmt: skip
@pytest.mark.parametrize("value", [10**8, -5, 0])
def test_offsets_that_do_not_ascend_are_refused(
    table: pa.Table, column: str, child: bool, value: int
) -> None:
    """A body with a wild offset between the first and the last (the old checks read through
    it: the collector died of a segmentation fault) is refused as undecodable."""
    with pytest.raises(BatchError) as e:
        decode_batch(_with_offset(table, column, child, 5, value), CT_ARROW)
    assert (e.value.field, e.value.reason) == (column, "decode"), str(e.value)
    assert "offsets not ascending" in str(e.value)


@pytest.mark.parametrize(("column", "field"), [("src_nic", "src_nic"), ("dst_nic", "dst_nic"),
                                               ("ts_source", "ts_source")])  # fmt: skip
def test_undecodable_text_is_refused_naming_the_field(
    table: pa.Table, column: str, field: str
) -> None:
    """Bytes that are not UTF-8 in an id (an internal error before: UnicodeDecodeError)."""
    body = _ipc(table)
    arr = pa.ipc.open_stream(body).read_next_batch().column(column)
    offsets = np.frombuffer(arr.buffers()[1], np.int32)
    at = arr.buffers()[2].address - body.address + int(offsets[3])
    bad = bytearray(body.to_pybytes())
    bad[at] = 0xFF  # row 3's first byte
    with pytest.raises(BatchError) as e:
        decode_batch(bytes(bad), CT_ARROW)
    assert e.value.field == field and "(row 3, 1 rows)" in str(e.value), str(e.value)


def test_a_buffer_too_small_is_refused(table: pa.Table) -> None:
    """A column said to hold nulls without a validity bitmap (the IPC reader does not check
    buffer sizes; the old checks failed with an internal error)."""
    body = bytearray(_ipc(table).to_pybytes())
    # The record batch's field nodes (length, null count) in column order, no nulls anywhere:
    # give `sent` (the sixth) nulls.
    nodes = body.index(struct.pack("<qq", table.num_rows, 0) * 6)
    body[nodes + 5 * 16 + 8 : nodes + 6 * 16] = struct.pack("<q", 3)
    with pytest.raises(BatchError) as e:
        decode_batch(bytes(body), CT_ARROW)
    assert (e.value.field, e.value.reason) == ("body", "decode"), str(e.value)
    assert "Buffer #0 too small" in str(e.value)


def _bad(t: pa.Table, row: int) -> pa.Table:
    received = t["received"].to_numpy().copy()
    received[row] = -1
    return t.set_column(t.schema.get_field_index("received"), "received",
                        pa.array(received, pa.int32()))  # fmt: skip


def test_rows_count_from_the_table_start_in_slices_and_chunks(table: pa.Table) -> None:
    bad = _bad(table, 10)
    for t, row in ((bad, 10), (bad.slice(4), 6), (pa.concat_tables([table, bad]), 10 + len(table))):
        with pytest.raises(BatchError) as e:
            check_windows(t)
        assert str(e.value) == f"received: negative count (row {row}, 1 rows)"
    assert check_windows(bad.slice(11)) == check_windows(table.slice(11))


def test_what_the_pass_finds_for_the_collector(table: pa.Table) -> None:
    b = decode_batch(*encode_batch("h01", table))
    want = table["start_ns"].to_numpy() + table["duration_ns"].to_numpy()
    assert b.window_end == int(want.max())
    assert b.nics == (list(dict.fromkeys(table["src_nic"].to_pylist())),
                      list(dict.fromkeys(table["dst_nic"].to_pylist())))  # fmt: skip
    empty = decode_batch(*encode_batch("h01", table.slice(0, 0)))
    assert empty.rows == 0 and empty.nics == ([], [])


def test_a_hostile_body_does_not_stop_the_collector(server: Server, table: pa.Table) -> None:
    with server.client(INGEST) as c:
        r = c.post("/v1/ingest", content=_with_offset(table, "src_nic", False, 5, 10**8),
                   headers={"Content-Type": CT_ARROW})  # fmt: skip
        assert r.status_code == 400 and r.json()["field"] == "src_nic", r.text
        body, ctype = encode_batch("h01", table, "after-the-hostile-one")
        r = c.post("/v1/ingest", content=body, headers={"Content-Type": ctype})
        assert r.status_code == 200 and r.json()["stored"], r.text


def test_every_check_of_the_pass_has_its_error() -> None:
    from fleetlens import _batchscan, batch

    assert len(batch._CHECKS) == _batchscan.N_CHECKS


def test_nic_ids_are_the_same_objects_batch_after_batch(table: pa.Table) -> None:
    """The pass keeps the ids' str objects (hashes cached for the set lookups after it), and
    forgets them once it holds 2^16: ids without end from a misbehaving agent stay bounded
    and are still checked."""
    body, ctype = encode_batch("h01", table)
    a, b = decode_batch(body, ctype), decode_batch(body, ctype)
    assert all(x is y for x, y in zip(a.nics[1], b.nics[1], strict=True))
    many = 70_000
    junk = table.slice(0, 1).to_pylist()[0]
    rows = [dict(junk, dst_nic=f"z{i}/eth0") for i in range(many)]
    got = decode_batch(*encode_batch("h01", pa.Table.from_pylist(rows, table.schema)))
    assert len(got.nics[1]) == many and got.nics[1][-1] == f"z{many - 1}/eth0"
    bad = [dict(junk, dst_nic="h02/eth0\n"), *rows[:3]]
    with pytest.raises(BatchError) as e:
        decode_batch(*encode_batch("h01", pa.Table.from_pylist(bad, table.schema)))
    assert e.value.field == "dst_nic" and "(row 0, 1 rows)" in str(e.value)
    assert decode_batch(body, ctype).nics == a.nics


def test_a_link_id_that_is_not_text_is_refused(table: pa.Table) -> None:
    """Accepted before, it failed the writer's whole commit group when the links were named."""
    body, ctype = encode_batch("h01", table)
    at = body.index(b"->", body.index(b"leaf0->spine"))  # a link id of some row's path
    with pytest.raises(BatchError) as e:
        decode_batch(body[:at] + b"\xff" + body[at + 1 :], ctype)
    assert (e.value.field, e.value.reason) == ("path", "type"), str(e.value)
    assert "not UTF-8" in str(e.value)
    accented = table.set_column(table.schema.get_field_index("path"), "path",
                                pa.array([["h01/eth0->lèaf0"]] * table.num_rows))  # fmt: skip
    assert decode_batch(*encode_batch("h01", accented)).rows == table.num_rows


def test_a_column_name_that_is_not_text_is_refused(table: pa.Table) -> None:
    body, ctype = encode_batch("h01", table)
    at = body.index(b"acks_lost")
    with pytest.raises(BatchError) as e:
        decode_batch(body[:at] + b"\xff" + body[at + 1 :], ctype)  # an internal error before
    assert (e.value.field, e.value.reason) == ("body", "decode"), str(e.value)
