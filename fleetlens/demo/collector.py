"""A real ``fleetlens collector`` on 127.0.0.1 for the simulated demo, started and stopped
here by PID; its REST API and Prometheus counters read with errors as sentences."""

from __future__ import annotations

import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx


class SimDemoError(RuntimeError):
    """The story could not be told (e.g. the collector died); everything was cleaned up."""


class CollectorProcess:
    def __init__(self, workdir: Path, inventory: Path, loop_interval_s: float) -> None:
        self.workdir, self.inventory, self.loop_interval_s = workdir, inventory, loop_interval_s
        self.port = _free_port()
        self.proc: subprocess.Popen[bytes] | None = None
        self.http = httpx.Client(base_url=self.url, timeout=60)

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    @property
    def log(self) -> Path:
        return self.workdir / "collector.log"

    def start(self, timeout_s: float = 120.0) -> None:
        argv = [
            sys.executable, "-m", "fleetlens.cli", "collector",
            "--db", str(self.workdir / "fleetlens.duckdb"), "--listen", f"127.0.0.1:{self.port}",
            "--inventory", str(self.inventory), "--insecure-no-auth", "--public-metrics",
            "--loop-interval", str(self.loop_interval_s),
            # The run is minutes long and its store is thrown away: no rollup passes in between.
            "--retention-interval", "3600",
        ]  # fmt: skip
        with open(self.log, "ab") as log:
            self.proc = subprocess.Popen(argv, stdout=log, stderr=log, start_new_session=True)
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            self.check_alive("starting")
            try:
                if self.http.get("/healthz", timeout=2).status_code == 200:
                    return
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise SimDemoError(f"collector not healthy after {timeout_s:.0f} s{self.log_tail()}")

    def check_alive(self, doing: str) -> None:
        if self.proc is None or self.proc.poll() is not None:
            code = None if self.proc is None else self.proc.returncode
            raise SimDemoError(f"collector exited (code {code}) while {doing}{self.log_tail()}")

    def get(self, path: str, doing: str, **params: object) -> httpx.Response:
        try:
            r = self.http.get(path, params=params or None)
        except httpx.TransportError as e:
            self.check_alive(doing)
            raise SimDemoError(f"collector unreachable while {doing}: {e}") from e
        if r.status_code != 200:
            raise SimDemoError(f"GET {path} while {doing}: HTTP {r.status_code} {r.text[:300]}")
        return r

    def get_all(self, path: str, doing: str, **params: object) -> list[dict]:
        """Every page of a paged list endpoint."""
        out: list[dict] = []
        while True:
            page = self.get(path, doing, limit=1000, offset=len(out), **params).json()
            out += page
            if len(page) < 1000:
                return out

    def metrics(self, doing: str) -> dict[str, float]:
        """The loop counters and timings, from the Prometheus text of ``/metrics``."""
        text = self.get("/metrics", doing).text
        names = "runs_total|errors_total|duration_seconds_sum|duration_seconds_count"
        pat = rf'^(fleetlens_loop_(?:{names}))\{{loop="(\w+)"\}} (\S+)'
        return {f"{m[1]}:{m[2]}": float(m[3]) for m in re.finditer(pat, text, re.M)}

    def log_tail(self, lines: int = 20) -> str:
        try:
            tail = self.log.read_text(errors="replace").splitlines()[-lines:]
        except OSError:
            return ""
        return ("\n--- collector log (last lines) ---\n" + "\n".join(tail)) if tail else ""

    def stop(self) -> None:
        self.http.close()
        p, self.proc = self.proc, None
        if p is None or p.poll() is not None:
            return
        p.send_signal(signal.SIGTERM)
        try:
            p.wait(30)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait(10)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])
