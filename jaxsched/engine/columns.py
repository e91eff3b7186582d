"""Per-warp work on a few SMs of a batch: compact the SMs that need it, a few per configuration
at a time.

A CTA launch, a barrier release or a clock change touches the warps of a handful of SMs in a
step, while the batch holds thousands: a dense pass over every warp slot of every SM would cost
as much as the whole cycle. The batch arrays keep their SM axis last (`slots.py`), so the marked
SMs are columns: `take` gathers a few of them per configuration (`next_columns`), a function works on those
columns, and `put` scatters them back (`step._after_cycles` repeats this until no configuration
has SMs left).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int


def next_columns(marked: Bool[Array, "batch sm"], k: int) -> tuple[Int[Array, "batch k"], Bool[Array, "batch sm"]]:
    """Up to `k` marked SMs of each configuration (their indices; the SM count where fewer are
    marked) and the marks left after them."""
    n_sm = marked.shape[-1]
    cols = jax.vmap(lambda m: jnp.nonzero(m, size=k, fill_value=n_sm)[0].astype(jnp.int32))(marked)
    return cols, put(marked, cols, jnp.zeros(cols.shape, bool))


def take(x: Array, cols: Int[Array, "batch k"]) -> Array:
    """Columns `cols` of a batch array [batch, ..., sm] -> [batch, ..., k] (past the last SM:
    the last SM's, which `put` then drops)."""
    return jnp.take_along_axis(x, cols.reshape(cols.shape[0], *[1] * (x.ndim - 2), -1), axis=-1, mode="clip")


def put(x: Array, cols: Int[Array, "batch k"], values: Array) -> Array:
    """`x` with columns `cols` set to `values` (columns past the last SM are dropped)."""
    def one(a: Array, c: Array, v: Array) -> Array:
        return a.at[(slice(None),) * (a.ndim - 1) + (c,)].set(v, mode="drop")

    return jax.vmap(one)(x, cols, values)
