"""From raw per-CTA stamps to one time base: `%globaltimer` quantum, clocks, aligned CTA times.

Every CTA stamps `%globaltimer` (chip-wide, in ns, but updated in coarse steps) and `clock64`
(its SM's cycle counter: fine, but with a different origin on every SM) at its start and end.
Within one launch each SM's stamps obey `t = a_sm + c / f_sm` with a per-SM offset and clock.
(On the H200 the clocks of a short, heavy launch differ between SMs by a few percent, while a long
run shows one clock: docs/calibration.md.) `align` fits each SM's `f_sm` (least squares, or for a
coarse timer the middle of the range that every pair of its stamps allows), then narrows each
offset to the interval that every stamp's quantisation allows. CTA times then have the
resolution of `clock64`, and each SM's clock is measured along the way.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from jaxtyping import Float, Int

from ..errors import check


@dataclasses.dataclass(frozen=True)
class TimerQuantum:
    """How `%globaltimer` advances, from a tight loop of reads on one thread."""

    step_ns: float  # most common positive increment between distinct readings
    min_step_ns: float  # smallest positive increment seen
    read_period_ns: float  # mean time between two reads of the loop
    read_period_cycles: float  # the same in clock64 cycles
    samples: int


def timer_quantum(t_ns: Int[np.ndarray, " n"], c_cycles: Int[np.ndarray, " n"]) -> TimerQuantum:
    """The update step of `%globaltimer` from consecutive reads `t_ns` with their `clock64`."""
    t = np.asarray(t_ns, dtype=np.int64)
    check(t.size >= 3, "timer samples", t.size, ">= 3 readings")
    steps = np.diff(t)
    positive = steps[steps > 0]
    check(positive.size > 0, "timer samples", "constant", "the timer never advanced")
    values, counts = np.unique(positive, return_counts=True)
    c = np.asarray(c_cycles, dtype=np.int64)
    return TimerQuantum(step_ns=float(values[np.argmax(counts)]), min_step_ns=float(values[0]),
                        read_period_ns=float(t[-1] - t[0]) / (t.size - 1),
                        read_period_cycles=float(c[-1] - c[0]) / (c.size - 1), samples=int(t.size))


@dataclasses.dataclass(frozen=True)
class Aligned:
    """One launch's CTA times on a common time base, and the clocks they imply."""

    start_ns: Float[np.ndarray, " cta"]  # relative to the earliest CTA start of the launch
    end_ns: Float[np.ndarray, " cta"]
    sm_ids: Int[np.ndarray, " s"]  # the SMs that ran CTAs
    sm_clock_mhz: Float[np.ndarray, " s"]  # each one's clock during the launch (clock64 / ns)
    offset_width_ns: float  # median width of the feasible offset interval (NaN: none feasible)

    @property
    def clock_mhz(self) -> float:
        """The launch's typical SM clock (median over SMs)."""
        return float(np.median(self.sm_clock_mhz))

    @property
    def makespan_ns(self) -> float:
        return float(np.max(self.end_ns))


def align(
    cta_sm: Int[np.ndarray, " cta"],
    start_ns: Int[np.ndarray, " cta"],
    end_ns: Int[np.ndarray, " cta"],
    start_cycles: Int[np.ndarray, " cta"],
    end_cycles: Int[np.ndarray, " cta"],
    quantum_ns: float,
    min_span_quanta: float = 100.0,
) -> Aligned:
    """Fit each SM's clock and offset to a launch's stamps; return CTA times in ns.

    `start_ns`/`end_ns` are raw `%globaltimer` readings (a reading `t` means the true time lies
    in `[t, t + quantum_ns)`), `start_cycles`/`end_cycles` raw `clock64` of the CTA's SM. An SM
    whose stamps span fewer than `min_span_quanta` timer steps gets the median clock of the
    others (its own slope would be mostly quantisation).
    """
    sm = np.asarray(cta_sm, dtype=np.int64)
    check(sm.ndim == 1 and sm.size >= 1, "cta_sm", sm.shape, "one SM id per CTA")
    check(quantum_ns >= 0, "quantum_ns", quantum_ns, ">= 0")
    t0 = int(np.min(start_ns))
    c_all = np.concatenate([np.asarray(start_cycles, np.int64), np.asarray(end_cycles, np.int64)])
    s_all = np.concatenate([sm, sm])
    ids, inv = np.unique(s_all, return_inverse=True)
    c_origin = np.full(ids.size, np.iinfo(np.int64).max)
    np.minimum.at(c_origin, inv, c_all)
    c = (c_all - c_origin[inv]).astype(np.float64)  # per-SM origin keeps float64 exact
    t = (np.concatenate([np.asarray(start_ns, np.int64), np.asarray(end_ns, np.int64)]) - t0).astype(np.float64)
    check(bool(np.any(c > 0)), "clock64", "no span", "CTAs must run for some cycles")

    k = np.full(ids.size, np.nan)  # ns per cycle, per SM
    for g in range(ids.size):
        on = inv == g
        if np.ptp(t[on]) >= min_span_quanta * max(quantum_ns, 1.0) and np.ptp(c[on]) > 0:
            k[g] = _slope(c[on], t[on], quantum_ns)
    if not np.any(np.isfinite(k)):  # a short launch: one slope from every SM's stamps together
        k[:] = _pooled_slope(inv, c, t + 0.5 * quantum_ns)
    k = np.where(np.isfinite(k), k, np.nanmedian(k))
    check(bool(np.all(k > 0)), "clock fit", float(np.min(k)), "clock64 must advance with %globaltimer")

    # each reading bounds the SM's offset: t <= a + k c < t + q; else the least-squares offset
    lo = np.full(ids.size, -np.inf)
    hi = np.full(ids.size, np.inf)
    np.maximum.at(lo, inv, t - k[inv] * c)
    np.minimum.at(hi, inv, t + quantum_ns - k[inv] * c)
    feasible = lo <= hi
    mean_offset = np.bincount(inv, weights=t + 0.5 * quantum_ns - k[inv] * c) / np.bincount(inv)
    offset = np.where(feasible, 0.5 * (lo + hi), mean_offset)
    width = float(np.median((hi - lo)[feasible])) if np.any(feasible) else float("nan")

    n = sm.size
    times = offset[inv] + k[inv] * c
    start, end = times[:n], times[n:]
    first = float(np.min(start))
    return Aligned(start_ns=start - first, end_ns=end - first, sm_ids=ids, sm_clock_mhz=1000.0 / k,
                   offset_width_ns=width)


def _pooled_slope(group: np.ndarray, c: np.ndarray, t: np.ndarray) -> float:
    """Least-squares ns per cycle with a free offset per group."""
    count = np.bincount(group)
    cd = c - (np.bincount(group, weights=c) / count)[group]
    td = t - (np.bincount(group, weights=t) / count)[group]
    return float(np.sum(cd * td) / max(float(np.sum(cd * cd)), 1e-300))


def _slope(c: np.ndarray, t: np.ndarray, quantum_ns: float) -> float:
    """One SM's ns per cycle: least squares, or for a coarse timer the middle of the range that
    every pair of readings allows (`t_i <= a + k c_i < t_i + q` bounds `k` by
    `(t_j - t_i +- q) / (c_j - c_i)`), when that range is not empty."""
    ls = _pooled_slope(np.zeros(c.size, dtype=np.int64), c, t)
    if quantum_ns <= 1:
        return ls
    dc = c[None, :] - c[:, None]
    dt = t[None, :] - t[:, None]
    pos = dc > 0
    lo = float(np.max((dt[pos] - quantum_ns) / dc[pos]))
    hi = float(np.min((dt[pos] + quantum_ns) / dc[pos]))
    return 0.5 * (lo + hi) if 0 < lo <= hi else ls


def sm_clock_mhz(
    cta_sm: Int[np.ndarray, " cta"],
    start_ns: Int[np.ndarray, " cta"],
    end_ns: Int[np.ndarray, " cta"],
    start_cycles: Int[np.ndarray, " cta"],
    end_cycles: Int[np.ndarray, " cta"],
    n_sm: int,
) -> Float[np.ndarray, " sm"]:
    """Each SM's clock over its busy span (first CTA start to last CTA end): cycles / ns.

    Accurate when the span is long against the timer quantum (a long kernel); NaN for SMs that
    ran no CTA.
    """
    sm = np.asarray(cta_sm, dtype=np.int64)
    t0, t1 = np.asarray(start_ns, np.int64), np.asarray(end_ns, np.int64)
    c0, c1 = np.asarray(start_cycles, np.int64), np.asarray(end_cycles, np.int64)
    out = np.full(n_sm, np.nan)
    for s in np.unique(sm[(sm >= 0) & (sm < n_sm)]):
        on = np.flatnonzero(sm == s)
        first, last = on[np.argmin(t0[on])], on[np.argmax(t1[on])]
        dt, dc = float(t1[last] - t0[first]), float(c1[last] - c0[first])
        if dt > 0:
            out[s] = dc / dt * 1000.0
    return out
