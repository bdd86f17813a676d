"""The ``fleetlens`` command: one subcommand per component, each owning its own arguments.

Subcommand modules are imported only when run, so ``fleetlens lab`` does not pay for FastAPI
and ``fleetlens --help`` works even on a machine without the optional pieces.
"""

from __future__ import annotations

import argparse
import importlib
import sys

# name -> (module with ``main(argv) -> int``, one-line help)
SUBCOMMANDS: dict[str, tuple[str, str]] = {
    "agent": ("fleetlens.probe.cli", "run the probe agent on this host"),
    "collector": ("fleetlens.api.cli", "run the collector (ingest, DuckDB, REST API, /metrics)"),
    "fleet": (
        "fleetlens.api.fleetcli",
        "run the fleet tier over collector shards' summaries (NATS)",
    ),
    "lab": ("fleetlens.fixtures.lab.cli", "build, fault and tear down the namespace lab fabric"),
    "sim": ("fleetlens.fixtures.sim.cli", "simulate a fleet-scale fabric with ground truth"),
    "demo": ("fleetlens.demo.cli", "the whole story end to end on the lab fabric (or --sim)"),
    "audit": (
        "fleetlens.audit.cli",
        "pre-handover validation of every link and NIC, with a report",
    ),
}


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="fleetlens",
        description="Fabric telemetry for GPU clusters.",
        formatter_class=argparse.RawDescriptionHelpFormatter,
        epilog="commands:\n"
        + "\n".join(f"  {name:<10} {text}" for name, (_, text) in SUBCOMMANDS.items())
        + "\n\nRun 'fleetlens COMMAND --help' for a command's options.",
    )
    p.add_argument("--version", action="store_true", help="print the version and exit")
    p.add_argument("command", nargs="?", choices=sorted(SUBCOMMANDS), metavar="COMMAND")
    p.add_argument("args", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    parser = _parser()
    ns = parser.parse_args(sys.argv[1:] if argv is None else argv)
    if ns.version:
        from fleetlens import __version__

        print(f"fleetlens {__version__}")
        return 0
    if ns.command is None:
        parser.print_help()
        return 2
    module_name, _ = SUBCOMMANDS[ns.command]
    try:  # commands import some dependencies only once they run
        return int(importlib.import_module(module_name).main(ns.args) or 0)
    except ModuleNotFoundError as e:
        if e.name == module_name:
            print(f"fleetlens {ns.command}: not part of this build yet", file=sys.stderr)
            return 2
        missing = (e.name or "fleetlens").split(".")[0]
        if missing == "fleetlens":
            raise
        # A third-party dependency: each command's are the extra of its name (pyproject.toml).
        print(f"fleetlens {ns.command}: needs {missing}, which this install lacks: "
              f"pip install 'fleetlens[{ns.command}]'", file=sys.stderr)  # fmt: skip
        return 2


if __name__ == "__main__":
    sys.exit(main())
