"""Tuning of the triangulation engine, in one frozen dataclass (times in ns)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class TriangulateConfig:
    """Thresholds of every stage; the defaults are what the tests and bench/ assert against."""

    # loss tomography
    # per-link loss the fits treat as normal (null hypothesis) until the long horizon's counts
    # bound the background lower (evidence.learned_floor), and never below the second
    background_loss: float = 1e-6
    background_loss_min: float = 1e-6
    # a lossy link must also be significant against the background its flows show (learned
    # per fit, floored at background_loss) at this false-alarm rate per link and hour of
    # windows, for each of the three fits (see evidence.py)
    false_alarms_per_link_hour: float = 1e-3
    loss_llr: float = 12.0  # log-likelihood ratio a link needs to be called lossy
    min_lost: float = 2.0  # lost packets a link must explain before it is reported
    loss_decay_s: float = 30.0  # time constant of the long-horizon loss evidence
    loss_onset_windows: int = 3  # windows summed by the onset horizon (horizon.py)
    max_links_per_fit: int = 64  # greedy stops after this many links per fit
    # lost acks (records' ``acks_lost``) as loss evidence on each ack's reverse path, in a
    # one-window fit beside the probes' in every window that lost an ack, against the acks'
    # own background, no link's evidence resting on one agent's rows (evidence.py: agents
    # count late acks lost, by turns); its fit reads the rows of the links it picks as
    # per-link sums (loss.fit_incidence), so it costs about what the probes' fit does
    ack_evidence: bool = True
    # delay tomography
    delay_min_ns: float = 1_000.0  # smallest excess delay reported on a link
    delay_quantile: float = 0.25  # a link's statistic: this quantile of its flows' excess
    delay_z: float = 6.0  # excess must also be this many healthy std devs above normal
    delay_min_flows: int = 4  # flows a link needs in a window for a delay statistic
    delay_ewma: float = 0.1  # weight of a clean window in a link's healthy delay level
    # bigger windows: delay runs on a fixed 1/2^k hash-sample of at most this many rows (the
    # reference fabric: a half of its 0.93 M path rows, ~57 rows of ~12 probes per access-
    # link direction; an eighth of 6 M port rows when paths are never known, as before)
    delay_sample_rows: int = 800_000
    baseline_slack_ns_per_s: float = 2.0  # trailing-min baseline creeps up this fast
    clock_step_min_ns: float = 5_000.0  # a NIC's in/out delay shift this big = clock event
    # attribution
    device_fraction: float = 0.75  # share of a switch's fabric links implicated -> switch
    silent_fraction: float = 0.2  # a NIC sending under this share of its usual rows = silent
    # a NIC whose first window had under this share of its second's probes started during it
    # (its losses there are left off the horizons: engine._forget_partial_start)
    start_fraction: float = 0.8
    # verdicts
    fault_windows: int = 2  # consecutive bad windows before 'faulty' (unless strong)
    strong_llr: float = 40.0  # evidence this strong makes a subject faulty at once
    clear_ns: int = 5_000_000_000  # clean time before a faulty subject is healthy again
    flap_transitions: int = 4  # bad<->clean flips within the horizon -> flapping
    flap_horizon_ns: int = 30_000_000_000
    emit_healthy_links: bool = False  # also return a verdict for every observed healthy link
    evidence_flows: int = 16  # flow ids listed in a verdict's evidence
