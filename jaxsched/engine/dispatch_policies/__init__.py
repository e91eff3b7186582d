"""The engine's CTA-dispatch policies, one module per policy (docs/model.md section 9), each the
JAX twin of `jaxsched/reference_dispatch/NAME.py` and numbered as `jaxsched.DISPATCH_POLICIES`.

A policy module gives:

- `score(v: View) -> Int[Array, " sm"]`: higher is preferred, int64, distinct on enabled SMs
  (every policy breaks its ties by dispatch rank); the dispatcher reads it only on SMs with room;
- `STATIC`: whether the score reads only the SM's own state, so that SMs on their own time may
  take CTAs before the others catch up (`decouple.py`);

and, where the policy has one, `pointer_after(v, sm) -> Int[Array, ""]` (the shared pointer after
`sm` took a CTA). A policy whose twin says `READS_ESTIMATES` (`policies.ESTIMATE_DISPATCH`) reads
`View.est`: the closed loop's learning, censored estimates and hold are compiled in for it
(`step._dispatch`).

Policies are selected by a traced index, so one compiled simulation serves all of them: every
policy's score is computed and the configuration's is selected.
"""

from __future__ import annotations

from typing import NamedTuple

import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ...policies import DISPATCH_POLICIES, ESTIMATE_DISPATCH, engine_twins


class View(NamedTuple):
    """What a score reads, per SM, at one placement."""

    room: Int[Array, " sm"]  # usable free CTA slots the head launch's next CTA fits in
    rank: Int[Array, " sm"]  # dispatch rank (int64), distinct on enabled SMs
    n_enabled: Int[Array, ""]  # enabled SMs (int64, at least 1)
    pointer: Int[Array, ""]  # the shared pointer in rank space (round robin)
    live_warps: Int[Array, " sm"]  # warps not exited, of every launch
    resident: Int[Array, " sm"]  # CTAs occupying a slot
    weight: Int[Array, " sm"]  # static dispatch weights
    est: Int[Array, " sm"]  # the head launch's censored CTA-duration estimates, ticks (closed loop)
    freq_mhz: Int[Array, " sm"]  # each SM's clock now


MODULES = engine_twins(__name__, __path__, DISPATCH_POLICIES)
ESTIMATE_POLICIES = tuple(DISPATCH_POLICIES.index(name) for name in ESTIMATE_DISPATCH)
STATIC_POLICIES = tuple(i for i, m in enumerate(MODULES.values()) if m.STATIC)


def is_one_of(policy: Int[Array, "..."], numbers: tuple[int, ...]) -> Bool[Array, "..."]:
    """Whether `policy` is one of the policies `numbers`."""
    return jnp.isin(policy, jnp.asarray(numbers, dtype=jnp.int32)) if numbers else jnp.zeros_like(policy, bool)


def scores(v: View, policy: Int[Array, ""], with_estimates: bool) -> Int[Array, " sm"]:
    """The score of the configuration's `policy`. Without `with_estimates` (no configuration
    dispatches by a policy that reads the closed loop's estimates) those policies' scores are
    not computed and `v.est` is not read."""
    modules = list(MODULES.values())
    numbers = [i for i in range(len(modules)) if with_estimates or i not in ESTIMATE_POLICIES]
    candidates = [modules[i].score(v) for i in numbers]
    last = candidates.pop()  # the default
    return jnp.select([policy == i for i in numbers[:-1]], candidates, last)


def pointer_after(v: View, policy: Int[Array, ""], sm: Int[Array, ""]) -> Int[Array, ""]:
    """The shared pointer after `sm` took a CTA: moved by the policies that keep one, else as it was."""
    moved = [(i, m.pointer_after(v, sm)) for i, m in enumerate(MODULES.values()) if hasattr(m, "pointer_after")]
    return jnp.select([policy == i for i, _ in moved], [p for _, p in moved], v.pointer)
