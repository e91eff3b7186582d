"""The `jaxsched` command line: one subcommand per task, bad input as one line and exit code 2."""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import sys
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import TYPE_CHECKING

import numpy as np

from . import archio, compile_cache, fit_cli, presets, probe_cli, tomldoc
from .archvalues import ArchValues
from .errors import INT32_MAX, JaxschedError, check, os_error
from .occupancy import CARVEOUT_DEFAULT, NO_LIMIT, occupancy
from .policies import DEFAULT_DISPATCH, DEFAULT_WARP_POLICY, DISPATCH_POLICIES, WARP_POLICIES

if TYPE_CHECKING:
    from .arch import Arch

# Commands import JAX (and the engine) only where they need it: `arch`, `occupancy` and `--help`
# answer without starting it (benchmarks/RESULTS.md, "Command-line start-up").

_COMMANDS: dict[str, Callable[[argparse.Namespace], int]] = {}


def _command(fn: Callable[[argparse.Namespace], int]) -> Callable[[argparse.Namespace], int]:
    _COMMANDS[fn.__name__.removeprefix("cmd_").replace("_", "-")] = fn
    return fn


def _is_arch_file(spec: str) -> bool:
    return spec.endswith(".toml") or Path(spec).is_file()


def load_arch(spec: str) -> Arch:
    """A preset name or the path of an arch TOML file."""
    return archio.load(spec) if _is_arch_file(spec) else presets.get(spec)


def arch_values(spec: str) -> ArchValues:
    """`load_arch`'s architecture as numpy values, without JAX."""
    return archio.load_values(spec) if _is_arch_file(spec) else presets.values(spec)


@_command
def cmd_arch(args: argparse.Namespace) -> int:
    arch = arch_values(args.name)
    if args.toml:
        sys.stdout.write(archio.dumps(arch))
        return 0
    doc = archio.to_dict(arch)
    enabled = np.asarray(arch.sm_enabled)
    gpcs = np.asarray(arch.sm_gpc)
    per_gpc = [int(np.sum(enabled & (gpcs == g))) for g in range(int(gpcs.max()) + 1)]
    print(f"{arch.name}: compute capability {arch.compute_capability[0]}.{arch.compute_capability[1]}")
    print(f"  SMs: {arch.sm_count} enabled of {arch.n_sm_slots} on the die, "
          f"{len(per_gpc)} GPCs (SMs per GPC: {per_gpc}), {len(np.unique(arch.sm_tpc[enabled]))} TPCs")
    print(f"  schedulers per SM: {arch.schedulers_per_sm}, warp size {arch.warp_size}")
    print(f"  dispatch order (first 16 %smid): {np.asarray(arch.dispatch_order)[:16].tolist()}")
    for section in ("limits", "pipes", "memory", "clocks", "dispatch"):
        print(f"  [{section}]")
        for key, value in doc[section].items():
            print(f"    {key} = {value}")
    return 0


def _limit_str(value: int) -> str:
    return "none" if value == NO_LIMIT else str(value)


@_command
def cmd_occupancy(args: argparse.Namespace) -> int:
    arch = arch_values(args.arch)
    occ = occupancy(arch, args.threads, args.regs, args.smem, args.static_smem,
                    carveout_percent=args.carveout, block_barriers=args.barriers)
    sizes = np.arange(32, int(arch.max_threads_per_block) + 1, 32)
    curve = occupancy(arch, sizes, args.regs, args.smem, args.static_smem,
                      carveout_percent=args.carveout, block_barriers=args.barriers)
    max_warps = int(arch.max_threads_per_sm) // arch.warp_size
    result = {
        "arch": arch.name,
        "threads_per_block": args.threads,
        "regs_per_thread": args.regs,
        "dynamic_smem_bytes": args.smem,
        "static_smem_bytes": args.static_smem,
        "blocks_per_sm": int(occ.blocks_per_sm),
        "warps_per_block": int(occ.warps_per_block),
        "active_warps": int(occ.active_warps),
        "max_warps_per_sm": max_warps,
        "occupancy_percent": round(100.0 * float(occ.occupancy), 2),
        "limiters": occ.limiters(),
        "limits": {
            "warps": int(occ.limit_warps),
            "registers": int(occ.limit_registers),
            "shared_memory": int(occ.limit_shared_memory),
            "blocks": int(occ.limit_blocks),
            "barriers": int(occ.limit_barriers),
        },
        "allocated": {
            "registers_per_block": int(occ.regs_per_block_allocated),
            "smem_per_block_bytes": int(occ.smem_per_block_allocated_bytes),
            "smem_per_sm_bytes": int(occ.smem_per_sm_bytes),
        },
        "curve": [
            {"threads_per_block": int(t), "blocks_per_sm": int(b),
             "occupancy_percent": round(100.0 * float(o), 2)}
            for t, b, o in zip(sizes, curve.blocks_per_sm, curve.occupancy)
        ],
    }
    if args.json:
        json.dump(result, sys.stdout, indent=2)
        print()
        return 0
    print(f"{arch.name}: {args.threads} threads/block, {args.regs} registers/thread, "
          f"{args.static_smem + args.smem} B shared/block")
    print(f"  active blocks per SM : {result['blocks_per_sm']}")
    print(f"  active warps per SM  : {result['active_warps']} of {max_warps}")
    print(f"  occupancy            : {result['occupancy_percent']:.1f}%")
    print(f"  limited by           : {', '.join(result['limiters']) or 'nothing'}")
    print("  blocks allowed by    : " + ", ".join(
        f"{k} {_limit_str(v)}" for k, v in result["limits"].items()))
    print(f"  allocated per block  : {result['allocated']['registers_per_block']} registers, "
          f"{result['allocated']['smem_per_block_bytes']} B shared "
          f"(SM shared size {result['allocated']['smem_per_sm_bytes']} B)")
    print("  occupancy over block size:")
    for row in result["curve"]:
        bar = "#" * int(round(row["occupancy_percent"] / 4))
        mark = " <" if row["threads_per_block"] == args.threads else ""
        print(f"    {row['threads_per_block']:5d} {row['blocks_per_sm']:3d} blocks "
              f"{row['occupancy_percent']:6.1f}% {bar}{mark}")
    return 0


def _load_run_input(path: str):
    """A kernel TOML (`[kernel]`) or a workload TOML (`[workload]`, docs/model.md section 13)."""
    from .kernel import kernel_from_dict
    from .workload import workload_from_dict

    doc = tomldoc.read(path, "kernel file")
    if "workload" in doc:
        return workload_from_dict(doc, str(path), Path(path).parent)
    return kernel_from_dict(doc, str(path), Path(path).parent)


def _run_clocks(args: argparse.Namespace, arch: Arch):
    """The run's per-SM clocks: every SM at --clock-ghz (default boost), a map from --clocks, or
    a random chip from --clock-model (mean --clock-ghz, spread --sigma, chip --seed)."""
    from . import clocks, freqmap

    check(args.clocks is None or args.clock_model is None, "--clocks", args.clocks,
          "give a clock map or --clock-model, not both")
    if args.clock_model is None:
        for flag, value in (("--sigma", args.sigma), ("--seed", args.seed)):
            check(value is None, flag, value, "used only with --clock-model")
    if args.clocks is not None:
        check(args.clock_ghz is None, "--clock-ghz", args.clock_ghz, "not with --clocks (the map has every clock)")
        return freqmap.to_clocks(arch, freqmap.from_file(arch, args.clocks))
    if args.clock_model is not None:
        check(args.sigma is not None, "--sigma", None, f"--clock-model {args.clock_model} needs a spread, e.g. 0.05")
        mean = float(arch.boost_clock_ghz) if args.clock_ghz is None else args.clock_ghz
        return freqmap.random_clocks(arch, args.clock_model, 0 if args.seed is None else args.seed, mean, args.sigma)
    return clocks.uniform(arch, args.clock_ghz)


def _per_gpc(arch: Arch, result, mhz: np.ndarray) -> tuple[dict, list[dict]]:
    """Per enabled SM (%smid order): GPC, clock, CTAs and busy time; and the same summed up per
    GPC (SMs, clock range, CTAs, CTAs per SM and busy time per SM: min, mean, max)."""
    on = np.asarray(arch.sm_enabled)
    gpc, f = np.asarray(arch.sm_gpc)[on], mhz[on].astype(np.float64)
    ctas = np.asarray(result.sm_ctas)[on]
    busy_ns = np.asarray(result.sm_busy_cycles)[on] * 1000.0 / f
    per_sm = {"sm_gpc": gpc.tolist(), "sm_clock_mhz": f.tolist(), "ctas_per_sm": ctas.tolist(),
              "sm_busy_ns": np.round(busy_ns, 3).tolist()}
    rows = []
    for g in np.unique(gpc):
        m = gpc == g
        rows.append({"gpc": int(g), "sms": int(m.sum()), "clock_mhz_min": float(f[m].min()),
                     "clock_mhz_max": float(f[m].max()), "ctas": int(ctas[m].sum()),
                     "ctas_per_sm_min": int(ctas[m].min()), "ctas_per_sm_max": int(ctas[m].max()),
                     "busy_ns_min": round(float(busy_ns[m].min()), 3), "busy_ns_mean": round(float(busy_ns[m].mean()), 3),
                     "busy_ns_max": round(float(busy_ns[m].max()), 3)})
    return per_sm, rows


def _span(low: float, high: float, fmt: str) -> str:
    return format(low, fmt) if low == high else f"{format(low, fmt)}..{format(high, fmt)}"


@_command
def cmd_run(args: argparse.Namespace) -> int:
    from .engine.run import simulate
    from .run_bounds import NAMES, bounds_ns
    from .workload import Workload

    arch = load_arch(args.arch)
    item = _load_run_input(args.kernel)
    is_workload = isinstance(item, Workload)
    kernels = item.kernels if is_workload else (item,)
    clk = _run_clocks(args, arch)
    result = simulate(arch, item, clk, warp_policy=args.warp_policy, dispatch=args.dispatch,
                      dispatch_start=args.dispatch_start, fast_forward=not args.no_fast_forward)
    n = sum(int(k.grid_ctas) for k in kernels)
    name = Path(args.kernel).stem if is_workload else item.name
    enabled = np.asarray(arch.sm_enabled)
    mhz = np.asarray(clk.sm_freq_mhz)
    stalls = np.asarray(result.sm_stalls).sum(axis=0)
    launches = [
        {"kernel": k.name, "stream": item.streams[l] if is_workload else 0, "ctas": int(k.grid_ctas),
         "ready_ns": round(float(result.kernel_ready_ns[l]), 3),
         "start_ns": round(float(result.kernel_start_ns[l]), 3),
         "end_ns": round(float(result.kernel_end_ns[l]), 3)}
        for l, k in enumerate(kernels)
    ]
    makespan = float(result.makespan_ns)
    bounds = bounds_ns(result, arch, item, mhz)
    binding = next(iter(bounds))  # the largest: the one the run is measured against
    per_sm, gpcs = _per_gpc(arch, result, mhz)
    summary = {
        "arch": arch.name,
        "kernel": name,
        "mode": item.mode if is_workload else "stream",
        "warp_policy": args.warp_policy,
        "dispatch": args.dispatch,
        "clock_ghz": float(mhz.max()) / 1000.0,
        "makespan_ns": makespan,
        "makespan_cycles": float(result.makespan_cycles),
        "makespan_ticks": int(result.makespan_ticks),
        "ticks_stepped": int(result.ticks_stepped),
        "issue_bound_ns": bounds["issue_slots"],
        "bounds_ns": bounds,
        "binding_bound": binding,
        "above_binding_percent": round(100 * (makespan / bounds[binding] - 1), 3),
        "ctas": n,
        "launches": launches,
        **per_sm,
        "gpcs": gpcs,
        "issued_instructions": int(np.sum(result.sm_issued)),
        "ipc_per_sm_mean": float(np.mean(result.ipc[enabled])),
        "achieved_occupancy_mean": float(np.mean(result.achieved_occupancy[enabled])),
        "simt_efficiency": float(result.simt_efficiency),
        "stall_reasons": dict(zip(result.stall_reasons, (int(v) for v in stalls))),
        "cta_trace": {
            "kernel": np.asarray(result.cta_kernel)[:n].tolist(),
            "sm": np.asarray(result.cta_sm)[:n].tolist(),
            "start_ns": np.round(result.cta_start_ns[:n], 3).tolist(),
            "end_ns": np.round(result.cta_end_ns[:n], 3).tolist(),
        },
    }
    if args.json:
        json.dump(summary, sys.stdout)
        print()
        return 0
    counts = np.asarray(summary["ctas_per_sm"])
    on_mhz = mhz[enabled]
    what = f"workload {name} ({len(kernels)} launches, {item.mode} mode)" if is_workload else name
    print(f"{what} on {arch.name} ({arch.sm_count} SMs at {_span(on_mhz.min() / 1000, on_mhz.max() / 1000, '.3f')} "
          f"GHz), warp policy {args.warp_policy}, dispatch {args.dispatch}")
    print(f"  makespan          : {makespan:.1f} ns = {summary['makespan_cycles']:.0f} "
          f"cycles at {float(arch.boost_clock_ghz):.3f} GHz")
    if is_workload:
        print("  launches          : ready / first CTA / end, ns from the host's first call")
        for l, row in enumerate(launches):
            print(f"    {l:3d} stream {row['stream']:<3d} {row['kernel'][:24]:24s} {row['ctas']:6d} CTAs  "
                  f"{row['ready_ns']:12.1f} {row['start_ns']:12.1f} {row['end_ns']:12.1f}")
    others = ", ".join(f"{NAMES[k]} {v:.1f} ns" for k, v in bounds.items() if k != binding)
    print(f"  bound             : {NAMES[binding]}, {bounds[binding]:.1f} ns; makespan "
          f"{summary['above_binding_percent']:+.1f}% above it" + (f" (also {others})" if others else ""))
    print(f"  CTAs              : {n}, per SM {counts.min()}..{counts.max()}")
    print("  per GPC           : SMs, clock MHz, CTAs per SM, busy ns per SM (min..max)")
    for row in gpcs:
        print(f"    GPC {row['gpc']:<3d}: {row['sms']:3d} SMs  {_span(row['clock_mhz_min'], row['clock_mhz_max'], '.0f'):>10s} MHz  "
              f"{_span(row['ctas_per_sm_min'], row['ctas_per_sm_max'], 'd'):>7s} CTAs  "
              f"{_span(row['busy_ns_min'], row['busy_ns_max'], '.1f'):>17s} ns busy")
    print(f"  instructions      : {summary['issued_instructions']}, IPC/SM {summary['ipc_per_sm_mean']:.2f}, "
          f"achieved occupancy {100 * summary['achieved_occupancy_mean']:.1f}%, "
          f"SIMT efficiency {100 * summary['simt_efficiency']:.1f}%")
    total = max(sum(summary["stall_reasons"].values()), 1)
    print("  warp states       : " + ", ".join(
        f"{k} {100 * v / total:.1f}%" for k, v in summary["stall_reasons"].items() if v))
    ends = result.cta_end_ns[:n]
    print(f"  CTA end times     : first {ends.min():.1f} ns, median {np.median(ends):.1f} ns, last {ends.max():.1f} ns")
    return 0


_NO_FF_HELP = "step every event instead of jumping recurring steady state (same results, slower: docs/model.md section 11)"
DEMO_SPEC = Path(__file__).resolve().parent.parent / "sweeps" / "demo.toml"


def _init_distributed(args: argparse.Namespace) -> None:
    """`jax.distributed.initialize` from --coordinator/--num-processes/--process-id, or from the
    cluster environment with --distributed."""
    given = [args.coordinator, args.num_processes, args.process_id]
    if not args.distributed and all(v is None for v in given):
        return
    check(args.distributed or all(v is not None for v in given), "--coordinator", args.coordinator,
          "multi-host runs need --coordinator HOST:PORT, --num-processes N and --process-id I "
          "(or --distributed to read them from the cluster environment)")
    import jax

    if all(v is not None for v in given):
        check(1 <= args.num_processes <= INT32_MAX, "--num-processes", args.num_processes,
              f"an integer in 1 .. {INT32_MAX}")
        check(0 <= args.process_id < args.num_processes, "--process-id", args.process_id,
              f"an integer in 0 .. {args.num_processes - 1} (--num-processes {args.num_processes})")
        jax.distributed.initialize(coordinator_address=args.coordinator, num_processes=args.num_processes,
                                   process_id=args.process_id)
    else:
        jax.distributed.initialize()


def _resume_hint(args: argparse.Namespace) -> str:
    parts = ["jaxsched", "sweep"] + ([args.spec] if args.spec else []) + ["-o", args.output, "--resume"]
    if args.devices:
        parts += ["--devices", args.devices]
    if args.no_fast_forward:
        parts += ["--no-fast-forward"]
    return " ".join(parts)


@_command
def cmd_sweep(args: argparse.Namespace) -> int:
    import signal
    import threading

    from . import plot, sweep

    check(args.chunk is None or args.chunk >= 1, "--chunk", args.chunk, ">= 1")
    _init_distributed(args)
    spec = sweep.load(args.spec or DEMO_SPEC)
    if args.no_fast_forward:
        spec = dataclasses.replace(spec, fast_forward=False)
    devices = sweep.select_devices(args.devices)
    out = Path(args.output)
    stop = threading.Event()

    def on_sigint(signum, frame):  # first Ctrl-C: finish the chunk in flight; second: now
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        print("\nCtrl-C: stopping after the chunk in flight is written (Ctrl-C again to stop now)",
              file=sys.stderr, flush=True)

    print(f"{spec.title}: {spec.n_configs} configurations", file=sys.stderr, flush=True)
    previous = signal.signal(signal.SIGINT, on_sigint) if threading.current_thread() is threading.main_thread() else None
    outcome = None
    try:
        outcome = sweep.execute(spec, out, resume=args.resume, chunk=args.chunk, devices=devices,
                                progress=sweep.Progress, stop=stop.is_set)
    except KeyboardInterrupt:
        pass
    finally:
        if previous is not None:
            signal.signal(signal.SIGINT, previous)
    if outcome is None or outcome.interrupted:
        store = out / sweep.STORE
        try:
            layout, done, chunks = sweep.store_progress(store)
            where = (f"{int(done.sum())}/{done.size} configurations "
                     f"({int(chunks.sum())}/{layout.n_chunks} chunks) are in {store}")
        except JaxschedError:
            where = f"nothing recorded in {store} yet"
        print(f"interrupted: {where}; resume with:\n  {_resume_hint(args)}", file=sys.stderr, flush=True)
        return 130
    if outcome.netcdf is None:  # another process of a multi-host run finishes the files
        state = "complete" if outcome.complete else "unfinished: rerun every process with --resume"
        print(f"computed {outcome.computed} configurations; the store has {outcome.configs_done}/"
              f"{outcome.n_configs} ({state})")
        return 0 if outcome.complete else 1
    ds = sweep.open_result(outcome.netcdf)
    grid_dims = [d for d in ds["makespan_ns"].dims if d != "replicate"]
    if not grid_dims:  # replicates only
        print(f"wrote {outcome.store} and {outcome.netcdf}")
        print(f"median makespan: {float(ds['makespan_ns'].median()):.1f} ns")
        return 0
    try:
        png = plot.makespan(ds, out / "makespan.png")
    except OSError as exc:
        raise JaxschedError(str(out / "makespan.png"), "not written",
                            f"{os_error(exc)}; the sweep itself is complete in {outcome.netcdf}") from None
    print(f"wrote {outcome.store}, {outcome.netcdf} and {png}")
    table = ds["makespan_ns"].median("replicate").to_dataframe()["makespan_ns"]
    if len(grid_dims) > 1:
        table = table.unstack(grid_dims[-1])
    print(table.round(1).to_string())
    return 0


@_command
def cmd_info(args: argparse.Namespace) -> int:
    from . import sweep

    print(sweep.describe(args.path))
    return 0


@_command
def cmd_check(args: argparse.Namespace) -> int:
    from . import sweep_check

    ok, lines = sweep_check.check_result(args.path, args.against)
    print("\n".join(lines))
    return 0 if ok else 1


def _parse_sel(ds, items: Sequence[str] | None) -> dict:
    """`dim=value` strings as a .sel mapping, each value converted to the coordinate's type."""
    sel = {}
    for item in items or []:
        dim, eq, text = item.partition("=")
        check(bool(eq) and dim in ds.dims, "--sel", item, f"DIM=VALUE with DIM one of {list(ds.dims)}")
        values = ds[dim].values
        kind = values.dtype.kind
        try:
            value = (text.lower() in ("1", "true", "yes") if kind == "b" else
                     int(text) if kind in "iu" else float(text) if kind == "f" else text)
        except ValueError:
            raise JaxschedError("--sel", item, f"{dim} values are {values.tolist()}") from None
        check(value in values.tolist(), "--sel", item, f"{dim} values are {values.tolist()}")
        sel[dim] = value
    return sel


@_command
def cmd_plot(args: argparse.Namespace) -> int:
    from . import plot

    path = Path(args.dataset)
    folder = path if path.is_dir() and path.suffix != ".zarr" else path.parent

    def target(kind: str) -> Path:
        return Path(args.output) if args.output else folder / f"{kind}.png"

    if plot.content(path) == "json":  # by what the file holds, not by its name
        check(args.kind in (None, "gantt"), "plot --kind", args.kind, f"{path} is a run's CTA trace (JSON): it draws gantt")
        trace = plot.load_trace(path)
        arch = load_arch(trace["arch"]) if trace.get("arch") in presets.names() else None
        print(f"wrote {plot.gantt(trace, arch, target('gantt'))}")
        return 0
    from . import sweep

    ds = sweep.open_result(path, partial=True)
    if "makespan_ns" not in ds and "cta_sm" in ds:  # a CTA trace (jaxsched.trace: probe or simulator)
        from . import trace

        check(args.kind in (None, "gantt"), "plot --kind", args.kind, f"{path} is a CTA trace: it draws gantt")
        print(f"wrote {plot.gantt(plot.trace_dict(trace.load(path)), None, target('gantt'))}")
        return 0
    kind = args.kind or "makespan"
    check(kind != "gantt", "plot --kind gantt", str(path),
          "needs a CTA trace: jaxsched run KERNEL --json > trace.json; jaxsched plot trace.json")
    check("makespan_ns" in ds, "dataset", str(path), "not a jaxsched sweep result (no makespan_ns)")
    if "done" in ds:
        done = ds["done"].values
        if not done.all():
            print(f"note: unfinished sweep, {int(done.sum())}/{done.size} configurations plotted",
                  file=sys.stderr)
        ds = ds.drop_vars("done")
    sel = _parse_sel(ds, args.sel)
    if kind == "makespan":
        check(not sel, "--sel", args.sel, "not used by --kind makespan (every dimension is shown)")
        written = plot.makespan(ds, target(kind), x=args.x)
    elif kind == "floorplan":
        written = plot.floorplan(ds, target(kind), var=args.var or "sm_utilisation", sel=sel)
    else:
        written = plot.stalls(ds, target(kind), x=args.x, sel=sel)
    print(f"wrote {written}")
    return 0


def _assignments(items: Sequence[str] | None, flag: str, value: Callable[[str, str], object]) -> dict:
    """`KEY=VALUE[,KEY=VALUE...]` options (repeatable) as a dict, each value through `value`."""
    out = {}
    for item in items or []:
        for part in item.split(","):
            key, eq, text = part.strip().partition("=")
            check(bool(eq) and bool(key) and bool(text), flag, part, "KEY=VALUE")
            out[key] = value(part, text)
    return out


def _number_or_array(flag: str, kind: type) -> Callable[[str, str], object]:
    def convert(part: str, text: str) -> object:
        if text.startswith("@"):
            return text
        try:
            return kind(text)
        except ValueError:
            raise JaxschedError(flag, part, f"a {'trip count' if kind is int else 'lane probability'} "
                                "or @ARRAY") from None
    return convert


def _sector_count(part: str, text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise JaxschedError("--sectors", part, "ADDRESS=SECTORS, the sectors an integer in [1, 32]") from None


@_command
def cmd_import_sass(args: argparse.Namespace) -> int:
    from . import sass_import, tomldoc

    text = tomldoc.read_text(args.sass, "SASS listing")
    if args.list:
        sys.stdout.write(sass_import.describe(text, args.kernel, args.arch))
        return 0
    program = sass_import.from_sass(
        text, args.kernel, arch=args.arch,
        trips=_assignments(args.trips, "--trips", _number_or_array("--trips", int)),
        branches=_assignments(args.branch, "--branch", _number_or_array("--branch", float)),
        sectors=_assignments(args.sectors, "--sectors", _sector_count),
        opmap=_assignments(args.map, "--map", lambda part, text: text))
    function = sass_import.find_function(text, args.kernel, args.arch)
    source = (f"Imported by `jaxsched import-sass` from {Path(args.sass).name}: {function.name}"
              f"{' (' + function.arch + ')' if function.arch else ''}.")
    doc = sass_import.kernel_toml(program, name=function.short_name, source=source, grid=args.grid,
                                  threads=args.threads, regs=args.regs)
    if args.output is None:
        sys.stdout.write(doc)
        return 0
    try:
        Path(args.output).write_text(doc)
    except OSError as exc:
        raise JaxschedError("-o", args.output, f"cannot be written ({os_error(exc)})") from None
    print(f"wrote {args.output}")
    return 0


def cmd_import_traces(args: argparse.Namespace) -> int:
    from . import accelsim_import

    opmap = {}
    for item in args.opmap or ():
        op, eq, cls = item.partition("=")
        check(bool(eq and op), "--opmap", item, "OP=CLASS, e.g. HMMA=fma")
        opmap[op] = cls
    kernels = accelsim_import.import_traces(args.traces, opmap=opmap, regs=args.regs)
    files = accelsim_import.write_workload(kernels, args.output, source=args.traces)
    for k in kernels:
        loops = sum(1 for line in k.program.splitlines() if line.lstrip().startswith("loop"))
        ifs = sum(1 for line in k.program.splitlines() if line.lstrip().startswith("if"))
        print(f"{k.name[:60]}: grid {k.grid} x {k.threads} threads, {int(k.warp_insts.sum())} warp instructions, "
              f"program of {len(k.program.splitlines())} lines ({loops} loops, {ifs} ifs, {len(k.arrays)} arrays)")
    print(f"wrote {files[0]}" + (f" and {len(files) - 1} arrays in {Path(files[1]).parent}" if len(files) > 1 else ""))
    return 0


_COMMANDS["import-traces"] = cmd_import_traces


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="jaxsched", description=__doc__)
    parser.add_argument("--no-compile-cache", action="store_true",
                        help="compile anew: keep no compiled simulations (default: kept in "
                        f"$XDG_CACHE_HOME/jaxsched or ~/.cache/jaxsched; ${compile_cache.ENV} moves it, "
                        f"{compile_cache.ENV}=off turns it off)")
    sub = parser.add_subparsers(dest="command", required=True)

    p = sub.add_parser("arch", help="print an architecture preset or TOML file")
    p.add_argument("name", help=f"preset ({', '.join(presets.names())}) or arch TOML path")
    p.add_argument("--toml", action="store_true", help="print the full TOML description")

    p = sub.add_parser("occupancy", help="CUDA occupancy calculator")
    p.add_argument("--arch", default="h200", help="preset name or arch TOML path")
    p.add_argument("--threads", type=int, required=True, help="threads per block")
    p.add_argument("--regs", type=int, required=True, help="registers per thread")
    p.add_argument("--smem", type=int, default=0, help="dynamic shared memory per block, bytes")
    p.add_argument("--static-smem", type=int, default=0, help="static shared memory per block, bytes")
    p.add_argument("--carveout", type=int, default=CARVEOUT_DEFAULT,
                   help="preferred shared-memory carveout percent (-1: default)")
    p.add_argument("--barriers", type=int, default=1, help="CTA barriers used by the kernel")
    p.add_argument("--json", action="store_true", help="print JSON")

    p = sub.add_parser("run", help="simulate one kernel launch or a workload of several")
    p.add_argument("kernel", help="kernel TOML file (see sweeps/kernels/) or workload TOML file "
                   "(a [workload] table: streams, events, graphs; see examples/workloads/)")
    p.add_argument("--arch", default="h200", help="preset name or arch TOML path")
    p.add_argument("--clock-ghz", type=float, default=None,
                   help="every SM's clock, or the mean clock of --clock-model (default: the boost clock)")
    g = p.add_argument_group("unequal per-SM clocks")
    g.add_argument("--clocks", metavar="FILE", default=None,
                   help="a clock map in MHz: .npy, .csv (numbers separated by commas or lines) or .toml "
                   "(sm_freq_mhz = [...]); one value per enabled SM in %%smid order (132 on the H200), or one "
                   "per SM slot of the die (144: the enabled SMs first, the floorswept slots' values ignored)")
    g.add_argument("--clock-model", metavar="MODEL", default=None,
                   help="a random chip around --clock-ghz: gaussian (independent per SM) or variation "
                   "(spatially correlated within-die variation, binned to the clock step), capped at boost")
    g.add_argument("--sigma", type=float, default=None, help="relative spread of --clock-model (0.05 = 5 %%)")
    g.add_argument("--seed", type=int, default=None, help="which random chip of --clock-model (default 0)")
    p.add_argument("--warp-policy", default=DEFAULT_WARP_POLICY, choices=WARP_POLICIES)
    p.add_argument("--dispatch", default=DEFAULT_DISPATCH, choices=DISPATCH_POLICIES)
    p.add_argument("--dispatch-start", type=int, default=0, help="rotation of the hardware SM order")
    p.add_argument("--json", action="store_true", help="print JSON (with the per-CTA trace)")
    p.add_argument("--no-fast-forward", action="store_true", help=_NO_FF_HELP)

    p = sub.add_parser("sweep", help="run a sweep spec (default: sweeps/demo.toml)",
                       description="Run a sweep into OUT/sweep.zarr chunk by chunk (resumable), then "
                       "OUT/sweep.nc and OUT/makespan.png. Ctrl-C stops after the chunk in flight.")
    p.add_argument("spec", nargs="?", help="sweep TOML (see sweeps/)")
    p.add_argument("-o", "--output", default="results/sweep", help="output folder")
    p.add_argument("--resume", action="store_true",
                   help="continue OUT/sweep.zarr: compute only the chunks not yet recorded")
    p.add_argument("--chunk", type=int, default=None,
                   help="configurations per batched call (default: the spec's, else sized to device memory)")
    p.add_argument("--devices", default=None,
                   help="local devices to shard over: all (default), a count N, or indices like 0,2 or 4:8")
    p.add_argument("--no-fast-forward", action="store_true", help=_NO_FF_HELP + " (overrides [engine] fast_forward)")
    g = p.add_argument_group("several hosts (jax.distributed; OUT on a shared filesystem)")
    g.add_argument("--coordinator", default=None, help="HOST:PORT of process 0")
    g.add_argument("--num-processes", type=int, default=None, help="number of processes (hosts)")
    g.add_argument("--process-id", type=int, default=None, help="this process, 0 .. N-1")
    g.add_argument("--distributed", action="store_true",
                   help="jax.distributed.initialize() from the cluster environment (SLURM, ...)")

    p = sub.add_parser("info", help="describe a sweep result: dimensions, swept values, completion")
    p.add_argument("path", help="sweep output folder, sweep.zarr or sweep.nc")

    p = sub.add_parser("check", help="verify a sweep result's chunks against their checksums; compare two results",
                       description="Verify every done chunk of OUT/sweep.zarr against its SHA-256 checksum and "
                       "OUT/sweep.nc against the store; with --against, compare with another result value by "
                       "value (attributes that differ by design are not compared). Exit code 1 if anything "
                       "is wrong or different.")
    p.add_argument("path", help="sweep output folder, sweep.zarr or sweep.nc")
    p.add_argument("--against", default=None, metavar="OTHER", help="another result of the same spec to compare with")

    p = sub.add_parser("plot", help="figures from a sweep result or a run trace")
    p.add_argument("dataset", help="sweep output folder, sweep.zarr, sweep.nc, a CTA trace (.nc), or the JSON "
                   "of `jaxsched run --json` (for --kind gantt); recognised by content, whatever the name")
    p.add_argument("--kind", choices=("makespan", "floorplan", "stalls", "gantt"), default=None,
                   help="makespan vs a swept value (default for a sweep), per-SM floorplan, stall breakdown, "
                   "CTA Gantt chart (default for a trace)")
    p.add_argument("-o", "--output", default=None, help="PNG or SVG path (default: KIND.png next to the data)")
    p.add_argument("--x", default=None, help="swept dimension on the x axis (makespan, stalls)")
    p.add_argument("--sel", action="append", metavar="DIM=VALUE",
                   help="fix a dimension (floorplan, stalls); repeatable")
    p.add_argument("--var", default=None, help="per-SM variable for --kind floorplan (default sm_utilisation)")
    p = sub.add_parser("import-sass", help="a kernel TOML from a kernel's SASS (cuobjdump -sass or nvdisasm)",
                       description="Translate one kernel of a SASS listing into jaxsched's program text form "
                       "(docs/sass_import.md): loops, if-regions, instruction classes and register "
                       "dependences. Loops are named L1, L2, ... and branches B1, B2, ... in address order "
                       "(--list shows them); give every loop a trip count and every branch the fraction "
                       "of lanes that fall through it.")
    p.add_argument("sass", help="SASS listing: the output of `cuobjdump -sass` or `nvdisasm`")
    p.add_argument("--kernel", default=None, help="function name, mangled or not (needed if the listing has several)")
    p.add_argument("--arch", default=None, help="architecture of a multi-architecture listing (sm_90)")
    p.add_argument("--list", action="store_true", help="print the kernels with their loops and branches, and stop")
    p.add_argument("--trips", action="append", metavar="L1=100,L2=@rows",
                   help="trip counts: a number, or @ARRAY for a per-CTA or per-warp array (repeatable)")
    p.add_argument("--branch", action="append", metavar="B1=0.5",
                   help="fraction of lanes that fall through a branch into its if-block, or @ARRAY (repeatable)")
    p.add_argument("--sectors", action="append", metavar="0x0c90=1",
                   help="32-byte sectors a global memory instruction's accesses touch, by SASS address, where "
                   "they are not 32 coalesced lanes (thread 0's store: 1; a strided load: up to 32) (repeatable)")
    p.add_argument("--map", action="append", metavar="OP=CLASS",
                   help="class of an opcode the table lacks or that you want to override: fma, alu, sfu, lds, "
                   "ldg, shfl, bar or drop (repeatable)")
    p.add_argument("-o", "--output", default=None, help="kernel TOML to write (default: print it)")
    p.add_argument("--grid", type=int, default=None, help="CTAs in the grid")
    p.add_argument("--threads", type=int, default=None, help="threads per CTA")
    p.add_argument("--regs", type=int, default=None, help="registers per thread (ptxas -v, cuobjdump -res-usage)")
    p = sub.add_parser("import-traces", help="turn Accel-Sim traces (kernelslist.g, *.traceg) into a workload TOML",
                       description="Read an Accel-Sim trace folder (its kernelslist.g and kernel .traceg files) and "
                       "write a workload TOML with one launch per kernel: the CTA shape from each trace's header, one "
                       "program per kernel, and per-warp trip counts and if-outcomes as .npy arrays in OUT's stem "
                       "+ .arrays/, so that every warp executes as many instructions as traced.")
    p.add_argument("traces", help="trace folder (with kernelslist.g) or the kernelslist.g file")
    p.add_argument("-o", "--output", required=True, help="workload TOML to write")
    p.add_argument("--opmap", action="append", metavar="OP=CLASS",
                   help="instruction class of a SASS opcode (fma, alu, sfu, lds, ldg, shfl, bar); repeatable")
    p.add_argument("--regs", type=int, default=None, help="registers per thread for every kernel (default: the "
                   "traces' -nregs)")
    _COMMANDS["probe"] = probe_cli.add_parser(sub)  # issue 8: hardware probe
    _COMMANDS["fit"] = fit_cli.add_parser(sub)  # issue 7: optax fits (speeds, dispatch)
    return parser


_COMPILING = ("run", "sweep", "fit")  # the commands that compile simulations


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        folder = compile_cache.default_folder()
        if args.command in _COMPILING:
            from .engine.mechanics.devices import use_host_cores

            use_host_cores()  # one CPU device per core, before JAX starts
            if not args.no_compile_cache and folder is not None:
                compile_cache.enable(folder)
        return _COMMANDS[args.command](args)
    except JaxschedError as exc:
        print(f"jaxsched {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:  # outside a sweep's own handling: no traceback
        print(f"jaxsched {args.command}: interrupted", file=sys.stderr)
        return 130
    except BrokenPipeError:  # output piped into `head`: not an error
        sys.stdout = open(os.devnull, "w")
        return 0


if __name__ == "__main__":
    sys.exit(main())
