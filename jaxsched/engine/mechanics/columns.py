"""Per-warp work on a few SMs of a batch: compact the SMs that need it, a few per configuration
at a time.

A CTA launch, a barrier release or a clock change touches the warps of a handful of SMs in a
step, while the batch holds thousands: a dense pass over every warp slot of every SM would cost
as much as the whole cycle. The batch arrays keep their SM axis last (`slots.py`), so the marked
SMs are columns: `for_marked_sms` gathers up to `k` of them per configuration, lets a function
work on those columns, scatters them back, and repeats until no configuration has marked SMs
left (no iteration at all in a step that marks none).
"""

from __future__ import annotations

from typing import Callable, TypeVar

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

T = TypeVar("T")


def take(x: Array, cols: Int[Array, "batch k"]) -> Array:
    """Columns `cols` of a batch array [batch, ..., sm] -> [batch, ..., k] (past the last SM:
    the last SM's, which `put` then drops)."""
    return jnp.take_along_axis(x, cols.reshape(cols.shape[0], *[1] * (x.ndim - 2), -1), axis=-1, mode="clip")


def put(x: Array, cols: Int[Array, "batch k"], values: Array) -> Array:
    """`x` with columns `cols` set to `values` (columns past the last SM are dropped)."""
    def one(a: Array, c: Array, v: Array) -> Array:
        return a.at[(slice(None),) * (a.ndim - 1) + (c,)].set(v, mode="drop")

    return jax.vmap(one)(x, cols, values)


def _first_marked(marked: Bool[Array, "batch sm"], k: int
                  ) -> tuple[Int[Array, "batch k"], Bool[Array, "batch sm"]]:
    """The indices of each configuration's first `k` marked SMs (the SM count past its last),
    and the marks left after them. The i-th is the number of SMs with at most i marked up to
    and including them. (As `jnp.nonzero(size=k)`, which scatters: a kernel of its own on the
    CPU; docs/engine_performance.md, "Scatters out of the CPU's loops, the ratio measured in rounds".)"""
    seen = jnp.cumsum(marked, axis=-1, dtype=jnp.int32)
    cols = jnp.stack([jnp.sum(seen <= i, axis=-1, dtype=jnp.int32) for i in range(k)], axis=-1)
    return cols, marked & (seen > k)


def for_marked_sms(marked: Bool[Array, "batch sm"], fn: Callable[[Int[Array, "batch k"], T], T], carry: T,
                   k: int) -> T:
    """`carry = fn(cols, carry)` for the marked SMs, `k` of each configuration per call (`cols`
    [batch, k]: their indices, the SM count where a configuration has fewer left), until none
    is left."""
    def body(c: tuple) -> tuple:
        left, value = c
        cols, left = _first_marked(left, k)
        return left, fn(cols, value)

    return jax.lax.while_loop(lambda c: jnp.any(c[0]), body, (marked, carry))[1]
