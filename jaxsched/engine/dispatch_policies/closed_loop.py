"""Closed-loop dispatch (docs/model.md section 9): each SM's CTA duration learnt by an EMA of the
CTAs it completed, censored by its oldest running CTA (`dispatch._censored_estimate`); the SM
with the smallest estimate, then the most usable free slots, then the lowest rank [S1]. Its
learning and its hold in the tail (`dispatch._hold_for_better_slots`) are compiled in only where
a configuration dispatches by it (its twin's `READS_ESTIMATES`)."""

from jaxtyping import Array, Int

from . import View

STATIC = False  # it reads every SM's CTA durations when it holds CTAs back


def score(v: View) -> Int[Array, " sm"]:
    i64 = v.rank.dtype
    return ((-v.est.astype(i64)) * 64 + v.room.astype(i64)) * 65536 - v.rank
