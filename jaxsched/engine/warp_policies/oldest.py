"""Oldest first: the eligible warp of the earliest CTA, then the lowest warp in it."""

from jaxtyping import Array, Int


def key(q: Int[Array, "warp 1"], last: Int[Array, "warp sm"], n_q: int, age: Int[Array, "warp sm"]
        ) -> Int[Array, "warp sm"]:
    return age
