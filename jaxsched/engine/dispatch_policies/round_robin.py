"""Round-robin dispatch (docs/model.md section 9): the first SM with room at or after a shared
pointer, in cyclic dispatch-rank order; the pointer moves past each SM that takes a CTA."""

import jax.numpy as jnp
from jaxtyping import Array, Int

from . import View

STATIC = False  # the pointer is the chip's


def score(v: View) -> Int[Array, " sm"]:
    after_pointer = v.rank - v.pointer.astype(v.rank.dtype)  # in (-n, n) on enabled SMs: mod n is one select
    return -jnp.where(after_pointer < 0, after_pointer + v.n_enabled, after_pointer)


def pointer_after(v: View, sm: Int[Array, ""]) -> Int[Array, ""]:
    return ((v.rank[sm] + 1) % v.n_enabled).astype(v.pointer.dtype)
