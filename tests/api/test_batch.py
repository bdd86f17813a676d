"""The batch encoding alone: lossless round trips and errors that name the field."""

from __future__ import annotations

import json
import math
import time

import msgpack
import pyarrow as pa
import pytest
from collector_helpers import make_windows

from fleetlens.batch import BatchError, decode_batch, encode_batch
from fleetlens.topology import leaf_spine

TOPO = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)


@pytest.fixture
def table() -> pa.Table:
    return make_windows(TOPO, "h01", time.time_ns() - 10**10, n_windows=2)


@pytest.mark.parametrize("fmt", ["arrow", "msgpack", "json"])
def test_round_trip_is_lossless(table: pa.Table, fmt: str) -> None:
    body, ctype = encode_batch("h01", table, "batch-7", fmt)
    batch = decode_batch(body, ctype)
    assert (batch.batch_id, batch.host_id) == ("batch-7", "h01")
    assert batch.windows.equals(table)


def test_batch_id_defaults_to_unique(table: pa.Table) -> None:
    ids = {decode_batch(*encode_batch("h01", table)).batch_id for _ in range(3)}
    assert len(ids) == 3


def _json_with(table: pa.Table, **change: object) -> bytes:
    rows = table.to_pylist()
    rows[1].update(change)
    return json.dumps({"batch_id": "b", "host_id": "h01", "windows": rows}).encode()


@pytest.mark.parametrize(
    ("change", "field"),
    [
        ({"sent": "many"}, "sent"),
        ({"sport": 1.5}, "sport"),
        ({"sport": True}, "sport"),
        ({"start_ns": 2**70}, "start_ns"),
        ({"received": -1}, "received"),
        ({"pure": -3}, "pure"),
        ({"owd_p50_ns": math.nan}, "owd_p50_ns"),
        ({"owd_max_ns": math.inf}, "owd_max_ns"),
        ({"received": 500}, "received"),
        ({"dst_nic": "not-a-nic"}, "dst_nic"),
        ({"src_nic": None}, "src_nic"),
        ({"duration_ns": 0}, "duration_ns"),
        ({"hull_owd_ns": [1]}, "hull_owd_ns"),
        ({"path": "leaf0->spine0"}, "path"),
        ({"ts_source": "sundial"}, "ts_source"),
    ],
)
def test_bad_values_name_the_field(table: pa.Table, change: dict, field: str) -> None:
    with pytest.raises(BatchError) as e:
        decode_batch(_json_with(table, **change), "application/json")
    assert e.value.field == field, str(e.value)
    assert field in str(e.value)


def test_truncated_arrow_and_garbage(table: pa.Table) -> None:
    body, ctype = encode_batch("h01", table)
    for bad in (body[: len(body) // 2], body[:-7], b"", b"\x00" * 64):
        with pytest.raises(BatchError) as e:
            decode_batch(bad, ctype)
        assert e.value.field == "body"
    with pytest.raises(BatchError) as e:
        decode_batch(b"{", "application/json")
    assert e.value.reason == "decode"
    with pytest.raises(BatchError) as e:
        decode_batch(body, "text/csv")
    assert e.value.field == "content-type"


def test_missing_required_column_and_ids(table: pa.Table) -> None:
    cols = table.drop(["sent"]).to_pydict()
    body = msgpack.packb({"batch_id": "b", "host_id": "h01", "columns": cols})
    with pytest.raises(BatchError) as e:
        decode_batch(body, "application/msgpack")
    assert e.value.field == "sent"
    body, ctype = encode_batch("h01", table, batch_id="bad id with spaces")
    with pytest.raises(BatchError) as e:
        decode_batch(body, ctype)
    assert e.value.field == "batch_id"


def test_optional_columns_default(table: pa.Table) -> None:
    cols = table.select(["src_nic", "dst_nic", "sport", "start_ns", "duration_ns", "sent",
                         "received", "pure"]).to_pydict()  # fmt: skip
    body = json.dumps({"batch_id": "b", "host_id": "h01", "columns": cols}).encode()
    w = decode_batch(body, "application/json").windows
    assert w.column("ts_source").to_pylist() == ["software"] * w.num_rows
    assert w.column("path").null_count == w.num_rows
    assert w.column("hull_t_ns").to_pylist() == [[]] * w.num_rows


@pytest.mark.parametrize("nic", ["h01/eth0\n", "h01", "h01/eth0/x", "h01/" + "e" * 33])
def test_malformed_nic_ids_stay_refused(table: pa.Table, nic: str) -> None:
    """The well-formed NIC-id memo never lets a malformed id through, however often it is
    sent, and well-formed ids of the same host around it do not change that."""
    good = decode_batch(*encode_batch("h01", table))  # memoises the batch's well-formed ids
    assert good.rows
    for _ in range(2):
        with pytest.raises(BatchError) as e:
            decode_batch(_json_with(table, dst_nic=nic), "application/json")
        assert e.value.field == "dst_nic" and "row 1" in str(e.value)


def test_hull_length_check_reads_nulls_as_empty(table: pa.Table) -> None:
    null_hulls = decode_batch(_json_with(table, hull_t_ns=None, hull_owd_ns=[]), "application/json")
    assert null_hulls.windows["hull_t_ns"][1].as_py() is None
    with pytest.raises(BatchError) as e:
        decode_batch(_json_with(table, hull_t_ns=None, hull_owd_ns=[5]), "application/json")
    assert e.value.field == "hull_owd_ns"
