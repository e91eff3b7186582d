"""Fastest-first dispatch (docs/model.md section 9): the SM with the fastest clock now (its `f_s`,
which DVFS and droop move), then the most usable free CTA slots, then the lowest dispatch rank."""

NUMBER = 5


def key(sim, kernel, sm, room: int) -> tuple:
    return (-sm.freq, -room, sm.rank)
