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

    def joined(self, change: int) -> None:
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
