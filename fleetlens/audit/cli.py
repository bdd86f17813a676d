"""``fleetlens audit``: parse, run the mode asked for, write the report; the exit code says
pass (0), fail (1) or could not audit (2). See :mod:`fleetlens.audit` for the model."""

from __future__ import annotations

import os
import signal
import sys
import traceback

from fleetlens.audit.data import AuditInputError
from fleetlens.audit.options import UsageError, parser, read_token, validate
from fleetlens.audit.run import run_collector, run_lab

_MAIN_PID = os.getpid()


def _sigterm(signum: int, frame: object) -> None:
    if os.getpid() != _MAIN_PID:  # a forked helper (pyroute2's netns workers): just die
        os._exit(128 + signum)
    raise KeyboardInterrupt  # same clean-up path as Ctrl-C


def main(argv: list[str]) -> int:
    a = parser().parse_args(argv)
    try:
        validate(a)
        if a.collector:
            read_token(a)  # a bad token file is a usage error before any waiting
    except UsageError as e:
        print(f"fleetlens audit: {e}", file=sys.stderr)
        return 2
    old = signal.signal(signal.SIGTERM, _sigterm)
    try:
        report = run_lab(a) if a.lab else run_collector(a)
    except AuditInputError as e:
        print(f"fleetlens audit: {e}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        print("fleetlens audit: interrupted; everything it started was stopped", file=sys.stderr)
        return 2
    except Exception as e:  # lab build/stack failures: a sentence, not a traceback
        log = a.report / "audit-error.log"
        log.write_text(traceback.format_exc())
        print(f"fleetlens audit: {type(e).__name__}: {e} (details: {log})", file=sys.stderr)
        return 2
    finally:
        signal.signal(signal.SIGTERM, old)
    from fleetlens.audit.render import write_html, write_json

    write_json(report, a.report)
    write_html(report, a.report)
    print(("PASS: " if report["result"] == "pass" else "FAIL: ") + report["summary"])
    print(f"report: {a.report / 'report.html'}, {a.report / 'report.json'}")
    return 0 if report["result"] == "pass" else 1
