"""Configurations: a point of a sweep and one replicate, turned into the `Params` the engine
runs (`Config`, `engine_config`): the point's launch (`launched`: its kernel, or a workload of its
launches), the replicate's per-SM clock map (`clock_map`) and DVFS parameters (`dvfs_params`),
drawn from the sweep's seed and the replicate (`REPLICATE_STRIDE`); and the configurations that
run (those of feasible points) in C order (`point_configs`, `configurations`). This is where
swept values reach the engine call.

`spec` checks every point through `launched` and `dvfs_params`, so it imports this module, and
this module names `Sweep` in annotations only."""

from __future__ import annotations

from typing import TYPE_CHECKING, Iterator, NamedTuple, Sequence

import jax
import numpy as np

from .. import clocks, dvfs, freqmap
from ..arch import Arch
from ..dvfs import Dvfs
from ..kernel import Kernel
from ..params import Params, make_params
from ..policies import FITTED_DISPATCH
from ..sweep_paths import Point
from ..workload import OVERHEAD_FIELDS, Workload, make_workload

if TYPE_CHECKING:
    from .spec import Sweep

REPLICATE_STRIDE = 1_000_003  # replicate r of seed s draws its chip from seed s x REPLICATE_STRIDE + r


class Config(NamedTuple):
    """One configuration of a sweep: where it lies (point index, replicate) and what runs."""

    index: tuple[int, ...]  # point index: grid dimensions..., design sample
    replicate: int
    params: Params


def engine_config(sweep: Sweep, point: Point, index: tuple[int, ...], replicate: int) -> Config:
    """The configuration of one point and replicate (the place where swept groups reach the
    engine call)."""
    arch, policy = point["arch"], point["policy"]
    if policy["dispatch"] == FITTED_DISPATCH:  # the policy and parameters of the fitted file
        policy = {**policy, "dispatch": sweep.fitted.dispatch, **sweep.fitted.values}
    weight = None if policy["weights"] == "clocks" else np.ones(arch.n_sm_slots, dtype=np.int32)
    seed = sweep.seed * REPLICATE_STRIDE + replicate
    params = make_params(arch, launched(point["kernel"], point["workload"]), clock_map(arch, point["clocks"], seed),
                         warp_policy=policy["warp"], dispatch=policy["dispatch"],
                         dispatch_start=policy["dispatch_start"], dispatch_weight=weight,
                         ema_alpha=policy["ema_alpha"], ema_prior_ns=policy["ema_prior_ns"],
                         hold_margin=policy["hold_margin"], hold_noise=policy["hold_noise"],
                         hold_queue=policy["hold_queue"], hold_left=policy["hold_left"],
                         dvfs=dvfs_params(arch, point["dvfs"], seed))
    return Config(index=tuple(index), replicate=replicate, params=params)


def launched(kernel: Kernel, table: dict) -> Kernel | Workload:
    """The point's kernel, or with `[workload] launches = N` a workload of N launches of it
    (launch `l` with seed `seed + l` on stream `l mod streams`; sweep_paths.WorkloadGroup)."""
    if table["launches"] == 0:
        return kernel
    n, seed = table["launches"], int(kernel.seed)
    kernels = [kernel.replace(seed=np.asarray(seed + l, np.asarray(kernel.seed).dtype)) for l in range(n)]
    overheads = {key: table[key] for key in OVERHEAD_FIELDS}
    return make_workload(kernels, [l % table["streams"] for l in range(n)], None, table["mode"], **overheads)


def dvfs_params(arch: Arch, table: dict, seed: int) -> Dvfs:
    """The `Dvfs` of one replicate: the `[dvfs]` values, plus a run-to-run draw (initial
    temperature, clock, controller phase, noise seed) from `seed` if `run_to_run`."""
    fields = {k: v for k, v in table.items() if k != "run_to_run" and not k.startswith("r2r_")}
    base = dvfs.default(arch, **fields)
    if not table["run_to_run"]:
        return base
    (drawn,) = dvfs.run_to_run(arch, base, seed, 1, temp_c=(table["r2r_temp_min_c"], table["r2r_temp_max_c"]),
                               clock_mhz=(table["r2r_clock_min_mhz"], table["r2r_clock_max_mhz"]))
    return drawn


def point_configs(sweep: Sweep, points: Sequence[tuple[int, ...]], replicates: Sequence[int]) -> list[Config]:
    """The configurations of the feasible `points` x `replicates`, in that (C) order."""
    out = []
    for index in points:
        if sweep.feasible[index]:
            point = sweep.point(index)
            out.extend(engine_config(sweep, point, index, r) for r in replicates)
    return out


def configurations(sweep: Sweep) -> Iterator[Config]:
    """Every configuration that runs (feasible points), in C order over (points..., replicate)."""
    for index in np.ndindex(*sweep.point_shape):
        yield from point_configs(sweep, [index], range(sweep.replicates))


def clock_map(arch: Arch, clk: dict, seed: int) -> clocks.Clocks:
    """The per-SM clock map of one replicate.

    `gaussian`: independent per-SM clocks, `mean (1 + sigma z)`, capped at boost.
    `variation`: `freqmap.process_variation` (spatially correlated within-die part `sigma`,
    die-to-die part `sigma_die`, correlation length `corr_length_mm`), times the IR-drop factor
    if `ir_drop`, floored to the arch's clock bins and capped at the boost clock.
    """
    if clk["model"] == "gaussian":
        return clocks.gaussian(arch, seed, clk["mean_ghz"], clk["sigma"])
    mhz = freqmap.process_variation(
        jax.random.key(seed), arch, mean_mhz=clk["mean_ghz"] * 1000.0, sigma_within=clk["sigma"],
        sigma_die=clk["sigma_die"], corr_length_mm=clk["corr_length_mm"])
    factors = (freqmap.ir_factor(arch),) if clk["ir_drop"] else ()
    boost = float(arch.boost_clock_ghz) * 1000.0
    return freqmap.to_clocks(arch, freqmap.combine(arch, mhz, *factors, cap_mhz=boost))
