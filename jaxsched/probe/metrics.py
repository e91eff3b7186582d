"""What the validation compares between a measured and a simulated launch.

- makespan: first CTA start to last CTA end;
- per-SM CTA counts: how the dispatcher spread the grid;
- completion stagger of co-resident CTAs: for the CTAs an SM started together at the launch's
  beginning (its first wave), how far apart they finish. Under fair round-robin warp scheduling
  (LRR) equal CTAs finish together; under greedy-then-oldest (GTO) the oldest CTA's warps are
  favoured and the CTAs finish one after another.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Float, Int


def sm_counts(cta_sm: Int[np.ndarray, " cta"], n_sm: int) -> Int[np.ndarray, " sm"]:
    """CTAs run per SM slot."""
    sm = np.asarray(cta_sm, dtype=np.int64)
    return np.bincount(sm[(sm >= 0) & (sm < n_sm)], minlength=n_sm).astype(np.int64)


@dataclasses.dataclass(frozen=True)
class Stagger:
    """Completion stagger of each SM's first-wave CTAs (medians over SMs with >= 2 of them)."""

    spread: float  # (last end - first end) / (last end - start): 0 = all together
    first_over_last: float  # (first end - start) / (last end - start): 1 = all together
    sms: int  # SMs that contributed


def first_wave_stagger(
    cta_sm: Int[np.ndarray, " cta"],
    start_ns: Float[np.ndarray, " cta"],
    end_ns: Float[np.ndarray, " cta"],
    together_ns: float,
) -> Stagger:
    """Stagger of the CTAs each SM started within `together_ns` of its first CTA start."""
    sm = np.asarray(cta_sm, dtype=np.int64)
    start = np.asarray(start_ns, dtype=np.float64)
    end = np.asarray(end_ns, dtype=np.float64)
    spreads, ratios = [], []
    for s in np.unique(sm):
        on = sm == s
        t0 = start[on].min()
        wave = on & (start <= t0 + together_ns)
        if wave.sum() < 2:
            continue
        first, last = end[wave].min(), end[wave].max()
        if last <= t0:
            continue
        spreads.append((last - first) / (last - t0))
        ratios.append((first - t0) / (last - t0))
    if not spreads:
        return Stagger(spread=float("nan"), first_over_last=float("nan"), sms=0)
    return Stagger(spread=float(np.median(spreads)), first_over_last=float(np.median(ratios)),
                   sms=len(spreads))


def dispatch_start(first_sms: Int[np.ndarray, " k"], dispatch_order: Int[np.ndarray, " sm"], n_enabled: int) -> int:
    """The simulator's `dispatch_start` (docs/model.md section 3) whose rotated order agrees best
    with the SMs a launch gave its first CTAs, `first_sms` (grid order, one per SM at most).

    The H200 always hands its first CTAs to the same 8 SMs and rotates only what follows, which
    no rotation of one order reproduces exactly; the best rotation matches all but a few."""
    order = np.asarray(dispatch_order)[:n_enabled]
    seq = np.asarray(first_sms)[:n_enabled]
    idx = (np.arange(n_enabled)[:, None] + np.arange(seq.size)[None, :]) % n_enabled
    agree = np.sum(order[idx] == seq[None, :], axis=1)
    return int(np.argmax(agree))
