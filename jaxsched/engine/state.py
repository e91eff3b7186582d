"""The JAX engine's evolving state: SMs, warp slots, CTA slots, chip queues, counters.

Shapes are static (`lower.Shapes`): `sm` SM slots, `warp` warp slots per SM (slot `4q + j`
belongs to scheduler `j` and is held at position `j * n_q + q`), `cta` CTA slots per SM, `grid`
the per-CTA trace length. The SM axis is last (`slots.py`); `Result` gives the per-SM
counters SM-first.
"""

from __future__ import annotations

import equinox as eqx
import jax.numpy as jnp
from jaxtyping import Array, Bool, Int

from ..isa import Op
from ..lower import Shapes

INF = jnp.iinfo(jnp.int32).max  # "never" for ticks and cycles
NO_WARP = -1  # the pc of an empty or exited warp slot
N_PIPES = 3  # FMA, ALU, SFU: the pipes with an issue interval (isa.Op values 0..2)
N_STALLS = 8
STALL_REASONS = (
    "selected",
    "not_selected",
    "long_scoreboard",
    "short_scoreboard",
    "wait",
    "barrier",
    "mio_throttle",
    "math_pipe_throttle",
)


class Warps(eqx.Module):
    """Per warp slot. Every step reads `wake` and `issue_class` (and `age` for the warp policies) of every
    slot; the other fields only for the warp a scheduler selects (`status.py`)."""

    pc: Int[Array, "warp sm"]  # NO_WARP: empty or exited
    trips_left: Int[Array, "loop warp sm"]  # per loop: trips to go (its trips outside it)
    trips: Int[Array, "loop warp sm"]  # per loop: the warp's trips, for its next entry (empty: one loop)
    lanes: Int[Array, "warp sm"]
    branch_lanes: Int[Array, "branch warp sm"]  # per branch: lanes of its if- and else-path, `if | else << 6`
    age: Int[Array, "warp sm"]
    # per dependence slot (docs/model.md section 7): when the results it holds are ready
    ready_fixed: Int[Array, "slot warp sm"]  # SM cycle
    ready_mio: Int[Array, "slot warp sm"]  # SM cycle
    ready_mem: Int[Array, "slot warp sm"]  # tick
    ready_fetch: Int[Array, "warp sm"]  # SM cycle: refetch after a taken branch (section 7)
    launch: Int[Array, "warp sm"]  # the workload launch whose program the warp runs
    wake: Int[Array, "warp sm"]  # first SM cycle its scoreboard lets it issue; INF: no warp or at a barrier
    issue_class: Int[Array, "warp sm"]  # throttle class of the instruction at pc (status.op_class)


class DvfsState(eqx.Module):
    """Section 12's controller, power and thermal state. Domain values are replicated on every SM
    of the domain, so every update is elementwise over SMs."""

    domain_mhz: Int[Array, " sm"]  # fd(cd(s)): the controlled clock of the SM's domain
    pending_mhz: Int[Array, " sm"]
    pending_tick: Int[Array, ""]  # INF: no decision in flight
    droop_mhz: Int[Array, " sm"]
    pending_droop_mhz: Int[Array, " sm"]
    droop_tick: Int[Array, ""]  # INF: no droop in flight
    temp_mk: Int[Array, " sm"]  # int64
    energy_pj: Int[Array, " sm"]  # int64
    energy_at_sample_pj: Int[Array, " sm"]  # int64
    snap_issued_op: Int[Array, "op sm"]  # int64 counters at the last fold
    snap_cycles: Int[Array, " sm"]  # int64
    next_sample: Int[Array, ""]
    n_sample: Int[Array, ""]
    trace_tick: Int[Array, " row"]
    trace_mhz: Int[Array, "row sm"]
    trace_mw: Int[Array, "row sm"]  # int64
    trace_mk: Int[Array, "row sm"]  # int64


class Recurrence(eqx.Module):
    """Per SM, the state recorded at the last snapshot point of the search for a recurring state
    (`fast_forward.py`, docs/model.md section 11): the warps' pcs and their ready times relative
    to the SM's cycle (clamped at 0: a past time acts as "now"), the trip counts, the SM's
    scheduling state and its counters. Snapshots are taken at doubling intervals of recorded
    points (Brent's cycle detection)."""

    valid: Bool[Array, " sm"]  # a snapshot exists, and every warp's memory results had arrived then
    cycle: Int[Array, " sm"]
    pc: Int[Array, "warp sm"]
    trips: Int[Array, "warp sm"]
    wake: Int[Array, "warp sm"]  # relative (INF kept)
    fixed: Int[Array, "slot warp sm"]
    short: Int[Array, "slot warp sm"]
    fetch: Int[Array, "warp sm"]
    pipe: Int[Array, "pipe sched sm"]  # relative, 1/64 cycle, int64
    mio: Int[Array, " sm"]
    last: Int[Array, "sched sm"]
    credit: Int[Array, " sm"]
    cta_id: Int[Array, "cta sm"]
    arrived: Int[Array, "cta sm"]
    g_waiting: Int[Array, " sm"]
    counters: Int[Array, "count sm"]  # int64, `fast_forward.counter_rows` order
    power: Int[Array, " sm"]  # points between snapshots, doubling
    count: Int[Array, " sm"]  # points since the snapshot


class Counters(eqx.Module):
    """Outputs accumulated while running (docs/model.md section 10). Per-SM counts are int64:
    64 warps x 2e9 cycles would overflow int32 within a few milliseconds of simulated time."""

    sm_cycles: Int[Array, " sm"]
    sm_busy_cycles: Int[Array, " sm"]
    sm_issued: Int[Array, " sm"]
    sm_issued_op: Int[Array, "op sm"]  # by isa.Op class
    sm_active_lanes: Int[Array, " sm"]
    sm_warp_cycles: Int[Array, " sm"]
    sm_stalls: Int[Array, "reason sm"]
    sm_ctas: Int[Array, " sm"]
    sm_items: Int[Array, " sm"]  # work items taken (persistent kernels), int64
    cta_sm: Int[Array, " grid"]
    cta_start_tick: Int[Array, " grid"]
    cta_end_tick: Int[Array, " grid"]
    # The dispatcher's score when the CTA was placed (int64): with CTAs placed at their SM's own
    # tick (`decouple.py`), the trace is put in grid order by (start tick, score) at the end.
    cta_key: Int[Array, " grid"]


class Dispatch(eqx.Module):
    """What the dispatch policies remember between placements (docs/model.md section 9)."""

    # closed loop: a CTA's duration per launch and SM, ticks (int64; -1 - prior until the SM's first
    # completion of the launch)
    est: Int[Array, "launch sm"]
    sq: Int[Array, "launch sm"]  # closed loop: the same EMA of squared CTA durations, ticks^2 (int64)
    hold: Bool[Array, ""]  # closed loop: CTAs held back this tick, re-evaluated the next
    pointer: Int[Array, ""]  # round robin: the shared pointer, in dispatch-rank space


class State(eqx.Module):
    # The next tick to process; where SMs run on their own time (`decouple.py`), the chip's next
    # tick: the next dispatch an SM waits for, DVFS event or the tick limit.
    tick: Int[Array, ""]
    freq: Int[Array, " sm"]  # f_s: each SM's clock now, MHz (0 floorswept)
    acc: Int[Array, " sm"]  # clock phase accumulators
    cycle: Int[Array, " sm"]  # cycles executed
    mio: Int[Array, " sm"]  # MIO backlog, cycles
    # from when each pipe is free, in 1/64 cycle (fractional issue intervals, section 7); int64:
    # 64 x 2^30 cycles overflows int32
    pipe_free64: Int[Array, "pipe sched sm"]
    last: Int[Array, "sched sm"]  # last issued warp (q index) per scheduler, -1 none
    launch_credit: Int[Array, " sm"]  # starved scheduler-cycles collected for CTA launches (section 7)
    cta_id: Int[Array, "cta sm"]  # global CTA index g (docs/model.md section 13), -1 free
    cta_launch: Int[Array, "cta sm"]  # launch of each slot's CTA (meaningful while occupied)
    cta_live: Int[Array, "cta sm"]
    cta_arrived: Int[Array, "cta sm"]
    resident: Int[Array, " sm"]  # CTAs resident
    cta_start: Int[Array, "cta sm"]  # start tick of the CTA in each slot
    cta_usable_tick: Int[Array, "cta sm"]  # a free slot takes a CTA from this tick (section 9)
    cta_used: Bool[Array, "cta sm"]  # the slot has held a CTA: refilling it needs launch credit (section 9)
    # the CTA slot of the warp at each position, -1 none: several launches only ([0, sm] with one;
    # engine/residency.py)
    warp_cta: Int[Array, "warp sm"]
    dispatch: Dispatch
    warps: Warps
    q_l2: Int[Array, ""]
    q_dram: Int[Array, ""]
    g_arrived: Int[Array, ""]  # warps arrived at the grid barrier
    g_waiting: Int[Array, " sm"]  # warps of each SM at the grid barrier, until it releases
    g_release: Int[Array, ""]  # tick a completed grid barrier releases (INF: none pending)
    items_taken: Int[Array, ""]  # persistent kernels' global work-queue counter
    next_cta: Int[Array, " launch"]  # per launch, the next CTA to dispatch (local index)
    ctas_done: Int[Array, ""]  # all launches
    last_exit_tick: Int[Array, ""]
    kernel_done: Int[Array, " launch"]  # CTAs completed per launch
    kernel_ready: Int[Array, " launch"]  # ready tick (INF: unknown until its dependencies end)
    kernel_start: Int[Array, " launch"]  # tick of the first CTA's dispatch (-1: not yet)
    kernel_end: Int[Array, " launch"]  # tick its last CTA completed
    counters: Counters
    dvfs: DvfsState
    resume: Int[Array, " sm"]  # the next tick at which the SM runs (ahead of `tick`: fast-forward, own time)
    acct: Int[Array, " sm"]  # the last tick whose cycles the SM's counters hold
    park: Int[Array, " sm"]  # the tick at which the SM waits for the dispatcher (INF: none; `decouple.py`)
    steps: Int[Array, ""]  # steps the event loop took (ticks processed)
    recurrence: Recurrence


N_COUNTER_ROWS = 6 + len(Op) + N_STALLS  # cycles, busy, issued, lanes, warp-cycles, items, per op, per reason


def initial_state(shapes: Shapes) -> State:
    s, w, c, j, n = shapes.n_sm, shapes.warp_slots, shapes.cta_slots, shapes.schedulers, shapes.n_launches
    zi = lambda *shape: jnp.zeros(shape, jnp.int32)  # noqa: E731
    zl = lambda *shape: jnp.zeros(shape, jnp.int64)  # noqa: E731  (needs jax.enable_x64)
    r, n_op, d = shapes.trace_len, len(Op), shapes.dep_slots
    wf = w if shapes.fast_forward else 0  # without fast-forward the search keeps no warps
    return State(
        tick=zi(),
        freq=zi(s),
        acc=zi(s),
        cycle=zi(s),
        mio=zi(s),
        pipe_free64=zl(N_PIPES, j, s),
        last=jnp.full((j, s), -1, jnp.int32),
        launch_credit=zi(s),
        cta_id=jnp.full((c, s), -1, jnp.int32),
        cta_launch=zi(c, s),
        cta_live=zi(c, s),
        cta_arrived=zi(c, s),
        resident=zi(s),
        cta_start=zi(c, s),
        cta_usable_tick=zi(c, s),
        cta_used=jnp.zeros((c, s), bool),
        warp_cta=jnp.full((w if n > 1 else 0, s), -1, jnp.int32),
        dispatch=Dispatch(est=zl(n, s), sq=zl(n, s), hold=jnp.zeros((), bool), pointer=zi()),
        warps=Warps(
            pc=jnp.full((w, s), NO_WARP, jnp.int32),
            trips_left=zi(shapes.loops, w, s),
            trips=zi(shapes.loops if shapes.loops > 1 else 0, w, s),
            lanes=zi(w, s),
            branch_lanes=zi(shapes.branches, w, s),
            age=zi(w, s),
            ready_fixed=zi(d, w, s),
            ready_mio=zi(d, w, s),
            ready_mem=zi(d, w, s),
            ready_fetch=zi(w, s),
            launch=zi(w, s),
            wake=jnp.full((w, s), INF, jnp.int32),
            issue_class=zi(w, s),
        ),
        q_l2=zi(),
        q_dram=zi(),
        g_arrived=zi(),
        g_waiting=zi(s),
        g_release=jnp.full((), INF, jnp.int32),
        items_taken=zi(),
        next_cta=zi(n),
        ctas_done=zi(),
        last_exit_tick=zi(),
        kernel_done=zi(n),
        kernel_ready=jnp.full((n,), INF, jnp.int32),
        kernel_start=jnp.full((n,), -1, jnp.int32),
        kernel_end=zi(n),
        counters=Counters(
            sm_cycles=zl(s),
            sm_busy_cycles=zl(s),
            sm_issued=zl(s),
            sm_issued_op=zl(n_op, s),
            sm_active_lanes=zl(s),
            sm_warp_cycles=zl(s),
            sm_stalls=zl(N_STALLS, s),
            sm_ctas=zi(s),
            sm_items=zl(s),
            cta_sm=jnp.full((shapes.max_ctas,), -1, jnp.int32),
            cta_start_tick=zi(shapes.max_ctas),
            cta_end_tick=zi(shapes.max_ctas),
            cta_key=zl(shapes.max_ctas),
        ),
        dvfs=DvfsState(
            domain_mhz=zi(s),
            pending_mhz=zi(s),
            pending_tick=jnp.full((), INF, jnp.int32),
            droop_mhz=zi(s),
            pending_droop_mhz=zi(s),
            droop_tick=jnp.full((), INF, jnp.int32),
            temp_mk=zl(s),
            energy_pj=zl(s),
            energy_at_sample_pj=zl(s),
            snap_issued_op=zl(n_op, s),
            snap_cycles=zl(s),
            next_sample=zi(),
            n_sample=zi(),
            trace_tick=jnp.full((r,), -1, jnp.int32),
            trace_mhz=zi(r, s),
            trace_mw=zl(r, s),
            trace_mk=zl(r, s),
        ),
        resume=zi(s),
        acct=jnp.full((s,), -1, jnp.int32),
        park=jnp.full((s,), INF, jnp.int32),
        steps=zi(),
        recurrence=Recurrence(
            valid=jnp.zeros((s,), bool),
            cycle=zi(s),
            pc=jnp.full((wf, s), NO_WARP, jnp.int32),
            trips=zi(wf, s),
            wake=zi(wf, s),
            fixed=zi(d, wf, s),
            short=zi(d, wf, s),
            fetch=zi(wf, s),
            pipe=zl(N_PIPES, j, s),
            mio=zi(s),
            last=zi(j, s),
            credit=zi(s),
            cta_id=zi(c, s),
            arrived=zi(c, s),
            g_waiting=zi(s),
            counters=zl(N_COUNTER_ROWS, s),
            power=jnp.ones((s,), jnp.int32),
            count=zi(s),
        ),
    )
