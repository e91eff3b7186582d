"""Exact integer division through float64, for the divisions by a traced divisor in every step.

A CPU has no SIMD integer division, and a GPU spends some twenty instructions on one; a float64
division is one vector instruction on a CPU and cheap on a GPU. Its floor is within one of the
exact quotient whatever XLA does with it (XLA rewrites a division by a loop-invariant scalar into
a multiplication by its reciprocal, hoisted out of the loop), so one correction with the exact
remainder in int64 makes it exact: `floor_div` equals Python's `//` for numerators below 2^53
and quotients below 2^31, on every backend alike.
"""

from __future__ import annotations

import jax.numpy as jnp
from jaxtyping import Array, Int


def floor_div(n: Int[Array, "..."], d: Int[Array, "..."]) -> Int[Array, "..."]:
    """`n // d` for `|n| < 2^53`, `d >= 1` and a quotient that fits int32, as int32. Needs
    `jax.enable_x64` (the engine runs under it): without, float64 and int64 are 32-bit."""
    if jnp.asarray(0.0, jnp.float64).dtype != jnp.float64:
        raise RuntimeError("exact.floor_div needs jax.enable_x64 (float64 and int64)")
    n, d = jnp.asarray(n).astype(jnp.int64), jnp.asarray(d).astype(jnp.int64)
    q = jnp.floor(n.astype(jnp.float64) / d.astype(jnp.float64)).astype(jnp.int64)
    r = n - q * d
    return (q - (r < 0) + (r >= d)).astype(jnp.int32)
