"""Clock-regression dispatch (docs/model.md section 9): the closed loop's key and tail hold (no
deviation term), with each SM's CTA duration predicted from every SM's completions and the
clocks now. Per launch, `est_{l,s}` is the sum of the durations of its CTAs completed on `s`
and `sq_{l,s}` their count (`observe`); at a dispatch (`estimates`) the per-SM mean durations
`m_s = est // sq` of the `K` SMs with a completion are fitted against their clock periods
`u_s = 2^20 // max(f_s, 64)` by least squares: with `d_s = K u_s - sum u`, the slope
`min(max(sum m d / sum u d, 0), sum m / sum u)` (0 where `sum u d = 0`), one float64 division;
every SM's estimate is `max((sum m + floor(slope * (K u_s - sum u))) // K, 0)` at its clock
(0 before the launch's first completion), not censored."""

import math

from . import closed_loop

NUMBER = 6
READS_ESTIMATES = True  # it learns from completions (`observe`) and reads them (`estimates`); so does its twin
PERIOD_SCALE = 2**20
MIN_FIT_MHZ = 64
key = closed_loop.key


def init(launch, n_sm: int) -> list[int]:
    """No completions yet: every SM's duration sum 0 (the counts `sq` start at 0)."""
    return [0] * n_sm


def observe(sim, sm, kernel, g: int, t0: int, k: int) -> None:
    """CTA `g` of `kernel`, started at tick `t0`, completed on `sm` at tick `k`: its duration
    added to the launch's sum on `sm`, 1 to the count."""
    s, d = sm.index, k - t0
    kernel.est[s] += d
    kernel.sq[s] += 1
    sim.chip.est_log.append((k, s, g, d, kernel.est[s]))


def fit(est: list[int], count: list[int], freq_mhz: list[int]) -> list[int]:
    """Every SM's predicted CTA duration (ticks) from the sums, counts and clocks (module doc)."""
    seen = [s for s, n in enumerate(count) if n > 0]
    if not seen:
        return [0] * len(est)
    period = [PERIOD_SCALE // max(f, MIN_FIT_MHZ) for f in freq_mhz]
    m = {s: est[s] // count[s] for s in seen}
    k, s_u, s_m = len(seen), sum(period[s] for s in seen), sum(m.values())
    d = {s: k * period[s] - s_u for s in seen}
    num, den = sum(m[s] * d[s] for s in seen), sum(period[s] * d[s] for s in seen)
    slope = float(num) / float(den) if den > 0 else 0.0
    slope = min(max(slope, 0.0), float(s_m) / float(max(s_u, 1)))
    return [max((s_m + math.floor(slope * float(k * u - s_u))) // k, 0) for u in period]


def estimates(sim, kernel, k: int) -> list[int]:
    """The fit at tick `k`'s clocks (not censored)."""
    return fit(kernel.est, kernel.sq, [sm.freq for sm in sim.sms])


def hold(sim, kernel, cand) -> bool:
    """The closed loop's hold with no deviation term."""
    return closed_loop.hold_for(sim, kernel, cand, 0)
