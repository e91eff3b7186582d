"""Hardware dispatch, the GigaThread engine's rule as modelled (docs/model.md section 9): the SM
with the most usable free CTA slots, ties to the lowest dispatch rank [Gil21]."""

NUMBER = 0


def key(sim, kernel, sm, room: int) -> tuple:
    return (-room, sm.rank)
