"""Closed-loop dispatch (docs/model.md section 9): each SM's CTA duration learnt from the CTAs it
completed, the first one's duration then an EMA, and the same EMA of squared durations (`observe`),
censored by its oldest running CTA (`estimates`); the SM with the smallest estimate, then the
most usable free slots, then the lowest rank. In the tail it holds the CTA if the launch's CTAs
left fit in clearly better slots: expected to finish it earlier by the hold margin
(`hold_margin`, a share of its estimate, 1/8 by default, plus `hold_noise` times its deviation,
0 by default), each better slot counting 1 plus `hold_queue` for each later CTA it is expected to
finish before the candidate would (up to `HOLD_QUEUE_CTAS` in all), against `hold_left` times the
CTAs left (by default 0 and 1: the count of better slots against the CTAs left)."""

import math

from ..policies import HOLD_QUEUE_CTAS

NUMBER = 4
READS_ESTIMATES = True  # it learns estimates (`observe`) and reads them (`estimates`); so does its engine twin


def init(launch, n_sm: int) -> list[int]:
    """The estimate before an SM's first CTA of the launch completes: the prior, on every SM
    (`observe` knows an SM's first completion by its absence from `kernel.est_seen`)."""
    return [int(launch.policy.ema_prior_ticks)] * n_sm


def observe(sim, sm, kernel, g: int, t0: int, k: int) -> None:
    """Section 9 (per launch, section 13): CTA `g` of `kernel`, started at tick `t0`, completed
    on `sm` at tick `k`, `d = k - t0`: the SM's first completion of the launch sets
    `est_{l,s} = d` and `sq_{l,s} = d^2`, each later one `est_{l,s} += floor(a * (d - est_{l,s})
    / 256)` and `sq_{l,s} += floor(a * (d^2 - sq_{l,s}) / 256)` (Python floor division, negative
    values too)."""
    s, d = sm.index, k - t0
    ema = lambda x, target: x + (sim.ema_alpha_256 * (target - x)) // 256
    if s in kernel.est_seen:
        kernel.est[s], kernel.sq[s] = ema(kernel.est[s], d), ema(kernel.sq[s], d * d)
    else:
        kernel.est[s], kernel.sq[s] = d, d * d
        kernel.est_seen.add(s)
    sim.chip.est_log.append((k, s, g, d, kernel.est[s]))


def deviation(kernel, s: int) -> int:
    """`floor(sqrt(max(sq_{l,s} - est_{l,s}^2, 0)))`: the smoothed standard deviation of the
    CTA durations of launch `l` = `kernel` on SM `s` (0 before its first completion)."""
    if s not in kernel.est_seen:
        return 0
    return math.isqrt(max(kernel.sq[s] - kernel.est[s] ** 2, 0))


def estimates(sim, kernel, k: int) -> list[int]:
    """`e_s = max(est_{l,s}, k - t_s)` of launch `l` = `kernel` at tick `k`, `t_s` the earliest
    start of its CTAs resident on `s` (the term is 0 if it has none there)."""
    return [
        max(kernel.est[sm.index],
            max((k - t0 for cta, t0 in zip(sm.cta_id, sm.start)
                 if cta >= 0 and sim.chip.cta_kernel[cta] == kernel.index), default=0))
        for sm in sim.sms
    ]


def key(sim, kernel, sm, room: int) -> tuple:
    return (sim.censored[kernel.index][sm.index], -room, sm.rank)


def hold(sim, kernel, cand) -> bool:
    """The launch's CTAs left (this one included) fit in slots expected to finish them earlier
    than `cand` would, by `margin = floor((e * hold_margin_256 + dev * hold_noise_256) / 256)`
    with `e` its estimate and `dev` its deviation (`deviation`): occupied slots (of any launch),
    and free slots still in their launch latency; not free slots waiting for launch credit (when
    the SM collects it depends on when its schedulers starve)."""
    return hold_for(sim, kernel, cand, deviation(kernel, cand.index))


def queued(free: int, es: int, target: int, margin: int) -> int:
    """How many CTAs of estimate `es` a slot free from tick `free` finishes, one after another,
    with `margin` to spare before `target`: the `k` with `free + k * es + margin < target`,
    at most `HOLD_QUEUE_CTAS` (all of them where `es` is 0)."""
    gap = target - margin - free - 1
    if es == 0:
        return HOLD_QUEUE_CTAS if gap >= 0 else 0
    return min(max(gap // es, 0), HOLD_QUEUE_CTAS)


def hold_for(sim, kernel, cand, dev: int) -> bool:
    """`hold` with the candidate's deviation `dev` given (the clock regression passes 0): with
    `n_j` the CTAs slot `j` finishes before the candidate would (`queued`), the better slots are
    those with `n_j >= 1`; the CTA is held where there is one and `256 * better + hold_queue_256
    * sum (n_j - 1) >= hold_left_256 * left`."""
    e = sim.censored[kernel.index]
    target = sim.now + e[cand.index]
    margin = (e[cand.index] * sim.hold_margin_256 + dev * sim.hold_noise_256) // 256
    counts = []
    for sm in sim.enabled_sms:
        es = e[sm.index]
        for cta, t0 in zip(sm.cta_id, sm.start):
            if cta >= 0:
                counts.append(queued(max(sim.now, t0 + es), es, target, margin))
        for j in range(sim.ctas_per_sm):
            u = sm.usable[j]
            if sm.cta_id[j] < 0 and u > sim.now:
                counts.append(queued(u, es, target, margin))
    better = sum(1 for n in counts if n >= 1)
    later = sum(n - 1 for n in counts if n >= 1)
    return better >= 1 and 256 * better + sim.hold_queue_256 * later >= sim.hold_left_256 * kernel.left
