"""Closed-loop dispatch (docs/model.md section 9): each SM's CTA duration learnt from the CTAs it
completed, the first one's duration then an EMA (`observe`), censored by its oldest running CTA (`estimates`); the SM with
the smallest estimate, then the most usable free slots, then the lowest rank. In the tail it
holds the CTA if the launch's CTAs left fit in clearly better slots: expected to finish it
earlier by the hold margin (`hold_margin`, a share of its estimate, 1/8 by default)."""

NUMBER = 4
READS_ESTIMATES = True  # it learns estimates (`observe`) and reads them (`estimates`); so does its engine twin


def init(launch, n_sm: int) -> list[int]:
    """The estimate before an SM's first CTA of the launch completes: the prior, on every SM
    (`observe` knows an SM's first completion by its absence from `kernel.est_seen`)."""
    return [int(launch.policy.ema_prior_ticks)] * n_sm


def observe(sim, sm, kernel, g: int, t0: int, k: int) -> None:
    """Section 9 (per launch, section 13): CTA `g` of `kernel`, started at tick `t0`, completed
    on `sm` at tick `k`: the SM's first completion of the launch sets `est_{l,s} = k - t0`, each
    later one `est_{l,s} += floor(a * (k - t0 - est_{l,s}) / 256)` (Python floor division,
    negative values too)."""
    est = kernel.est[sm.index]
    est = est + (sim.ema_alpha_256 * (k - t0 - est)) // 256 if sm.index in kernel.est_seen else k - t0
    kernel.est_seen.add(sm.index)
    kernel.est[sm.index] = est
    sim.chip.est_log.append((k, sm.index, g, k - t0, est))


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
    than `cand` would, by `floor(e * hold_margin_256 / 256)` with `e` its estimate: occupied
    slots (of any launch), and free slots still in their launch latency; not free slots waiting
    for launch credit (when the SM collects it depends on when its schedulers starve)."""
    e = sim.censored[kernel.index]
    target = sim.now + e[cand.index]
    margin = e[cand.index] * sim.hold_margin_256 // 256
    better = 0
    for sm in sim.enabled_sms:
        es = e[sm.index]
        for cta, t0 in zip(sm.cta_id, sm.start):
            if cta >= 0 and max(sim.now, t0 + es) + es + margin < target:
                better += 1
        for j in range(sim.ctas_per_sm):
            u = sm.usable[j]
            if sm.cta_id[j] < 0 and u > sim.now and u + es + margin < target:
                better += 1
    return kernel.left <= better
