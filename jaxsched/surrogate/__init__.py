"""Differentiable surrogate of the scheduler and the optax fits built on it (docs/surrogate.md).

- `launch`: the surrogate's inputs (per-CTA work measured by the exact engine, clocks, SM order);
- `relax`: the relaxed CTA-level scheduler (`schedule`), soft, hard or straight-through;
- `speeds`: per-SM clocks fitted from CTA traces, with uncertainty, against the EMA estimate;
- `dispatch_fit`: dispatch weights and closed-loop parameters fitted through the surrogate and
  evaluated in the exact engine.
"""

from .launch import (
           DispatchParams,
           SurrogateLaunch,
           dispatch_params,
           make_launch,
           measure_work,
           replay_launch,
)
from .relax import MODES, Schedule, schedule

__all__ = ["MODES", "DispatchParams", "Schedule", "SurrogateLaunch", "dispatch_params", "make_launch",
           "measure_work", "replay_launch", "schedule"]
