"""LinkPass: ABI, data integrity, failover / fail-back, drain by decision file, no-path timeout.

The plugin is built through its Makefile once per session.  Root-only tests run the C harness as
two ranks in a private pair of network namespaces joined by 4 veth "NICs" (lp-a-PID-N /
lp-b-PID-N), inject real faults (link down, silent nft drop, all links down) and check what the
harness measured: bytes verified against a per-message pattern, the longest interval without a
completion, and the per-NIC byte counters the plugin publishes.
"""

from __future__ import annotations

import ctypes
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from fleetlens.records import Decision, DrainEntry

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "ext" / "linkpass" / "harness"))
import lpnet

IS_ROOT = os.geteuid() == 0
needs_root = pytest.mark.skipif(
    not IS_ROOT or shutil.which("ip") is None,
    reason="needs root and iproute2: runs the ranks in network namespaces joined by veth NICs",
)
needs_nft = pytest.mark.skipif(
    shutil.which("nft") is None, reason="needs nft (Debian package nftables) for a silent drop"
)
VERSIONS = (12, 11, 10, 9, 8)
CHUNK_SLACK = 64 * 1024  # heartbeats only: far below one 512 KiB chunk
_ids = itertools.count()


@pytest.fixture(scope="session")
def built() -> Path:
    lpnet.build()
    return lpnet.PLUGIN


@pytest.fixture
def net(built: Path) -> Iterator[lpnet.NetnsPair]:
    with lpnet.NetnsPair(f"{os.getpid()}-{next(_ids)}") as pair:
        yield pair


# ---------------------------------------------------------------- helpers


def run_harness(args: list[str], env: dict[str, str], timeout: float = 60) -> list[dict]:
    out = subprocess.run(
        [str(lpnet.HARNESS), "--plugin", str(lpnet.PLUGIN), *args],
        env={**os.environ, **env},
        capture_output=True,
        text=True,
        timeout=timeout,
    )
    assert out.returncode == 0, out.stdout + out.stderr
    return [json.loads(line) for line in out.stdout.splitlines()]


def value_at(ts: list[float], vals: list[int], t: float) -> int:
    """Counter value at the last sample taken at or before wall time t."""
    best = vals[0]
    for ti, v in zip(ts, vals, strict=True):
        if ti <= t:
            best = v
    return best


def delta(ts: list[float], vals: list[int], t0: float, t1: float) -> int:
    return value_at(ts, vals, t1) - value_at(ts, vals, t0)


def first_growth(ts: list[float], vals: list[int], t: float, min_bytes: int) -> float | None:
    """Seconds after t at which the counter has grown by more than min_bytes."""
    base = value_at(ts, vals, t)
    for ti, v in zip(ts, vals, strict=True):
        if ti > t and v - base > min_bytes:
            return ti - t
    return None


def run_with_faults(
    net: lpnet.NetnsPair,
    workdir: Path,
    seconds: float,
    schedule: list[tuple[float, Callable[[], None]]],
    env_a: dict[str, str] | None = None,
    env_b: dict[str, str] | None = None,
    finish_timeout: float = 60,
    extra: list[str] | None = None,
) -> tuple[lpnet.Rank, lpnet.Rank, list[float], tuple[int, int]]:
    """Starts both ranks, runs each fault at its offset after the sender is ready (recording
    the wall time it took effect), and waits for both ranks to exit."""
    args = ["--sample-ms", "100", *(extra or [])]
    send, recv = lpnet.start_pair(net, workdir, seconds, env_a, env_b, args)
    try:
        ready = send.wait_event("ready", 20)
        assert ready, f"sender never ready: {send.events} {send.stderr} {recv.stderr}"
        t_ready = time.monotonic()
        times = []
        for offset, action in schedule:
            time.sleep(max(0.0, t_ready + offset - time.monotonic()))
            action()
            times.append(time.time())
        rcs = (send.finish(finish_timeout), recv.finish(finish_timeout))
    finally:
        send.kill()
        recv.kill()
    return send, recv, times, rcs


def assert_clean_transfer(
    send: lpnet.Rank, recv: lpnet.Rank, rcs: tuple[int, int], max_stall_ms: float = 1000
) -> None:
    sd, rd = send.done(), recv.done()
    assert rcs == (0, 0), (rcs, send.of("error"), recv.of("error"), recv.stderr[-5:])
    assert sd and rd
    assert not send.of("error") and not recv.of("error")
    assert sd["errors"] == 0 and rd["errors"] == 0
    assert rd["mismatches"] == 0, recv.of("mismatch")[:3]
    # every byte exactly once and in order: message k verified in the k-th receive
    assert rd["bytes_verified"] == sd["bytes_verified"] > 0
    assert rd["messages"] == sd["messages"]
    assert rd["max_stall_ms"] < max_stall_ms, rd
    assert sd["max_stall_ms"] < max_stall_ms, sd


def report(what: str, side: str, recv: lpnet.Rank, back: float | None) -> None:
    """The measured figures, visible with `pytest -s` (quoted in the README/report)."""
    d = recv.done() or {}
    print(
        f"\n[linkpass] {what} on side {side}: max stall {d.get('max_stall_ms', -1):.0f} ms, "
        f"{d.get('bytes_verified', 0) / 1e9:.2f} GB verified, traffic back after "
        f"{'never' if back is None else f'{back:.2f}'} s"
    )


def final_status(rank: lpnet.Rank) -> dict:
    return rank.of("sample")[-1]["status"]


# ---------------------------------------------------------------- no root needed


def test_symbols_and_names(built: Path) -> None:
    lib = ctypes.CDLL(str(built))
    for v in VERSIONS:
        # the first member of every table is `const char *name`
        name = ctypes.c_char_p.in_dll(lib, f"ncclNetPlugin_v{v}").value
        assert name == b"linkpass", v
    nm = subprocess.run(["nm", "-D", "--defined-only", str(built)], capture_output=True, text=True)
    exported = {line.split()[-1] for line in nm.stdout.splitlines()}
    assert {f"ncclNetPlugin_v{v}" for v in VERSIONS} <= exported
    assert not any(s.startswith("lp_") for s in exported), "internal symbols must stay hidden"


def test_every_version_table_initialises(built: Path) -> None:
    events = run_harness(["--role", "abi"], {"LINKPASS_NICS": "lo"})
    abi = {e["version"]: e for e in events if e["event"] == "abi"}
    assert sorted(abi) == sorted(VERSIONS)
    for v, e in abi.items():
        assert e["found"] and e["name"] == "linkpass", v
        assert (e["init"], e["devices"], e["props"]) == (0, 0, 0), e
        assert e["ndev"] == 1 and e["dev_name"] == "linkpass"
        assert e["ptr_support"] == 1 and e["max_recvs"] == 1 and e["speed"] > 0
    assert any("NIC 0 lo" in e.get("msg", "") for e in events), "logs go through NCCL's logger"


def test_no_nic_makes_init_fail(built: Path) -> None:
    out = subprocess.run(
        [str(lpnet.HARNESS), "--plugin", str(built), "--role", "abi"],
        env={**os.environ, "LINKPASS_NICS": "lp-no-such-nic"},
        capture_output=True,
        text=True,
        timeout=30,
    )
    events = [json.loads(line) for line in out.stdout.splitlines()]
    assert all(e["init"] != 0 for e in events if e["event"] == "abi")


class VProps8(ctypes.Structure):
    _fields_ = [("ndevs", ctypes.c_int), ("devs", ctypes.c_int * 8)]


class PropsV12(ctypes.Structure):
    """ncclNetProperties_v12_t as NCCL's plugins/net documentation lays it out."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        ("pciPath", ctypes.c_char_p),
        ("guid", ctypes.c_uint64),
        ("ptrSupport", ctypes.c_int),
        ("regIsGlobal", ctypes.c_int),
        ("forceFlush", ctypes.c_int),
        ("speed", ctypes.c_int),
        ("port", ctypes.c_int),
        ("latency", ctypes.c_float),
        ("maxComms", ctypes.c_int),
        ("maxRecvs", ctypes.c_int),
        ("netDeviceType", ctypes.c_int),
        ("netDeviceVersion", ctypes.c_int),
        ("vProps", VProps8),
        ("maxP2pBytes", ctypes.c_size_t),
        ("maxCollBytes", ctypes.c_size_t),
        ("maxMultiRequestSize", ctypes.c_int),
        ("railId", ctypes.c_int16),
        ("planeId", ctypes.c_int16),
    ]


RESULT = ctypes.c_int
VOIDP = ctypes.c_void_p


class NetV12(ctypes.Structure):
    """The head of ncclNet_v12_t: name, init, devices, getProperties (22 members in all)."""

    _fields_ = [
        ("name", ctypes.c_char_p),
        (
            "init",
            ctypes.CFUNCTYPE(RESULT, ctypes.POINTER(VOIDP), ctypes.c_uint64, VOIDP, VOIDP, VOIDP),
        ),
        ("devices", ctypes.CFUNCTYPE(RESULT, ctypes.POINTER(ctypes.c_int))),
        ("getProperties", ctypes.CFUNCTYPE(RESULT, ctypes.c_int, ctypes.POINTER(PropsV12))),
        ("rest", VOIDP * 16),  # listen .. makeVDevice
        ("finalize", ctypes.CFUNCTYPE(RESULT, VOIDP)),
        ("setNetAttr", VOIDP),
    ]


def test_v12_properties_layout_matches_nccls(built: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Reads getProperties through an independent ctypes transcription of NCCL's layout."""
    monkeypatch.setenv("LINKPASS_NICS", "lo")
    lib = ctypes.CDLL(str(built))
    net = NetV12.in_dll(lib, "ncclNetPlugin_v12")
    assert ctypes.sizeof(NetV12) == 22 * ctypes.sizeof(VOIDP)
    ctx = VOIDP()
    assert net.init(ctypes.byref(ctx), 7, None, None, None) == 0
    try:
        n = ctypes.c_int()
        assert net.devices(ctypes.byref(n)) == 0 and n.value == 1
        p = PropsV12()
        assert net.getProperties(0, ctypes.byref(p)) == 0
        assert p.name == b"linkpass" and p.pciPath is None
        assert (p.ptrSupport, p.maxRecvs, p.speed) == (1, 1, 10000)
        assert p.vProps.ndevs == 1 and p.vProps.devs[0] == 0
        assert p.maxP2pBytes == p.maxCollBytes == 2048 * 512 * 1024
        assert p.maxMultiRequestSize == 1 and (p.railId, p.planeId) == (-1, -1)
        assert net.getProperties(1, ctypes.byref(p)) != 0
    finally:
        net.finalize(ctx)


DECISION_OK = [
    Decision("h03", 1, [DrainEntry("h03/eth1", "faulty link", 5)]).to_json(),
    Decision("h03", 1, []).to_json(),
    '{"drain":[{"nic_id":"h\\u00e9/eth0","reason":"x\\"y","since_ns":1}],"extra":[1,2.5e3,null]}',
]
DECISION_BAD = [
    "",
    "{",
    '{"drain": [',
    '{"drain": {}}',
    '{"host_id": "h03"}',
    '{"drain": [{"nic_id": 7}]}',
    '{"drain": []} trailing',
    '[{"drain": []}]',
    "\x00\xff garbage",
    '{"drain":' + "[" * 100 + "]" * 100 + "}",
    '{"drain": [], "x": "unterminated}',
]


@pytest.mark.parametrize("text", DECISION_OK)
def test_decision_parser_accepts_agent_output(built: Path, text: str) -> None:
    lib = ctypes.CDLL(str(built))
    drained = (ctypes.c_int * 8)()
    raw = text.encode()
    assert lib.linkpass_decision_parse(raw, ctypes.c_size_t(len(raw)), drained) == 0


@pytest.mark.parametrize("text", DECISION_BAD)
def test_decision_parser_rejects_malformed(built: Path, text: str) -> None:
    lib = ctypes.CDLL(str(built))
    drained = (ctypes.c_int * 8)()
    raw = text.encode("latin-1")
    assert lib.linkpass_decision_parse(raw, ctypes.c_size_t(len(raw)), drained) == -1


def loopback_pair(
    tmp_path: Path,
    send_args: list[str],
    recv_args: list[str],
    env: dict[str, str] | None = None,
    timeout: float = 30,
) -> tuple[lpnet.Rank, lpnet.Rank, tuple[int, int]]:
    """Both ranks on 127.0.0.1 (LINKPASS_NICS=lo): no namespaces, no root."""
    base_env = {**os.environ, "LINKPASS_NICS": "lo", **(env or {})}
    common = ["--plugin", str(lpnet.PLUGIN), "--handle", str(tmp_path / "handle")]

    def spawn(role: str, args: list[str], extra_env: dict[str, str]) -> lpnet.Rank:
        return lpnet.Rank(
            subprocess.Popen(
                [str(lpnet.HARNESS), "--role", role, *common, *args],
                env={**base_env, **extra_env},
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
            )
        )

    recv = spawn("recv", recv_args, {"LINKPASS_STATUS_FILE": str(tmp_path / "recv-status.json")})
    send = spawn("send", send_args, {"LINKPASS_STATUS_FILE": str(tmp_path / "send-status.json")})
    try:
        rcs = (send.finish(timeout), recv.finish(timeout))
    finally:
        send.kill()
        recv.kill()
    return send, recv, rcs


@pytest.mark.parametrize("version", VERSIONS)
def test_loopback_transfer_through_each_version(built: Path, tmp_path: Path, version: int) -> None:
    """One NIC (lo), real sockets: every table moves verified data; status files are written;
    a malformed decision file present from the start is logged and survived."""
    decision = tmp_path / "d.json"
    decision.write_text('{"drain": [ {"nic_id": ')
    args = ["--version", str(version), "--msg-bytes", str(1 << 20)]
    send, recv, rcs = loopback_pair(
        tmp_path, [*args, "--seconds", "1"], args, {"LINKPASS_DECISION_FILE": str(decision)}
    )
    assert_clean_transfer(send, recv, rcs)
    assert recv.done()["version"] == version
    doc = json.loads((tmp_path / "send-status.json").read_text())
    rdoc = json.loads((tmp_path / "recv-status.json").read_text())
    sent, got = doc["nics"][0], rdoc["nics"][0]
    assert sent["name"] == got["name"] == "lo"
    assert sent["tx_bytes"] >= send.done()["bytes_verified"]
    assert got["rx_bytes"] >= recv.done()["bytes_verified"]
    assert doc["decision_errors"] >= 1 and rdoc["decision_errors"] >= 1
    assert any("malformed" in e["msg"] for e in send.of("log"))


@pytest.mark.parametrize(
    ("send_args", "recv_args"),
    [
        # 32 requests in flight per comm, messages smaller than a chunk
        (["--inflight", "32", "--msg-bytes", "65536"],) * 2,
        # messages that end in a partial chunk
        (["--msg-bytes", str(3 * 512 * 1024 + 8)],) * 2,
        # sender far ahead of the receiver: chunks wait in the unexpected store, in order
        (
            ["--inflight", "16", "--msg-bytes", "262144"],
            ["--inflight", "1", "--msg-bytes", "262144"],
        ),
        # eight comms in one process, each with its own I/O thread and pattern
        (["--conns", "8", "--msg-bytes", "262144"],) * 2,
    ],
    ids=["32-inflight", "partial-chunk", "sender-ahead", "8-comms"],
)
def test_loopback_request_shapes(
    built: Path, tmp_path: Path, send_args: list[str], recv_args: list[str]
) -> None:
    send, recv, rcs = loopback_pair(tmp_path, [*send_args, "--seconds", "1"], recv_args)
    assert_clean_transfer(send, recv, rcs)
    assert recv.done()["messages"] > 100


def test_message_larger_than_receive_is_an_error(built: Path, tmp_path: Path) -> None:
    _send, recv, rcs = loopback_pair(
        tmp_path,
        ["--msg-bytes", str(2 << 20), "--seconds", "1", "--deadline", "4"],
        ["--msg-bytes", str(1 << 20)],
    )
    errs = recv.of("error")
    assert rcs[1] == 2 and errs and errs[0]["call"] == "test", (rcs, recv.events[-3:])
    assert errs[0]["rc"] == 5  # ncclInvalidUsage
    assert any("for a 1048576-byte receive" in e["msg"] for e in recv.of("log"))


def test_every_nic_drained_still_moves_data(built: Path, tmp_path: Path) -> None:
    decision = tmp_path / "d.json"
    Decision("h", 1, [DrainEntry("h/lo", "all bad", 1)]).write_atomic(decision)
    send, recv, rcs = loopback_pair(
        tmp_path, ["--seconds", "1"], [], {"LINKPASS_DECISION_FILE": str(decision)}
    )
    assert_clean_transfer(send, recv, rcs)
    assert any("every live NIC is drained" in e["msg"] for e in send.of("log"))


# ---------------------------------------------------------------- namespaces (root)


@needs_root
@pytest.mark.parametrize(
    ("side", "conns"), [("a", 1), ("b", 3)], ids=["sender-nic-1comm", "receiver-nic-3comms"]
)
def test_link_down_failover_and_failback(
    net: lpnet.NetnsPair, tmp_path: Path, side: str, conns: int
) -> None:
    """eth1 goes down on the sender's host (seen at once by netlink) or on the receiver's host
    (the sender only loses carrier late: heartbeats catch it first), under one comm or three
    comms driven by one progress thread as NCCL's proxy does."""
    send, recv, (t_down, t_up), rcs = run_with_faults(
        net,
        tmp_path,
        7.0,
        [(2.0, lambda: net.link(side, 1, False)), (4.5, lambda: net.link(side, 1, True))],
        extra=["--conns", str(conns)],
    )
    assert_clean_transfer(send, recv, rcs)
    ts, tx = send.nic_series("tx_bytes")
    assert delta(ts, tx["eth1"], t_down + 1.0, t_up) == 0, "traffic left the dead NIC"
    for nic in ("eth0", "eth2", "eth3"):
        assert delta(ts, tx[nic], t_down + 1.0, t_up) > 10 << 20, "survivors carried the load"
    back = first_growth(ts, tx["eth1"], t_up, 1 << 20)
    report("link down", side, recv, back)
    assert back is not None and back < 2.0, f"traffic back on eth1 after {back} s"
    st = final_status(send)
    assert st["failovers"] >= conns and st["failbacks"] >= conns and st["comms"] == conns
    logs = send.of("log") + recv.of("log")
    assert any("eth1" in e["msg"] and "failed" in e["msg"] for e in logs)


@needs_root
@needs_nft
def test_silent_drop_detected_by_heartbeat(net: lpnet.NetnsPair, tmp_path: Path) -> None:
    """nft drops everything on eth2 while its link stays up: only heartbeats/TCP_USER_TIMEOUT
    can tell; the chunks in flight there are re-sent on the other NICs."""
    send, recv, (t_drop, t_heal), rcs = run_with_faults(
        net,
        tmp_path,
        7.0,
        [(2.0, lambda: net.silence("a", 2)), (4.5, lambda: net.unsilence("a", 2))],
    )
    assert_clean_transfer(send, recv, rcs)
    ts, tx = send.nic_series("tx_bytes")
    assert delta(ts, tx["eth2"], t_drop + 1.0, t_heal) < CHUNK_SLACK
    back = first_growth(ts, tx["eth2"], t_heal, 1 << 20)
    report("silent drop", "a", recv, back)
    assert back is not None and back < 2.0, f"traffic back on eth2 after {back} s"
    st = final_status(send)
    assert st["failovers"] >= 1 and st["resent_chunks"] >= 1 and st["failbacks"] >= 1


@needs_root
def test_decision_file_drains_without_stall(net: lpnet.NetnsPair, tmp_path: Path) -> None:
    """The sender's host drains eth3, the receiver's host drains eth0 (told to the sender over
    the lane); a malformed file in between keeps the previous drain set; undrain restores."""
    dec_a, dec_b = tmp_path / "decision-a.json", tmp_path / "decision-b.json"

    def drain() -> None:
        now = time.time_ns()
        Decision("lpa", now, [DrainEntry("lpa/eth3", "test", now)]).write_atomic(dec_a)
        Decision("lpb", now, [DrainEntry("lpb/eth0", "test", now)]).write_atomic(dec_b)

    def corrupt() -> None:
        tmp = dec_a.with_suffix(".tmp")
        tmp.write_text('{"drain": [{"nic_id": "lpa/eth3"')
        tmp.replace(dec_a)

    def undrain() -> None:
        Decision("lpa", time.time_ns(), []).write_atomic(dec_a)
        Decision("lpb", time.time_ns(), []).write_atomic(dec_b)

    send, recv, (t_drain, _t_bad, t_undrain), rcs = run_with_faults(
        net,
        tmp_path,
        7.5,
        [(2.0, drain), (3.5, corrupt), (5.0, undrain)],
        env_a={"LINKPASS_DECISION_FILE": str(dec_a)},
        env_b={"LINKPASS_DECISION_FILE": str(dec_b)},
    )
    assert_clean_transfer(send, recv, rcs)
    ts, tx = send.nic_series("tx_bytes")
    for nic in ("eth3", "eth0"):
        assert delta(ts, tx[nic], t_drain + 1.0, t_undrain) < CHUNK_SLACK, nic
        back = first_growth(ts, tx[nic], t_undrain, 1 << 20)
        report("drain/undrain", f"{nic}", recv, back)
        assert back is not None and back < 2.0, f"traffic back on {nic} after {back} s"
    for nic in ("eth1", "eth2"):
        assert delta(ts, tx[nic], t_drain + 1.0, t_undrain) > 10 << 20
    st = final_status(send)
    assert st["decision_errors"] >= 1 and st["failovers"] == 0, st
    assert any("malformed" in e["msg"] for e in send.of("log"))


@needs_root
def test_all_nics_down_errors_after_timeout(net: lpnet.NetnsPair, tmp_path: Path) -> None:
    timeout_ms = 2000
    env = {"LINKPASS_TIMEOUT_MS": str(timeout_ms)}

    def all_down() -> None:
        for i in range(net.nics):
            net.link("a", i, False)

    send, recv, (t_down,), rcs = run_with_faults(
        net, tmp_path, 30.0, [(1.5, all_down)], env_a=env, env_b=env, finish_timeout=15
    )
    assert rcs == (2, 2), (rcs, send.events[-3:], recv.events[-3:])
    for rank, slack in ((send, 1.0), (recv, 2.5)):
        errs = rank.of("error")
        assert errs and errs[0]["call"] in ("test", "isend", "irecv"), errs
        after = errs[0]["wall"] - t_down
        print(f"\n[linkpass] all NICs down: {errs[0]['call']} error after {after:.2f} s")
        assert timeout_ms / 1e3 - 0.1 <= after <= timeout_ms / 1e3 + slack, after
        assert rank.done()["mismatches"] == 0


@needs_root
def test_all_nics_down_briefly_is_survived(net: lpnet.NetnsPair, tmp_path: Path) -> None:
    """Every NIC down for 1 s, shorter than LINKPASS_TIMEOUT_MS: test() only says "not done",
    then everything resumes with no byte lost, duplicated or reordered."""

    def all_links(up: bool) -> Callable[[], None]:
        return lambda: [net.link("a", i, up) for i in range(net.nics)]

    send, recv, (t_down, t_up), rcs = run_with_faults(
        net, tmp_path, 5.0, [(1.5, all_links(False)), (2.5, all_links(True))]
    )
    assert_clean_transfer(send, recv, rcs, max_stall_ms=(t_up - t_down + 2.0) * 1e3)
    ts, tx = send.nic_series("tx_bytes")
    for nic in tx:
        back = first_growth(ts, tx[nic], t_up, 1 << 20)
        assert back is not None and back < 2.0, (nic, back)
    print(
        f"\n[linkpass] all NICs down for {t_up - t_down:.2f} s: max stall "
        f"{recv.done()['max_stall_ms']:.0f} ms, no error"
    )


@needs_root
def test_drained_nic_fails_without_resends(net: lpnet.NetnsPair, tmp_path: Path) -> None:
    """FleetLens drains eth2, then eth2 dies: nothing was in flight on it, so nothing is re-sent
    and the job does not stall; after the undrain it carries traffic again."""
    dec = tmp_path / "decision.json"

    def drain(nics: list[str]) -> Callable[[], None]:
        return lambda: Decision(
            "lpa", time.time_ns(), [DrainEntry(f"lpa/{n}", "test", 0) for n in nics]
        ).write_atomic(dec)

    send, recv, (_t_drain, _t_down, _t_up, t_undrain), rcs = run_with_faults(
        net,
        tmp_path,
        6.0,
        [
            (1.5, drain(["eth2"])),
            (2.5, lambda: net.link("a", 2, False)),
            (3.5, lambda: net.link("a", 2, True)),
            (4.0, drain([])),
        ],
        env_a={"LINKPASS_DECISION_FILE": str(dec)},
    )
    assert_clean_transfer(send, recv, rcs)
    st = final_status(send)
    assert st["failovers"] >= 1 and st["resent_chunks"] == 0, st
    ts, tx = send.nic_series("tx_bytes")
    back = first_growth(ts, tx["eth2"], t_undrain, 1 << 20)
    report("drained then failed", "a", recv, back)
    assert back is not None and back < 2.0


@needs_root
def test_nic_discovery_without_env(net: lpnet.NetnsPair, monkeypatch: pytest.MonkeyPatch) -> None:
    """No LINKPASS_NICS: every non-loopback UP interface with an IPv4 address is a NIC."""
    monkeypatch.delenv("LINKPASS_NICS", raising=False)
    rank = lpnet.Rank(
        net.popen("a", [str(lpnet.HARNESS), "--plugin", str(lpnet.PLUGIN), "--role", "abi"], {})
    )
    assert rank.finish(30) == 0, rank.stderr
    v12 = next(e for e in rank.of("abi") if e["version"] == 12)
    assert v12["ndev"] == 1 and v12["speed"] == 4 * 10000  # veth reports no speed: 10G each
    found = (re.match(r"LinkPass: NIC \d+ (\S+) link", e["msg"]) for e in rank.of("log"))
    named = {m.group(1) for m in found if m}
    assert {f"eth{i}" for i in range(4)} <= named and "lo" not in named
