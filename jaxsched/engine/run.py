"""Run a configuration to completion: tick, dispatch, skip to the next event, until the grid is done.

`simulate` runs one configuration; `simulate_batch` runs a stack of them under one `jit(vmap)`
with every swept number traced (architecture, kernel, clocks and policy parameters), so a whole
sweep of equal static shapes compiles once. A configuration runs one kernel or a workload of
several launches (streams, events, graphs: docs/model.md section 13). Counters are int64: the
engine runs under `jax.enable_x64`, while the hot per-warp state stays int32.
"""

from __future__ import annotations

import dataclasses
import functools
from typing import Callable, Sequence

import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import ArrayLike

from .. import compile_cache
from ..arch import Arch
from ..clocks import Clocks
from ..dvfs import MAX_TRACE_ROWS, MODES, Dvfs
from ..errors import JaxschedError, check, check_ints, is_traced
from ..kernel import MAX_DEP_SLOTS, Kernel
from ..lower import Shapes, policy_indices, shapes_for, validate_launch
from ..params import Params, checked, make_params
from ..policies import (DEFAULT_EMA_ALPHA, DEFAULT_EMA_PRIOR_NS, DEFAULT_FAST_FORWARD, DEFAULT_HOLD_LEFT,
                        DEFAULT_HOLD_MARGIN, DEFAULT_HOLD_NOISE, DEFAULT_HOLD_QUEUE, DEFAULT_TRACE_LEN,
                        DISPATCH_POLICIES, WARP_POLICIES)
from ..stacking import stack
from ..workload import Workload
from .configure import engine_params, lower_config
from .dispatch_policies import ESTIMATE_POLICIES
from .fast_forward import may_fast_forward
from .mechanics.batching import chunked, default_chunk, padded_batch
from .mechanics.devices import default_devices, mesh_of, sharded
from .mechanics.sizes import compiled_shapes
from .prepare import WorkloadInput, prepare_workload, workload_shapes
from .result import Result, outputs
from .step import loop

MAX_TICKS = 1 << 30  # ~0.54 s at 1.98 GHz; int32 ticks leave headroom above it


def _run_config(params: Params, *, shapes: Shapes, max_ticks: int) -> Result:
    """One configuration (`engine_params`): a batch of one."""
    one = _run_batch(jax.tree.map(lambda x: jnp.asarray(x)[None], params), shapes=shapes, max_ticks=max_ticks)
    return jax.tree.map(lambda x: x[0], one)


def _run_batch(params: Params, *, shapes: Shapes, max_ticks: int) -> Result:
    """A batch of configurations (a leading axis on every array) in one loop (`step.loop`)."""
    runs = jax.vmap(functools.partial(lower_config, shapes=shapes))(params)
    final, _ = loop(runs, shapes, max_ticks)
    return jax.vmap(lambda f, r, a: outputs(f, r, a, shapes))(final, runs, params.arch)


@compile_cache.stored
@functools.partial(jax.jit, static_argnames=("shapes", "max_ticks", "batched", "chunk", "mesh"))
def _compiled(params: Params, *, shapes: Shapes, max_ticks: int, batched: bool, chunk: int | None = None,
              mesh: Mesh | None = None) -> Result:
    """One configuration, or (`batched`) a stack of them (`engine_params`), split over the
    devices of `mesh` (None: the default device) and on each `chunk` at a time (None: all at
    once)."""
    if not batched:
        return _run_config(params, shapes=shapes, max_ticks=max_ticks)
    fn = functools.partial(_run_batch, shapes=shapes, max_ticks=max_ticks)
    if mesh is None:
        return chunked(fn, params, chunk)
    padded, n = padded_batch(params, mesh.size)
    out = sharded(lambda p: chunked(fn, p, chunk), mesh)(padded)
    return jax.tree.map(lambda y: y[:n], out)


def any_dvfs(dvfs: Dvfs) -> bool:
    """Whether a configuration (or any of a stack) has DVFS on, so needs the DVFS step."""
    return bool(np.any(np.asarray(dvfs.mode) != MODES.index("off")))


def uses_closed_loop(dispatch: ArrayLike) -> bool:
    """Whether any of these dispatch policies (indices) reads the closed loop's estimates, so needs
    its learning (`dispatch_policies.ESTIMATE_POLICIES`)."""
    return bool(np.any(np.isin(np.asarray(dispatch), ESTIMATE_POLICIES)))


def _compiled_in(needed: bool, requested: bool | None, field: str, why: str) -> bool:
    """A step compiled in where the batch needs it, or where the caller asks (`requested`)."""
    if requested is None:
        return needed
    check(requested or not needed, field, requested, f"True: {why}")
    return bool(requested)


def _trace_len(n: int) -> int:
    check(isinstance(n, (int, np.integer)) and 0 <= n <= MAX_TRACE_ROWS, "trace_len", n,
          f"an integer in 0 .. {MAX_TRACE_ROWS}")
    return int(n)


def _flag(value: object, field: str) -> bool:
    check(isinstance(value, (bool, np.bool_)), field, value, "True or False")
    return bool(value)


def _fast_forward_in(flag: object, requested: bool | None, items: Sequence) -> bool:
    """Whether the engine is compiled with fast-forward: asked for, and (unless `requested`
    decides) some kernel of the batch could use it."""
    if not _flag(flag, "fast_forward"):
        return False
    if requested is not None:
        return _flag(requested, "fast_forward_step")
    kernels = [k for it in items for k in (it.kernels if hasattr(it, "kernels") else (it,))]
    return any(may_fast_forward(k) for k in kernels)


def _free_sms_in(fast_forward: bool, requested: bool | None) -> bool:
    """Whether SMs may run on their own time (`engine/decouple.py`): with fast-forward, whose
    jumps it lets each SM take without waiting for the others, unless `requested` decides."""
    return fast_forward if requested is None else _flag(requested, "free_sms_step")


def _max_ticks(n: int) -> int:
    check(isinstance(n, (int, np.integer)) and not isinstance(n, bool) and 1 <= n <= MAX_TICKS, "max_ticks", n,
          f"an integer in 1 .. {MAX_TICKS} (2^30 ticks, about 0.54 s at 1.98 GHz)")
    return int(n)


def _for_each(items: Sequence, fn: Callable) -> list:
    """`fn(i, item)` for every configuration of a batch; an error names the configuration."""
    out = []
    for i, item in enumerate(items):
        try:
            out.append(fn(i, item))
        except JaxschedError as exc:
            raise JaxschedError(f"configuration {i}: {exc.field}", exc.value, exc.limit) from None
    return out


def _check_done(result: Result, max_ticks: int) -> None:
    done = np.asarray(result.completed)
    check(bool(np.all(done)), "max_ticks", max_ticks,
          f"{int(np.sum(~done))} configuration(s) did not finish; raise max_ticks")


def simulate(
    arch: Arch | Params,
    kernel: Kernel | Workload | None = None,
    clocks: Clocks | None = None,
    *,
    trace_len: int = DEFAULT_TRACE_LEN,
    max_ticks: int = MAX_TICKS,
    fast_forward: bool = DEFAULT_FAST_FORWARD,
    **config: object,
) -> Result:
    """Simulate one kernel launch, or a workload of several (`jaxsched.workload`: streams,
    events, CUDA graphs; docs/model.md section 13), on one chip: `simulate(params)` with a
    `jaxsched.Params`, or `simulate(arch, kernel, clocks, **config)`, which builds it with
    `make_params` (keywords `warp_policy`, `dispatch`, `dispatch_start`, `dispatch_weight`,
    `ema_alpha`, `ema_prior_ns`, `hold_margin`, `hold_noise`, `hold_queue`, `hold_left`, `dvfs`).

    Warp policies `WARP_POLICIES` (lrr, gto, oldest); dispatch policies `DISPATCH_POLICIES`
    (the modules of `engine/dispatch_policies/`: hardware, ...; docs/model.md section 9).
    `dispatch_start` rotates the hardware SM order; `dispatch_weight` (per SM slot, default the
    SM clocks in MHz) drives `weighted`; `ema_alpha`, `ema_prior_ns`, `hold_margin`,
    `hold_noise`, `hold_queue` and `hold_left` drive `closed_loop` (the last four its tail hold,
    which `clock_regression` shares).
    `dvfs` (`jaxsched.dvfs.default(arch)`, `locked(...)`; default static clocks) turns on the
    power, thermal and clock-controller model with `clocks` as each SM's cap (section 12), and
    `trace_len` rows of the clock trace are kept. `fast_forward` jumps whole periods of an SM's
    recurring state (docs/model.md section 11); results are the same without it, bit for bit.
    """
    if isinstance(arch, Params):
        check(kernel is None and clocks is None and not config, "simulate", "Params with other inputs",
              "a Params alone, or arch, kernel, clocks and keywords")
        p = checked(arch)
    else:
        p = make_params(arch, kernel, clocks, **config)
    kernel, shapes = _prepared(p)
    shapes = dataclasses.replace(shapes, guarded=any(is_traced(x) for x in jax.tree.leaves(p)))
    ff = _fast_forward_in(fast_forward, None, [kernel])
    shapes = dataclasses.replace(shapes, trace_len=_trace_len(trace_len), dvfs=any_dvfs(p.dvfs),
                                 closed_loop=uses_closed_loop(p.dispatch), fast_forward=ff, free_sms=ff)
    sized = compiled_shapes(shapes)
    with jax.enable_x64(True):
        result = _compiled(engine_params(p, kernel, sized), shapes=sized, max_ticks=_max_ticks(max_ticks),
                           batched=False)
        result = jax.device_get(result)
    _check_done(result, max_ticks)
    return _trimmed(result, shapes.max_ctas)


def _prepared(params: Params, n_instr: int | None = None) -> tuple[Kernel | WorkloadInput, Shapes]:
    """The configuration's kernel checked against its chip, or its workload made ready
    (`prepare_workload`, programs padded to `n_instr`), and the static sizes it needs."""
    if isinstance(params.kernel, Workload):
        prepared = prepare_workload(params.kernel, params.arch, n_instr)
        return prepared, workload_shapes(params.arch, prepared)
    validate_launch(params.arch, params.kernel)
    return params.kernel, shapes_for(params.arch, params.kernel)


def _trimmed(result: Result, n_ctas: int) -> Result:
    """`result` with its per-CTA trace cut to `n_ctas` entries (`sizes.compiled_shapes` pads it)."""
    cut = lambda x: x[..., :n_ctas]  # noqa: E731
    return dataclasses.replace(result, cta_sm=cut(result.cta_sm), cta_start_tick=cut(result.cta_start_tick),
                               cta_end_tick=cut(result.cta_end_tick), cta_kernel=cut(result.cta_kernel))


def _int32s(values: ArrayLike, field: str, n: int, low: int = -(2**31)) -> np.ndarray:
    """A batch's per-configuration integers (one value for all, or one per configuration) as
    int32, each checked against `low .. 2^31 - 1` before the cast could wrap or overflow."""
    a = np.asarray(values)
    check(a.ndim == 0 or a.shape == (n,), field, f"shape {a.shape}", f"one value, or one per configuration ({n})")
    check_ints(a, field, low, 2**31 - 1)
    return np.broadcast_to(a.astype(np.int32), (n,))


def simulate_batch(
    archs: Sequence[Arch] | Params | Sequence[Params],
    kernels: Sequence[Kernel] | Sequence[Workload] | None = None,
    clocks: Sequence[Clocks] | None = None,
    warp_policy: ArrayLike | None = None,
    dispatch: ArrayLike | None = None,
    dispatch_start: ArrayLike | None = None,
    *,
    dispatch_weight: Sequence[ArrayLike | None] | None = None,
    ema_alpha: ArrayLike = DEFAULT_EMA_ALPHA,
    ema_prior_ns: ArrayLike = DEFAULT_EMA_PRIOR_NS,
    hold_margin: ArrayLike = DEFAULT_HOLD_MARGIN,
    hold_noise: ArrayLike = DEFAULT_HOLD_NOISE,
    hold_queue: ArrayLike = DEFAULT_HOLD_QUEUE,
    hold_left: ArrayLike = DEFAULT_HOLD_LEFT,
    dvfs: Sequence[Dvfs | None] | None = None,
    trace_len: int = DEFAULT_TRACE_LEN,
    max_ticks: int = MAX_TICKS,
    dvfs_step: bool | None = None,
    closed_loop_step: bool | None = None,
    fast_forward_step: bool | None = None,
    free_sms_step: bool | None = None,
    cta_slots: int | None = None,
    max_ctas: int | None = None,
    dep_slots: int | None = None,
    data_tables: bool | None = None,
    chunk: int | None = None,
    devices: Sequence | None = None,
    fast_forward: bool = DEFAULT_FAST_FORWARD,
) -> Result:
    """Simulate N configurations in one vmapped call (one compilation for equal static shapes):
    `simulate_batch(js.stack(params))`, or a list of `Params` (workloads of one batch may differ
    in program length and structure, which only the list allows: they are padded to one length
    here). The keyword form builds that list with `make_params`: policies are indices into
    `WARP_POLICIES`/`DISPATCH_POLICIES`, one for all or one per configuration; `dispatch_weight`
    a list of per-SM weights (or None: the clocks); `ema_alpha`, `ema_prior_ns`, `hold_margin`,
    `hold_noise`, `hold_queue` and `hold_left` scalars or length-N arrays; `dvfs` a list of `Dvfs`
    (None: static clocks).
    Workloads of one batch need one number of launches.

    The rest are static choices. `dvfs_step` compiles the DVFS step in (True) or out (False:
    every configuration must have DVFS off); None decides by the batch. A sweep passes True when
    any of its configurations has DVFS on, so that its chunks share one compilation.
    `closed_loop_step` likewise compiles in the closed loop's learning (True) or leaves it out
    (False: no configuration may dispatch by `closed_loop`), and `fast_forward_step`
    fast-forward's search (None: where a kernel of the batch could use it,
    `fast_forward.may_fast_forward`; it is exact either way), and `free_sms_step` lets SMs run on
    their own time (`engine/decouple.py`; None: with fast-forward; exact either way). `cta_slots`
    sizes the per-SM CTA-slot arrays at least this large (default: the batch's largest
    occupancy), and `max_ctas` the per-CTA trace (default: the batch's largest grid); a sweep
    passes its largest of each, for the same reason and so that every chunk's trace has the
    sweep's length; `dep_slots` sizes the warps' dependence slots (default: the most the batch's
    programs use; register dependences, docs/model.md section 7); `data_tables` compiles in data
    tables as long as the trace (True) or decides by the batch (None: where a program of the
    batch reads data), so that kernels with and without data share a compilation (the loop and
    branch tables are not padded on request: the engine takes a faster form for programs of
    one loop). `chunk` runs the batch that many configurations at a time in one compiled call
    (default `default_chunk`: on the CPU, as many as keep a step's arrays in cache; elsewhere
    all at once) on each device. `devices` (default: the one device of an enclosing
    `jax.default_device`, else every local device of the default backend: on the CPU one per
    core, `engine/mechanics/devices.py`) share the batch, each running a contiguous slice of it. Results depend on neither, nor on
    `fast_forward` (as in `simulate`).
    """
    if isinstance(archs, Params) or (isinstance(archs, (list, tuple)) and archs and isinstance(archs[0], Params)):
        check(all(x is None for x in (kernels, clocks, warp_policy, dispatch, dispatch_start, dispatch_weight, dvfs)),
              "simulate_batch", "Params with other inputs", "stacked Params (or a list of them) alone")
        ps = _for_each(_unstacked(archs), lambda i, p: checked(p))
    else:
        ps = _keyword_params(archs, kernels, clocks, warp_policy, dispatch, dispatch_start, dispatch_weight,
                             ema_alpha, ema_prior_ns, hold_margin, hold_noise, hold_queue, hold_left, dvfs)
    items, shape_list = _prepare_batch(ps)
    shape_set = {dataclass_key(s) for s in shape_list}
    check(len(shape_set) == 1, "batch", sorted(shape_set),
          "every configuration needs the same SM slots, warp slots, schedulers, program length and number "
          "of launches (pad programs with make_kernel(pad_to=...))")
    shapes = dataclasses.replace(shape_list[0],
                                 max_ctas=_padded("max_ctas", max_ctas, [s.max_ctas for s in shape_list], "grid",
                                                  2**31 - 1),
                                 cta_slots=_padded("cta_slots", cta_slots, [s.cta_slots for s in shape_list],
                                                   "occupancy", 1024),
                                 trace_len=_trace_len(trace_len),
                                 dvfs=_compiled_in(any(any_dvfs(p.dvfs) for p in ps), dvfs_step, "dvfs_step",
                                                   "a configuration of the batch has DVFS on"),
                                 closed_loop=_compiled_in(uses_closed_loop([p.dispatch for p in ps]), closed_loop_step,
                                                          "closed_loop_step",
                                                          "a configuration of the batch dispatches by closed_loop"),
                                 fast_forward=_fast_forward_in(fast_forward, fast_forward_step, items),
                                 data_rows=1, loops=max(s.loops for s in shape_list),
                                 branches=max(s.branches for s in shape_list),
                                 dep_slots=_padded("dep_slots", dep_slots, [s.dep_slots for s in shape_list],
                                                   "dependence slots", MAX_DEP_SLOTS))
    # data tables span the padded trace's CTAs, so that batches of other grids share a compilation
    reads_data = _compiled_in(max(s.data_rows for s in shape_list) > 1, data_tables, "data_tables",
                              "a program of the batch reads data")
    shapes = dataclasses.replace(shapes, data_rows=shapes.max_ctas if reads_data else 1)
    shapes = dataclasses.replace(shapes, free_sms=_free_sms_in(shapes.fast_forward, free_sms_step))
    check(chunk is None or (isinstance(chunk, (int, np.integer)) and 1 <= chunk <= 2**31 - 1), "chunk", chunk,
          "an integer in 1 .. 2^31 - 1, or None")
    chunk = default_chunk(shapes) if chunk is None else int(chunk)
    shapes = dataclasses.replace(shapes, guarded=False)  # a batch is stacked in numpy: every value concrete, checked
    sized = compiled_shapes(shapes)
    batch = stack([engine_params(p, item, sized) for p, item in zip(ps, items)])
    devices = default_devices() if devices is None else list(devices)
    check(len(devices) >= 1, "devices", devices, "at least one device")
    with jax.enable_x64(True), jax.default_device(devices[0]):
        result = _compiled(batch, shapes=sized, max_ticks=_max_ticks(max_ticks), batched=True, chunk=chunk,
                           mesh=mesh_of(devices))
        result = jax.device_get(result)
    _check_done(result, max_ticks)
    return _trimmed(result, shapes.max_ctas)


def _keyword_params(archs: Sequence[Arch], kernels: Sequence[Kernel] | Sequence[Workload] | None,
                    clocks: Sequence[Clocks] | None, warp_policy: ArrayLike | None, dispatch: ArrayLike | None,
                    dispatch_start: ArrayLike | None, dispatch_weight: Sequence[ArrayLike | None] | None,
                    ema_alpha: ArrayLike, ema_prior_ns: ArrayLike, hold_margin: ArrayLike, hold_noise: ArrayLike,
                    hold_queue: ArrayLike, hold_left: ArrayLike, dvfs: Sequence[Dvfs | None] | None) -> list[Params]:
    """The `Params` of `simulate_batch`'s keyword form, one per configuration (`make_params`)."""
    check(all(x is not None for x in (kernels, clocks, warp_policy, dispatch, dispatch_start)),
          "simulate_batch", "missing inputs", "stacked Params, or archs, kernels, clocks, warp_policy, dispatch and "
          "dispatch_start")
    n = len(archs)
    check(len(kernels) == n and len(clocks) == n, "batch", (n, len(kernels), len(clocks)),
          "archs, kernels and clocks must have the same length")
    weights = [None] * n if dispatch_weight is None else list(dispatch_weight)
    dvfs_list = [None] * n if dvfs is None else list(dvfs)
    check(len(weights) == n, "dispatch_weight", len(weights), f"one entry per configuration ({n})")
    check(len(dvfs_list) == n, "dvfs", len(dvfs_list), f"one entry per configuration ({n})")
    columns = dict(warp_policy=policy_indices(_int32s(warp_policy, "warp_policy", n), WARP_POLICIES, "warp_policy"),
                   dispatch=policy_indices(_int32s(dispatch, "dispatch", n), DISPATCH_POLICIES, "dispatch"),
                   dispatch_start=_int32s(dispatch_start, "dispatch_start", n, low=0),
                   ema_alpha=_floats(ema_alpha, "ema_alpha", n), ema_prior_ns=_floats(ema_prior_ns, "ema_prior_ns", n),
                   hold_margin=_floats(hold_margin, "hold_margin", n), hold_noise=_floats(hold_noise, "hold_noise", n),
                   hold_queue=_floats(hold_queue, "hold_queue", n), hold_left=_floats(hold_left, "hold_left", n))
    return _for_each(list(range(n)), lambda i, _: make_params(
        archs[i], kernels[i], clocks[i], dispatch_weight=weights[i], dvfs=dvfs_list[i],
        **{name: col[i].item() for name, col in columns.items()}))


def _floats(values: ArrayLike, field: str, n: int) -> np.ndarray:
    """A batch's per-configuration numbers (one value for all, or one per configuration)."""
    a = np.asarray(values)
    check(a.ndim == 0 or a.shape == (n,), field, f"shape {a.shape}", f"one value, or one per configuration ({n})")
    return np.broadcast_to(a, (n,))


def _unstacked(params: Params | Sequence[Params]) -> list[Params]:
    """The configurations of stacked `Params` (a leading axis on every array), or of a list."""
    if not isinstance(params, Params):
        check(all(isinstance(p, Params) for p in params), "simulate_batch", "a list mixing Params and other inputs",
              "a list of Params")
        return list(params)
    n = int(np.shape(params.warp_policy)[0]) if np.ndim(params.warp_policy) == 1 else 0
    check(n >= 1, "simulate_batch", "unstacked Params", "js.stack([...]) of Params, or js.simulate for one")
    return [jax.tree.map(lambda x, i=i: x[i], params) for i in range(n)]


def _padded(field: str, given: int | None, sizes: list[int], what: str, most: int) -> int:
    """A size the batch pads to: `given`, which must cover every configuration, else the largest."""
    need = max(sizes)
    check(given is None or (isinstance(given, (int, np.integer)) and need <= given <= most), field, given,
          f"an integer in {need} (the batch's largest {what}) .. {most}")
    return need if given is None else int(given)


def dataclass_key(shapes: Shapes) -> tuple[int, ...]:
    """The static sizes every configuration of a batch must share (the batch pads CTA slots and
    the CTA trace to its largest)."""
    return (shapes.n_sm, shapes.warp_slots, shapes.schedulers, shapes.n_instr, shapes.n_launches)


def _prepare_batch(ps: Sequence[Params]) -> tuple[list, list[Shapes]]:
    """The configurations' kernels checked against their chips, or their workloads made ready,
    and their static sizes. Kernels differ in grid size only through the traced `grid_ctas`
    (nothing to pad); workloads are padded to the longest program of the batch and must have
    one number of launches."""
    workloads = [isinstance(p.kernel, Workload) for p in ps]
    check(all(workloads) or not any(workloads), "batch", "kernels and workloads",
          "one kind per batch: all kernels or all workloads")
    if any(workloads):
        check(len({p.kernel.n_launches for p in ps}) == 1, "batch", sorted({p.kernel.n_launches for p in ps}),
              "workloads in one batch need the same number of launches")
    n_instr = max(k.n_instr for p in ps for k in p.kernel.kernels) if any(workloads) else None
    prepared = _for_each(list(ps), lambda i, p: _prepared(p, n_instr))
    return [k for k, _ in prepared], [s for _, s in prepared]
