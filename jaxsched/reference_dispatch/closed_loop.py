"""Closed-loop dispatch (docs/model.md section 9): each SM's CTA duration learnt by an EMA of the
CTAs it completed, censored by its oldest running CTA (`_Sim.censored_estimates`); the SM with
the smallest estimate, then the most usable free slots, then the lowest rank. In the tail it
holds the CTA if the launch's CTAs left fit in clearly better slots: expected to finish it
earlier by the hold margin (`hold_margin`, a share of its estimate, 1/8 by default)."""

NUMBER = 4
READS_ESTIMATES = True  # it reads the censored estimates (`_Sim.dispatch`); the engine learns them for it


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
