"""Weighted dispatch (docs/model.md section 9): static weights per SM (by default its clock), the
SM with the highest `floor(weight * 65536 / (resident + 1))`, ties to the lowest dispatch rank."""

from jaxtyping import Array, Int

from ..mechanics.exact import floor_div
from . import View

STATIC = True


def score(v: View) -> Int[Array, " sm"]:
    i64 = v.rank.dtype
    return floor_div(v.weight.astype(i64) * 65536, v.resident + 1).astype(i64) * 65536 - v.rank
