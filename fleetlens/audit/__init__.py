"""``fleetlens audit``: pre-handover validation of every fabric link and NIC, with a report.

    fleetlens audit --minutes N --report DIR --collector URL [--token-file F]
                    [--inventory FILE] [--db FILE]
    fleetlens audit --minutes N --report DIR --lab [--inject loss:0.5%|delay:50us] [--seed S]

For N minutes the agents probe every planned NIC pair over every ECMP path (the planner gives
each pair enough source ports to cover its paths); then the audit judges every link and NIC
as validated or failed and writes DIR/report.json and DIR/report.html.

Judgement (see ``audit.judge``): loss and delay tomography over per-flow totals for the whole
period — far more sensitive than the collector's per-window verdicts, which are kept in the
report as evidence. Per-flow totals come from the collector's ``GET /v1/flows`` (from any
machine; the topology from ``--inventory`` or, without it, the inventory the collector
serves). ``--lab`` reads its collector's database after stopping it; on the collector's own
machine ``--db FILE`` reads a copy of its live DuckDB file instead of the REST API, which
also leaves out host stalls (seconds an agent lost probes to or from nearly every peer at
once; the REST totals cannot tell them). Only when the collector has no inventory (and none
is given) or predates /v1/flows does the judgement fall back to its verdict history.

Exit code: 0 pass, 1 fail, 2 usage or infrastructure error (collector unreachable, lab not
buildable, interrupted).
"""
