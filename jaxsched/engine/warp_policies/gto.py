"""Greedy then oldest: the warp that issued last while it stays eligible, else the oldest."""

import jax.numpy as jnp
from jaxtyping import Array, Int


def key(q: Int[Array, "warp 1"], last: Int[Array, "warp sm"], n_q: int, age: Int[Array, "warp sm"]
        ) -> Int[Array, "warp sm"]:
    return jnp.where(q == last, -1, age)
