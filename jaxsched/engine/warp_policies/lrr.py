"""Loose round robin: the first eligible warp after the one that issued last, cyclically."""

from jaxtyping import Array, Int


def key(q: Int[Array, "warp 1"], last: Int[Array, "warp sm"], n_q: int, age: Int[Array, "warp sm"]
        ) -> Int[Array, "warp sm"]:
    return (q - last - 1) % n_q
