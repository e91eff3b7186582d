"""Greedy then oldest: the warp that issued last while it stays eligible, else the oldest."""

NUMBER = 1


def key(q: int, last: int, n_q: int, age: int) -> int:
    return -1 if q == last else age
