"""A configuration made ready for the event loop: its `Params` lowered (`lower.lower`, one launch
or a workload's launches) into the tables a run reads at every step (`step.Run`), with the last
run-time guard on values that were traced when given (`guarded`); and `engine_params`, the
`Params` as the compiled entry point takes them."""

from __future__ import annotations

import dataclasses
from typing import Sequence

import equinox as eqx
import jax
import jax.numpy as jnp

from .. import clocks as clocks_mod
from ..kernel import MAX_TRIPS, Kernel
from ..lower import Launch, Shapes, lower
from ..params import Params
from .decouple import decoupling
from .dispatch import variation_tables
from .launches import Launches, make_launches, single
from .mechanics.sizes import compiled_input, unnamed
from .power import domains
from .prepare import WorkloadInput
from .step import Run


def run_tables(launch: Launch, shapes: Shapes, per: Launch | None, launches: Launches | None) -> Run:
    """A run's tables from its lowering. `launch` holds what every launch shares (and `n_ctas`,
    all launches' CTAs); a workload adds `per`, its launches' own lowerings stacked on a leading
    axis, and `launches`, their tables. Without them `launch` is the only launch, without launch
    overhead."""
    if per is None:
        launches = single(launch, shapes) if launches is None else launches
        variation = variation_tables(launch, shapes)
    else:
        variation = variation_tables(per, shapes, launches)
    return Run(launch, launches, variation, domains(launch), decoupling(launch, launches, variation, shapes))


def _lower_workload(workload: WorkloadInput, lower_one, shapes: Shapes) -> tuple[Launch, Launch, Launches]:
    """(shared launch, stacked per-launch lowerings, tables) of a prepared workload: every
    kernel lowered alike (one vmapped lowering), the shared values from launch 0 with `n_ctas`
    the workload's total, and the CTA slots and shared-memory size of the launch that needs the
    most (CTAs of different shapes share an SM: docs/model.md section 13)."""
    kernels = jax.tree.map(lambda *xs: jnp.stack(xs), *workload.kernels)
    per = jax.vmap(lower_one)(kernels)
    launch = jax.tree.map(lambda x: x[0], per)
    work = workload.lower(launch.clocks.tick_mhz)
    program = dataclasses.replace(launch.program, n_ctas=jnp.sum(work.grid_ctas, dtype=jnp.int32),
                                  ctas_per_sm=jnp.max(per.program.ctas_per_sm),
                                  smem_per_sm_bytes=jnp.max(per.program.smem_per_sm_bytes))
    launch = dataclasses.replace(launch, program=program)
    return launch, per, make_launches(per, work, shapes)


def lower_config(params: Params, *, shapes: Shapes) -> Run:
    """One configuration's lowering and tables; `params.kernel` is a kernel or a prepared
    workload (`engine_params`)."""

    def lower_one(k: Kernel) -> Launch:
        return lower(params.arch, k, params.clocks, params.warp_policy, params.dispatch, params.dispatch_start,
                     params.dispatch_weight, params.ema_alpha, params.ema_prior_ns, params.hold_margin,
                     params.hold_noise, params.hold_queue, params.hold_left, params.dvfs)

    kernel = params.kernel
    if isinstance(kernel, WorkloadInput):
        launch, per, launches = _lower_workload(kernel, lower_one, shapes)
        return run_tables(guarded(launch, kernel.kernels) if shapes.guarded else launch, shapes, per, launches)
    launch = lower_one(kernel)
    return run_tables(guarded(launch, (kernel,)) if shapes.guarded else launch, shapes, None, single(launch, shapes))


def guarded(launch: Launch, kernels: Sequence[Kernel]) -> Launch:
    """The engine's last guard on values that were traced when the configuration was built (the
    modules check concrete ones): a run whose clocks, trip counts or probabilities could only
    give wrong numbers or never end raises at run time (`equinox.error_if`) instead. Left out
    where every value was concrete (`Shapes.guarded`)."""
    enabled = launch.chip.sm_enabled
    bad_clock = (launch.clocks.tick_mhz < 1) | jnp.any(enabled & ((launch.clocks.sm_freq_mhz < 1)
                                                           | (launch.clocks.sm_freq_mhz > clocks_mod.MAX_MHZ)))
    tick = eqx.error_if(launch.clocks.tick_mhz, bad_clock,
                        f"clocks.sm_freq_mhz: every enabled SM needs a clock in 1 .. {clocks_mod.MAX_MHZ} MHz")
    bad_kernel = jnp.bool_(False)
    for k in kernels:
        longest = k.trips.astype(jnp.int64) + k.trips_cta_spread + k.trips_warp_spread
        unit = lambda p: ~((p >= 0) & (p <= 1))  # noqa: E731  (NaN included)
        bad_kernel |= (jnp.any((k.trips < 0) | (k.trips_cta_spread < 0) | (k.trips_warp_spread < 0)
                               | (longest > MAX_TRIPS) | unit(k.branch_if_probability))
                       | unit(k.l2_hit_rate) | (k.grid_ctas < 1)
                       | jnp.any((k.trips_data < 0) | (k.trips_data > MAX_TRIPS)))
    tick = eqx.error_if(tick, bad_kernel, "kernel: trips, spreads, l2_hit_rate or branch_if_probability out of "
                        f"range (trip counts in 0 .. {MAX_TRIPS}, probabilities in [0, 1]) or grid_ctas < 1")
    return dataclasses.replace(launch, clocks=dataclasses.replace(launch.clocks, tick_mhz=tick))


def engine_params(params: Params, kernel: Kernel | WorkloadInput, shapes: Shapes) -> Params:
    """`params` as `_compiled` takes them: the arch unnamed and `kernel` (the configuration's
    kernel, or its workload made ready by `prepare_workload`) fitted to `shapes`
    (`mechanics/sizes.py`), so that configurations of one compiled shape stack and share a
    compilation."""
    return eqx.tree_at(lambda p: (p.arch, p.kernel), params, (unnamed(params.arch), compiled_input(kernel, shapes)))
