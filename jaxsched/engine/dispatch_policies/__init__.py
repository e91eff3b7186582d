"""The engine's CTA-dispatch policies, one module per policy (docs/model.md section 9), each the
JAX twin of `jaxsched/reference_dispatch/NAME.py` and numbered as `jaxsched.DISPATCH_POLICIES`.

A policy module gives:

- `score(v: View) -> Int[Array, " sm"]`: higher is preferred, int64, distinct on enabled SMs
  (every policy breaks its ties by dispatch rank); the dispatcher reads it only on SMs with room;
- `STATIC`: whether the score reads only the SM's own state, so that SMs on their own time may
  take CTAs before the others catch up (`decouple.py`);

and, where the policy has one, `pointer_after(v, sm) -> Int[Array, ""]` (the shared pointer after
`sm` took a CTA). A policy that learns from the run (its twin says `READS_ESTIMATES`:
`policies.ESTIMATE_DISPATCH`) keeps its state in the dispatch state's moments of CTA durations
(`state.Dispatch.est` and `.sq`, per launch and SM) through four hooks, which the engine calls
for the configurations that dispatch by it and compiles in only where one does
(`step._dispatch`):

- `init(launch, dispatch) -> Dispatch`: before the run;
- `observe(state, was_occupied, launch) -> Dispatch`: after each tick's cycles, from the CTAs
  that completed in them;
- `estimates(state, tick) -> (est, dev)`: what its score (`View.est`) and its hold read at a
  placement, per launch and SM;
- `hold(slots, launch, launching_tick, est, dev, sm, tick, left) -> Bool`: keep the chosen SM's
  CTA back for this tick.

Policies are selected by a traced index, so one compiled simulation serves all of them: every
policy's score is computed and the configuration's is selected.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

import jax
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ...lower import Launch
from ...policies import DISPATCH_POLICIES, ESTIMATE_DISPATCH, engine_twins
from ..state import Dispatch, State

if TYPE_CHECKING:
    from ..dispatch import Slots


class View(NamedTuple):
    """What a score reads, per SM, at one placement."""

    room: Int[Array, " sm"]  # usable free CTA slots the head launch's next CTA fits in
    rank: Int[Array, " sm"]  # dispatch rank (int64), distinct on enabled SMs
    n_enabled: Int[Array, ""]  # enabled SMs (int64, at least 1)
    pointer: Int[Array, ""]  # the shared pointer in rank space (round robin)
    live_warps: Int[Array, " sm"]  # warps not exited, of every launch
    resident: Int[Array, " sm"]  # CTAs occupying a slot
    weight: Int[Array, " sm"]  # static dispatch weights
    est: Int[Array, " sm"]  # the head launch's estimates as its policy reads them (`estimates`), ticks
    freq_mhz: Int[Array, " sm"]  # each SM's clock now


MODULES = engine_twins(__name__, __path__, DISPATCH_POLICIES)
ESTIMATE_POLICIES = tuple(DISPATCH_POLICIES.index(name) for name in ESTIMATE_DISPATCH)
_LEARNING = tuple((DISPATCH_POLICIES.index(name), MODULES[name]) for name in ESTIMATE_DISPATCH)
for _name in ESTIMATE_DISPATCH:
    if not all(hasattr(MODULES[_name], hook) for hook in ("init", "observe", "estimates", "hold")):
        raise ImportError(f"{__name__}.{_name} reads estimates, so needs init, observe, estimates and hold")
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


def _by_policy(policy: Int[Array, ""], hook: str, otherwise, *args: object):
    """The learning hook `hook` of the configuration's `policy` (an array or a pytree of them),
    `otherwise` where its policy does not learn."""
    out = otherwise
    for number, module in _LEARNING:
        out = jax.tree.map(lambda new, old: jnp.where(policy == number, new, old), getattr(module, hook)(*args), out)
    return out


def init(launch: Launch, dispatch: Dispatch) -> Dispatch:
    """The dispatch state before the run (`init` of the configuration's policy)."""
    return _by_policy(launch.policy.dispatch_policy, "init", dispatch, launch, dispatch)


def observe(state: State, was_occupied: Bool[Array, "cta sm"], launch: Launch) -> Dispatch:
    """The dispatch state after a tick's cycles (`observe` of the configuration's policy)."""
    return _by_policy(launch.policy.dispatch_policy, "observe", state.dispatch, state, was_occupied, launch)


def estimates(state: State, launch: Launch, tick: Int[Array, ""]
              ) -> tuple[Int[Array, "launch sm"], Int[Array, "launch sm"]]:
    """What the placements of tick `tick` read, estimates and deviations (`estimates` of the
    configuration's policy)."""
    return _by_policy(launch.policy.dispatch_policy, "estimates", (state.dispatch.est, state.dispatch.sq), state,
                      tick)


def hold(slots: Slots, launch: Launch, launching_tick: Int[Array, "cta sm"], est: Int[Array, " sm"],
         dev: Int[Array, " sm"], sm: Int[Array, ""], tick: Int[Array, ""], left: Int[Array, ""]) -> Bool[Array, ""]:
    """Whether the configuration's policy keeps the CTA chosen for `sm` back this tick."""
    return _by_policy(launch.policy.dispatch_policy, "hold", jnp.bool_(False), slots, launch, launching_tick, est, dev,
                      sm, tick, left)
