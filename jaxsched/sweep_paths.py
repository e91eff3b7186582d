"""Swept paths: the `group.field` names a sweep spec may set, their types and limits, and how a
list of assignments turns the spec's base configuration into the configuration of one point.

A *point* is a mapping group -> part: `arch` (an `Arch`), `kernel` (a `Kernel`) and one plain
dict per table group (`policy`, `clocks`). `GROUPS` lists the groups:

- `TableGroup`: plain values given by a TOML table of the spec (`[policy]`, `[clocks]`), with
  defaults; every field is a `Param` (type and limits), checked in the table and when swept.
- `PytreeGroup`: scalar fields of a pytree. `arch.*`: every scalar numeric `Arch` field (the
  `Arch` checks its own invariants). `kernel.*` (`KernelGroup`): the launch and variation
  numbers of `KERNEL` (structural fields such as the loop bounds are not sweepable), under the
  kernel TOML's short names or the `Kernel` field names, plus `kernel.threads_fixed_work`
  (threads per CTA with the grid rescaled so the total thread count stays the spec kernel's).

Adding a group (say `dvfs.*`) is one entry in `GROUPS`: a `TableGroup` of plain values (fields
and defaults), or a group object with `base(table, arch, where)` (the part built from the spec's
table), `canonical`, `kind` and `set` (e.g. a `PytreeGroup` subclass over a `Dvfs` pytree). The
spec then takes a `[dvfs]` table and `"dvfs.<field>"` grid and design paths; the sweep hands
`point["dvfs"]` to the engine where it builds the call (`sweep.engine_config`, `sweep.Runner`).
"""

from __future__ import annotations

import dataclasses
import math
from typing import Callable, Mapping, Sequence

import numpy as np

from . import dvfs, freqmap, workload
from .arch import Arch
from .errors import INT32_MAX, JaxschedError, check
from .kernel import Kernel
from .lower import DISPATCH_POLICIES, WARP_POLICIES
from .policies import (DEFAULT_DISPATCH, DEFAULT_DISPATCH_START, DEFAULT_EMA_ALPHA, DEFAULT_EMA_PRIOR_NS,
                       DEFAULT_HOLD_LEFT, DEFAULT_HOLD_MARGIN, DEFAULT_HOLD_NOISE, DEFAULT_HOLD_QUEUE,
                       DEFAULT_WARP_POLICY, FITTED_DISPATCH, MAX_HOLD_LEFT, MAX_HOLD_NOISE,
                       MAX_HOLD_QUEUE)

Point = Mapping[str, object]  # group -> Arch | Kernel | dict of a table group

KINDS = ("float", "int", "bool", "choice")


@dataclasses.dataclass(frozen=True)
class Param:
    """One sweepable field: `kind` is one of `KINDS`; numbers lie between `low` and `high`
    (inclusive unless `low_open`/`high_open`), choices in `choices`."""

    kind: str
    low: float = -math.inf
    high: float = math.inf
    low_open: bool = False
    high_open: bool = False
    choices: tuple = ()

    def limit(self) -> str:
        if self.kind == "choice":
            return f"one of {self.choices}"
        if self.kind == "bool":
            return "true or false"
        what = "an integer" if self.kind == "int" else "a finite number"
        if self.low > -math.inf and self.high < math.inf:
            return f"{what} in {'(' if self.low_open else '['}{self.low}, {self.high}{')' if self.high_open else ']'}"
        if self.low > -math.inf:
            return f"{what} {'>' if self.low_open else '>='} {self.low}"
        return what

    def check(self, where: str, value: object) -> object:
        """`value` (floats as float, integers as int) or `JaxschedError` naming `where`."""
        if self.kind == "choice":
            check(isinstance(value, str) and value in self.choices, where, value, self.limit())
            return value
        if self.kind == "bool":
            check(isinstance(value, bool), where, value, self.limit())
            return value
        number = isinstance(value, (int, float, np.integer, np.floating)) and not isinstance(value, (bool, np.bool_))
        if self.kind == "int":
            check(number and isinstance(value, (int, np.integer)), where, value, self.limit())
            value = int(value)
        else:
            check(number and math.isfinite(float(value)), where, value, self.limit())
            value = float(value)
        above = value > self.low if self.low_open else value >= self.low
        below = value < self.high if self.high_open else value <= self.high
        check(above and below, where, value, self.limit())
        return value


def _number_kind(dtype: np.dtype) -> str:
    return "int" if np.issubdtype(dtype, np.integer) else "float"


@dataclasses.dataclass(frozen=True)
class TableGroup:
    """Plain values from a TOML table of the spec, with defaults that may depend on the arch."""

    params: Mapping[str, Param]
    defaults: Callable[[Arch], dict]

    def base(self, table: object, arch: Arch, where: str) -> dict:
        check(isinstance(table, dict), where, table, "a table of field = value")
        values = {**self.defaults(arch), **table}
        return {key: self.param(key, f"{where}.{key}").check(f"{where}.{key}", v) for key, v in values.items()}

    def canonical(self, part: dict, field: str, where: str, value: object = None) -> str:
        self.param(field, where, value)
        return field

    def param(self, field: str, where: str, value: object = None) -> Param:
        check(field in self.params, where, value, f"unknown field; expected one of {tuple(self.params)}")
        return self.params[field]

    def kind(self, part: dict, field: str) -> str:
        return self.params[field].kind

    def set(self, part: dict, field: str, value: object, where: str) -> dict:
        return {**part, field: self.params[field].check(where, value)}


def _int32(low: int = 0, high: int = 2**31 - 1) -> Param:
    return Param("int", low, high)


# Kernel fields a sweep may set: short name (as in the kernel TOML / program text) -> field.
KERNEL_ALIASES = {
    "grid": "grid_ctas",
    "threads": "threads_per_cta",
    "regs": "regs_per_thread",
    "smem_bytes": "dynamic_smem_bytes",
    "cta_spread": "trips_cta_spread",
    "warp_spread": "trips_warp_spread",
    "if_probability": "branch_if_probability",
}
# Out-of-range resources (threads > 1024, too many registers, ...) are not errors here: such a
# point cannot launch and the sweep marks it infeasible (jaxsched.sweep).
KERNEL = {
    "grid_ctas": _int32(1),
    "threads_per_cta": _int32(1),
    "regs_per_thread": _int32(0),
    "dynamic_smem_bytes": _int32(0),
    "static_smem_bytes": _int32(0),
    "trips": _int32(0, 2**24 - 1),
    "trips_cta_spread": _int32(0, 2**24 - 1),
    "trips_warp_spread": _int32(0, 2**24 - 1),
    "branch_if_probability": Param("float", 0.0, 1.0),
    "l2_hit_rate": Param("float", 0.0, 1.0),
    "seed": _int32(-(2**31)),
    "grid_sync_ns": Param("float", 0.0, 1e6),
    "threads_fixed_work": _int32(1),
}
# Fields whose every limit is a limit on the value alone (its `Param`): whether a point can
# launch, and the engine's checks of a whole configuration, do not depend on them.
VALUE_ONLY = {"kernel.l2_hit_rate", "kernel.branch_if_probability", "kernel.seed", "kernel.trips_cta_spread",
              "kernel.grid_sync_ns"}
_NEEDS = {"trips": "loop", "trips_cta_spread": "loop", "trips_warp_spread": "loop",
          "branch_if_probability": "branch"}


@dataclasses.dataclass(frozen=True)
class PytreeGroup:
    """Scalar fields of the point's `Arch` or `Kernel` (`params`: the allowed fields and their
    limits; None: every scalar numeric field, checked by the pytree itself)."""

    params: Mapping[str, Param] | None = None
    aliases: Mapping[str, str] = dataclasses.field(default_factory=dict)

    def fields(self, part) -> list[str]:
        if self.params is not None:
            return list(self.params)
        return [f.name for f in dataclasses.fields(part) if not f.metadata.get("static")
                and np.ndim(getattr(part, f.name)) == 0]

    def canonical(self, part, field: str, where: str, value: object = None) -> str:
        name = self.aliases.get(field, field)
        known = self.fields(part)
        check(name in known, where, value, f"sweepable fields: {tuple(self.aliases) + tuple(known)}")
        return name

    def kind(self, part, field: str) -> str:
        if self.params is not None:
            return self.params[field].kind
        return _number_kind(np.asarray(getattr(part, field)).dtype)

    def set(self, part, field: str, value: object, where: str):
        value = (self.params[field] if self.params is not None else Param(self.kind(part, field))).check(where, value)
        old = np.asarray(getattr(part, field))
        if np.issubdtype(old.dtype, np.integer):
            info = np.iinfo(old.dtype)
            check(info.min <= value <= info.max, where, value, f"fits {old.dtype} ({info.min} .. {info.max})")
        try:
            return part.replace(**{field: np.asarray(value, dtype=old.dtype)})
        except JaxschedError as exc:
            raise JaxschedError(where, value, exc.limit) from None


@dataclasses.dataclass(frozen=True)
class KernelGroup(PytreeGroup):
    """`kernel.*`: loop and branch fields need a program with a loop / an if; the derived field
    `threads_fixed_work` sets the threads per CTA and rescales the grid to keep the spec
    kernel's total thread count (rounded up)."""

    def set(self, kernel: Kernel, field: str, value: object, where: str) -> Kernel:
        data = {"loop": bool(np.any(kernel.trips_from_data)), "branch": bool(np.any(kernel.if_from_data))}
        if field in ("grid_ctas", "threads_per_cta", "threads_fixed_work"):
            check(not any(data.values()), where, value, "the kernel takes its work from arrays sized for its "
                  "grid and CTA shape (`loop @NAME`, `if @NAME`): sweep kernels (kernel.variant) instead")
        if field in _NEEDS:
            check(not data[_NEEDS[field]], where, value, f"the kernel's {_NEEDS[field]} takes its values from an "
                  "array (`@NAME`), not from this field")
        if field == "threads_fixed_work":
            threads = self.params[field].check(where, value)
            total = int(kernel.grid_ctas) * int(kernel.threads_per_cta)
            grid = -(-total // threads)
            check(grid <= INT32_MAX, where, value,
                  f"the kernel's {total} threads in CTAs of {threads} make a grid of {grid} CTAs, beyond {INT32_MAX}")
            return kernel.replace(threads_per_cta=np.asarray(threads, np.int32), grid_ctas=np.asarray(grid, np.int32))
        if field in _NEEDS:
            what = _NEEDS[field]
            count = kernel.n_loops if what == "loop" else kernel.n_branches
            check(count > 0, where, value, f"the kernel's program has no {what}")
            check(count == 1, where, value, f"a program with one {what} (this one has {count}): the field sets "
                  f"that {what}'s value; sweep kernels (kernel.variant) for programs of several")
            value = (self.params[field] if self.params is not None else Param(self.kind(kernel, field))).check(
                where, value)
            entries = np.array(getattr(kernel, field))
            entries[0] = value
            try:
                return kernel.replace(**{field: entries})
            except JaxschedError as exc:
                raise JaxschedError(where, value, exc.limit) from None
        return super().set(kernel, field, value, where)


def _clock_defaults(arch: Arch) -> dict:
    return {"model": "gaussian", "mean_ghz": float(arch.boost_clock_ghz), "sigma": 0.0, "sigma_die": 0.0,
            "corr_length_mm": float(freqmap.default_corr_length_mm(arch)), "ir_drop": False}


def _dvfs_defaults(arch: Arch) -> dict:
    d = dvfs.default(arch, mode="off")
    values = {f.name: np.asarray(getattr(d, f.name)).item() for f in dataclasses.fields(d)
              if np.ndim(getattr(d, f.name)) == 0 and f.name not in DVFS_CHOICES}
    del values["latency_us"]  # unless given: one period (dvfs.default), whatever the period
    return {**values, "mode": "off", "clock_domain": "chip", "thermal_domain": "sm",
            "run_to_run": False, "r2r_temp_min_c": 35.0, "r2r_temp_max_c": 85.0,
            "r2r_clock_min_mhz": values["min_mhz"], "r2r_clock_max_mhz": values["boost_mhz"]}


DVFS_CHOICES = {"mode": dvfs.MODES, "clock_domain": dvfs.DOMAINS, "thermal_domain": dvfs.DOMAINS}
# `[dvfs]`: every scalar `Dvfs` field (docs/model.md section 12; `dvfs.validate_dvfs` checks the
# combination), plus the run-to-run draw: with `run_to_run = true` each replicate draws its
# initial temperature in [r2r_temp_min_c, r2r_temp_max_c], its initial clock on the bin grid in
# [r2r_clock_min_mhz, r2r_clock_max_mhz], its controller phase and its sensor-noise seed.
DVFS_PARAMS = {
    **{name: Param("choice", choices=choices) for name, choices in DVFS_CHOICES.items()},
    **{f.name: Param("int" if f.name in ("seed", "trace_every") else "float")
       for f in dataclasses.fields(dvfs.Dvfs) if f.name not in DVFS_CHOICES and f.name != "energy_pj"},
    "run_to_run": Param("bool"),
    "r2r_temp_min_c": Param("float", -50.0, 300.0),
    "r2r_temp_max_c": Param("float", -50.0, 300.0),
    "r2r_clock_min_mhz": Param("float", 1.0, 10_000.0),
    "r2r_clock_max_mhz": Param("float", 1.0, 10_000.0),
}

@dataclasses.dataclass(frozen=True)
class WorkloadGroup(TableGroup):
    """`[workload]`: the spec's kernel launched `launches` times (0: one plain launch without
    launch overhead), launch `l` on stream `l mod streams`, in `mode` "stream" or "graph", with
    the architecture's launch overheads unless given (docs/model.md section 13). `launches` and
    `streams` fix the engine's static structure, so they are set in the table, never swept."""

    def set(self, part: dict, field: str, value: object, where: str) -> dict:
        check(field not in STATIC_WORKLOAD, where, value,
              f"workload.{field} fixes the engine's static structure: set it in [workload], do not sweep it")
        return super().set(part, field, value, where)


STATIC_WORKLOAD = ("launches", "streams")


def _workload_defaults(arch: Arch) -> dict:
    return {"launches": 0, "streams": 1, "mode": "stream",
            **{key: float(getattr(arch, key)) for key in workload.OVERHEAD_FIELDS}}


WEIGHTS = ("clocks", "uniform")
CLOCK_MODELS = ("gaussian", "variation")

GROUPS: dict[str, TableGroup | PytreeGroup] = {
    "policy": TableGroup(
        {"warp": Param("choice", choices=WARP_POLICIES),
         "dispatch": Param("choice", choices=(*DISPATCH_POLICIES, FITTED_DISPATCH)),  # fitted: [policy] fitted
         "dispatch_start": _int32(),
         # weighted dispatch: per-SM weights = the SM clocks in MHz, or all equal
         "weights": Param("choice", choices=WEIGHTS),
         # closed-loop dispatch: EMA smoothing factor and initial CTA-duration estimate
         "ema_alpha": Param("float", 0.0, 1.0),
         "ema_prior_ns": Param("float", 0.0, 1e8, high_open=True),
         # closed-loop dispatch: the tail hold's margin, a share of the CTA-duration estimate
         "hold_margin": Param("float", 0.0, 1.0),
         # and a multiple of the SM's deviation (the smoothed standard deviation of its CTA durations)
         "hold_noise": Param("float", 0.0, MAX_HOLD_NOISE),
         # the hold's score: weight of each later CTA a better slot finishes first, and of the CTAs left
         "hold_queue": Param("float", 0.0, MAX_HOLD_QUEUE),
         "hold_left": Param("float", 0.0, MAX_HOLD_LEFT)},
        lambda arch: {"warp": DEFAULT_WARP_POLICY, "dispatch": DEFAULT_DISPATCH, "dispatch_start": DEFAULT_DISPATCH_START,
                      "weights": "clocks", "ema_alpha": DEFAULT_EMA_ALPHA, "ema_prior_ns": DEFAULT_EMA_PRIOR_NS,
                      "hold_margin": DEFAULT_HOLD_MARGIN, "hold_noise": DEFAULT_HOLD_NOISE,
                      "hold_queue": DEFAULT_HOLD_QUEUE, "hold_left": DEFAULT_HOLD_LEFT}),
    "clocks": TableGroup(
        {"model": Param("choice", choices=CLOCK_MODELS),
         "mean_ghz": Param("float", 0.0, low_open=True),
         "sigma": Param("float", 0.0),
         "sigma_die": Param("float", 0.0),
         "corr_length_mm": Param("float", 0.0),
         "ir_drop": Param("bool")},
        _clock_defaults),
    "dvfs": TableGroup(DVFS_PARAMS, _dvfs_defaults),
    "workload": WorkloadGroup(
        {"launches": _int32(0, workload.MAX_LAUNCHES),
         "streams": _int32(1, workload.MAX_LAUNCHES),
         "mode": Param("choice", choices=workload.MODES),
         **{key: Param("float", 0.0, workload.MAX_OVERHEAD_NS) for key in workload.OVERHEAD_FIELDS}},
        _workload_defaults),
    "kernel": KernelGroup(KERNEL, KERNEL_ALIASES),
    "arch": PytreeGroup(),
}
# Groups given by a table of the spec (`[policy]`, ...): those with `base(table, arch, where)`.
TABLES = tuple(name for name, g in GROUPS.items() if callable(getattr(g, "base", None)))


def split(path: str, where: str, value: object = None) -> tuple[str, str]:
    """(group, field) of a dotted path; the field as written (aliases resolved by `canonical`)."""
    group, dot, field = str(path).partition(".")
    check(bool(dot) and group in GROUPS, where, value,
          f"paths are group.field with group one of {tuple(GROUPS)}")
    return group, field


# `kernel.variant`: the whole kernel, one of the spec's `[kernels]` (name -> kernel); it must be
# the first swept kernel path, since it replaces every kernel field.
VARIANT = "kernel.variant"
VARIANTS = "kernel_variants"  # the point's key holding the spec's named kernels


def canonical(point: Point, path: str, where: str, value: object = None) -> str:
    """The path with aliases resolved (`kernel.threads` -> `kernel.threads_per_cta`); checks it."""
    if path == VARIANT:
        check(bool(point.get(VARIANTS)), where, value, "kernel.variant needs a [kernels] table of named kernels")
        return path
    group, field = split(path, where, value)
    return f"{group}.{GROUPS[group].canonical(point[group], field, where, value)}"


def kind(point: Point, path: str, where: str, value: object = None) -> str:
    """The value type of a path: one of `KINDS`."""
    if canonical(point, path, where, value) == VARIANT:
        return "choice"
    group, field = canonical(point, path, where, value).split(".", 1)
    return GROUPS[group].kind(point[group], field)


def assign(point: Point, path: str, value: object, where: str) -> dict:
    """A copy of `point` with `path` set to `value` (validated; errors name `where`)."""
    if canonical(point, path, where, value) == VARIANT:
        variants = point[VARIANTS]
        check(value in variants, where, value, f"one of the [kernels]: {tuple(variants)}")
        return {**point, "kernel": variants[value]}
    group, field = canonical(point, path, where, value).split(".", 1)
    return {**point, group: GROUPS[group].set(point[group], field, value, where)}


def writes(path: str) -> set[str]:
    """Canonical paths a canonical path sets (for conflicts between swept paths)."""
    if path == "kernel.threads_fixed_work":
        return {path, "kernel.threads_per_cta", "kernel.grid_ctas"}
    return {path}


def assign_all(point: Point, assignments: Sequence[tuple[str, object]], where: str) -> dict:
    for path, value in assignments:
        point = assign(point, path, value, f"{where}: {path}")
    return dict(point)
