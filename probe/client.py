"""The agent's side of the collector API: register, plan, decisions."""

from __future__ import annotations

import json
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

from fleetlens.probe.rest import HttpClient, HttpError

from fleetlens.records import ClockModel, Decision, DrainEntry, HostPlan, PlanEntry


class CollectorError(RuntimeError):
    pass


class CollectorClient:
    def __init__(self, url: str, token: str | None, timeout_s: float = 5.0) -> None:
        headers = {"authorization": f"Bearer {token}"} if token else {}
        self._http = HttpClient(url, headers, timeout_s)

    def _call(self, method: str, path: str, json_body: object = None) -> dict[str, Any]:
        body, headers = None, {}
        if json_body is not None:
            body, headers = json.dumps(json_body).encode(), {"content-type": "application/json"}
        try:
            r = self._http.request(method, path, body, headers)
        except HttpError as e:
            raise CollectorError(str(e)) from e
        if r.status_code != 200:
            raise CollectorError(f"{method} {path}: {r.status_code} {r.text[:300]}")
        try:
            out = json.loads(r.content)
        except ValueError as e:
            raise CollectorError(f"{method} {path}: the answer is not JSON ({e})") from e
        if not isinstance(out, dict):
            raise CollectorError(f"{method} {path}: expected a JSON object, got {r.text[:100]}")
        return out

    def register(
        self, host_id: str, nics: list[dict[str, str]], ts_source: str, metrics_port: int | None
    ) -> None:
        body: dict[str, object] = {
            "host_id": host_id,
            "nics": nics,
            "ts_source": ts_source,
            "agent_version": "fleetlens-agent/0.1",
        }
        if metrics_port:
            body["metrics_port"] = metrics_port
        self._call("POST", "/v1/register", body)

    def plan(self, host_id: str) -> HostPlan:
        d = self._call("GET", f"/v1/plan/{host_id}")
        with _malformed("plan"):
            return self._plan(host_id, d)

    @staticmethod
    def _plan(host_id: str, d: dict[str, Any]) -> HostPlan:
        c = d["clock"]
        clock = ClockModel(
            host_id,
            int(c.get("t0_ns") or 0),
            float(c.get("offset_ns") or 0.0),
            float(c.get("drift_ppb") or 0.0),
            c.get("error_bound_ns"),
            bool(c.get("synced", False)),
        )
        entries = [
            PlanEntry(e["src_nic"], e["dst_nic"], e["dst_ip"], tuple(e["sports"]))
            for e in d["entries"]
        ]
        return HostPlan(
            host_id, int(d["dport"]), int(d["period_ns"]), int(d["window_ns"]), entries, clock
        )

    def decision(self, host_id: str) -> Decision:
        d = self._call("GET", f"/v1/decisions/{host_id}")
        with _malformed("decision"):
            drain = [
                DrainEntry(e["nic_id"], e["reason"], int(e["since_ns"])) for e in d.get("drain", [])
            ]
            return Decision(host_id, int(d.get("generated_ns") or 0), drain)

    def interfaces(self) -> dict[str, str]:
        """Switch interface address -> link arriving there (empty: no inventory)."""
        return {str(k): str(v) for k, v in self._call("GET", "/v1/interfaces").items()}

    def close(self) -> None:
        self._http.close()


@contextmanager
def _malformed(what: str) -> Iterator[None]:
    """A malformed answer is a failed call (retried later), never an exception in a thread."""
    try:
        yield
    except (KeyError, TypeError, ValueError, AttributeError) as e:
        raise CollectorError(f"malformed {what} from the collector: {e!r}") from e
