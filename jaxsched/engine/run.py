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

import equinox as eqx
import jax
import jax.numpy as jnp
import numpy as np
from jax.sharding import Mesh
from jaxtyping import Array, ArrayLike

from .. import clocks as clocks_mod
from .. import compile_cache
from ..arch import Arch
from ..clocks import Clocks
from ..dvfs import MAX_TRACE_ROWS, MODES, Dvfs
from ..errors import JaxschedError, check, check_ints, is_traced
from ..kernel import MAX_DEP_SLOTS, MAX_TRIPS, Kernel
from ..policies import DEFAULT_EMA_ALPHA, DEFAULT_EMA_PRIOR_NS, DEFAULT_HOLD_MARGIN
from ..lower import DISPATCH_POLICIES, WARP_POLICIES, Launch, Shapes, lower, policy_indices, shapes_for, validate
from ..params import Params, dispatch_inputs, dvfs_input, make_params
from ..workload import Workload
from .mechanics.devices import default_devices, mesh_of, sharded
from .decouple import decoupling
from .dispatch import variation_tables
from .dispatch_policies import ESTIMATE_POLICIES
from .fast_forward import may_fast_forward
from .launches import Launches, make_launches, single
from .power import domains
from .prepare import WorkloadInput, prepare_workload, workload_shapes
from .mechanics.sizes import compiled_input, compiled_shapes, unnamed
from .result import Result, outputs
from .mechanics.batching import chunked, default_chunk, padded_batch
from .step import Run, loop

MAX_TICKS = 1 << 30  # ~0.54 s at 1.98 GHz; int32 ticks leave headroom above it


def _prepare(launch: Launch, shapes: Shapes, per: Launch | None, launches: Launches | None) -> Run:
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
    work = workload.lower(launch.tick_mhz)
    launch = dataclasses.replace(launch, n_ctas=jnp.sum(work.grid_ctas, dtype=jnp.int32),
                                 ctas_per_sm=jnp.max(per.ctas_per_sm),
                                 smem_per_sm_bytes=jnp.max(per.smem_per_sm_bytes))
    return launch, per, make_launches(per, work, shapes)


def _lower_config(
    arch: Arch,
    kernel: Kernel | WorkloadInput,
    clocks: Clocks,
    warp_policy: Array,
    dispatch_policy: Array,
    dispatch_start: Array,
    dispatch_weight: Array,
    ema_alpha: Array,
    ema_prior_ns: Array,
    hold_margin: Array,
    dvfs: Dvfs,
    *,
    shapes: Shapes,
) -> Run:
    """One configuration's lowering and tables (a kernel, or a prepared workload)."""

    def lower_one(k: Kernel) -> Launch:
        return lower(arch, k, clocks, warp_policy, dispatch_policy, dispatch_start,
                     dispatch_weight, ema_alpha, ema_prior_ns, hold_margin, dvfs)

    if isinstance(kernel, WorkloadInput):
        launch, per, launches = _lower_workload(kernel, lower_one, shapes)
        return _prepare(_guarded(launch, kernel.kernels) if shapes.guarded else launch, shapes, per, launches)
    launch = lower_one(kernel)
    return _prepare(_guarded(launch, (kernel,)) if shapes.guarded else launch, shapes, None, single(launch, shapes))


def _guarded(launch: Launch, kernels: Sequence[Kernel]) -> Launch:
    """The engine's last guard on values that were traced when the configuration was built (the
    modules check concrete ones): a run whose clocks, trip counts or probabilities could only
    give wrong numbers or never end raises at run time (`equinox.error_if`) instead. Left out
    where every value was concrete (`Shapes.guarded`)."""
    enabled = launch.sm_enabled
    bad_clock = (launch.tick_mhz < 1) | jnp.any(enabled & ((launch.sm_freq_mhz < 1)
                                                           | (launch.sm_freq_mhz > clocks_mod.MAX_MHZ)))
    tick = eqx.error_if(launch.tick_mhz, bad_clock,
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
    return dataclasses.replace(launch, tick_mhz=tick)


def _run_config(*config, shapes: Shapes, max_ticks: int) -> Result:
    """One configuration (the arguments of `_lower_config`): a batch of one."""
    one = _run_batch(*jax.tree.map(lambda x: jnp.asarray(x)[None], config), shapes=shapes, max_ticks=max_ticks)
    return jax.tree.map(lambda x: x[0], one)


def _run_batch(*config, shapes: Shapes, max_ticks: int) -> Result:
    """A batch of configurations (a leading axis on every argument) in one loop (`step.loop`)."""
    runs = jax.vmap(functools.partial(_lower_config, shapes=shapes))(*config)
    final, _ = loop(runs, shapes, max_ticks)
    return jax.vmap(lambda f, r, a: outputs(f, r, a, shapes))(final, runs, config[0])


@compile_cache.stored
@functools.partial(jax.jit, static_argnames=("shapes", "max_ticks", "batched", "chunk", "mesh"))
def _compiled(*config, shapes: Shapes, max_ticks: int, batched: bool, chunk: int | None = None,
              mesh: Mesh | None = None):
    """One configuration, or (`batched`) a stack of them, split over the devices of `mesh`
    (None: the default device) and on each `chunk` at a time (None: all at once)."""
    if not batched:
        return _run_config(*config, shapes=shapes, max_ticks=max_ticks)
    fn = functools.partial(_run_batch, shapes=shapes, max_ticks=max_ticks)
    if mesh is None:
        return chunked(fn, config, chunk)
    padded, n = padded_batch(config, mesh.size)
    out = sharded(lambda *c: chunked(fn, c, chunk), mesh)(*padded)
    return jax.tree.map(lambda y: y[:n], out)


def any_dvfs(dvfs: Dvfs) -> bool:
    """Whether a configuration (or any of a stack) has DVFS on, so needs the DVFS step."""
    return bool(np.any(np.asarray(dvfs.mode) != MODES.index("off")))


def _dvfs_step(dvfs: Dvfs, requested: bool | None) -> bool:
    """`Shapes.dvfs`: the batch's own need, or the caller's choice where that covers it."""
    return _compiled_in(any_dvfs(dvfs), requested, "dvfs_step", "a configuration of the batch has DVFS on")


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
    trace_len: int = 0,
    max_ticks: int = MAX_TICKS,
    fast_forward: bool = True,
    **config: object,
) -> Result:
    """Simulate one kernel launch, or a workload of several (`jaxsched.workload`: streams,
    events, CUDA graphs; docs/model.md section 13), on one chip: `simulate(params)` with a
    `jaxsched.Params`, or `simulate(arch, kernel, clocks, **config)`, which builds it with
    `make_params` (keywords `warp_policy`, `dispatch`, `dispatch_start`, `dispatch_weight`,
    `ema_alpha`, `ema_prior_ns`, `hold_margin`, `dvfs`).

    Warp policies `WARP_POLICIES` (lrr, gto, oldest); dispatch policies `DISPATCH_POLICIES`
    (the modules of `engine/dispatch_policies/`: hardware, ...; docs/model.md section 9).
    `dispatch_start` rotates the hardware SM order; `dispatch_weight` (per SM slot, default the
    SM clocks in MHz) drives `weighted`; `ema_alpha`, `ema_prior_ns` and `hold_margin` drive
    `closed_loop`.
    `dvfs` (`jaxsched.dvfs.default(arch)`, `locked(...)`; default static clocks) turns on the
    power, thermal and clock-controller model with `clocks` as each SM's cap (section 12), and
    `trace_len` rows of the clock trace are kept. `fast_forward` jumps whole periods of an SM's
    recurring state (docs/model.md section 11); results are the same without it, bit for bit.
    """
    if isinstance(arch, Params):
        check(kernel is None and clocks is None and not config, "simulate", "Params with other inputs",
              "a Params alone, or arch, kernel, clocks and keywords")
        p = arch
    else:
        p = make_params(arch, kernel, clocks, **config)
    arch, kernel, clocks = p.arch, p.kernel, p.clocks
    if isinstance(kernel, Workload):
        kernel = prepare_workload(kernel, arch, clocks)
        shapes = workload_shapes(arch, kernel)
    else:
        validate(arch, kernel, clocks)
        shapes = shapes_for(arch, kernel)
    shapes = dataclasses.replace(shapes, guarded=any(is_traced(x) for x in jax.tree.leaves(p)))
    ff = _fast_forward_in(fast_forward, None, [kernel])
    shapes = dataclasses.replace(shapes, trace_len=_trace_len(trace_len), dvfs=any_dvfs(p.dvfs),
                                 closed_loop=uses_closed_loop(p.dispatch), fast_forward=ff, free_sms=ff)
    sized = compiled_shapes(shapes)
    with jax.enable_x64(True):
        result = _compiled(unnamed(arch), compiled_input(kernel, sized), clocks, p.warp_policy, p.dispatch,
                           p.dispatch_start, p.dispatch_weight, p.ema_alpha, p.ema_prior_ns, p.hold_margin, p.dvfs,
                           shapes=sized,
                           max_ticks=_max_ticks(max_ticks), batched=False)
        result = jax.device_get(result)
    _check_done(result, max_ticks)
    return _trimmed(result, shapes.max_ctas)


def _trimmed(result: Result, n_ctas: int) -> Result:
    """`result` with its per-CTA trace cut to `n_ctas` entries (`sizes.compiled_shapes` pads it)."""
    cut = lambda x: x[..., :n_ctas]  # noqa: E731
    return dataclasses.replace(result, cta_sm=cut(result.cta_sm), cta_start_tick=cut(result.cta_start_tick),
                               cta_end_tick=cut(result.cta_end_tick), cta_kernel=cut(result.cta_kernel))


def stack(items: Sequence[eqx.Module]) -> eqx.Module:
    """Stack equal-shaped pytrees (Arch, Kernel, Clocks) along a new leading batch axis.

    Names may differ (the stack is named by joining them); other static fields, which fix
    shapes or rules (compute capability, schedulers per SM), must agree.
    """
    first = items[0]
    if dataclasses.is_dataclass(first):
        statics = [f.name for f in dataclasses.fields(first) if f.metadata.get("static")]
        for field in statics:
            values = [getattr(x, field) for x in items]
            if field == "name":
                joined = "|".join(dict.fromkeys(values))
                items = [dataclasses.replace(x, name=joined) if x.name != joined else x for x in items]
            else:
                check(len(set(values)) == 1, field, sorted(set(map(str, values))),
                      "configurations in one batch must agree on it")
    return jax.tree.map(lambda *xs: np.stack([np.asarray(x) for x in xs]), *items)


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
    dvfs: Sequence[Dvfs | None] | None = None,
    trace_len: int = 0,
    max_ticks: int = MAX_TICKS,
    dvfs_step: bool | None = None,
    closed_loop_step: bool | None = None,
    fast_forward_step: bool | None = None,
    free_sms_step: bool | None = None,
    cta_slots: int | None = None,
    max_ctas: int | None = None,
    dep_slots: int | None = None,
    chunk: int | None = None,
    devices: Sequence | None = None,
    fast_forward: bool = True,
) -> Result:
    """Simulate N configurations in one vmapped call (one compilation for equal static shapes):
    `simulate_batch(js.stack(params))` (or a list of `Params`), or the configurations' parts as
    below.

    Policies are integer arrays of length N (indices into `WARP_POLICIES`/`DISPATCH_POLICIES`);
    `dispatch_weight` is a list of per-SM weights (or None: the clocks), `ema_alpha`,
    `ema_prior_ns` and `hold_margin` scalars or length-N arrays; `dvfs` a list of `Dvfs` (None: static clocks).
    `kernels` may instead be workloads with one number of launches (streams, dependencies and
    modes may differ); their programs are padded to one length. `dvfs_step` compiles the DVFS
    step in (True) or out (False: every configuration must have DVFS off); None decides by the
    batch. A sweep passes True when any of its configurations has DVFS on, so that its chunks
    share one compilation. `closed_loop_step` likewise compiles in the closed loop's learning
    (True) or leaves it out (False: no configuration may dispatch by `closed_loop`), and
    `fast_forward_step` fast-forward's search (None: where a kernel of the batch could use it,
    `fast_forward.may_fast_forward`; it is exact either way), and `free_sms_step` lets SMs run on
    their own time (`engine/decouple.py`; None: with fast-forward; exact either way). `cta_slots`
    sizes the per-SM CTA-slot arrays at least this large (default: the batch's largest
    occupancy), and `max_ctas` the per-CTA trace (default: the batch's largest grid); a sweep
    passes its largest of each, for the same reason and so that every chunk's trace has the
    sweep's length; `dep_slots` sizes the warps' dependence slots (default: the most the batch's
    programs use; register dependences, docs/model.md section 7). `chunk` runs the batch that many configurations at a time in one compiled
    call (default `default_chunk`: on the CPU, as many as keep a step's arrays in cache;
    elsewhere all at once) on each device. `devices` (default: the one
    device of an enclosing `jax.default_device`, else every local device of the default backend:
    on the CPU one per core, `engine/mechanics/devices.py`) share the batch, each running a contiguous
    slice of it. Results depend on neither, nor on `fast_forward` (as in `simulate`).
    """
    if isinstance(archs, Params) or (isinstance(archs, (list, tuple)) and archs and isinstance(archs[0], Params)):
        check(all(x is None for x in (kernels, clocks, warp_policy, dispatch, dispatch_start, dispatch_weight, dvfs)),
              "simulate_batch", "Params with other inputs", "stacked Params (or a list of them) alone")
        ps = _unstacked(archs)
        archs, kernels, clocks = [p.arch for p in ps], [p.kernel for p in ps], [p.clocks for p in ps]
        warp_policy, dispatch, dispatch_start = ([getattr(p, f) for p in ps]
                                                 for f in ("warp_policy", "dispatch", "dispatch_start"))
        dispatch_weight, dvfs = [p.dispatch_weight for p in ps], [p.dvfs for p in ps]
        ema_alpha, ema_prior_ns, hold_margin = (np.asarray([getattr(p, f) for p in ps])
                                                for f in ("ema_alpha", "ema_prior_ns", "hold_margin"))
    check(all(x is not None for x in (kernels, clocks, warp_policy, dispatch, dispatch_start)),
          "simulate_batch", "missing inputs", "stacked Params, or archs, kernels, clocks, warp_policy, dispatch and "
          "dispatch_start")
    n = len(archs)
    check(len(kernels) == n and len(clocks) == n, "batch", (n, len(kernels), len(clocks)),
          "archs, kernels and clocks must have the same length")
    kernels, shape_list = _prepare_batch(archs, kernels, clocks)
    shape_set = {dataclass_key(s) for s in shape_list}
    check(len(shape_set) == 1, "batch", sorted(shape_set),
          "every configuration needs the same SM slots, warp slots, schedulers, program length and number "
          "of launches (pad programs with make_kernel(pad_to=...))")
    dvfs_list = [None] * n if dvfs is None else list(dvfs)
    check(len(dvfs_list) == n, "dvfs", len(dvfs_list), f"one entry per configuration ({n})")
    dvfs_stack = stack(_for_each(list(zip(archs, dvfs_list)), lambda i, ad: dvfs_input(*ad)))
    shapes = dataclasses.replace(shape_list[0],
                                 max_ctas=_padded("max_ctas", max_ctas, [s.max_ctas for s in shape_list], "grid",
                                                  2**31 - 1),
                                 cta_slots=_padded("cta_slots", cta_slots, [s.cta_slots for s in shape_list],
                                                   "occupancy", 1024),
                                 trace_len=_trace_len(trace_len), dvfs=_dvfs_step(dvfs_stack, dvfs_step),
                                 closed_loop=_compiled_in(uses_closed_loop(dispatch), closed_loop_step,
                                                          "closed_loop_step",
                                                          "a configuration of the batch dispatches by closed_loop"),
                                 fast_forward=_fast_forward_in(fast_forward, fast_forward_step, kernels),
                                 data_rows=1, loops=max(s.loops for s in shape_list),
                                 branches=max(s.branches for s in shape_list),
                                 dep_slots=_padded("dep_slots", dep_slots, [s.dep_slots for s in shape_list],
                                                   "dependence slots", MAX_DEP_SLOTS))
    # data tables span the padded trace's CTAs, so that batches of other grids share a compilation
    shapes = dataclasses.replace(shapes, data_rows=shapes.max_ctas if max(s.data_rows for s in shape_list) > 1 else 1)
    shapes = dataclasses.replace(shapes, free_sms=_free_sms_in(shapes.fast_forward, free_sms_step))
    check(chunk is None or (isinstance(chunk, (int, np.integer)) and 1 <= chunk <= 2**31 - 1), "chunk", chunk,
          "an integer in 1 .. 2^31 - 1, or None")
    chunk = default_chunk(shapes) if chunk is None else int(chunk)
    shapes = dataclasses.replace(shapes, guarded=False)  # a batch is stacked in numpy: every value concrete, checked
    as_i32 = lambda v: np.broadcast_to(np.asarray(v, dtype=np.int32), (n,))  # noqa: E731
    warp_policy = policy_indices(_int32s(warp_policy, "warp_policy", n), WARP_POLICIES, "warp_policy")
    dispatch = policy_indices(_int32s(dispatch, "dispatch", n), DISPATCH_POLICIES, "dispatch")
    dispatch_start = _int32s(dispatch_start, "dispatch_start", n, low=0)
    weights = [None] * n if dispatch_weight is None else list(dispatch_weight)
    alphas = np.broadcast_to(np.asarray(ema_alpha, dtype=np.float32), (n,))
    priors = np.broadcast_to(np.asarray(ema_prior_ns, dtype=np.float32), (n,))
    margins = np.broadcast_to(np.asarray(hold_margin, dtype=np.float32), (n,))
    extra = _for_each(list(zip(archs, clocks, weights, alphas, priors, margins)), lambda i, x: dispatch_inputs(*x))
    extra = tuple(np.stack(col) for col in zip(*extra))
    sized = compiled_shapes(shapes)
    devices = default_devices() if devices is None else list(devices)
    check(len(devices) >= 1, "devices", devices, "at least one device")
    with jax.enable_x64(True), jax.default_device(devices[0]):
        result = _compiled(stack([unnamed(a) for a in archs]), stack([compiled_input(k, sized) for k in kernels]),
                           stack(clocks), as_i32(warp_policy), as_i32(dispatch), as_i32(dispatch_start), *extra,
                           dvfs_stack, shapes=sized, max_ticks=_max_ticks(max_ticks), batched=True, chunk=chunk,
                           mesh=mesh_of(devices))
        result = jax.device_get(result)
    _check_done(result, max_ticks)
    return _trimmed(result, shapes.max_ctas)


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


def _prepare_batch(
    archs: Sequence[Arch], items: Sequence[Kernel] | Sequence[Workload], clocks: Sequence[Clocks]
) -> tuple[list, list[Shapes]]:
    """Validated configurations and their static sizes. Kernels differ in grid size only through
    the traced `grid_ctas` (nothing to pad); workloads are padded to the longest program of the
    batch and must have one number of launches."""
    workloads = [isinstance(x, Workload) for x in items]
    check(all(workloads) or not any(workloads), "batch", "kernels and workloads",
          "one kind per batch: all kernels or all workloads")
    if not any(workloads):
        _for_each(list(zip(archs, items, clocks)), lambda i, akc: validate(*akc))
        return list(items), [shapes_for(a, k) for a, k in zip(archs, items)]
    check(len({w.n_launches for w in items}) == 1, "batch", sorted({w.n_launches for w in items}),
          "workloads in one batch need the same number of launches")
    n_instr = max(k.n_instr for w in items for k in w.kernels)
    prepared = _for_each(list(zip(items, archs, clocks)), lambda i, wac: prepare_workload(*wac, n_instr))
    return prepared, [workload_shapes(a, w) for a, w in zip(archs, prepared)]
