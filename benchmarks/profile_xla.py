"""Where the event loop's time goes inside XLA: fused kernels and the source lines they came from.

Runs the throughput workload (benchmarks/throughput.py) at `--batch` from tick `--from-ticks`
(default 0: the first wave; refills run from about tick 1300 to 8000) to `--ticks`
under `jax.profiler`, reads the time of every fused kernel from the trace, and attributes it to
the engine's source lines through the stack frames that the compiled HLO records for each
instruction (a fusion's time is split over its instructions' lines in proportion to their
number). Prints JSON: the run's wall and CPU seconds, the share of per-warp fusions
(`[batch, warp, sm]` arrays) and their element operations per warp slot, and the top fusions,
functions and lines: the view to use when changing the step (docs/engine_performance.md, "Where the time
goes").

    python benchmarks/profile_xla.py --batch 16 --ticks 600 [--from-ticks 0] [--dvfs] [--top 25]
"""

from __future__ import annotations

import argparse
import collections
import dataclasses
import glob
import gzip
import json
import re
import tempfile
import time

import jax
from throughput import workload

from jaxsched.engine.mechanics.devices import use_host_cores
from jaxsched.engine.configure import run_tables
from jaxsched.stacking import stack
from jaxsched.engine.step import loop, start
from jaxsched.lower import lower, shapes_for

_SKIPPED_OPS = re.compile(r" (parameter|constant|bitcast|broadcast)\(")


def _section(hlo: str, name: str, following: str) -> str:
    return hlo[hlo.index("\n" + name + "\n"):hlo.index("\n" + following + "\n")]


def _frame_lines(hlo: str) -> dict[str, str]:
    """stack_frame_id -> "file.py:function:line" of the innermost frame."""
    files = dict(re.findall(r'^(\d+) "([^"]*)"', _section(hlo, "FileNames", "FunctionNames"), re.MULTILINE))
    funcs = dict(re.findall(r'^(\d+) "([^"]*)"', _section(hlo, "FunctionNames", "FileLocations"), re.MULTILINE))
    locations = {
        loc: f"{files[f].split('/')[-1]}:{funcs[fn]}:{line}"
        for loc, f, fn, line in re.findall(r"^(\d+) \{file_name_id=(\d+) function_name_id=(\d+) line=(\d+)",
                                           _section(hlo, "FileLocations", "StackFrames"), re.MULTILINE)
    }
    frames = re.findall(r"^(\d+) \{file_location_id=(\d+) parent_frame_id=", hlo[hlo.index("\nStackFrames\n"):], re.MULTILINE)
    return {frame: locations[loc] for frame, loc in frames}


def _fusion_body(hlo: str, name: str) -> tuple[str, str] | None:
    """(output shape, body text) of the fused computation that instruction `name` calls."""
    call = re.search(r"^\s*%" + re.escape(name) + r" = (\S+) .*$", hlo, re.MULTILINE)
    if call is None:
        return None
    callee = re.search(r"calls=(%[\w.\-]+)", call.group(0))
    body = re.search(r"^" + re.escape(callee.group(1)) + r" .*?\n}", hlo, re.MULTILINE | re.DOTALL) if callee else None
    return call.group(1), body.group(0) if body else call.group(0)


def kernel_times_us(trace_dir: str) -> tuple[collections.Counter, collections.Counter, float | None]:
    """Total microseconds and executions per kernel (fusion, gather, ...) name in the profiler's
    trace, and on a GPU the share of the traced window in which the device ran a kernel.

    On a GPU only the device's own kernel events count: the host's entries (a `while` thunk's
    span includes its wait for every kernel queued before it) would count the same time twice
    (docs/engine_performance.md, "The H200's step, kernel by kernel"). On the CPU the kernels are the
    host's events; a loop's own entry (`while`) is its total, inner kernels included."""
    path = max(glob.glob(f"{trace_dir}/**/*.trace.json.gz", recursive=True))
    with gzip.open(path) as stream:
        events = json.load(stream)["traceEvents"]
    devices = {e["pid"] for e in events if e.get("ph") == "M" and e.get("name") == "process_name"
               and "/device:" in e["args"]["name"]}
    kernels = [e for e in events if e.get("ph") == "X" and (not devices or e["pid"] in devices)
               and "Thunk" not in e.get("name", "") and not e.get("name", "").startswith("$")]
    total: collections.Counter = collections.Counter()
    count: collections.Counter = collections.Counter()
    for event in kernels:
        total[event["name"]] += event.get("dur", 0)
        count[event["name"]] += 1
    busy = None
    if devices and kernels:
        window = max(e["ts"] + e.get("dur", 0) for e in kernels) - min(e["ts"] for e in kernels)
        busy = round(100 * sum(e.get("dur", 0) for e in kernels) / max(window, 1), 1)
    return total, count, busy


def attribute(hlo: str, times_us: collections.Counter, counts: collections.Counter, top: int) -> dict:
    lines = _frame_lines(hlo)
    by_line: collections.Counter = collections.Counter()
    fusions, per_warp_us, per_warp_ops = [], 0.0, 0
    for name, us in times_us.items():
        found = _fusion_body(hlo, name)
        if found is None:
            continue
        shape, body = found
        ops = sum(1 for row in body.split("\n") if " = " in row and not _SKIPPED_OPS.search(row))
        frames = collections.Counter(lines.get(f, "?") for f in re.findall(r"stack_frame_id=(\d+)", body))
        for where, n in frames.items():
            by_line[where] += us * n / max(sum(frames.values()), 1)
        per_warp = bool(re.search(r"\[\d+,64,\d+\]|\[\d{5,},", shape))
        if per_warp:
            per_warp_us, per_warp_ops = per_warp_us + us, per_warp_ops + ops
        fusions.append({"name": name, "ms": round(us / 1e3, 1), "runs": counts[name], "shape": shape[:60], "ops": ops,
                        "lines": [w for w, _ in frames.most_common(3)]})
    total = sum(times_us[f["name"]] for f in fusions)
    by_function: collections.Counter = collections.Counter()
    for where, us in by_line.items():
        by_function[where.rsplit(":", 1)[0]] += us
    share = lambda us: round(100 * us / max(total, 1), 1)
    return {
        "kernels_ms": round(total / 1e3, 1),
        "per_warp_share_percent": share(per_warp_us),
        "per_warp_element_ops_per_step": per_warp_ops,
        "top_kernels": sorted(fusions, key=lambda f: -f["ms"])[:top],
        "top_functions_percent": {k: share(v) for k, v in by_function.most_common(top)},
        "top_lines_percent": {k: share(v) for k, v in by_line.most_common(top)},
    }


def main() -> None:
    use_host_cores()  # as throughput.py: one CPU device per core
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=16)
    parser.add_argument("--ticks", type=int, default=600, help="simulate each configuration up to this tick")
    parser.add_argument("--from-ticks", type=int, default=0, help="profile from the state at this tick")
    parser.add_argument("--dvfs", action="store_true", help="compile the DVFS step in (Shapes.dvfs)")
    parser.add_argument("--top", type=int, default=25)
    parser.add_argument("--hlo", help="also write the compiled loop's HLO text here")
    parser.add_argument("--no-fast-forward", action="store_true", help="compile the engine without fast-forward")
    args = parser.parse_args()
    arch, kernel, maps, _ = workload(args.batch)
    # As throughput.py: the workload dispatches by hardware order, so the closed loop is compiled out.
    shapes = dataclasses.replace(shapes_for(arch, kernel), dvfs=args.dvfs, closed_loop=False,
                                 fast_forward=not args.no_fast_forward)
    with jax.enable_x64(True):
        launches = jax.jit(jax.vmap(lambda c: lower(arch, kernel, c, 1, 0, 0)))(stack(maps))
        runs = jax.jit(jax.vmap(lambda l: run_tables(l, shapes, None, None)))(launches)
        begin = jax.jit(jax.vmap(lambda r: start(r, shapes)))(runs)
        if args.from_ticks:
            begin = jax.jit(lambda r, s: loop(r, shapes, args.from_ticks, s)[0])(runs, begin)
        run = jax.jit(lambda r, s: loop(r, shapes, args.ticks, s)[1])
        jax.block_until_ready(run(runs, begin))
        wall, cpu = time.perf_counter(), time.process_time()
        steps = int(jax.block_until_ready(run(runs, begin)))
        wall, cpu = time.perf_counter() - wall, time.process_time() - cpu
        hlo = run.lower(runs, begin).compile().as_text()
        with tempfile.TemporaryDirectory() as trace_dir:
            with jax.profiler.trace(trace_dir):
                jax.block_until_ready(run(runs, begin))
            times, counts, busy = kernel_times_us(trace_dir)
    if args.hlo:
        with open(args.hlo, "w") as stream:
            stream.write(hlo)
    out = {"device": str(jax.devices()[0].device_kind), "batch": args.batch, "ticks": [args.from_ticks, args.ticks],
           "dvfs_step": args.dvfs, "steps": steps, "run_wall_s": round(wall, 3), "run_cpu_s": round(cpu, 3),
           "ms_per_step": round(wall / max(steps, 1) * 1e3, 3), "device_busy_percent": busy}
    print(json.dumps({**out, **attribute(hlo, times, counts, args.top)}, indent=1))


if __name__ == "__main__":
    main()
