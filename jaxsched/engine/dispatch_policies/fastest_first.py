"""Fastest-first dispatch (docs/model.md section 9): the SM with the fastest clock now (its `f_s`,
which DVFS and droop move), then the most usable free CTA slots, then the lowest dispatch rank.
Frequency-aware but open-loop: it reads the clocks, as a driver could, not how long CTAs take."""

from jaxtyping import Array, Int

from . import View

STATIC = True  # its SM's clock changes only at DVFS steps, which every SM reaches together


def score(v: View) -> Int[Array, " sm"]:
    i64 = v.rank.dtype  # clock < 2^14 MHz, room and rank < 2^16: distinct, inside int64
    return (v.freq_mhz.astype(i64) * 65536 + v.room.astype(i64)) * 65536 - v.rank
