"""Least-loaded dispatch (docs/model.md section 9): the SM with the fewest live warps now, of
every launch (CTAs placed earlier in the tick's dispatch count all their warps), ties to the
lowest dispatch rank."""

NUMBER = 2


def key(sim, kernel, sm, room: int) -> tuple:
    return (sim.live_warps(sm), sm.rank)
