"""The writer process's side of the ingest link (``ingestlink._Frames``): frames read by the
socket straight into buffers of their own, however the bytes arrive."""

from __future__ import annotations

import itertools
from typing import Any

import numpy as np
import pyarrow as pa
from fleetlens.api import ingestlink
from fleetlens.api.ingestlink import _HEAD, BATCH, COUNT, KNOWN


class _Server:
    limit = 1 << 20

    def __init__(self) -> None:
        self.frames: list[tuple[int, int, bytes, type]] = []
        self.linked = 0

    def joined(self, change: int, out: Any) -> None:
        self.linked += change

    def frame(self, kind: int, rid: int, payload: Any, out: Any) -> None:
        self.frames.append((kind, rid, bytes(payload), type(payload)))


class _Transport:
    closed = False

    def close(self) -> None:
        self.closed = True


def _feed(proto: ingestlink._Frames, data: bytes, pieces: list[int]) -> None:
    """``data`` as the socket would hand it over, in reads of at most the given sizes."""
    at = 0
    for size in itertools.cycle(pieces):
        if at == len(data):
            return
        buf = proto.get_buffer(-1)
        n = min(size, len(buf), len(data) - at)
        buf[:n] = data[at : at + n]
        proto.buffer_updated(n)
        at += n


def _frames(rng: np.random.Generator) -> list[tuple[int, int, bytes]]:
    return [
        (BATCH, 1, rng.bytes(70_000)),
        (KNOWN, 2, b""),
        (COUNT, 3, b'{"received": 5}'),
        (BATCH, 4, rng.bytes(13)),  # as long as a header
    ]


def test_frames_arrive_whole_however_the_bytes_are_split() -> None:
    rng = np.random.default_rng(0)
    for pieces in ([1], [7, 13, 4096], [1 << 20]):
        server, out = _Server(), _Transport()
        proto = ingestlink._Frames(server)  # type: ignore[arg-type]
        proto.connection_made(out)  # type: ignore[arg-type]
        want = _frames(rng)
        data = b"".join(_HEAD.pack(len(p), k, r) + p for k, r, p in want)
        _feed(proto, data, pieces)
        assert [(k, r, p) for k, r, p, _ in server.frames] == want
        assert {t for *_, t in server.frames} == {pa.Buffer}  # what the IPC reader views
        proto.connection_lost(None)
        assert server.linked == 0 and not out.closed


def test_a_frame_over_the_limit_closes_the_link() -> None:
    server, out = _Server(), _Transport()
    proto = ingestlink._Frames(server)  # type: ignore[arg-type]
    proto.connection_made(out)  # type: ignore[arg-type]
    _feed(proto, _HEAD.pack(server.limit + 1, BATCH, 9), [64])
    assert out.closed and server.frames == []


def test_a_batch_frame_carries_the_batch_and_its_ids() -> None:
    """A ``BATCH`` payload read back (from a buffer as the socket fills it): the same batch,
    whether its record batch is the agent's body's own or serialized (no Arrow body, or an
    older agent's without the last column), and the worker's ids when it sent them (a null
    path's validity included), else none."""
    from collector_helpers import make_windows

    from fleetlens.batch import LayoutIds, decode_batch, encode_batch
    from fleetlens.topology import leaf_spine

    topo = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)
    t = make_windows(topo, topo.hosts[0], 1_700_000_000 * 10**9, n_windows=2)
    body, ctype = encode_batch(topo.hosts[0], t, "frame-1")
    old_t = t.drop_columns(["acks_lost"])
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, old_t.schema.with_metadata(
            pa.ipc.open_stream(body).schema.metadata)) as w:  # fmt: skip
        w.write_table(old_t)
    older = sink.getvalue().to_pybytes()
    rng = np.random.default_rng(1)
    rows, elems = t.num_rows, 3 * t.num_rows
    ints = lambda n: rng.integers(0, 1000, n).astype(np.int32)  # noqa: E731
    off = np.sort(rng.integers(0, elems, rows + 1)).astype(np.int32)
    off[0], off[-1] = 0, elems
    empty = pa.Table.from_batches([], t.schema)
    got = ingestlink.read_batch_frame(
        pa.py_buffer(
            b"".join(
                bytes(p)
                for p in ingestlink.batch_frame(
                    decode_batch(*encode_batch(topo.hosts[0], empty, "frame-0")), None, None
                )
            )
        )
    )
    assert got.batch_id == "frame-0" and got.rows == 0  # fmt: skip
    for arrow_body in (body, older, None):
        batch = decode_batch(arrow_body or body, ctype)
        msg = ingestlink._record_batch_message(batch.windows, arrow_body)
        whole = pa.py_buffer(arrow_body or b"")
        inside = whole.address <= msg.address < whole.address + whole.size
        assert inside == (arrow_body is body)  # the agent's own message: not copied
        for valid, path in itertools.product((None, (np.arange(rows) % 3 > 0).astype(np.uint8)),
                                             (None, ints(rows))):  # fmt: skip
            sent = LayoutIds(ints(rows), ints(rows), ints(rows), off, ints(elems), valid, path)
            for layout in (sent, None):
                parts = ingestlink.batch_frame(batch, layout, arrow_body)
                payload = np.frombuffer(b"".join(bytes(p) for p in parts), np.uint8).copy()
                got = ingestlink.read_batch_frame(pa.py_buffer(payload))
                assert (got.batch_id, got.host_id) == ("frame-1", topo.hosts[0])
                assert got.windows.equals(batch.windows)
                if layout is None:
                    assert got.layout is None
                    continue
                assert got.layout is not None
                for name in ("src", "dst", "ts", "path_off", "links", "path_valid", "path"):
                    a, b = getattr(got.layout, name), getattr(sent, name)
                    assert (a is None and b is None) or a.tolist() == b.tolist(), name
                frame = b"".join(bytes(p) for p in ingestlink.ids_frame(7, sent))
                back = ingestlink.read_ids_frame(frame[_HEAD.size :])
                for name in ("src", "dst", "ts", "path_off", "links", "path_valid", "path"):
                    a, b = getattr(back, name), getattr(sent, name)
                    assert (a is None and b is None) or a.tolist() == b.tolist(), name


class _Known:
    version = 1

    def __init__(self, nics: list[str]) -> None:
        self._nics = nics

    def nics(self) -> pa.Array:
        return pa.array(self._nics, pa.string())


class _Collector:
    """What the link server uses of the collector: a real store, written at once."""

    def __init__(self, store: Any, settings: Any, nics: list[str]) -> None:
        self.store, self.settings, self.known = store, settings, _Known(nics)
        self.dicts_asked = 0

    def submit(self, batch: Any) -> Any:
        from concurrent.futures import Future

        fut: Future = Future()
        fut.set_result(self.store.insert_batches([batch], 1_700_000_000 * 10**9)[0])
        return fut


def test_a_workers_copy_fills_up_from_the_answers(tmp_path: Any) -> None:
    """Over a real link: a worker whose copy lacks a host's names sends its first batch
    without ids; the answer brings the entries that batch's commit added (the copy then
    equals the committed dictionaries, asked for only once, at the start) and the ids the
    writer found, path ids included, which the host's next batch with the same strings takes
    as they are: the ids a copy numbering it would find. Every row is stored as sent."""
    import asyncio
    import secrets

    from collector_helpers import make_windows
    from fleetlens.api.codec import WorkerDicts
    from fleetlens.api.config import Settings
    from fleetlens.api.ingestworker import _unix_listener, unix_address
    from fleetlens.api.store import Store

    from fleetlens.batch import decode_batch, encode_batch
    from fleetlens.topology import leaf_spine

    topo = leaf_spine(hosts=4, nics=2, leaves=2, spines=2)
    store = Store(tmp_path / "c.duckdb")
    settings = Settings(db_path=tmp_path / "c.duckdb")
    col = _Collector(store, settings, [n.id for n in topo.nics])
    name = f"@fleetlens-test-{secrets.token_hex(4)}"
    asked = []
    sent: list[pa.Table] = []

    def bodies(host: str, k: int) -> list[Any]:
        t = make_windows(topo, host, 1_700_000_000 * 10**9, n_windows=1)
        return [decode_batch(*encode_batch(host, t, f"{host}-{k}-{i}")) for i in range(2)]

    async def run() -> None:
        server = ingestlink.LinkServer(col)  # type: ignore[arg-type]
        frame = server.frame
        server.frame = lambda kind, *a: (asked.append(kind), frame(kind, *a))[1]  # type: ignore[method-assign]
        await server.start(_unix_listener(name))
        worker = ingestlink.LinkBackend(settings, unix_address(name))
        await worker.connect()
        try:
            for k, host in enumerate(topo.hosts[:2]):
                first, second = bodies(host, k)
                assert k > 0 or worker._dicts.sizes() == [0, 0, 0]  # the file is new
                assert await worker.store(first, None)
                assert worker._dicts.sizes() == list(store.committed_sizes)
                fresh = WorkerDicts()
                fresh.extend(*store.committed_names([0, 0, 0]))
                want = fresh.number(host, second.windows)
                got = worker._dicts.number(host, second.windows)
                assert want is not None and got is not None
                for field in ("src", "dst", "ts", "path_off", "links"):
                    assert getattr(got, field).tolist() == getattr(want, field).tolist()
                assert worker._dicts._last[host][1] is got  # taken as the answer gave them
                assert got.path is not None and len(got.path) == second.rows
                assert await worker.store(second, None)
                sent.extend([first.windows, second.windows])
        finally:
            await worker.close()
            await server.close()

    order = [(n, "ascending") for n in ("start_ns", "src_nic", "dst_nic", "sport")]
    try:
        asyncio.run(run())
        got = store.read_windows().sort_by(order)
    finally:
        store.close()
    assert got.equals(pa.concat_tables(sent).sort_by(order))
    assert asked.count(ingestlink.DICTS) == 1
    assert asked.count(ingestlink.BATCH) == 4
