"""LinkPass benchmark: striped throughput vs raw TCP, and the curve during a NIC pull.

    sudo .venv/bin/python bench/linkpass_bench.py [--seconds 5] [--png /tmp/linkpass.png]

All in one command, in a private pair of network namespaces joined by 4 veth NICs:
1. baseline: 4 plain TCP streams (one per veth pair, iperf-style C tool), aggregate Gbit/s;
2. LinkPass over the same 4 NICs (harness, pattern check off so both sides only move bytes),
   and the ratio LinkPass / baseline (target >= 0.9);
3. for each fault (link down, silent nft drop): a transfer with eth1 pulled at +3 s and restored
   at +6 s; prints the received throughput and per-NIC send rates every 100 ms, the longest stall,
   and plots the series to a PNG (needs the `bench` extra: matplotlib).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "ext" / "linkpass" / "harness"))
import lpnet

NICS = 4


def child_cpu() -> float:
    """CPU seconds (user + system) of all waited-for children so far: both ranks of a run."""
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def with_cpu(done: dict, cpu0: float, nbytes: int) -> dict:
    """Adds CPU seconds per GB moved: a figure a busy neighbour on the machine barely moves."""
    cpu = child_cpu() - cpu0
    return {**done, "cpu_s": cpu, "cpu_s_per_gb": cpu / (nbytes / 1e9) if nbytes else 0.0}


def baseline(net: lpnet.NetnsPair, seconds: float) -> dict:
    addrs = ",".join(lpnet.addr("b", i) for i in range(NICS))
    args = ["--addrs", addrs, "--port", "5201", "--seconds", str(seconds)]
    cpu0 = child_cpu()
    recv = lpnet.Rank(net.popen("b", [str(lpnet.TCPBASE), "--role", "recv", *args], {}))
    assert recv.wait_event("listening", 10)
    send = lpnet.Rank(net.popen("a", [str(lpnet.TCPBASE), "--role", "send", *args], {}))
    try:
        send.finish(seconds + 30)
        recv.finish(30)
    finally:
        send.kill()
        recv.kill()
    done = recv.done()
    assert done, recv.stderr
    return with_cpu(done, cpu0, done["bytes"])


def linkpass(net: lpnet.NetnsPair, work: Path, seconds: float, verify: int) -> dict:
    extra = ["--verify", str(verify), "--sample-ms", "1000"]
    cpu0 = child_cpu()
    send, recv = lpnet.start_pair(net, work, seconds, extra=extra)
    try:
        send.finish(seconds + 60)
        recv.finish(30)
    finally:
        send.kill()
        recv.kill()
    done = recv.done()
    assert done and done["errors"] == 0, (recv.events[-3:], recv.stderr[-3:])
    return with_cpu(done, cpu0, send.done()["bytes"])


def rates(ts: list[float], vals: list[int]) -> tuple[np.ndarray, np.ndarray]:
    """Midpoint times and Gbit/s between consecutive samples (vectorised)."""
    t, v = np.asarray(ts, dtype=float), np.asarray(vals, dtype=float)
    dt = np.diff(t)
    ok = dt > 0
    return (t[1:] + t[:-1])[ok] / 2, (np.diff(v)[ok] * 8 / dt[ok] / 1e9)


def fault_run(net: lpnet.NetnsPair, work: Path, fault: str) -> dict:
    def pull() -> None:
        net.link("a", 1, False) if fault == "down" else net.silence("a", 1)

    def restore() -> None:
        net.link("a", 1, True) if fault == "down" else net.unsilence("a", 1)

    send, recv = lpnet.start_pair(net, work, 9.0, extra=["--sample-ms", "100"])
    try:
        assert send.wait_event("ready", 20), send.stderr
        time.sleep(3.0)
        pull()
        t_pull = time.time()
        time.sleep(3.0)
        restore()
        t_back = time.time()
        send.finish(60)
        recv.finish(30)
    finally:
        send.kill()
        recv.kill()
    rd, sd = recv.done(), send.done()
    assert rd and sd, (recv.events[-3:], send.events[-3:])
    samples = recv.of("sample")
    rt, rb = [e["wall"] for e in samples], [e["bytes"] for e in samples]
    tt, total = rates(rt, rb)
    sts, tx = send.nic_series("tx_bytes")
    per_nic = {nic: rates(sts, v) for nic, v in tx.items()}
    status = send.of("sample")[-1]["status"]
    return {
        "fault": fault,
        "t_pull": t_pull,
        "t_back": t_back,
        "total": (tt - t_pull, total),
        "per_nic": {n: (t - t_pull, r) for n, (t, r) in per_nic.items()},
        "recv": rd,
        "send": sd,
        "status": status,
    }


def print_series(run: dict) -> None:
    t, total = run["total"]
    nics = sorted(run["per_nic"])
    back = run["t_back"] - run["t_pull"]
    print(f"\n# fault={run['fault']}: eth1 pulled at t=0, restored at t={back:.2f} s")
    print("t_s    recv_Gbit/s  " + "  ".join(f"{n}_tx_Gbit/s" for n in nics))
    for i in range(len(t)):
        cols = []
        for n in nics:
            nt, nr = run["per_nic"][n]
            j = int(np.argmin(np.abs(nt - t[i]))) if len(nt) else -1
            cols.append(f"{nr[j]:13.2f}" if j >= 0 else " " * 13)
        print(f"{t[i]:6.2f} {total[i]:11.2f}  " + "  ".join(cols))
    rd, st = run["recv"], run["status"]
    print(
        f"max stall: recv {rd['max_stall_ms']:.1f} ms at t={rd['max_stall_at']:.2f}, "
        f"send {run['send']['max_stall_ms']:.1f} ms; bytes verified {rd['bytes_verified']}, "
        f"mismatches {rd['mismatches']}, errors {rd['errors']}; failovers {st['failovers']}, "
        f"failbacks {st['failbacks']}, resent chunks {st['resent_chunks']}"
    )


def plot(runs: list[dict], path: Path) -> None:
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        print("matplotlib missing (pip install -e '.[bench]'): no PNG written")
        return
    fig, axes = plt.subplots(len(runs), 1, figsize=(9, 3.6 * len(runs)), squeeze=False)
    for ax, run in zip(axes[:, 0], runs, strict=True):
        t, total = run["total"]
        ax.plot(t, total, "k-", lw=2, label="received (all NICs)")
        for n, (nt, nr) in sorted(run["per_nic"].items()):
            ax.plot(nt, nr, lw=1, label=f"{n} sent")
        ax.axvline(0, color="r", ls="--", lw=1)
        ax.axvline(run["t_back"] - run["t_pull"], color="g", ls="--", lw=1)
        rd = run["recv"]
        ax.set_title(
            f"LinkPass, eth1 {run['fault']} at 0 s, back at "
            f"{run['t_back'] - run['t_pull']:.1f} s; max stall {rd['max_stall_ms']:.0f} ms"
        )
        ax.set_xlabel("s since pull")
        ax.set_ylabel("Gbit/s")
        ax.legend(fontsize=7, loc="upper right")
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    print(f"\nplot written to {path}")


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seconds", type=float, default=4.0, help="length of each throughput run")
    ap.add_argument("--rounds", type=int, default=3, help="interleaved raw/LinkPass rounds")
    ap.add_argument("--png", type=Path, default=Path("/tmp/linkpass_failover.png"))
    ap.add_argument("--faults", default="down,silent", help="comma list of down,silent")
    ap.add_argument("--json", type=Path, help="also write the figures as JSON here")
    args = ap.parse_args(argv)
    if os.geteuid() != 0:
        print("needs root (network namespaces)", file=sys.stderr)
        return 2
    lpnet.build()
    out: dict = {}
    with lpnet.NetnsPair(f"bench-{os.getpid()}", NICS) as net, tempfile.TemporaryDirectory() as d:
        work = Path(d)
        rounds = []
        for i in range(args.rounds):  # interleaved: a busy neighbour hits both alike
            base = baseline(net, args.seconds)
            lp = linkpass(net, work, args.seconds, verify=0)
            rounds.append((base["gbit_s"], lp["gbit_s"], base["cpu_s_per_gb"], lp["cpu_s_per_gb"]))
            print(
                f"round {i}: raw TCP {base['gbit_s']:6.2f} Gbit/s"
                f" ({base['cpu_s_per_gb']:.3f} CPU-s/GB), LinkPass {lp['gbit_s']:6.2f} Gbit/s"
                f" ({lp['cpu_s_per_gb']:.3f} CPU-s/GB), ratio {lp['gbit_s'] / base['gbit_s']:.3f}"
            )
        raw_g = float(np.median([r[0] for r in rounds]))
        lp_g = float(np.median([r[1] for r in rounds]))
        ratio = float(np.median([r[1] / r[0] for r in rounds]))
        lpv = linkpass(net, work, args.seconds, verify=1)
        print(f"raw TCP, {NICS} streams over {NICS} veth NICs (median): {raw_g:8.2f} Gbit/s")
        print(f"LinkPass over the same {NICS} NICs (median)          : {lp_g:8.2f} Gbit/s")
        print(f"ratio LinkPass / raw (median of rounds)           : {ratio:8.3f}  (target >= 0.9)")
        print(f"LinkPass with the byte-pattern check on           : {lpv['gbit_s']:8.2f} Gbit/s")
        cpu_raw = float(np.median([r[2] for r in rounds]))
        cpu_lp = float(np.median([r[3] for r in rounds]))
        print(
            f"CPU seconds per GB moved, both ranks (median)     : raw {cpu_raw:.3f}, "
            f"LinkPass {cpu_lp:.3f}, efficiency ratio raw/LinkPass {cpu_raw / cpu_lp:.3f}"
        )
        out.update(cpu_s_per_gb_raw=cpu_raw, cpu_s_per_gb_linkpass=cpu_lp)
        out.update(rounds=rounds, raw_gbit_s=raw_g, linkpass_gbit_s=lp_g, ratio=ratio)
        out.update(linkpass_verify_gbit_s=lpv["gbit_s"])
        runs = []
        for fault in [f for f in args.faults.split(",") if f]:
            run = fault_run(net, work, fault)
            print_series(run)
            runs.append(run)
        out["faults"] = [
            {
                "fault": r["fault"],
                "recv": r["recv"],
                "send": r["send"],
                "status": r["status"],
                "t_s": r["total"][0].round(3).tolist(),
                "recv_gbit_s": r["total"][1].round(3).tolist(),
            }
            for r in runs
        ]
        if runs:
            plot(runs, args.png)
    if args.json:
        args.json.write_text(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
