"""Loose round robin: the first eligible warp after the one that issued last, cyclically."""

NUMBER = 0


def key(q: int, last: int, n_q: int, age: int) -> int:
    return (q - last - 1) % n_q
