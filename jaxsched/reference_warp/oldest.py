"""Oldest first: the eligible warp of the earliest CTA, then the lowest warp in it."""

NUMBER = 2


def key(q: int, last: int, n_q: int, age: int) -> int:
    return age
