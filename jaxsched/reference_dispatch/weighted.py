"""Weighted dispatch (docs/model.md section 9): static weights per SM (by default its clock), the
SM with the highest `floor(weight * 65536 / (resident + 1))`, ties to the lowest dispatch rank."""

NUMBER = 3
WEIGHT_ONE = 65536  # the score's fixed-point unit


def key(sim, kernel, sm, room: int) -> tuple:
    return (-(sm.weight * WEIGHT_ONE // (sm.resident + 1)), sm.rank)


def check(sim) -> None:
    if any(sm.weight < 1 for sm in sim.enabled_sms):
        raise ValueError("weighted dispatch needs a weight >= 1 on every enabled SM")
