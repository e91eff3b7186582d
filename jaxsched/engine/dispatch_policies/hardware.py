"""Hardware dispatch, the GigaThread engine's rule as modelled (docs/model.md section 9): the SM
with the most usable free CTA slots, ties to the lowest dispatch rank [Gil21]."""

from jaxtyping import Array, Int

from . import View

STATIC = True


def score(v: View) -> Int[Array, " sm"]:
    return v.room.astype(v.rank.dtype) * 65536 - v.rank
