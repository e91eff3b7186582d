"""Round-robin dispatch (docs/model.md section 9): the first SM with room at or after a shared
pointer, in cyclic dispatch-rank order; the pointer moves past each SM that takes a CTA."""

NUMBER = 1


def key(sim, kernel, sm, room: int) -> tuple:
    return ((sm.rank - sim.chip.rr_pointer) % sim.n_enabled,)


def placed(sim, sm) -> None:
    sim.chip.rr_pointer = (sm.rank + 1) % sim.n_enabled
