"""Least-loaded dispatch (docs/model.md section 9): the SM with the fewest live warps now, of
every launch (CTAs placed earlier in the tick's dispatch count all their warps), ties to the
lowest dispatch rank."""

from jaxtyping import Array, Int

from . import View

STATIC = True


def score(v: View) -> Int[Array, " sm"]:
    return -v.live_warps.astype(v.rank.dtype) * 65536 - v.rank
