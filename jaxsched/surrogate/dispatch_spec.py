"""`jaxsched fit dispatch SPEC`: the spec, the training problem, and the exact-engine evaluation.

Spec (TOML; see `sweeps/fit_dispatch.toml` and docs/surrogate.md):

    title = "..."
    arch = "h200"                  # preset name or arch TOML path (relative to the spec)
    warp_policy = "gto"
    seed = 0
    families = ["weighted", "closed_loop"]      # what to fit (dispatch_fit.FAMILIES)
    [[kernels]]                    # one table per kernel: a kernel TOML file and/or inline fields
    file = "kernels/compute_bound.toml"
    grid = 4224                    # inline fields override the file's
    [clocks]                       # frequency maps, as a sweep's [clocks] (gaussian or variation)
    model = "gaussian"
    mean_ghz = 1.8
    sigma = 0.1                    # or a list: map i draws with sigma[i % len], so that one fit
                                   # weighs uniform and unequal chips together
    train_maps = 8                 # chips the fit sees
    test_maps = 8                  # other chips, for the exact-engine evaluation
    [fit]
    steps = 40
    learning_rate = 0.1
    temperature = 0.05             # the soft surrogate's temperature (docs/surrogate.md)
    mode = "soft"                  # or "straight_through": descend the hard surrogate's makespan
                                   # along the soft one's gradient (dispatch_fit.fit)
    per_chip = false               # true: one theta per training chip (evaluated on that chip)
    method = "surrogate"           # or "engine": the best of ENGINE_GRID in the exact engine
    uniform_tolerance = 0.005      # "engine" only, optional: admit only candidates at most this
                                   # much slower than hardware dispatch on every uniform (sigma 0)
                                   # training chip and kernel
    objective = "fluid"            # "engine" only: rank candidates by mean makespan / fluid bound,
                                   # or "recovered": by their mean share of hardware dispatch's gap
                                   # to the clairvoyant schedule on the unequal training chips

Train map `i` draws its clocks from seed `seed * 1_000_003 + i`, test map `j` from
`seed * 1_000_003 + 500_000 + j`: the two sets never share a chip.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Callable
from pathlib import Path

import jax.numpy as jnp
import numpy as np
import xarray as xr

from .. import archio, bounds, clocks, fitted_policy, presets, tomldoc
from ..arch import Arch
from ..engine.run import simulate_batch
from ..errors import INT32_MAX, check
from ..issue_bound import IssueDemand, issue_demand, issue_ns
from ..kernel import Kernel, kernel_from_dict
from ..lower import DISPATCH_POLICIES, WARP_POLICIES
from ..policies import DEFAULT_WARP_POLICY, FITTED_DISPATCH
from ..sweep import MAX_SEED, clock_map
from . import dispatch_fit as df
from .launch import (
    dispatch_params,
    make_launch,
    stack_launches,
    uniform_runs,
    work_from_runs,
)
from .relax import schedule

_TOP = ("title", "arch", "warp_policy", "seed", "families", "kernels", "clocks", "fit")
_CLOCKS = {"model": "gaussian", "mean_ghz": 1.8, "sigma": 0.1, "sigma_die": 0.0, "corr_length_mm": None,
           "ir_drop": False, "train_maps": 8, "test_maps": 8}
_FIT = {"steps": 40, "learning_rate": 0.1, "temperature": 0.05, "mode": "soft", "per_chip": False,
        "method": "surrogate",
        "uniform_tolerance": None, "objective": "fluid"}
# How `theta` is fitted: Adam through the soft surrogate, or the best of `ENGINE_GRID` in the exact
# engine on the training chips (families in `ENGINE_GRID` only, one theta for every chip).
METHODS = ("surrogate", "engine")
# What `method = "engine"` minimises over the candidates (`engine_search`).
OBJECTIVES = ("fluid", "recovered")
# The candidates of `method = "engine"`: every combination of these EMA smoothings, hold margins
# (1/256: the engine's smallest above 0; 255/256: practically never hold) and, for
# `closed_loop_noise`, deviations in the margin (at least 1/4: a weight of 0 is the tail family).
# Smoothings down to 1/16 let an SM's estimate average out CTA-to-CTA noise (the memory-mix
# kernel's trip counts vary by a factor of 3), which a small margin needs on uniform chips.
ENGINE_GRID = {"closed_loop_tail": {"ema_alpha": (1 / 16, 1 / 8, 1 / 4, 1 / 2),
                                    "hold_margin": (1 / 256, 1 / 32, 1 / 16, 3 / 32, 1 / 8, 3 / 16, 1 / 4,
                                                    255 / 256)},
               "closed_loop_noise": {"ema_alpha": (1 / 16, 1 / 8, 1 / 4),
                                     "hold_margin": (1 / 32, 1 / 16, 1 / 8, 3 / 16),
                                     "hold_noise": (1 / 4, 1 / 2, 1, 2)},
               # the hold score's queue weight from 1/4 (0 is the tail family) and CTAs-left weight
               "closed_loop_score": {"ema_alpha": (1 / 8, 1 / 4), "hold_margin": (1 / 32, 1 / 16, 1 / 8),
                                     "hold_queue": (1 / 4, 1 / 2, 1), "hold_left": (1 / 2, 1, 2)},
               "clock_regression": {"hold_margin": (1 / 256, 1 / 32, 1 / 16, 3 / 32, 1 / 8, 3 / 16, 1 / 4,
                                                    255 / 256)}}
_KERNEL_KEYS = ("file", "name", "program", "grid", "threads", "regs", "smem_bytes", "static_smem_bytes",
                "l2_hit_rate", "seed")
TEST_SEED_OFFSET = 500_000
# closed_loop_per_sm needs per-SM priors
ENGINE_FAMILIES = ("weighted", "closed_loop", "closed_loop_tail", "closed_loop_noise", "closed_loop_score",
                   "clock_regression")
# What `simulate_batch` takes per configuration of the dispatch policies' numbers, and its
# defaults: a fitted-policy file's fields.
_DISPATCH_NUMBERS = fitted_policy.DEFAULTS


@dataclasses.dataclass(frozen=True)
class DispatchSpec:
    title: str
    text: str
    arch: Arch
    warp_policy: str
    seed: int
    families: tuple[str, ...]
    kernels: tuple[Kernel, ...]
    clocks: dict
    fit: dict

    def map_seed(self, i: int, test: bool) -> int:
        return self.seed * 1_000_003 + (TEST_SEED_OFFSET if test else 0) + i

    def map_sigma(self, i: int) -> float:
        """The clock spread map `i` (train or test) is drawn with: `clocks.sigma` in turn."""
        return self.clocks["sigma"][i % len(self.clocks["sigma"])]

    def map_clocks(self, i: int, test: bool) -> clocks.Clocks:
        """Train or test map `i`."""
        return clock_map(self.arch, {**self.clocks, "sigma": self.map_sigma(i)}, self.map_seed(i, test))


def _is_int(v: object) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


def _is_real(v: object) -> bool:
    return isinstance(v, (int, float)) and not isinstance(v, bool)


def _table(doc: dict, key: str, defaults: dict, source: str) -> dict:
    table = {**defaults, **doc.get(key, {})}
    for k, v in table.items():
        check(k in defaults, f"{source}: {key}.{k}", v, f"unknown key; expected one of {tuple(defaults)}")
    return table


def _kernel(entry: dict, base_dir: Path, source: str, i: int) -> Kernel:
    where = f"{source}: kernels[{i}]"
    check(isinstance(entry, dict), where, entry, "a table ([[kernels]])")
    for k, v in entry.items():
        check(k in _KERNEL_KEYS, f"{where}.{k}", v, f"unknown key; expected one of {_KERNEL_KEYS}")
    fields = {}
    if "file" in entry:
        fields = dict(tomldoc.read(base_dir / entry["file"], f"{where}.file").get("kernel", {}))
    fields.update({k: v for k, v in entry.items() if k != "file"})
    fields.setdefault("name", f"kernel{i}")
    return kernel_from_dict(fields, where)


def loads(text: str, base_dir: Path = Path("."), source: str = "<spec>") -> DispatchSpec:
    doc = tomldoc.parse(text, source)
    for key in doc:
        check(key in _TOP, f"{source}: {key}", doc[key], f"unknown key; expected one of {_TOP}")
    arch_spec = str(doc.get("arch", "h200"))
    arch = archio.load(base_dir / arch_spec) if arch_spec.endswith(".toml") else presets.get(arch_spec)
    warp = doc.get("warp_policy", DEFAULT_WARP_POLICY)
    check(warp in WARP_POLICIES, f"{source}: warp_policy", warp, f"one of {WARP_POLICIES}")
    families = tuple(doc.get("families", [f for f in ENGINE_FAMILIES if f not in df.ENGINE_ONLY_FAMILIES]))
    check(len(families) >= 1, f"{source}: families", families, "at least one family")
    for fam in families:
        check(fam in ENGINE_FAMILIES, f"{source}: families", fam,
              f"each one of {ENGINE_FAMILIES} (the families the exact engine can run)")
    kernels = doc.get("kernels", [])
    check(isinstance(kernels, list) and len(kernels) >= 1, f"{source}: kernels", kernels,
          "at least one [[kernels]] table")
    kernels = tuple(_kernel(k, base_dir, source, i) for i, k in enumerate(kernels))
    names = [k.name for k in kernels]
    check(len(set(names)) == len(names), f"{source}: kernels", names, "distinct kernel names")
    clk = _table(doc, "clocks", _CLOCKS, source)
    check(clk["model"] in ("gaussian", "variation"), f"{source}: clocks.model", clk["model"],
          "gaussian or variation")
    for key in ("train_maps", "test_maps"):
        check(_is_int(clk[key]) and 1 <= clk[key] <= 4096, f"{source}: clocks.{key}", clk[key],
              "an integer in 1 .. 4096")
    sigmas = clk["sigma"] if isinstance(clk["sigma"], list) else [clk["sigma"]]
    check(len(sigmas) >= 1 and all(_is_real(x) and 0 <= x < 1 for x in sigmas), f"{source}: clocks.sigma",
          clk["sigma"], "a number in [0, 1), or a non-empty list of them")
    clk["sigma"] = tuple(float(x) for x in sigmas)
    if clk["corr_length_mm"] is None:
        from ..freqmap import default_corr_length_mm

        clk["corr_length_mm"] = float(default_corr_length_mm(arch))
    fit = _table(doc, "fit", _FIT, source)
    check(_is_int(fit["steps"]) and 1 <= fit["steps"] <= INT32_MAX, f"{source}: fit.steps", fit["steps"],
          f"an integer in 1 .. {INT32_MAX}")
    for key in ("learning_rate", "temperature"):
        check(_is_real(fit[key]) and 0 < fit[key] < np.inf, f"{source}: fit.{key}", fit[key], "a finite number > 0")
    seed = doc.get("seed", 0)
    check(_is_int(seed) and 0 <= seed <= MAX_SEED, f"{source}: seed", seed, f"an integer in 0 .. {MAX_SEED}")
    check(isinstance(fit["per_chip"], bool), f"{source}: fit.per_chip", fit["per_chip"], "true or false")
    check(fit["mode"] in ("soft", "straight_through"), f"{source}: fit.mode", fit["mode"],
          "soft or straight_through")
    check(fit["method"] in METHODS, f"{source}: fit.method", fit["method"], f"one of {METHODS}")
    if fit["method"] == "engine":
        for fam in families:
            check(fam in ENGINE_GRID, f"{source}: families", fam,
                  f'each one of {tuple(ENGINE_GRID)} with fit.method = "engine"')
        check(not fit["per_chip"], f"{source}: fit.per_chip", True, 'false with fit.method = "engine"')
    else:
        for fam in families:
            check(fam not in df.ENGINE_ONLY_FAMILIES, f"{source}: families", fam,
                  'a family the surrogate models, or fit.method = "engine"')
    tol = fit["uniform_tolerance"]
    if tol is not None:
        check(_is_real(tol) and 0 <= tol < 1, f"{source}: fit.uniform_tolerance", tol, "a number in [0, 1)")
        check(fit["method"] == "engine", f"{source}: fit.uniform_tolerance", tol, 'set only with fit.method = "engine"')
        check(0 in sigmas[: clk["train_maps"]], f"{source}: fit.uniform_tolerance", tol,  # map i: sigma[i % len]
              "set only where a training map is uniform (a clocks.sigma of 0 among the first train_maps)")
        fit["uniform_tolerance"] = float(tol)
    objective = fit["objective"]
    check(objective in OBJECTIVES, f"{source}: fit.objective", objective, f"one of {OBJECTIVES}")
    if objective == "recovered":
        check(fit["method"] == "engine", f"{source}: fit.objective", objective, 'set only with fit.method = "engine"')
        check(any(s > 0 for s in sigmas[: clk["train_maps"]]), f"{source}: fit.objective", objective,
              "set only where a training map is unequal (a clocks.sigma > 0 among the first train_maps)")
    return DispatchSpec(title=str(doc.get("title", source)), text=text, arch=arch, warp_policy=warp,
                        seed=seed, families=families, kernels=kernels, clocks=clk, fit=fit)


def load(path: str | Path) -> DispatchSpec:
    p = Path(path)
    return loads(tomldoc.read_text(p, "dispatch spec"), base_dir=p.parent, source=str(p))


# ----------------------------------------------------------------------------- problem


@dataclasses.dataclass(frozen=True)
class Prepared:
    """Per kernel: the surrogate's work, the fluid bound's slot work and issue demand, and the
    SM-attributed work (a tighter fluid bound, not strict); per map: the clocks."""

    works: tuple[bounds.Work, ...]
    works_bound: tuple[bounds.Work, ...]
    demands: tuple[IssueDemand, ...]
    works_sm: tuple[bounds.Work, ...]
    train_clocks: tuple[clocks.Clocks, ...]
    test_clocks: tuple[clocks.Clocks, ...]


def prepare(spec: DispatchSpec) -> Prepared:
    """Measure every kernel's work (two exact uniform-chip runs each) and draw the clock maps."""
    works, works_bound, demands, works_sm = [], [], [], []
    for kernel in spec.kernels:
        runs = uniform_runs(spec.arch, kernel, spec.warp_policy)
        works.append(work_from_runs(*runs, float(spec.arch.cta_launch_ns)))
        works_bound.append(bounds.work_from_uniform(*runs))
        demands.append(issue_demand(runs[0], spec.arch, kernel))
        works_sm.append(bounds.work_from_uniform(*runs, attribution="sm"))
    draw = lambda n, test: tuple(spec.map_clocks(i, test) for i in range(n))
    return Prepared(tuple(works), tuple(works_bound), tuple(demands), tuple(works_sm),
                    draw(spec.clocks["train_maps"], False), draw(spec.clocks["test_maps"], True))


def fluid_parts_ns(work: bounds.Work, demand: IssueDemand, sm_freq_mhz: np.ndarray) -> tuple[float, float]:
    """The two fluid lower bounds of a launch on a chip: slot occupancy (`bounds.fluid_ns`) and
    issue slots with launch credit (`issue_bound.issue_ns`); the fluid lower bound is the larger."""
    f = jnp.asarray(sm_freq_mhz)
    return float(bounds.fluid_ns(work, f)), float(issue_ns(demand, f))


def _mhz(clk: clocks.Clocks) -> np.ndarray:
    return np.asarray(clk.sm_freq_mhz, np.float32)


def problem(spec: DispatchSpec, prep: Prepared) -> tuple[df.Problem, int]:
    """The training configurations (train maps x kernels, map-major) and the slot width."""
    launches, fluid, group = [], [], []
    for i, clk in enumerate(prep.train_clocks):
        for kernel, work, work_bound, demand in zip(spec.kernels, prep.works, prep.works_bound, prep.demands):
            launches.append(make_launch(spec.arch, kernel, _mhz(clk), work))
            fluid.append(max(fluid_parts_ns(work_bound, demand, _mhz(clk))))
            group.append(i)
    stacked = stack_launches(launches)
    return (df.Problem(launch=stacked, fluid_ns=jnp.asarray(fluid, jnp.float32), group=jnp.asarray(group, jnp.int32)),
            stacked.work.slots_per_sm)


# ----------------------------------------------------------------------------- evaluation

REFERENCE_POLICIES = ("hardware", "weighted_clocks", "closed_loop_default")


def _reference_inputs(label: str) -> dict:
    return {"hardware": {"dispatch": "hardware"}, "weighted_clocks": {"dispatch": "weighted"},
            "closed_loop_default": {"dispatch": "closed_loop"}}[label]


def _surrogate_params(label: str, fits: dict[str, df.FitResult], group: int, launch, arch: Arch):
    """(policy, DispatchParams) of a reference or learned policy in the surrogate."""
    if label in REFERENCE_POLICIES:
        policy = _reference_inputs(label)["dispatch"]
        return policy, dispatch_params(arch, np.asarray(launch.sm_freq_mhz))
    family = label.removesuffix("_fit")
    theta = {k: jnp.asarray(v[group]) for k, v in fits[family].theta.items()}
    return df.ENGINE_POLICY[family], df.params_for(family, theta, launch)


def evaluate(spec: DispatchSpec, prep: Prepared, fits: dict[str, df.FitResult], max_slots: int,
             progress: Callable[[str], None] | None = None) -> xr.Dataset:
    """Every policy (reference and learned) in the exact engine on the evaluation maps (the test
    maps; with `per_chip`, each training chip under its own fit), with the bounds, the makespan
    of a uniform chip at the map's mean clock and the hard surrogate's prediction."""
    per_chip = bool(spec.fit["per_chip"])
    maps = prep.train_clocks if per_chip else prep.test_clocks
    labels = list(REFERENCE_POLICIES) + [f"{fam}_fit" for fam in fits]
    n_k, n_m, n_p = len(spec.kernels), len(maps), len(labels)
    shape = (n_k, n_m, n_p)
    makespan, predicted = np.full(shape, np.nan), np.full(shape, np.nan)
    fluid_slot, fluid_issue, fluid_sm, clair, uniform_eq = (np.full((n_k, n_m), np.nan) for _ in range(5))
    wp = WARP_POLICIES.index(spec.warp_policy)
    for ki, (kernel, work, work_bound, demand, work_sm) in enumerate(
            zip(spec.kernels, prep.works, prep.works_bound, prep.demands, prep.works_sm)):
        if progress:
            progress(f"exact engine: {kernel.name}, {n_m} maps x {n_p} policies + uniform-equivalent chips")
        configs, kwargs = [], []
        for mi, clk in enumerate(maps):
            launch = make_launch(spec.arch, kernel, _mhz(clk), work)
            d = float(df.mean_occupancy_ns(launch))
            fluid_slot[ki, mi], fluid_issue[ki, mi] = fluid_parts_ns(work_bound, demand, _mhz(clk))
            clair[ki, mi] = float(bounds.clairvoyant_ns(work_bound, jnp.asarray(_mhz(clk))))
            fluid_sm[ki, mi] = float(bounds.fluid_ns(work_sm, jnp.asarray(_mhz(clk))))
            for pi, label in enumerate(labels):
                if label in REFERENCE_POLICIES:
                    kw = _reference_inputs(label)
                else:
                    fam = label.removesuffix("_fit")
                    theta = {k: float(v[mi if per_chip else 0]) for k, v in fits[fam].theta.items()}
                    kw = df.engine_inputs(fam, theta, spec.arch, _mhz(clk), d)
                configs.append((clk, kw))
                kwargs.append((mi, pi))
                if label.removesuffix("_fit") in df.ENGINE_ONLY_FAMILIES:
                    continue  # the surrogate does not model it: no prediction (NaN)
                policy, params = _surrogate_params(label, fits, mi if per_chip else 0, launch, spec.arch)
                predicted[ki, mi, pi] = float(schedule(launch, params, 0.0, policy=policy, mode="hard",
                                                       max_slots=max_slots).makespan_ns)
            mean_mhz = float(np.mean(_mhz(clk)[np.asarray(spec.arch.sm_enabled)]))
            configs.append((clocks.uniform(spec.arch, round(mean_mhz) / 1000.0), {"dispatch": "hardware"}))
            kwargs.append((mi, -1))
        n = len(configs)
        result = simulate_batch(
            [spec.arch] * n, [kernel] * n, [c for c, _ in configs], [wp] * n,
            [DISPATCH_POLICIES.index(kw["dispatch"]) for _, kw in configs], [0] * n,
            dispatch_weight=[kw.get("dispatch_weight") for _, kw in configs],
            **{k: np.asarray([kw.get(k, v) for _, kw in configs]) for k, v in _DISPATCH_NUMBERS.items()})
        for (mi, pi), value in zip(kwargs, np.asarray(result.makespan_ns)):
            if pi < 0:
                uniform_eq[ki, mi] = value
            else:
                makespan[ki, mi, pi] = value
    dims3, dims2 = ("kernel", "map", "policy"), ("kernel", "map")
    ns = lambda a, long_name: (a, {"long_name": long_name, "units": "ns"})
    ds = xr.Dataset(
        {
            "makespan_ns": (dims3, *ns(makespan, "exact-engine makespan")),
            "surrogate_ns": (dims3, *ns(predicted, "hard surrogate's makespan")),
            "fluid_ns": (dims2, *ns(np.maximum(fluid_slot, fluid_issue),
                                    "fluid lower bound (the larger of fluid_slot_ns and fluid_issue_ns)")),
            "fluid_slot_ns": (dims2, *ns(fluid_slot, "fluid bound on slot occupancy (bounds.fluid_ns)")),
            "fluid_issue_ns": (dims2, *ns(fluid_issue, "fluid bound on issue slots and launch credit "
                                                       "(issue_bound.issue_ns)")),
            "fluid_sm_ns": (dims2, *ns(fluid_sm, "fluid bound on SM-attributed work (tighter, not strict)")),
            "clairvoyant_ns": (dims2, *ns(clair, "clairvoyant earliest-finish schedule (slot work)")),
            "uniform_equivalent_ns": (dims2, *ns(uniform_eq, "exact engine on a uniform chip at the map's mean clock")),
        },
        coords={"kernel": [k.name for k in spec.kernels],
                "map": [spec.map_seed(i, not per_chip) for i in range(n_m)], "policy": labels},
    )
    ds["sigma"] = ("map", [spec.map_sigma(i) for i in range(n_m)], {"long_name": "the map's per-SM clock spread"})
    ds["gap_fluid"] = ds.makespan_ns / ds.fluid_ns - 1.0
    ds["gap_fluid"].attrs = {"long_name": "makespan / fluid bound - 1", "units": "1"}
    ds["gap_uniform"] = ds.makespan_ns / ds.uniform_equivalent_ns - 1.0
    ds["gap_uniform"].attrs = {"long_name": "makespan / uniform-equivalent makespan - 1", "units": "1"}
    return ds


def fit_dataset(spec: DispatchSpec, fits: dict[str, df.FitResult], evaluation: xr.Dataset) -> xr.Dataset:
    """Loss curves and learned parameters, merged with the evaluation."""
    n_groups = max(r.loss.shape[1] for r in fits.values())
    steps = max(r.loss.shape[0] for r in fits.values())
    loss = np.full((len(fits), steps, n_groups), np.nan)
    data = {}
    for i, (fam, r) in enumerate(fits.items()):
        loss[i, : r.loss.shape[0], : r.loss.shape[1]] = r.loss
        for name, value in r.theta.items():
            data[f"{fam}_{name}"] = ("chip", np.pad(value, (0, n_groups - len(value)), constant_values=np.nan),
                                     {"long_name": f"learned {name} of the {fam} family"})
    if spec.fit["method"] != "engine":
        what = f"mean surrogate makespan / fluid bound ({'hard' if spec.fit['mode'] == 'straight_through' else 'soft'})"
    elif spec.fit["objective"] == "fluid":
        what = "mean exact-engine makespan / fluid bound of each candidate (step: candidate)"
    else:
        what = ("minus the mean recovered share of hardware dispatch's gap to the clairvoyant schedule on the "
                "unequal training chips, of each candidate (step: candidate)")
    data["loss"] = (("family", "step", "chip"), loss, {"long_name": what, "units": "1"})
    ds = xr.Dataset(data, coords={"family": list(fits), "step": np.arange(steps), "chip": np.arange(n_groups)})
    out = xr.merge([ds, evaluation])
    out.attrs = {"title": spec.title, "arch": spec.arch.name, "warp_policy": spec.warp_policy,
                 "temperature": float(spec.fit["temperature"]), "mode": spec.fit["mode"],
                 "steps": int(spec.fit["steps"]),
                 "learning_rate": float(spec.fit["learning_rate"]), "per_chip": int(spec.fit["per_chip"]),
                 "method": spec.fit["method"],
                 "uniform_tolerance": "none" if spec.fit["uniform_tolerance"] is None
                 else float(spec.fit["uniform_tolerance"]),
                 "objective": spec.fit["objective"], "spec": spec.text}
    return out


def policy_files(ds: xr.Dataset) -> dict[str, str]:
    """Per fitted family in `dispatch_fit.PORTABLE_FAMILIES`, the `jaxsched.fitted_policy` file of
    its learned parameters (`fit_dataset`'s `FAMILY_NAME` variables); none for per-chip fits."""
    if int(ds.attrs["per_chip"]):
        return {}
    out = {}
    for fam in (str(f) for f in ds["family"].values):
        if fam in df.PORTABLE_FAMILIES:
            theta = {name: float(ds[f"{fam}_{name}"].values[0]) for name in df.initial_theta(fam)}
            inputs = df.portable_inputs(fam, theta)
            tried = int(np.isfinite(ds["loss"].sel(family=fam).values[:, 0]).sum())  # steps are padded to the longest
            how = (f"the best of {tried} candidates in the exact engine" if ds.attrs["method"] == "engine"
                   else f"{ds.attrs['steps']} {ds.attrs.get('mode', 'soft')} steps at T = {ds.attrs['temperature']}")
            header = (f"jaxsched fit dispatch: family {fam} of {ds.attrs['title']!r} ({ds.attrs['arch']}), {how}\n"
                      f'a sweep runs it with [policy] dispatch = "{FITTED_DISPATCH}", fitted = "<this file>"')
            out[fam] = fitted_policy.dumps(inputs.pop("dispatch"), inputs, header)
    return out


def engine_search(spec: DispatchSpec, prep: Prepared, prob: df.Problem, family: str) -> df.FitResult:
    """`method = "engine"`: every candidate of `ENGINE_GRID[family]`, and hardware dispatch, in the
    exact engine on every training chip and kernel; `theta` is the candidate with the lowest loss
    (`engine_loss`: by `fit.objective`). With `fit.uniform_tolerance` only candidates at most that
    much slower than hardware dispatch on every uniform training chip and kernel are admitted: a
    mean over chips would otherwise trade a loss on uniform chips for gains on unequal ones. The
    loss curve holds every candidate's, in grid order (`step` indexes the candidates)."""
    grid = ENGINE_GRID[family]
    candidates = [dict(zip(grid, values)) for values in itertools.product(*grid.values())]
    wp = WARP_POLICIES.index(spec.warp_policy)
    n_k, n_m, n_c = len(spec.kernels), len(prep.train_clocks), len(candidates)
    makespan, hardware = np.zeros((n_c, n_m, n_k)), np.zeros((n_m, n_k))
    policy = ([DISPATCH_POLICIES.index(df.ENGINE_POLICY[family])] * (n_c * n_m)
              + [DISPATCH_POLICIES.index("hardware")] * n_m)
    with_hardware = lambda values: np.concatenate([np.repeat(values, n_m), np.zeros(n_m)])  # hardware reads none
    for ki, kernel in enumerate(spec.kernels):
        n = (n_c + 1) * n_m  # the candidates, map-minor, then hardware dispatch on every map
        result = simulate_batch([spec.arch] * n, [kernel] * n, list(prep.train_clocks) * (n_c + 1), [wp] * n,
                                policy, [0] * n,
                                **{k: with_hardware([c.get(k, v) for c in candidates])
                                   for k, v in _DISPATCH_NUMBERS.items()})
        ns = np.asarray(result.makespan_ns, np.float64).reshape(n_c + 1, n_m)
        makespan[:, :, ki], hardware[:, ki] = ns[:n_c], ns[n_c]
    loss = engine_loss(spec, prep, prob, makespan, hardware)
    tol, slower = spec.fit["uniform_tolerance"], np.zeros(n_c)
    if tol is not None:
        uniform = [i for i in range(n_m) if spec.map_sigma(i) == 0]
        slower = (makespan[:, uniform] / hardware[uniform] - 1.0).max(axis=(1, 2))
    best = candidates[best_admitted(loss, slower, tol, family)]
    theta = df.theta_of(family, best)
    return df.FitResult(family=family, theta={k: np.asarray([v], np.float64) for k, v in theta.items()},
                        loss=loss[:, None])


def engine_loss(spec: DispatchSpec, prep: Prepared, prob: df.Problem, makespan_ns: np.ndarray,
                hardware_ns: np.ndarray) -> np.ndarray:
    """[candidate] the loss `engine_search` minimises, from the candidates' exact makespans
    `makespan_ns` [candidate, train map, kernel] and hardware dispatch's `hardware_ns` [train map,
    kernel]. `fit.objective = "fluid"`: the mean makespan over the fluid bound (the surrogate
    fit's objective, measured exactly). `"recovered"`: minus the mean share of hardware dispatch's
    gap to the clairvoyant schedule a candidate wins back (`bounds.recovered`) over the unequal
    (sigma > 0) training chips and kernels, the schedule with the architecture's CTA launch
    latency between a slot's CTAs (as experiments/die_scaling_report.py reports it); a chip
    where hardware dispatch is not above that schedule counts for no candidate."""
    n_m, n_k = hardware_ns.shape
    if spec.fit["objective"] == "fluid":
        fluid = np.asarray(prob.fluid_ns, np.float64).reshape(n_m, n_k)  # map-major, as `problem` stacks them
        return (makespan_ns / fluid).mean(axis=(1, 2))
    unequal = [i for i in range(n_m) if spec.map_sigma(i) > 0]
    launch_ns = float(spec.arch.cta_launch_ns)
    clairvoyant = np.asarray([[float(bounds.clairvoyant_ns(work, jnp.asarray(_mhz(prep.train_clocks[i])), launch_ns))
                               for work in prep.works_bound] for i in unequal])
    shares = bounds.recovered(hardware_ns[unequal], makespan_ns[:, unequal], clairvoyant)
    check(bool(np.isfinite(shares).any()), "fit.objective", "recovered",
          "training chips where hardware dispatch is above the clairvoyant schedule (none is)")
    return -np.nanmean(shares, axis=(1, 2))


def best_admitted(loss: np.ndarray, slower: np.ndarray, tolerance: float | None, family: str) -> int:
    """The index of the lowest-`loss` candidate among those whose slowdown against hardware
    dispatch on the uniform training chips, `slower` [candidate], is at most `tolerance` (every
    candidate without one); an error if none is."""
    admitted = np.ones(len(loss), bool) if tolerance is None else slower <= tolerance
    check(bool(admitted.any()), "fit.uniform_tolerance", tolerance,
          f"a tolerance some {family} candidate meets (the closest is {100 * slower.min():+.2f} % "
          "against hardware dispatch on a uniform training chip)")
    return int(np.argmin(np.where(admitted, loss, np.inf)))


def run(spec: DispatchSpec, progress: Callable[[str], None] | None = None) -> xr.Dataset:
    """Prepare, fit every family, evaluate: the whole `fit dispatch`."""
    say = progress or (lambda message: None)
    say(f"measuring work: {len(spec.kernels)} kernel(s), two uniform-chip runs each")
    prep = prepare(spec)
    prob, max_slots = problem(spec, prep)
    fits = {}
    for fam in spec.families:
        if spec.fit["method"] == "engine":
            n = int(np.prod([len(v) for v in ENGINE_GRID[fam].values()]))
            say(f"fitting {fam} in the exact engine: {n} candidates x {int(prob.fluid_ns.shape[0])} configurations")
            fits[fam] = engine_search(spec, prep, prob, fam)
            continue
        say(f"fitting {fam}: {int(prob.fluid_ns.shape[0])} configurations, {spec.fit['steps']} steps")
        fits[fam] = df.fit(prob, fam, steps=spec.fit["steps"], learning_rate=float(spec.fit["learning_rate"]),
                           temperature=float(spec.fit["temperature"]), max_slots=max_slots,
                           mode=spec.fit["mode"],
                           per_chip=bool(spec.fit["per_chip"]),
                           progress=lambda i, n, v, fam=fam: say(f"  {fam} step {i}/{n}: loss {v:.4f}")
                           if i == 1 or i == n or i % 10 == 0 else None)
    return fit_dataset(spec, fits, evaluate(spec, prep, fits, max_slots, say))
