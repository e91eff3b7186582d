"""Running a sweep: the local devices (`select_devices`), the `Runner` that runs a batch of
configurations sharded over them with engine options fixed for the whole sweep (`runner_for`:
one compilation), the chunk size that fits their memory (`auto_chunk`), one chunk's variables
(`_compute_chunk`), and the two ways to run every chunk: in memory (`run`), or into the store,
resumable and over several hosts (`execute`, `Outcome`; the package docstring's "Execution" and
"Several hosts"), with progress on stderr (`Progress`, `print_progress`)."""

from __future__ import annotations

import dataclasses
import math
import os
import sys
import time
from pathlib import Path
from typing import Callable, Sequence

import jax
import numpy as np
import xarray as xr

from .. import sweep_lock, sweep_paths
from ..engine.fast_forward import may_fast_forward
from ..engine.run import Result, simulate_batch
from ..errors import JaxschedError, check, os_error
from ..lower import shapes_for
from .configs import Config
from .layout import Layout, chunk_configs, make_layout
from .spec import Sweep, uses_closed_loop, uses_dvfs
from .store import (NETCDF, STORE, _attrs, _check_resumable, _dataset, _unfilled, _write_chunk, _write_done,
                    create_store, open_store, read_done, store_layout, store_progress, variables, verify_chunks,
                    write_netcdf)

THROTTLE_ENV = "JAXSCHED_SWEEP_THROTTLE_S"
_CPU_CHUNK_PER_DEVICE = 64  # when the backend reports no memory figures
_MAX_CHUNK_PER_DEVICE = 4096


# ----------------------------------------------------------------------------- devices


def select_devices(spec: str | int | None = None) -> list:
    """Local devices: all (None or "all"), the first N ("N"), or indices ("0,2", "4:8")."""
    local = jax.local_devices()
    if spec is None or str(spec).strip().lower() in ("", "all"):
        return local
    text = str(spec).strip()
    picked: list[int] = []
    try:
        if "," not in text and ":" not in text:
            n = int(text)
            check(1 <= n <= len(local), "--devices", spec, f"a count between 1 and the {len(local)} local devices")
            return local[:n]
        for part in filter(None, text.split(",")):
            if ":" in part:
                a, _, b = part.partition(":")
                picked.extend(range(int(a or 0), int(b) if b else len(local)))
            else:
                picked.append(int(part))
    except JaxschedError:
        raise
    except ValueError:
        raise JaxschedError("--devices", spec, "a count N, or device indices like 0,2 or 4:8") from None
    check(len(picked) > 0 and len(set(picked)) == len(picked) and all(0 <= j < len(local) for j in picked),
          "--devices", spec, f"distinct indices of the {len(local)} local devices")
    return [local[j] for j in picked]


class Runner:
    """Runs batches of configurations on local devices, sharded over them when more than one."""

    def __init__(self, devices: Sequence | None = None, dvfs_step: bool | None = None,
                 cta_slots: int | None = None, max_ctas: int | None = None, closed_loop_step: bool | None = None,
                 fast_forward_step: bool = True):
        self.devices = list(devices) if devices else jax.local_devices()
        # simulate_batch's; None decides per batch. A sweep fixes them so that it compiles once.
        self.dvfs_step, self.cta_slots, self.max_ctas = dvfs_step, cta_slots, max_ctas
        self.closed_loop_step, self.fast_forward_step = closed_loop_step, fast_forward_step

    def batch_size(self, n: int) -> int:
        """`n` rounded up to a multiple of the device count."""
        d = len(self.devices)
        return -(-n // d) * d

    def describe(self) -> str:
        d = self.devices[0]
        kinds = sorted({x.device_kind for x in self.devices})
        return (f"{len(self.devices)} x {d.platform} ({', '.join(kinds)})"
                + (f", process {jax.process_index()} of {jax.process_count()}" if jax.process_count() > 1 else ""))

    def __call__(self, configs: list[Config], batch: int) -> Result:
        """The configurations' results, run as one batch of `batch` `Params` (the last repeated
        to fill it; a list, which `simulate_batch` stacks once each is made ready: workloads of
        one batch may differ in program length and structure, which `js.stack` refuses)."""
        n = len(configs)
        result = simulate_batch([c.params for c in configs + configs[-1:] * (batch - n)],
                                dvfs_step=self.dvfs_step, closed_loop_step=self.closed_loop_step,
                                cta_slots=self.cta_slots, max_ctas=self.max_ctas, devices=self.devices,
                                fast_forward_step=self.fast_forward_step)
        return jax.tree.map(lambda x: x[:n], result)


def runner_for(sweep: Sweep, devices: Sequence | None) -> Runner:
    """The runner of a sweep: static engine options fixed for all its chunks (one compilation)."""
    kernels = [sweep.kernel, *sweep.base[sweep_paths.VARIANTS].values()]
    uses_ff = sweep.fast_forward and (any(may_fast_forward(k) for k in kernels) or _sweeps_loops(sweep))
    return Runner(devices, uses_dvfs(sweep), sweep.max_cta_slots, sweep.max_grid_ctas, uses_closed_loop(sweep),
                  uses_ff)


def _sweeps_loops(sweep: Sweep) -> bool:
    """Whether a swept kernel path could give a point fast-forward can use where the base kernel
    has none (trip counts): then every chunk compiles it in (it is exact either way)."""
    loops = ("kernel.trips", "kernel.cta_spread", "kernel.warp_spread", "kernel.trips_cta_spread",
             "kernel.trips_warp_spread")
    swept = list(sweep.grid) + (list(sweep.design.values) if sweep.design else [])
    return any(p in loops for p in swept)


def auto_chunk(sweep: Sweep, devices: Sequence) -> int:
    """Configurations per chunk that fit the devices' free memory (heuristic: 8 x the engine
    state per configuration in half the free memory), at most 4096 per device; 64 per device
    where the backend reports no memory figures (CPU)."""
    per_device = _CPU_CHUNK_PER_DEVICE
    try:
        stats = [d.memory_stats() for d in devices]
        if all(s and "bytes_limit" in s for s in stats):
            free = min(s["bytes_limit"] - s.get("bytes_in_use", 0) for s in stats)
            per_device = int(0.5 * free // _bytes_per_config(sweep))
    except Exception:  # noqa: BLE001 -- a heuristic: keep the default
        pass
    per_device = min(max(per_device, 1), _MAX_CHUNK_PER_DEVICE)
    n = len(devices)
    return max(1, min(per_device * n, -(-sweep.n_configs // n) * n))


def _bytes_per_config(sweep: Sweep) -> int:
    from ..engine.state import initial_state

    shapes = dataclasses.replace(shapes_for(sweep.arch, sweep.kernel), max_ctas=sweep.max_grid_ctas,
                                 cta_slots=sweep.max_cta_slots)
    with jax.enable_x64(True):
        state = jax.eval_shape(lambda: initial_state(shapes))
    return 8 * sum(math.prod(x.shape) * x.dtype.itemsize for x in jax.tree.leaves(state)) + (1 << 16)


# ----------------------------------------------------------------------------- variables


def _variables(sweep: Sweep, configs: list[Config], result: Result) -> dict[str, np.ndarray]:
    """Per-configuration outputs (leading axis: the configurations), enabled SMs only."""
    enabled = np.asarray(sweep.arch.sm_enabled)

    def per_sm(name: str) -> np.ndarray:
        return np.asarray(getattr(result, name))[:, enabled]

    busy, cycles = per_sm("sm_busy_cycles"), per_sm("sm_cycles")
    stalls = np.asarray(result.sm_stalls)[:, enabled].sum(axis=1)
    values = {
        "makespan_ns": np.asarray(result.makespan_ns),
        "makespan_cycles": np.asarray(result.makespan_cycles),
        "ticks_stepped": np.asarray(result.ticks_stepped),
        "sm_ctas": per_sm("sm_ctas"),
        "sm_busy_cycles": busy,
        "sm_cycles": cycles,
        "sm_utilisation": busy / np.maximum(cycles, 1),
        "sm_freq_mhz": np.stack([np.asarray(c.params.clocks.sm_freq_mhz)[enabled] for c in configs]),
        "ipc": per_sm("sm_issued") / np.maximum(busy, 1),
        "achieved_occupancy": per_sm("sm_warp_cycles") / np.maximum(busy, 1) / result.max_warps_per_sm,
        "stall_fraction": stalls / np.maximum(stalls.sum(-1, keepdims=True), 1),
    }
    if sweep.cta_trace:
        n = sweep.max_grid_ctas
        sm = np.asarray(result.cta_sm)[:, :n]
        ran = sm >= 0
        values.update(cta_sm=sm, cta_kernel=np.where(ran, np.asarray(result.cta_kernel)[:, :n], -1),
                      cta_start_ns=np.where(ran, np.asarray(result.cta_start_ns)[:, :n], np.nan),
                      cta_end_ns=np.where(ran, np.asarray(result.cta_end_ns)[:, :n], np.nan))
    return {k: v.astype(variables(sweep)[k][1]) for k, v in values.items()}


def _compute_chunk(sweep: Sweep, layout: Layout, i: int, runner: Runner, batch: int) -> dict[str, np.ndarray]:
    """Variables of chunk `i`, shaped like its region (plus `sm`/`stall_reason`); infeasible
    points keep the fill values."""
    region = layout.region(i)
    shape = tuple(s.stop - s.start for s in region)
    out = _unfilled(sweep, shape)
    configs = chunk_configs(sweep, layout, i)
    if configs:
        runs = np.broadcast_to(sweep.feasible[region[:-1]][..., None], shape)
        for name, v in _variables(sweep, configs, runner(configs, batch)).items():
            out[name][runs] = v
    return out


# ----------------------------------------------------------------------------- in memory


def run(sweep: Sweep, progress: Callable[[int, int, float], None] | None = None, *,
        devices: Sequence | None = None, chunk: int | None = None) -> xr.Dataset:
    """Run every configuration in chunks and return the dataset (in memory, no store)."""
    runner = runner_for(sweep, devices)
    layout = make_layout(sweep, chunk or sweep.chunk or auto_chunk(sweep, runner.devices))
    arrays = _unfilled(sweep, layout.shape)
    batch = runner.batch_size(layout.chunk_size)
    t0, done = time.perf_counter(), 0
    for i in range(layout.n_chunks):
        values = _compute_chunk(sweep, layout, i, runner, batch)
        for name, v in values.items():
            arrays[name][layout.region(i)] = v
        done += layout.count(i)
        if progress:
            progress(done, layout.n_configs, time.perf_counter() - t0)
    return _dataset(sweep, layout, arrays, _attrs(sweep, layout, runner.describe()))


# ----------------------------------------------------------------------------- execution


@dataclasses.dataclass
class Outcome:
    store: Path
    netcdf: Path | None
    n_configs: int
    configs_done: int  # in the store, by every process
    computed: int  # by this call
    chunks_done: int
    n_chunks: int
    interrupted: bool

    @property
    def complete(self) -> bool:
        return self.configs_done == self.n_configs


def _barrier(name: str, process_count: int) -> None:
    if process_count > 1:
        from jax.experimental import multihost_utils

        multihost_utils.sync_global_devices(name)


def _stderr(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def execute(
    sweep: Sweep,
    out: str | Path,
    *,
    resume: bool = False,
    chunk: int | None = None,
    devices: Sequence | None = None,
    progress: Callable[..., "Progress"] | None = None,
    stop: Callable[[], bool] | None = None,
    log: Callable[[str], None] = _stderr,
) -> Outcome:
    """Run a sweep into `out/sweep.zarr`, chunk by chunk, then write `out/sweep.nc`.

    `resume`: continue an existing store (refused if the spec changed), computing only the
    chunks not yet recorded, and those recorded whose data no longer matches its checksum.
    Without it an existing store is replaced, unless it is unfinished (an error: pass `resume`
    or remove it). `chunk` overrides the spec's chunk size for a new store (a resumed store keeps
    its chunk shape). `progress(total, done)` makes a reporter with `update(done)` and `close()`.
    `stop()` is checked after every chunk is written: when it returns True the run ends early
    (`Outcome.interrupted`). Under `jax.distributed`, every process calls this with the same
    arguments (see the package docstring).

    The run holds `out`'s lock throughout (`sweep_lock`): another run writing `out` is an error
    naming it. A full disk or another I/O error is an error too, and leaves the store valid: the
    chunk being written is not marked done, and `resume` completes the sweep.
    """
    out = Path(out)
    check(not out.exists() or out.is_dir(), "-o", str(out), "exists and is not a folder: name an output folder")
    rank, n_proc = jax.process_index(), jax.process_count()
    try:
        out.mkdir(parents=True, exist_ok=True)
    except OSError as exc:
        raise JaxschedError("-o", str(out), f"cannot be created: {os_error(exc)}") from None
    lock = sweep_lock.StoreLock(sweep_lock.lock_path(out, rank), sweep_lock.Owner.me(rank, n_proc))
    stale = lock.acquire()
    if stale is not None:
        log(f"{lock.path}: taking over from {stale.describe()}, which ended without releasing it")
    try:
        return _execute(sweep, out, resume, chunk, devices, progress, stop, log)
    finally:
        lock.release()


def _io_error(store: Path, layout: Layout, i: int, exc: OSError) -> JaxschedError:
    """A chunk that could not be written: what failed, and that the store stays valid."""
    return JaxschedError(str(store), f"{layout.describe(i)} not written",
                         f"{os_error(exc)}; the store keeps every chunk written before and this one is not "
                         "marked done: free space (or fix the cause) and continue with --resume")


def _execute(sweep: Sweep, out: Path, resume: bool, chunk: int | None, devices: Sequence | None,
             progress: Callable[..., "Progress"] | None, stop: Callable[[], bool] | None,
             log: Callable[[str], None]) -> Outcome:
    """`execute` with `out`'s lock held."""
    store = out / STORE
    rank, n_proc = jax.process_index(), jax.process_count()
    runner = runner_for(sweep, devices)
    if rank == 0:
        keep = False
        if store.exists():
            if resume:
                ds = open_store(store)
                _check_resumable(ds, sweep, store)
                keep = True
                if chunk and tuple(store_layout(ds).block) != make_layout(sweep, chunk).block:
                    log(f"--resume: keeping the store's chunk shape {tuple(ds.attrs['chunk_shape'])}")
            else:
                try:
                    _, done, _ = store_progress(store)
                    unfinished = not done.all()
                except JaxschedError:
                    unfinished = False  # not readable: replaced
                if unfinished:
                    raise JaxschedError(str(store), f"{int(done.sum())}/{done.size} configurations done",
                                        "an unfinished sweep is there: continue it with --resume, or remove it")
                log(f"replacing {store}")
        elif resume:
            log(f"--resume: no store at {store} yet; starting it")
        if not keep:
            layout = make_layout(sweep, chunk or sweep.chunk or auto_chunk(sweep, runner.devices))
            create_store(store, sweep, layout, runner.describe())
    _barrier("jaxsched-sweep-store", n_proc)
    ds = open_store(store)
    _check_resumable(ds, sweep, store)
    layout = store_layout(ds)
    done, unreadable = read_done(store, layout)
    chunk_done = layout.done_chunks(done)
    mine = [i for i in range(layout.n_chunks) if i % n_proc == rank]
    for i in unreadable:
        if i in mine:
            log(f"{layout.describe(i)}: its done record cannot be read; recomputing it")
    recorded = [i for i in mine if chunk_done[i]]
    changed = verify_chunks(store, layout, recorded)
    if recorded:
        log(f"verified {len(recorded)} chunks done against their checksums: "
            + (f"{len(changed)} changed on disk" if changed else "all intact"))
    for i, problem in changed.items():
        log(f"{layout.describe(i)}: {problem}; recomputing it")
        try:
            _write_done(store, layout, i, False)  # the store no longer claims it
        except OSError as exc:
            raise _io_error(store, layout, i, exc) from None
        chunk_done[i] = False
    todo = [i for i in mine if not chunk_done[i]]
    total = sum(layout.count(i) for i in mine)
    already = total - sum(layout.count(i) for i in todo)
    if already:
        log(f"resuming: {already} of {total} configurations already done "
            f"({len(mine) - len(todo)}/{len(mine)} chunks); computing {total - already}")
    batch = runner.batch_size(layout.chunk_size)
    log(f"{layout.n_configs} configurations in {layout.n_chunks} chunks of shape {layout.block} "
        f"(batch {batch}) on {runner.describe()}" + (f"; this process: {len(mine)} chunks" if n_proc > 1 else ""))
    if not sweep.feasible.all():
        log(f"{int((~sweep.feasible).sum())} of {sweep.feasible.size} points cannot launch and are not run "
            f"(feasible = False, NaN results), e.g. {sweep.infeasible_reason[~sweep.feasible].flat[0]}")
    reporter = progress(total, already) if progress else None
    computed, interrupted = 0, False
    throttle = float(os.environ.get(THROTTLE_ENV, "0") or 0)
    try:
        for i in todo:
            if stop is not None and stop():
                interrupted = True
                break
            values = _compute_chunk(sweep, layout, i, runner, batch)
            try:
                _write_chunk(store, layout, i, values)
            except OSError as exc:
                raise _io_error(store, layout, i, exc) from None
            computed += layout.count(i)
            if reporter:
                reporter.update(already + computed)
            if throttle:
                time.sleep(throttle)
    finally:
        if reporter:
            reporter.close()
    _barrier("jaxsched-sweep-done", n_proc)
    _, done, chunk_done = store_progress(store)
    nc = None
    if rank == 0 and done.all():
        nc = write_netcdf(store, out / NETCDF)
    return Outcome(store=store, netcdf=nc, n_configs=layout.n_configs, configs_done=int(done.sum()),
                   computed=computed, chunks_done=int(chunk_done.sum()), n_chunks=layout.n_chunks,
                   interrupted=interrupted)


# ----------------------------------------------------------------------------- progress


class Progress:
    """Configurations done, rate and ETA on stderr: a rich bar on a terminal, otherwise one
    plain line per update (logs, CI, pipes). The rate counts this run's configurations only."""

    def __init__(self, total: int, done: int = 0, *, stream=None, bar: bool | None = None,
                 label: str = "configurations"):
        self.stream = stream or sys.stderr
        self.total, self.start, self.label = total, done, label
        self.t0 = time.perf_counter()
        isatty = getattr(self.stream, "isatty", lambda: False)()
        self._rich = None
        if bar if bar is not None else isatty:
            from rich.console import Console
            from rich.progress import (BarColumn, MofNCompleteColumn, Progress as RichProgress,
                                       TextColumn, TimeElapsedColumn, TimeRemainingColumn)

            self._rich = RichProgress(
                TextColumn("[bold]sweep"), BarColumn(), MofNCompleteColumn(), TextColumn(label),
                TextColumn("{task.fields[rate]}"), TextColumn("elapsed"), TimeElapsedColumn(),
                TextColumn("ETA"), TimeRemainingColumn(),
                console=Console(file=self.stream), transient=False)
            self._rich.start()
            self._task = self._rich.add_task("sweep", total=total, completed=done, rate="")

    def rate_eta(self, done: int) -> tuple[float, float]:
        seconds = time.perf_counter() - self.t0
        rate = (done - self.start) / max(seconds, 1e-9)
        return rate, (self.total - done) / rate if rate > 0 else float("inf")

    def update(self, done: int) -> None:
        rate, eta = self.rate_eta(done)
        if self._rich is not None:
            self._rich.update(self._task, completed=done, rate=f"{rate:.1f}/s")
        else:
            print(f"  {done}/{self.total} {self.label}, {rate:.1f}/s, ETA {eta:.0f} s",
                  file=self.stream, flush=True)

    def close(self) -> None:
        if self._rich is not None:
            self._rich.stop()
            self._rich = None


def print_progress(done: int, total: int, seconds: float) -> None:
    """One line per chunk on stderr (the `run` callback form)."""
    rate = done / max(seconds, 1e-9)
    eta = (total - done) / max(rate, 1e-9)
    print(f"  {done}/{total} configurations, {rate:.1f}/s, ETA {eta:.0f} s", file=sys.stderr, flush=True)
