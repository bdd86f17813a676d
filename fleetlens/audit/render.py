"""The audit's report: ``report.json`` (machine readable) and a self-contained ``report.html``.

The HTML carries its plots as inline SVG drawn with matplotlib (Agg backend, no display, no
JavaScript, nothing fetched from the network): a host × host one-way delay heatmap, the
per-link loss estimates against the threshold, and clock quality per host.
"""

from __future__ import annotations

import html
import io
import json
from pathlib import Path

import matplotlib

matplotlib.use("Agg")  # before pyplot: no display on a server
import matplotlib.pyplot as plt
import numpy as np

_COLORS = {"validated": "#2e7d32", "failed": "#c62828", "unobserved": "#9e9e9e"}
_MAX_BARS = 80  # loss chart: the worst links only on a big fleet


def write_json(report: dict, out: Path) -> Path:
    path = out / "report.json"
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(report, indent=1, sort_keys=False, default=_jsonable))
    tmp.replace(path)
    return path


def _jsonable(x: object) -> object:
    if isinstance(x, np.generic):
        return x.item()
    raise TypeError(f"not JSON serializable: {type(x).__name__}")


def _svg(fig: plt.Figure) -> str:
    buf = io.StringIO()
    fig.savefig(buf, format="svg", bbox_inches="tight")
    plt.close(fig)
    text = buf.getvalue()
    return text[text.index("<svg") :]  # drop the XML prolog: the SVG goes inline


def delay_heatmap(report: dict) -> str | None:
    hosts = [h["host_id"] for h in report["hosts"]]
    rows = report.get("host_pairs") or []
    if not hosts or not rows:
        return None
    idx = {h: i for i, h in enumerate(hosts)}
    grids = {k: np.full((len(hosts), len(hosts)), np.nan) for k in ("owd", "excess")}
    for r in rows:
        i, j = idx.get(r["src_host"]), idx.get(r["dst_host"])
        if i is None or j is None:
            continue
        if r.get("owd_median_ns") is not None:
            grids["owd"][i, j] = r["owd_median_ns"] / 1e3
        if r.get("max_path_excess_ns") is not None:
            grids["excess"][i, j] = r["max_path_excess_ns"] / 1e3
    panels = [(k, g) for k, g in grids.items() if np.isfinite(g).any()]
    size = max(3.5, 0.35 * len(hosts))
    fig, axes = plt.subplots(1, len(panels), figsize=(size * len(panels) + 1, size), squeeze=False)
    titles = {
        "owd": "median one-way delay (µs)",
        "excess": "slowest path vs fastest path of the pair (µs)",
    }
    for ax, (k, g) in zip(axes[0], panels, strict=True):
        im = ax.imshow(g, cmap="viridis" if k == "owd" else "magma", interpolation="nearest")
        ax.set_title(titles[k], fontsize=9)
        ticks = range(len(hosts))
        ax.set_xticks(ticks, hosts, rotation=90, fontsize=7)
        ax.set_yticks(ticks, hosts, fontsize=7)
        ax.set_xlabel("destination host")
        ax.set_ylabel("source host")
        fig.colorbar(im, ax=ax, shrink=0.8)
    return _svg(fig)


def loss_chart(report: dict) -> str | None:
    links = [lk for lk in report["links"] if lk["probes"] > 0]
    if not links:
        return None
    links.sort(key=lambda lk: (lk["status"] != "failed", -lk["loss_rate"], -lk["loss_upper"]))
    links = links[:_MAX_BARS]
    threshold = report["thresholds"]["max_loss"]
    fig, ax = plt.subplots(figsize=(max(6, 0.18 * len(links) + 2), 4))
    x = np.arange(len(links))
    raw = [100 * lk["lost"] / lk["probes"] for lk in links]
    fitted = [100 * lk["loss_rate"] for lk in links]
    colors = [_COLORS[lk["status"]] for lk in links]
    ax.bar(x, fitted, color=colors, label="fitted loss of the link")
    ax.plot(x, raw, "k.", markersize=4, label="loss of the flows crossing it")
    ax.axhline(100 * threshold, color="#c62828", ls="--", lw=1, label="threshold")
    ax.set_xticks(x, [lk["link_id"] for lk in links], rotation=90, fontsize=6)
    ax.set_ylabel("loss (%)")
    ax.set_title("per-link loss over the audit", fontsize=9)
    ax.legend(fontsize=7)
    return _svg(fig)


def clock_chart(report: dict) -> str | None:
    hosts = report["hosts"]
    if not hosts:
        return None
    fig, ax = plt.subplots(figsize=(max(5, 0.35 * len(hosts) + 2), 3.5))
    x = np.arange(len(hosts))
    bound = [h["clock"].get("error_bound_ns") or np.nan for h in hosts]
    colors = [_COLORS["validated" if h["clock"].get("synced") else "failed"] for h in hosts]
    ax.bar(x - 0.2, bound, 0.4, color=colors, label="served error bound")
    truth = [h.get("clock_error_vs_truth_ns") for h in hosts]
    if any(t is not None for t in truth):
        ax.bar(x + 0.2, [abs(t) if t is not None else np.nan for t in truth], 0.4,
               color="#1565c0", label="|error| vs injected truth (lab)")  # fmt: skip
    ax.set_xticks(x, [h["host_id"] for h in hosts], rotation=90, fontsize=7)
    ax.set_ylabel("ns")
    ax.set_yscale("symlog", linthresh=10)
    ax.set_title("clock quality per host (red: not synced)", fontsize=9)
    ax.legend(fontsize=7)
    return _svg(fig)


def _table(rows: list[dict], cols: list[tuple[str, str]]) -> str:
    head = "".join(f"<th>{html.escape(t)}</th>" for _, t in cols)
    body = []
    for r in rows:
        cls = html.escape(str(r.get("status", "")))
        cells = "".join(f"<td>{html.escape(_fmt(r.get(k)))}</td>" for k, _ in cols)
        body.append(f'<tr class="{cls}">{cells}</tr>')
    return f"<table><tr>{head}</tr>{''.join(body)}</table>"


def _fmt(v: object) -> str:
    if v is None:
        return "—"
    if isinstance(v, float):
        return f"{v:.4g}"
    if isinstance(v, list):
        return "; ".join(map(str, v))
    return str(v)


_CSS = """
body{font-family:sans-serif;margin:1.5em;max-width:1400px}
table{border-collapse:collapse;font-size:12px;margin:0.5em 0 1.5em}
td,th{border:1px solid #ccc;padding:2px 6px;text-align:left}
tr.failed td{background:#ffebee} tr.unobserved td{background:#f5f5f5}
.pass{color:#2e7d32} .fail{color:#c62828} figure{margin:0 0 1.5em}
"""


def write_html(report: dict, out: Path) -> Path:
    ok = report["result"] == "pass"
    figs = [
        ("Delay heatmap (host × host)", delay_heatmap(report)),
        ("Per-link loss", loss_chart(report)),
        ("Clock quality per host", clock_chart(report)),
    ]
    parts = [
        "<!DOCTYPE html><html><head><meta charset='utf-8'><title>FleetLens audit</title>",
        f"<style>{_CSS}</style></head><body>",
        f"<h1>FleetLens audit: <span class='{'pass' if ok else 'fail'}'>"
        f"{'PASS' if ok else 'FAIL'}</span></h1>",
        f"<p>{html.escape(report['summary'])}</p>",
        f"<p>period {report['period']['start_iso']} → {report['period']['end_iso']} "
        f"({report['period']['seconds']:.0f} s); source {html.escape(report['source'])}; "
        f"method {html.escape(report['method'])}</p>",
    ]
    for title, svg in figs:
        parts.append(f"<h2>{html.escape(title)}</h2>")
        parts.append(f"<figure>{svg}</figure>" if svg else "<p>no data</p>")
    failed = [lk for lk in report["links"] if lk["status"] != "validated"]
    parts.append(f"<h2>Links ({len(report['links'])}; not validated: {len(failed)})</h2>")
    parts.append(_table(sorted(report["links"], key=_order), _LINK_COLS))
    groups = report.get("ambiguity_groups") or []
    if groups:
        parts.append(f"<h2>Ambiguity groups ({len(groups)}): links the probes cannot tell "
                     "apart, reported together</h2>")  # fmt: skip
        rows = [{**g, "states": [f"{k}: {v}" for k, v in g["states"].items()]} for g in groups]
        parts.append(_table(rows, _GROUP_COLS))
    parts.append(f"<h2>NICs ({len(report['nics'])})</h2>")
    parts.append(_table(sorted(report["nics"], key=_order), _NIC_COLS))
    parts.append("<h2>Hosts and clocks</h2>")
    parts.append(_table([_host_row(h) for h in report["hosts"]], _HOST_COLS))
    parts.append("</body></html>")
    path = out / "report.html"
    path.write_text("\n".join(parts))
    return path


def _order(r: dict) -> tuple:
    return ({"failed": 0, "unobserved": 1}.get(r["status"], 2), r.get("link_id") or r["nic_id"])


def _host_row(h: dict) -> dict:
    c = h["clock"]
    return {
        **h, "synced": c.get("synced"), "error_bound_ns": c.get("error_bound_ns"),
        "offset_ns": c.get("offset_ns"), "drift_ppb": c.get("drift_ppb"),
    }  # fmt: skip


_LINK_COLS = [
    ("link_id", "link"), ("tier", "tier"), ("status", "status"), ("flows", "flows"),
    ("probes", "probes"), ("lost", "lost"), ("loss_rate", "loss (fit)"),
    ("loss_upper", "loss 95% upper"), ("excess_delay_ns", "excess delay ns"),
    ("live_faulty_rounds", "collector faulty rounds"), ("live_group_id", "group"),
    ("reasons", "reasons"),
]  # fmt: skip
_GROUP_COLS = [("group_id", "group"), ("size", "links"), ("links", "members"), ("states", "states")]
_NIC_COLS = [
    ("nic_id", "NIC"), ("status", "status"), ("flows_out", "flows out"),
    ("sent_out", "probes sent"), ("lost_out", "lost"), ("flows_in", "flows in"),
    ("sent_in", "probes to it"), ("lost_in", "lost"), ("live_state", "collector state"),
    ("reasons", "reasons"),
]  # fmt: skip
_HOST_COLS = [
    ("host_id", "host"), ("status", "status"), ("synced", "synced"),
    ("error_bound_ns", "error bound ns"), ("clock_error_vs_truth_ns", "error vs truth ns"),
    ("offset_ns", "offset ns"), ("drift_ppb", "drift ppb"), ("reasons", "reasons"),
    ("warnings", "warnings"),
]  # fmt: skip
