"""Ship window batches to the collector, surviving its outages without losing or doubling any.

Every batch gets its id once, when it is made, so a retry after a lost response is stored once
by the collector. Batches wait in memory up to ``mem_batches``; past that the oldest spill to
files in ``spill_dir`` (which also keeps them across an agent restart); past ``spill_max_bytes``
the oldest spilled batch is dropped, logged and counted — the only way a window is ever lost.
Sending is strictly oldest first, with exponential backoff, honouring ``Retry-After`` on 429.

With ``nats`` (``fleetlens agent --nats URL[,URL...]``) a batch is published to the JetStream
stream instead (``fleetlens/stream.py``: the host's partition's subject, the batch id as the
message id, the same Arrow body): the same queue, spill, order and backoff; a publish the
stream did not confirm is retried with the same id, which JetStream's duplicate window drops
if the first one was stored after all. The collector shards check the batch; a refused one is
counted there, not here.
"""

from __future__ import annotations

import logging
import threading
import time
import uuid
from collections import deque
from dataclasses import dataclass
from pathlib import Path

import pyarrow as pa

from fleetlens.batch import CT_ARROW, encode_batch
from fleetlens.client import CollectorClient, CollectorError
from fleetlens.stream import Publisher, PublishError

log = logging.getLogger("fleetlens.agent.upload")


@dataclass
class Pending:
    seq: int
    batch_id: str
    windows: int
    body: bytes | None  # None: spilled, read it from ``path``
    path: Path | None = None

    def payload(self) -> bytes:
        """The batch's bytes, from memory or else from its spill file."""
        if self.body is not None:
            return self.body
        assert self.path is not None, "a batch not in memory has been spilled"
        return self.path.read_bytes()


@dataclass
class UploadStats:
    uploaded_batches: int = 0
    uploaded_windows: int = 0
    spilled_batches: int = 0
    dropped_batches: int = 0
    dropped_windows: int = 0
    rejected_batches: int = 0
    retries: int = 0


class Uploader:
    def __init__(
        self,
        url: str,
        host_id: str,
        token: str | None,
        spill_dir: Path,
        mem_batches: int = 120,
        spill_max_bytes: int = 256 << 20,
        timeout_s: float = 5.0,
        nats: str | None = None,
        partition: str = "",
    ) -> None:
        self.host_id = host_id
        self.partition = partition
        self._publisher = Publisher(nats, timeout_s=timeout_s) if nats else None
        self.spill_dir = spill_dir
        self.mem_batches = mem_batches
        self.spill_max_bytes = spill_max_bytes
        self.stats = UploadStats()
        self._queue: deque[Pending] = deque()
        self._lock = threading.Condition()
        self._seq = 0
        self._stop = threading.Event()
        self._client = CollectorClient(url, token, timeout_s)
        spill_dir.mkdir(parents=True, exist_ok=True)
        self._recover_spilled()
        self._thread = threading.Thread(target=self._run, name="uploader", daemon=True)

    def start(self) -> None:
        self._thread.start()

    # ---- producer side ------------------------------------------------------------------
    def submit(self, windows: pa.Table) -> None:
        batch_id = uuid.uuid4().hex
        body, _ = encode_batch(self.host_id, windows, batch_id, fmt="arrow")
        with self._lock:
            self._seq += 1
            self._queue.append(Pending(self._seq, batch_id, windows.num_rows, body))
            self._enforce_bounds()
            self._lock.notify()

    @property
    def depth(self) -> tuple[int, int]:
        """(batches in memory, batches spilled to disk) waiting to be sent."""
        with self._lock:
            spilled = sum(1 for p in self._queue if p.body is None)
            return len(self._queue) - spilled, spilled

    def _enforce_bounds(self) -> None:
        in_mem = [p for p in self._queue if p.body is not None]
        for p in in_mem[: max(0, len(in_mem) - self.mem_batches)]:
            self._spill(p)
        while self._spilled_bytes() > self.spill_max_bytes:
            oldest = next(p for p in self._queue if p.body is None)
            assert oldest.path is not None, "a batch not in memory has been spilled"
            self._queue.remove(oldest)
            oldest.path.unlink(missing_ok=True)
            self.stats.dropped_batches += 1
            self.stats.dropped_windows += oldest.windows
            log.error(
                "upload buffer full: dropped batch %s (%d windows; %d windows dropped so far)",
                oldest.batch_id, oldest.windows, self.stats.dropped_windows,
            )  # fmt: skip

    def _spill(self, p: Pending) -> None:
        p.path = self.spill_dir / f"{p.seq:012d}-{p.windows}-{p.batch_id}.arrow"
        tmp = p.path.with_suffix(".tmp")
        tmp.write_bytes(p.payload())
        tmp.replace(p.path)
        p.body = None
        self.stats.spilled_batches += 1

    def _spilled_bytes(self) -> int:
        return sum(p.path.stat().st_size for p in self._queue if p.body is None and p.path)

    def _recover_spilled(self) -> None:
        """Batches a previous run spilled (or left at shutdown) go first, ids unchanged."""
        for path in sorted(self.spill_dir.glob("*.arrow")):
            seq, windows, batch_id = path.stem.split("-", 2)
            self._seq = max(self._seq, int(seq))
            self._queue.append(Pending(int(seq), batch_id, int(windows), None, path))
        if self._queue:
            log.info("resending %d batches spilled by an earlier run", len(self._queue))

    # ---- sender side --------------------------------------------------------------------
    def _run(self) -> None:
        backoff = 0.2
        while not self._stop.is_set():
            with self._lock:
                while not self._queue and not self._stop.is_set():
                    self._lock.wait(0.5)
                if self._stop.is_set():
                    return
                head = self._queue[0]
            wait = self._send(head)
            if wait is None:
                backoff = 0.2
                continue
            self.stats.retries += 1
            self._stop.wait(max(wait, backoff))
            backoff = min(backoff * 2, 5.0)

    def _send(self, p: Pending) -> float | None:
        """Send one batch; None when it is done with (stored or refused), else seconds to wait."""
        body = p.payload()
        if self._publisher is not None:
            return self._publish(p, body, self._publisher)
        try:
            r = self._client.ingest(body, CT_ARROW)
        except CollectorError as e:
            log.warning("collector unreachable (%s); %d batches waiting", e, len(self._queue))
            return 0.0
        if r.status_code == 429 or r.status_code >= 500:
            return float(r.headers.get("retry-after", "0") or 0)
        if r.status_code == 200:
            self._stored(p, "the collector")
        else:  # 4xx: a retry cannot fix it; say why and move on
            self.stats.rejected_batches += 1
            log.error("collector refused batch %s: %s %s", p.batch_id, r.status_code, r.text[:300])
        self._dequeue(p)
        return None

    def _publish(self, p: Pending, body: bytes, publisher: Publisher) -> float | None:
        try:
            publisher.publish(self.partition, p.batch_id, body, CT_ARROW)
        except PublishError as e:
            log.warning("stream unreachable (%s); %d batches waiting", e, len(self._queue))
            return 0.0
        self._stored(p, "the stream")
        self._dequeue(p)
        return None

    def _stored(self, p: Pending, by: str) -> None:
        if not self.stats.uploaded_batches:  # a start-up stage (the lab test times it)
            log.info("first batch stored by %s (%d windows)", by, p.windows)
        self.stats.uploaded_batches += 1
        self.stats.uploaded_windows += p.windows

    def _dequeue(self, p: Pending) -> None:
        with self._lock:
            self._queue.popleft()
        if p.path is not None:
            p.path.unlink(missing_ok=True)

    def close(self, spill_rest: bool = True) -> None:
        """Stop sending; what is still waiting goes to disk for the next run."""
        self._stop.set()
        with self._lock:
            self._lock.notify_all()
        if self._thread.is_alive():
            self._thread.join(timeout=10)
        with self._lock:
            if spill_rest:
                for p in self._queue:
                    if p.body is not None:
                        self._spill(p)
        self._client.close()
        if self._publisher is not None:
            self._publisher.close()

    def flush(self, timeout_s: float) -> bool:
        """Wait until everything queued was sent (True) or the timeout passed (False)."""
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            with self._lock:
                if not self._queue:
                    return True
            time.sleep(0.05)
        return False
