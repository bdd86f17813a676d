"""Tuning of the clock sync, in one frozen dataclass (times in ns, drifts in ppb).

Each field says why it has its value; the history of how the values were found is in
``docs/notes/sync.md``. ``HuygensSync(config)`` hands the config (or its fields) down to every
stage.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from fleetlens.records import TS_HARDWARE


@dataclass(frozen=True)
class SyncConfig:
    """Thresholds of every stage; the defaults are what the tests and bench/ assert against."""

    # ---- the solve (solver.py) --------------------------------------------------------------
    # hosts need this many agreeing edges to be solved (1: pairwise-only, e.g. a two-host lab);
    # with two a conflict cannot be told from a wrong edge, with three the majority wins
    min_edges: int = 3
    # windows pooled per candidate span (pooling.py); (1,): single-window fits only. Memory is
    # the last max-1 windows' hulls per directed NIC pair and their blocks' hulls
    pool_sizes: tuple[int, ...] = (1, 8, 32)
    # first window: re-map times until the offsets used agree with the solution this closely
    # (≤ 200 ppm drift difference x 5 µs = 1 ns residual)
    remap_ns: float = 5_000.0
    max_passes: int = 5  # ... and at most this many passes (two or three suffice)
    max_backlog: int = 3  # window generations folded in per call when the caller fell behind
    stale_calls: int = 5  # calls in a row without a new window: models no longer count as synced
    soft_weight: float = 0.1  # network weight of a soft-margin (overlapping) edge
    unstable_fraction: float = 0.5  # a host with more soft edges than this is left out
    # pooled fits: slope within this many tracked drift σ of the tracker's (at least
    # pool_bracket_ppb): over 32 windows a free slope tilts on its few extreme points
    pool_bracket_k: float = 3.0
    pool_bracket_ppb: float = 2.0  # ... but never narrower than this
    # a window's slope rests on points about half its span apart, at least this far (s)
    slope_base_s: float = 0.5
    short_span_s: float = 0.6  # a host whose points span less than this is in a partial window
    short_window_k: float = 3.0  # ... whose offset σ is widened this much (few points, high)
    # a window's extra offset σ per ns of margin excess: with both directions' excesses
    # alike-distributed the error's σ is ~0.7x their mean
    evidence_k: float = 0.7
    # residual-scale floors of the network solve: below these, edges are never outliers
    floor_software_ns: float = 20.0  # software stamps scatter by tens of ns
    floor_hardware_ns: float = 5.0  # PHC stamps by a few ns
    # drift floors: within-window wander (≈ 20 ppb/√s) dominates stamp noise in both modes
    drift_floor_software_ppb: float = 20.0
    drift_floor_hardware_ppb: float = 20.0  # the same wander: stamps do not matter here
    # ---- purity (purity.py; the simulator's defaults too) ---------------------------------
    purity_software_ns: int = 800  # idle software gap errors p99 ≈ 500 ns; queues add µs
    purity_hardware_ns: int = 40  # PHC stamps jitter by a few ns
    # ---- per-edge fit (edgefit.py) ---------------------------------------------------------
    slope_bracket: float = 1e-3  # ±1000 ppm around the prior: drift differences are ≤ 200 ppm
    min_span_ns: float = 2e8  # points spanning less: slope too uncertain (100 ns / 0.2 s)
    soft_nu: float = 0.2  # ν-SVM: at most this fraction of an overlapping edge's points violate
    max_soft_edges: int = 256  # past this many overlapping edges per window the data is garbage
    # ---- network solve (network.py) --------------------------------------------------------
    huber_k: float = 2.5  # residuals beyond this many robust σ get Huber weights
    outlier_k: float = 6.0  # ... beyond this many (and the floor) the edge is removed
    irls_rounds: int = 6  # reweighting rounds (they converge in a few)
    cg_rtol: float = 1e-10  # conjugate-gradient tolerance: sub-ns on ±50 ms first offsets
    # ... and its absolute floor: a solve stops once every host's weighted residual sum is
    # below this (ns or ppb x weight), an error of about this over the Laplacian's smallest
    # nonzero eigenvalue (0.2 for two hosts joined by one soft edge: 0.005 ns), where the
    # relative tolerance alone chased the rounding of ±50 ms offsets (1e-8 ns) through every
    # refinement
    cg_atol: float = 1e-3
    refine: int = 3  # iterative-refinement rounds around conjugate gradients
    trim: float = 0.2  # trimmed-mean anchor: one stepping host does not drag the fleet
    # ---- span choice (pooling.py) ----------------------------------------------------------
    score_weight: float = 0.2  # EWMA weight of a window in a span's prediction/bend scores
    score_cap_ns: float = 1_000.0  # one window's prediction error counts at most this much
    min_scored: int = 3  # predictions a span needs before it may be chosen over one window
    pool_stale_ns: int = 5_000_000_000  # an edge unseen this long starts its spans' scores over
    surprise_k: float = 4.0  # a prediction error beyond this many of the span's rms surprises
    surprise_run: int = 3  # surprises in a row that restart a span's score
    bend_z: float = 1.0  # standard errors within which two spans' bend scores count as equal
    # a tied pooled span yields to a shorter one predicting this much better (rms)
    score_veto: float = 1.5
    # ---- drift tracking (tracking.py) ------------------------------------------------------
    # drift random walk (ppb²/s) to start from: ageing ~20 ppb/√s plus temperature steps
    q_drift: float = 50.0**2
    q_min: float = 1.0  # bounds of the per-host adapted process noise: 1 ppb/√s ...
    q_max: float = 4 * 50.0**2  # ... to 100 ppb/√s
    q_gain: float = 0.5  # process noise scales by exp(q_gain·ρ) per window (ρ: lag-1 corr.)
    gate_k: float = 5.0  # innovations beyond this many σ are not folded in unconfirmed
    adapt: float = 0.1  # weight of a new window in the running noise estimates (~10 windows)
    step_k: float = 8.0  # an offset innovation beyond this many σ (+ floor) is a clock step
    step_floor_ns: float = 500.0  # ... and beyond this: smaller jumps are followed, not restarted
    change_k: float = 3.0  # beyond this many σ the clock changed (not noise)
    confirm_rel: float = 0.5  # a confirming window agrees with the last surprise this closely
    change_s: float = 1.0  # s: a drift change seen only in the offset is taken to be this old
    # a window without a slope says nothing about drift: its prior must cover real drifts
    # (±100 ppm), or the next window's true drift is gated out as a 5σ outlier
    drift_unknown_ppb: float = 1e5
    drift_restart_ppb: float = 100.0  # drift kept across a restart without a drift measurement
    max_p_theta_ns2: float = 1e14  # unknown offset (10 ms): state from an unsynced model
    # not measured this long (agents restarted, a collector catching up): start over
    track_stale_ns: int = 10_000_000_000
    restart_inflate: float = 9.0  # variance factor of a restarted state over its one window

    def __post_init__(self) -> None:
        sizes = self.pool_sizes
        if not sizes or sizes[0] != 1 or list(sizes) != sorted(set(sizes)):
            raise ValueError(f"pool sizes must start at 1 and increase, not {sizes!r}")

    def floor_ns(self, ts_kind: str) -> float:
        return self.floor_hardware_ns if ts_kind == TS_HARDWARE else self.floor_software_ns

    def drift_floor_ppb(self, ts_kind: str) -> float:
        hw = ts_kind == TS_HARDWARE
        return self.drift_floor_hardware_ppb if hw else self.drift_floor_software_ppb

    def purity_ns(self, ts_source: str) -> int:
        hw = ts_source == TS_HARDWARE
        return self.purity_hardware_ns if hw else self.purity_software_ns

    @property
    def bend_scatter(self) -> float:
        """Relative standard error of one edge's bend score (a median's over n edges is this
        over √n): an EWMA (weight w) of squared near-normal intrusions has a coefficient of
        variation √2·√(w/(2−w)), and a median of n draws ~1.25 σ/√n."""
        w = self.score_weight
        return 1.2533 * math.sqrt(2 * w / (2 - w))


DEFAULT = SyncConfig()
