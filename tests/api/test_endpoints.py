"""Every endpoint of a real collector fed with windows whose faults are known: a lossy fabric
link (leaf0->spine0) and a lossy access link (h01/eth1->leaf1), run through the background loops
(placeholder triangulation) into verdicts, decisions, job impact and metrics."""

from __future__ import annotations

import shutil
import subprocess
import time
from urllib.parse import quote

import pytest
from collector_helpers import INGEST, READ, Server, make_windows, metric
from prometheus_client.parser import text_string_to_metric_families

from fleetlens.batch import encode_batch
from fleetlens.topology import Topology

FABRIC, ACCESS = "leaf0->spine0", "h01/eth1->leaf1"
LOSS = 0.3


@pytest.fixture(scope="module")
def fed(server: Server, topo: Topology) -> Server:
    start = (time.time_ns() // 10**9 - 3) * 10**9
    with server.client(INGEST) as c:
        for host in topo.hosts:
            lossy = frozenset({FABRIC, ACCESS})
            t = make_windows(topo, host, start, n_windows=2, lossy_links=lossy, loss=LOSS)
            body, ctype = encode_batch(host, t)
            r = c.post("/v1/ingest", content=body, headers={"Content-Type": ctype})
            assert r.status_code == 200, r.text
    deadline = time.monotonic() + 20
    with server.client(READ) as c:
        while time.monotonic() < deadline:
            faulty = {x["link_id"] for x in c.get("/v1/links", params={"state": "faulty"}).json()}
            if {FABRIC, ACCESS} <= faulty and c.get("/v1/decisions/h01").json()["drain"]:
                return server
            time.sleep(0.2)
    raise AssertionError(f"loops never flagged the injected faults: {faulty}")


def enc(x: str) -> str:
    return quote(x, safe="")


def test_links(fed: Server, topo: Topology) -> None:
    with fed.client() as c:
        r = c.get("/v1/links", params={"state": "faulty"})
        faulty = {x["link_id"]: x for x in r.json()}
        every = c.get("/v1/links", params={"limit": 1000})
    assert every.headers["X-Total-Count"] == str(len(topo.links))
    f = faulty[FABRIC]
    assert (f["a"], f["b"], f["tier"], f["state"]) == ("leaf0", "spine0", "fabric", "faulty")
    assert f["loss_rate"] == pytest.approx(LOSS, abs=0.01) and f["flows"] >= 2 and f["since"]
    assert faulty[ACCESS]["tier"] == "access"
    # Links crossed by at least one clean flow are never faulty (no false accusation).
    for lk in ("leaf0->spine1", "spine1->leaf1", "h00/eth0->leaf0", "leaf1->spine0"):
        assert lk not in faulty
    healthy = [x["link_id"] for x in every.json() if x["state"] == "healthy"]
    assert "leaf0->spine1" in healthy
    # Worst first, and pages tile the list.
    states = [x["state"] for x in every.json()]
    assert states[: len(faulty)] == ["faulty"] * len(faulty)
    with fed.client() as c:
        p1 = c.get("/v1/links", params={"limit": 5, "offset": 0}).json()
        p2 = c.get("/v1/links", params={"limit": 5, "offset": 5}).json()
    assert [x["link_id"] for x in p1 + p2] == [x["link_id"] for x in every.json()[:10]]


def test_link_detail_and_errors(fed: Server) -> None:
    with fed.client() as c:
        r = c.get(f"/v1/links/{enc(FABRIC)}")
        assert r.status_code == 200, r.text
        d = r.json()
        assert d["state"] == "faulty" and d["history"] and d["history"][0]["state"] == "faulty"
        assert all(">" in f and ":" in f for f in d["evidence_flows"])
        assert c.get("/v1/links/h01/eth1->leaf1").json()["link_id"] == ACCESS  # raw slash too
        assert c.get(f"/v1/links/{enc('leaf9->spine9')}").status_code == 404
        bad = c.get("/v1/links/not-a-link")
        assert bad.status_code == 422 and bad.json()["field"] == "link_id"
        for params, field in (({"state": "broken"}, "state"), ({"limit": 0}, "limit"),
                              ({"limit": 5000}, "limit"), ({"offset": -1}, "offset")):  # fmt: skip
            r = c.get("/v1/links", params=params)
            assert r.status_code == 422 and r.json()["field"] == field, r.text
        r = c.get(f"/v1/links/{enc(FABRIC)}", params={"since": "yesterday"})
        assert r.status_code == 422 and r.json()["field"] == "since"


def test_hosts_nics_clocks(fed: Server, topo: Topology) -> None:
    with fed.client() as c:
        hosts = {h["host_id"]: h for h in c.get("/v1/hosts").json()}
        nics = c.get("/v1/nics", params={"state": "faulty"}).json()
        all_nics = c.get("/v1/nics", params={"limit": 1000})
        clocks = c.get("/v1/clocks").json()
        bad_hosts = c.get("/v1/hosts", params={"state": "faulty"})
        page = c.get("/v1/hosts", params={"limit": 2, "offset": 1})
    assert sorted(hosts) == topo.hosts
    assert [h["host_id"] for h in bad_hosts.json()] == ["h01"]
    assert bad_hosts.headers["X-Total-Count"] == "1"
    assert [h["host_id"] for h in page.json()] == topo.hosts[1:3]
    assert page.headers["X-Total-Count"] == str(len(topo.hosts))
    assert hosts["h01"]["state"] == "faulty" and hosts["h00"]["state"] == "healthy"
    assert {n["nic_id"] for n in hosts["h01"]["nics"]} == {"h01/eth0", "h01/eth1"}
    assert [n["nic_id"] for n in nics] == ["h01/eth1"]
    assert nics[0]["leaf"] == "leaf1" and ACCESS in nics[0]["reason"]
    assert all_nics.headers["X-Total-Count"] == str(len(topo.nics))
    # Huygens on these windows: delays of 2-4 µs both ways, so every offset is within a few µs.
    assert sorted(x["host_id"] for x in clocks) == topo.hosts
    assert all(abs(x["offset_ns"]) < 5_000 and x["updated"] for x in clocks), clocks
    assert hosts["h02"]["clock"]["host_id"] == "h02"


def test_pair_history_params(fed: Server) -> None:
    base = f"/v1/pairs/{enc('h01/eth1')}/{enc('h00/eth0')}/owd"
    with fed.client() as c:
        r = c.get(base, params={"since": "-5m", "step": "1s"})
        assert r.status_code == 200, r.text
        pts = r.json()["points"]
        assert len(pts) == 2 and all(p["windows"] == 2 for p in pts)
        assert all(
            p["loss_rate"] == pytest.approx(LOSS) for p in pts
        )  # leaves through the lossy h01/eth1->leaf1
        now = time.time_ns()
        cases = [
            ({"since": now, "until": now - 1}, "until"),
            ({"since": 0, "until": now}, "since"),  # longer than the maximum range
            ({"step": "1ns"}, "step"),
            ({"step": "fortnight"}, "step"),
            ({"since": "-1d", "step": "1s"}, "step"),  # too many points
            ({"until": "2026-01-01T00:00:00"}, "until"),  # no time zone
        ]
        for params, field in cases:
            r = c.get(base, params=params)
            assert r.status_code == 422 and r.json()["field"] == field, (params, r.text)
        r = c.get(f"/v1/pairs/{enc('h00/eth0')}/{enc('h42/eth9')}/owd")
        assert r.status_code == 404 and r.json()["field"] == "dst_nic"


def test_jobs_and_impact(fed: Server) -> None:
    with fed.client() as c:
        r = c.post("/v1/jobs", json={"name": "llama-70b", "hosts": ["h00", "h01"]})
        assert r.status_code == 201, r.text
        imp = c.get("/v1/jobs/llama-70b/impact").json()
        clean = c.post("/v1/jobs", json={"name": "small", "hosts": ["h02", "h03"]})
        assert clean.status_code == 201
        imp2 = c.get("/v1/jobs/small/impact").json()
        bad = c.post("/v1/jobs", json={"name": "x", "hosts": ["h00", "h99"]})
        assert bad.status_code == 422 and "h99" in bad.json()["detail"]
        assert c.get("/v1/jobs/nope/impact").status_code == 404
    assert {x["link_id"] for x in imp["bad_links"]} >= {FABRIC, ACCESS}
    assert [n["nic_id"] for n in imp["bad_nics"]] == ["h01/eth1"]
    # h02/h03 still cross the faulty fabric link (both leaves), but not h01's access link.
    assert ACCESS not in {x["link_id"] for x in imp2["bad_links"]} and not imp2["bad_nics"]
    assert imp["links_crossed"] > len(imp["bad_links"])


def test_decisions_and_plan(fed: Server, topo: Topology) -> None:
    with fed.client(INGEST) as c:  # agents use the ingest token for plan and decisions
        d = c.get("/v1/decisions/h01").json()
        h02 = c.get("/v1/decisions/h02").json()
        plan = c.get("/v1/plan/h00")
        assert c.get("/v1/decisions/h77").status_code == 404
        assert c.get("/v1/plan/h77").status_code == 404
    assert [e["nic_id"] for e in d["drain"]] == ["h01/eth1"]
    assert ACCESS in d["drain"][0]["reason"] and d["drain"][0]["since_ns"] > 0
    # On two leaves FABRIC is one of a group (leaf0->spine0 = spine0->leaf1: no probe tells
    # them apart) that reaches h02's NICs on both leaves: a host never drains all its NICs.
    assert h02["drain"] == []
    assert plan.status_code == 200, plan.text
    p = plan.json()
    assert {e["src_nic"] for e in p["entries"]} == {"h00/eth0", "h00/eth1"}
    assert all(e["sports"] and not e["dst_nic"].startswith("h00/") for e in p["entries"])
    assert p["clock"]["host_id"] == "h00" and p["window_ns"] == 10**9


def test_metrics(fed: Server, topo: Topology) -> None:
    with fed.client() as c:
        text = c.get("/metrics").text
        synced = {x["host_id"]: x["synced"] for x in c.get("/v1/clocks").json()}
    assert metric(text, "fleetlens_links", state="faulty") >= 2
    assert metric(text, "fleetlens_faulty_link_loss_ratio", link=FABRIC) == pytest.approx(
        LOSS, abs=0.01
    )
    assert metric(text, "fleetlens_faulty_link_excess_delay_seconds", link=FABRIC) == 0.0
    # One OWD observation per window per side; leaf0 holds eth0 of the 4 hosts, each sending
    # 2 windows x 2 ports x 6 remote NICs, 3 of them on its own leaf.
    n = metric(text, "fleetlens_leaf_owd_seconds_count", leaf="leaf0", direction="tx")
    assert n == 4 * 2 * 2 * 6
    assert metric(text, "fleetlens_leaf_owd_seconds_bucket", leaf="leaf0", direction="tx",
                  le="1e-05") == n  # every generated median is 3-6 us  # fmt: skip
    assert metric(text, "fleetlens_leaf_owd_seconds_bucket", leaf="leaf0", direction="tx",
                  le="2e-06") == 0  # fmt: skip
    assert metric(text, "fleetlens_rail_owd_seconds_count", rail="eth1", direction="rx") == n
    assert metric(text, "fleetlens_tier_owd_seconds_count", tier="leaf") == n
    for host, is_synced in synced.items():  # the gauge says what the API says
        assert metric(text, "fleetlens_clock_synced", host=host) == float(is_synced)
    assert metric(text, "fleetlens_ingest_rejected_batches_total", reason="future") == 0
    assert metric(text, "fleetlens_ingest_windows_total") == sum(2 * 2 * 2 * 6 for _ in topo.hosts)
    assert metric(text, "fleetlens_writer_queue_depth") == 0
    assert metric(text, "fleetlens_writer_lag_seconds") >= 0
    assert metric(text, "fleetlens_loop_runs_total", loop="triangulate") >= 1
    # Never per pair, and per NIC only with --per-nic-metrics: no delay series names a NIC.
    owd_labels = {
        frozenset(sample.labels)
        for fam in text_string_to_metric_families(text)
        if fam.name.endswith("_owd_seconds")
        for sample in fam.samples
    }
    assert owd_labels and not any(labels & {"nic", "src_nic", "dst_nic"} for labels in owd_labels)


def test_docs_and_openapi(fed: Server) -> None:
    with fed.client(None) as c:
        assert "swagger" in c.get("/docs").text.lower()
        paths = set(c.get("/openapi.json").json()["paths"])
    assert {"/v1/ingest", "/v1/register", "/v1/plan/{host_id}", "/v1/links", "/v1/links/{link_id}",
            "/v1/hosts", "/v1/nics", "/v1/clocks", "/v1/pairs/{src_nic}/{dst_nic}/owd",
            "/v1/jobs", "/v1/jobs/{name}/impact", "/v1/decisions/{host_id}", "/healthz",
            "/metrics"} <= paths  # fmt: skip


@pytest.mark.skipif(shutil.which("promtool") is None, reason="needs promtool (Debian: prometheus)")
def test_metrics_pass_promtool_lint(fed: Server) -> None:
    """Prometheus' own linter: naming, units, _total counters, HELP/TYPE on every family."""
    with fed.client() as c:
        text = c.get("/metrics").text
    r = subprocess.run(["promtool", "check", "metrics"], input=text, capture_output=True,
                       text=True, timeout=60)  # fmt: skip
    assert r.returncode == 0 and not r.stdout.strip() and not r.stderr.strip(), r.stdout + r.stderr
