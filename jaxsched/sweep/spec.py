"""The sweep spec (its format: the package docstring): the `Sweep` it parses into, `load` and
`loads`, the spec's limits (`MAX_SEED`, `MAX_CONFIGS`) and every check made before anything runs:
keys, paths, grid values, design ranges, then each point (can its kernel launch, does it keep the
engine's static shapes, is its `[dvfs]` valid). Also what a spec implies for the engine options
fixed for all its chunks (`uses_dvfs`, `uses_closed_loop`). Parsing and checking live together
so that a spec that loads is one that runs."""

from __future__ import annotations

import dataclasses
import math
from pathlib import Path
from typing import Callable, Iterator, Sequence

import numpy as np

from .. import archio, clocks, fitted_policy, presets, sweep_design, sweep_paths, tomldoc
from ..arch import Arch
from ..dvfs import Dvfs, validate_dvfs
from ..engine.run import any_dvfs
from ..errors import JaxschedError, check
from ..kernel import Kernel, kernel_from_dict, load_kernel, pad_program
from ..lower import cta_slots_for, shapes_for, validate
from ..occupancy import check_launch, occupancy
from ..policies import DEFAULT_FAST_FORWARD, ESTIMATE_DISPATCH, FITTED_DISPATCH
from ..sweep_design import Design
from ..sweep_paths import Point
from .configs import REPLICATE_STRIDE, dvfs_params, launched

_TOP_KEYS = ("title", "arch", "kernel", "kernels", "replicates", "seed", "chunk", "cta_trace", "engine", "grid",
             "design") + sweep_paths.TABLES
_ENGINE_KEYS = ("fast_forward",)
_LAUNCH_GROUPS = ("arch", "kernel")  # the path groups that decide whether a point can launch
MAX_SEED = 2**31 - 1  # a 32-bit seed, as the kernel's and DVFS's: its replicates' seeds fit 64 bits
# The resume record, the feasibility of every point and a design's draws are held in memory, one
# entry per configuration or point: 10^8 configurations take a few GB of host memory.
MAX_CONFIGS = 10**8


@dataclasses.dataclass(frozen=True)
class Sweep:
    """A parsed, validated sweep: the base point, the grid, the design, and per point (grid
    dimensions x design samples) whether it can launch."""

    title: str
    text: str
    base: Point
    grid: dict[str, list]
    design: Design | None
    replicates: int
    seed: int
    chunk: int | None  # configurations per batched call; None: sized to device memory
    cta_trace: bool  # keep the per-CTA trace (SM, start, end, launch) of every configuration
    fast_forward: bool  # the engine jumps recurring steady state (results are the same either way)
    feasible: np.ndarray  # bool, point shape
    infeasible_reason: np.ndarray  # str, point shape ("" where feasible)
    max_grid_ctas: int  # the largest grid of any feasible point (sizes the engine state)
    max_cta_slots: int  # the largest occupancy (CTAs per SM) of any feasible point (sizes it too)
    fitted: fitted_policy.FittedPolicy | None = None  # [policy] fitted: what dispatch = "fitted" runs

    @property
    def arch(self) -> Arch:
        return self.base["arch"]

    @property
    def kernel(self) -> Kernel:
        return self.base["kernel"]

    @property
    def point_shape(self) -> tuple[int, ...]:
        return tuple(len(v) for v in self.grid.values()) + ((self.design.samples,) if self.design else ())

    @property
    def n_configs(self) -> int:
        return math.prod(self.point_shape) * self.replicates

    def assignments(self, index: Sequence[int]) -> list[tuple[str, object]]:
        """(path, value) pairs of the point at `index` (grid indices, then the sample)."""
        pairs = [(path, values[i]) for (path, values), i in zip(self.grid.items(), index)]
        if self.design:
            pairs += [(path, v[index[-1]].item()) for path, v in self.design.values.items()]
        return pairs

    def point(self, index: Sequence[int]) -> dict:
        return sweep_paths.assign_all(self.base, self.assignments(index), _point_label(self, index))


def load(path: str | Path) -> Sweep:
    p = Path(path)
    return loads(tomldoc.read_text(p, "sweep spec"), base_dir=p.parent, source=str(p))


def loads(text: str, base_dir: Path = Path("."), source: str = "<spec>") -> Sweep:
    """Parse and validate a spec (the package docstring); every point is checked, nothing runs."""
    doc = tomldoc.parse(text, source)
    for key in doc:
        check(key in _TOP_KEYS, f"{source}: {key}", doc[key], f"unknown key; expected one of {_TOP_KEYS}")
    arch_spec = str(doc.get("arch", "h200"))
    arch = (archio.load(base_dir / arch_spec) if arch_spec.endswith(".toml") else presets.get(arch_spec))
    check("kernel" in doc, f"{source}: kernel", None, "required (a kernel TOML path or a [kernel] table)")
    kspec = doc["kernel"]
    kernel = (kernel_from_dict(kspec, source, base_dir) if isinstance(kspec, dict) else load_kernel(base_dir / kspec))
    variants = _kernel_variants(doc, kernel, base_dir, source)
    every = [kernel, *variants.values()]
    n_instr = max(k.n_instr for k in every)
    loops, branches = (max(np.shape(getattr(k, f))[-1] for k in every) for f in ("loop_start", "branch_start"))
    variants = {name: pad_program(k, n_instr, loops, branches) for name, k in variants.items()}
    base = {"arch": arch, "kernel": pad_program(kernel, n_instr, loops, branches), sweep_paths.VARIANTS: variants}
    doc, fitted = _fitted(doc, base_dir, source)
    for name in sweep_paths.TABLES:
        base[name] = sweep_paths.GROUPS[name].base(doc.get(name, {}), arch, f"{source}: {name}")
    seed = doc.get("seed", 0)
    check(isinstance(seed, int) and not isinstance(seed, bool) and 0 <= seed <= MAX_SEED, f"{source}: seed", seed,
          f"an integer in 0 .. {MAX_SEED} (replicate r draws its chip from seed x {REPLICATE_STRIDE} + r)")
    replicates = doc.get("replicates", 1)
    check(isinstance(replicates, int) and not isinstance(replicates, bool) and 1 <= replicates <= MAX_CONFIGS,
          f"{source}: replicates", replicates, f"an integer in 1 .. {MAX_CONFIGS}")
    chunk = doc.get("chunk")
    check(chunk is None or (isinstance(chunk, int) and not isinstance(chunk, bool) and chunk >= 1),
          f"{source}: chunk", chunk, "an integer >= 1")
    cta_trace = doc.get("cta_trace", False)
    check(isinstance(cta_trace, bool), f"{source}: cta_trace", cta_trace, "true or false")
    fast_forward = _engine_options(doc.get("engine", {}), source)
    grid = _parse_grid(doc.get("grid", {}), base, source)
    design = None
    if "design" in doc:
        design = sweep_design.parse(
            doc["design"], default_seed=seed, max_samples=MAX_CONFIGS, where=f"{source}: design",
            kind_of=lambda path, value, where: sweep_paths.kind(base, path, where, value),
            check_value=lambda path, value, where: sweep_paths.assign(base, path, value, where))
    n_configs = math.prod(len(v) for v in grid.values()) * (design.samples if design else 1) * replicates
    check(n_configs <= MAX_CONFIGS, f"{source}: configurations", n_configs,
          f"at most {MAX_CONFIGS} (grid points x design samples x replicates): split the sweep")
    swept = [(f"grid.{p}", p) for p in grid] + [(f"design.{f.path}", f.path) for f in (design.factors if design else ())]
    _check_distinct_paths(base, swept, source)
    partial = Sweep(title=str(doc.get("title", source)), text=text, base=base, grid=grid, design=design,
                    replicates=replicates, seed=seed, chunk=chunk, cta_trace=cta_trace, fast_forward=fast_forward, feasible=np.ones((), bool),
                    infeasible_reason=np.asarray(""),
                    max_grid_ctas=int(kernel.grid_ctas) * max(1, base["workload"]["launches"]),
                    max_cta_slots=int(arch.max_blocks_per_sm), fitted=fitted)
    _check_fitted(partial, source)
    _check_dvfs(partial, source)
    feasible, reasons, max_grid, max_slots = _check_points(partial, source)
    return dataclasses.replace(partial, feasible=feasible, infeasible_reason=reasons, max_grid_ctas=max_grid,
                               max_cta_slots=max_slots)


def _fitted(doc: dict, base_dir: Path, source: str) -> tuple[dict, fitted_policy.FittedPolicy | None]:
    """The spec without `[policy] fitted`, and the fitted policy that file holds (or None)."""
    table = doc.get("policy", {})
    if not isinstance(table, dict) or "fitted" not in table:
        return doc, None
    path = table["fitted"]
    check(isinstance(path, str) and bool(path), f"{source}: policy.fitted", path,
          "the path of a policy file that jaxsched fit dispatch wrote (relative to the spec)")
    rest = {k: v for k, v in table.items() if k != "fitted"}
    return {**doc, "policy": rest}, fitted_policy.load(base_dir / path)


def _check_fitted(sweep: Sweep, source: str) -> None:
    """`dispatch = "fitted"` needs `[policy] fitted`, whose file then fixes the policy's
    parameters: sweeping them too would be ignored on those points, so it is refused."""
    if FITTED_DISPATCH not in swept_values(sweep, "policy.dispatch"):
        return
    check(sweep.fitted is not None, f"{source}: policy.fitted", None,
          f'required where policy.dispatch = "{FITTED_DISPATCH}": the file jaxsched fit dispatch wrote')
    for field in fitted_policy.FIELDS:
        path = f"policy.{field}"
        check(len(swept_values(sweep, path)) == 1, f"{source}: {path}", swept_values(sweep, path),
              f'one value: the fitted policy fixes it where policy.dispatch = "{FITTED_DISPATCH}"')


def _engine_options(table: object, source: str) -> bool:
    """The `[engine]` table: `fast_forward` (default true)."""
    check(isinstance(table, dict), f"{source}: engine", table, "a table")
    for key in table:
        check(key in _ENGINE_KEYS, f"{source}: engine.{key}", table[key], f"unknown key; expected one of {_ENGINE_KEYS}")
    value = table.get("fast_forward", DEFAULT_FAST_FORWARD)
    check(isinstance(value, bool), f"{source}: engine.fast_forward", value, "true or false")
    return value


def _kernel_variants(doc: dict, kernel: Kernel, base_dir: Path, source: str) -> dict[str, Kernel]:
    """The spec's `[kernels]` (name -> kernel TOML path or inline table) for `kernel.variant`,
    every program padded to one length so that they share one compilation."""
    table = doc.get("kernels", {})
    check(isinstance(table, dict), f"{source}: kernels", table, "a table of name = kernel TOML path or table")
    loaded = {name: (kernel_from_dict(v, f"{source}: kernels.{name}", base_dir) if isinstance(v, dict)
                     else load_kernel(base_dir / str(v))) for name, v in table.items()}
    n = max([k.n_instr for k in loaded.values()] + [kernel.n_instr])
    return {name: pad_program(k, n) for name, k in loaded.items()}


def _parse_grid(grid: object, base: Point, source: str) -> dict[str, list]:
    check(isinstance(grid, dict), f"{source}: grid", grid, 'a table of "path" = [values]')
    for path, values in grid.items():
        where = f"{source}: grid.{path}"
        check(isinstance(values, list) and len(values) > 0, where, values, "a non-empty list of values")
        for v in values:
            sweep_paths.assign(base, path, v, where)
    return dict(grid)


def _check_distinct_paths(base: Point, swept: list[tuple[str, str]], source: str) -> None:
    """No field is set by two swept paths (aliases and derived paths included); `swept` holds
    (where in the spec, path) pairs."""
    seen: dict[str, str] = {}
    for label, path in swept:
        for target in sweep_paths.writes(sweep_paths.canonical(base, path, f"{source}: {label}")):
            check(target not in seen, f"{source}: {label}", path,
                  f"sets {target}, which {seen.get(target)} also sets; sweep each field in one place")
            seen[target] = label


def _point_label(sweep: Sweep, index: Sequence[int]) -> str:
    """A point for error messages: its grid values, its design sample and that sample's values."""
    label = ", ".join(f"{p}={v!r}" for p, v in sweep.assignments(index))
    where = f"design sample {index[-1]}" if sweep.design else ("grid point" if sweep.grid else "base point")
    return f"{where} ({label})" if label else where


def _launch_refusal(arch: Arch, kernel: Kernel) -> str | None:
    """Why CUDA would refuse this launch (resources beyond the chip's limits), or None."""
    try:
        check_launch(arch, kernel.threads_per_cta, kernel.regs_per_thread, kernel.dynamic_smem_bytes,
                     kernel.static_smem_bytes)
    except JaxschedError as exc:
        return str(exc)
    occ = occupancy(arch, kernel.threads_per_cta, kernel.regs_per_thread, kernel.dynamic_smem_bytes,
                    kernel.static_smem_bytes)
    if int(occ.blocks_per_sm) == 0:
        return (f"{int(kernel.threads_per_cta)} threads x {int(kernel.regs_per_thread)} registers: a CTA "
                f"fits on no SM of {arch.name} (limited by {', '.join(occ.limiters())})")
    return None


def _static_shapes(arch: Arch, kernel: Kernel):
    """The sizes every point must share: the CTA trace and the CTA slots are padded to the
    sweep's largest (`max_grid_ctas`, `max_cta_slots`)."""
    return dataclasses.replace(shapes_for(arch, kernel), max_ctas=0, cta_slots=0)


def _dvfs_settings(sweep: Sweep, source: str) -> Iterator[tuple[str, Callable[[], Dvfs]]]:
    """Each distinct `[dvfs]` setting of the sweep: (where, its Dvfs), built lazily so that a
    caller can catch its error."""
    swept = [p for p in list(sweep.grid) + [f.path for f in (sweep.design.factors if sweep.design else ())]
             if p.startswith("dvfs.")]
    seen = set()
    for index in np.ndindex(*sweep.point_shape):
        key = tuple((p, v) for p, v in sweep.assignments(index) if p in swept)
        if key not in seen:
            seen.add(key)
            where = f"{source}: {_point_label(sweep, index)}"
            point = sweep_paths.assign_all(sweep.base, key, where)
            yield where, lambda point=point: dvfs_params(sweep.arch, point["dvfs"], sweep.seed)


def uses_dvfs(sweep: Sweep) -> bool:
    """Whether any configuration runs DVFS: then every chunk compiles the DVFS step, so that the
    sweep compiles once (`simulate_batch`'s `dvfs_step`)."""
    return any(any_dvfs(make()) for _, make in _dvfs_settings(sweep, "sweep"))


def uses_closed_loop(sweep: Sweep) -> bool:
    """Whether any configuration dispatches by a policy that reads the closed loop's estimates
    (`policies.ESTIMATE_DISPATCH`): then every chunk compiles its learning, so that the sweep
    compiles once (`simulate_batch`'s `closed_loop_step`)."""
    values = swept_values(sweep, "policy.dispatch")
    return any((sweep.fitted.dispatch if v == FITTED_DISPATCH else v) in ESTIMATE_DISPATCH for v in values)


def swept_values(sweep: Sweep, path: str) -> list:
    """The values a `group.field` path takes over the sweep: its grid's or design's, else the base's."""
    if path in sweep.grid:
        return list(sweep.grid[path])
    if sweep.design and path in sweep.design.values:
        return list(dict.fromkeys(np.asarray(sweep.design.values[path]).tolist()))
    group, field = path.split(".", 1)
    return [sweep.base[group][field]]


def _check_dvfs(sweep: Sweep, source: str) -> None:
    """Every distinct `[dvfs]` setting of the sweep is a valid combination (before any compute)."""
    for where, make in _dvfs_settings(sweep, source):
        try:
            validate_dvfs(make())
        except JaxschedError as exc:
            raise JaxschedError(f"{where}: {exc.field}", exc.value, exc.limit) from None


def _check_points(sweep: Sweep, source: str) -> tuple[np.ndarray, np.ndarray, int, int]:
    """Feasibility and reason of every point, the largest feasible grid and occupancy; raises for
    a point that fails otherwise.

    Only the `_LAUNCH_GROUPS` paths matter here (less `sweep_paths.VALUE_ONLY`), so points are
    checked once per distinct assignment of those (a grid over policies and clocks is checked
    once).
    """
    shape = sweep.point_shape
    swept = list(sweep.grid) + [f.path for f in (sweep.design.factors if sweep.design else ())]
    relevant = {p for p in swept if p.split(".", 1)[0] in _LAUNCH_GROUPS
                and sweep_paths.canonical(sweep.base, p, source) not in sweep_paths.VALUE_ONLY}
    feasible = np.ones(shape, dtype=bool)
    reasons = np.full(shape, "", dtype=object)
    shapes0 = _static_shapes(sweep.arch, sweep.kernel)
    checked: dict[tuple, str | None] = {}
    max_grid, max_slots = 1, 1
    for index in np.ndindex(*shape):
        key = tuple((p, v) for p, v in sweep.assignments(index) if p in relevant)
        if key not in checked:
            label = _point_label(sweep, index)
            point = sweep_paths.assign_all(sweep.base, key, f"{source}: {label}")
            arch, kernel = point["arch"], point["kernel"]
            refusal = _launch_refusal(arch, kernel)
            if refusal is None:
                try:
                    validate(arch, kernel, clocks.uniform(arch))
                    launched(kernel, point["workload"])  # the workload's own checks
                except JaxschedError as exc:
                    raise JaxschedError(f"{source}: {label}: {exc.field}", exc.value, exc.limit) from None
                got = _static_shapes(arch, kernel)
                changed = [f"{f.name} {getattr(shapes0, f.name)} -> {getattr(got, f.name)}"
                           for f in dataclasses.fields(got) if getattr(got, f.name) != getattr(shapes0, f.name)]
                check(not changed, f"{source}: {label}", "; ".join(changed),
                      "changes the engine's static array sizes; every configuration of a sweep must share them")
                max_grid = max(max_grid, int(kernel.grid_ctas) * max(1, sweep.base["workload"]["launches"]))
                max_slots = max(max_slots, cta_slots_for(arch, kernel))
            checked[key] = refusal
        if checked[key] is not None:
            feasible[index], reasons[index] = False, checked[key]
    check(bool(feasible.any()), f"{source}: every point", str(reasons.flat[0]),
          "no configuration of this sweep can launch")
    return feasible, reasons.astype(str), max_grid, max_slots
