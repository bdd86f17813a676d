"""``fleetlens demo`` (the lab fabric, as root) and ``fleetlens demo --sim`` (the simulator):
their options, and the runs that tell the story and print its summary."""

from __future__ import annotations

import argparse
import json
import os
import signal
import sys

from rich.console import Console

import fleetlens.demo
from fleetlens.demo import sim
from fleetlens.demo.story import Story
from fleetlens.demo.summary import render
from fleetlens.fixtures.lab.defaults import LAB_BACKGROUND_LOSS


def _lab_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetlens demo",
        description=fleetlens.demo.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    p.add_argument("--name", default="demo", help="lab name (default %(default)s)")
    p.add_argument("--hosts", type=int, default=8)
    p.add_argument("--nics", type=int, default=2)
    p.add_argument("--leaves", type=int, default=4)
    p.add_argument("--spines", type=int, default=2)
    p.add_argument("--fault-link", default="leaf1->spine0")
    p.add_argument("--fault", choices=["loss", "delay"], default="loss")
    p.add_argument("--fault-value", type=float, default=5.0, help="percent loss or µs delay")
    p.add_argument("--sync-timeout", type=float, default=30.0)
    p.add_argument("--baseline-timeout", type=float, default=30.0)
    p.add_argument(
        "--background-loss", type=float, default=LAB_BACKGROUND_LOSS,
        help="loss triangulation treats as normal: software stamps on a loaded 2-core lab "
        "lose ~1e-4 of probes in the measurement itself (default %(default)s)",
    )  # fmt: skip
    p.add_argument(
        "--warmup", type=float, default=6.0,
        help="seconds of clean, synced probing before the fault (delay baselines)",
    )  # fmt: skip
    p.add_argument("--localize-timeout", type=float, default=15.0)
    p.add_argument("--clear-timeout", type=float, default=30.0)
    p.add_argument(
        "--settle", type=float, default=3.0, help="seconds before reading the final verdicts"
    )
    p.add_argument("--linkpass-seconds", type=float, default=8.0)
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--keep", action="store_true", help="leave the stack running to explore")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary only")
    p.add_argument(
        "--sim", action="store_true",
        help="tell the story on the simulator at 1024 hosts, no root "
        "('fleetlens demo --sim --help' lists its options)",
    )  # fmt: skip
    return p


def _sim_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetlens demo --sim",
        description=sim.__doc__,
        formatter_class=argparse.RawDescriptionHelpFormatter,
    )
    d = sim.SimDemoConfig()
    p.add_argument("--hosts", type=int, default=d.hosts)
    p.add_argument("--nics", type=int, default=d.nics)
    p.add_argument("--leaves", type=int, help="default: 32 at >= 1024 hosts, else hosts/8")
    p.add_argument("--spines", type=int, help="default: 8 at >= 1024 hosts, else leaves/2")
    p.add_argument("--peers", type=int, default=d.peers)
    p.add_argument("--seed", type=int, default=d.seed)
    p.add_argument("--fault-link", help="leaf->spine link (default: drawn with the seed)")
    p.add_argument("--fault-value", type=float, default=d.fault_loss_pct, help="percent loss")
    p.add_argument("--fault-at", type=int, default=d.fault_at_s, help="simulated second")
    p.add_argument("--heal-at", type=int, default=d.heal_at_s, help="simulated second")
    p.add_argument("--max-seconds", type=int, default=d.max_seconds)
    p.add_argument("--asymmetric", action="store_true", help="keep the per-direction delays")
    p.add_argument("--keep", action="store_true", help="leave the collector running to explore")
    p.add_argument("--json", action="store_true", help="print a machine-readable summary only")
    return p


def _unwind_on_sigterm() -> None:
    """SIGTERM unwinds like Ctrl-C, so the fabric and every process are torn down. Children
    forked without exec (pyroute2 forks to create namespaces) inherit the handler: they
    must still just die, as by default."""
    me = os.getpid()

    def on_term(*_: object) -> None:
        if os.getpid() != me:
            os._exit(128 + signal.SIGTERM)
        sys.exit(128 + signal.SIGTERM)

    signal.signal(signal.SIGTERM, on_term)


def main(argv: list[str]) -> int:
    if "--sim" in argv:  # the same story on the simulator: its own options, no root
        return sim_main([x for x in argv if x != "--sim"])
    a = _lab_parser().parse_args(argv)
    if os.geteuid() != 0:
        print("fleetlens demo: the lab fabric needs root (network namespaces)", file=sys.stderr)
        return 2
    from fleetlens.demo.lab import LabFabric, LabSummary

    console = Console(stderr=a.json)
    _unwind_on_sigterm()
    fabric = LabFabric(a, console, quiet=a.json)
    s: LabSummary | None = None
    try:
        s = Story(fabric, console, quiet=a.json).run()
    finally:
        fabric.stop(a.keep, s)
    if a.json:
        print(json.dumps(s.to_dict(), indent=1))
    else:
        render(s, console)
    return 0 if all(s.checks.values()) else 1


def sim_main(argv: list[str]) -> int:
    a = _sim_parser().parse_args(argv)
    cfg = sim.SimDemoConfig(
        hosts=a.hosts, nics=a.nics, leaves=a.leaves, spines=a.spines, peers=a.peers,
        seed=a.seed, fault_link=a.fault_link, fault_loss_pct=a.fault_value,
        fault_at_s=a.fault_at, heal_at_s=a.heal_at, max_seconds=a.max_seconds,
        symmetric=not a.asymmetric,
    )  # fmt: skip
    try:
        out = sim.run_sim_demo(a.hosts, a.seed, a.keep, a.json, config=cfg)
    except (sim.SimDemoError, ValueError) as e:
        print(f"fleetlens demo --sim: {e}", file=sys.stderr)
        return 1
    if a.json:
        print(json.dumps(out, indent=1))
    return 0 if out["passed"] else 1
