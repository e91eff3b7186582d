"""The reference simulator: the oracle for the JAX engine.

This module is a plain-Python (numpy and the standard library only, no JAX) implementation of
the cycle-by-cycle model in `docs/model.md`, sections 2, 4-10, 12 and 13. It favours clarity
over speed: it executes every global tick in turn (no event skipping, section 11 is the JAX
engine's business) and keeps the state of every SM, CTA slot and warp slot in ordinary Python
objects. All arithmetic on simulated quantities is on Python integers, so runs are exact and
deterministic; the JAX engine must reproduce every integer output array exactly.

Entry points:
- `simulate_launch(launch, shapes)`: run one lowered `Launch` (numpy leaves, see
  `lower.to_numpy`) with its static `Shapes`; returns the exact output arrays of sections 10
  and 12.
- `simulate_workload(launches, plan, shapes)`: run several launches (one `Launch` each) under
  section 13's `Plan` (submit ticks, dependencies, launch gap); a kernel alone is the workload
  of one launch with no overhead.
- `simulate(arch, kernel_or_workload, clocks, dvfs=...)`: validate, lower and run one
  configuration; adds `makespan_ns` and `makespan_cycles`. Only this wrapper touches the
  (jax.numpy) lowering in `jaxsched.lower` and `jaxsched.workload`; the simulation itself is
  plain Python.

Order of events (the contract's sections in parentheses):
- tick `k` (8): every SM whose phase accumulator overflows executes one cycle (2), SMs in index
  order; then every launch whose dependencies have now all completed gets its ready tick (13);
  then the grid barrier (8, step 1b: a completed `gsync` schedules its release
  `grid_sync_ticks` later; a release due now frees every waiting warp); then CTA dispatch (9:
  a policy of `reference_dispatch/` (hardware, ...), every one counting only *usable* free
  CTA slots, those freed at least `cta_launch_ticks` ago that have never held a CTA or are on an
  SM that holds a full launch credit, which each refill of a used slot spends (a slot's first
  CTA spends none, so the first wave is placed in tick 0); in a persistent kernel each new warp
  takes its first work item, in placement then warp order; with several launches the head
  launch, the ready one with the smallest `(ready, l)`, places its CTAs first: 13);
  then the L2 and DRAM queues drain by one tick (1024 units); then, unless DVFS is off, the
  DVFS step (12: apply clocks, apply droop, sample, apply again, recompute every `f_s`), whose
  clocks the phase accumulators add from tick `k + 1`.
- SM cycle (7): stall reasons (a warp refetching after a taken loop branch waits), eligibility,
  busy and warp-cycle counts from the start-of-cycle state; schedulers `0 .. schedulers-1`
  select and issue in index order (the order matters for the MIO backlog, the chip-wide memory
  queues, the grid-barrier arrivals and the persistent work queue, whose takes are thus ordered
  (tick, SM index, scheduler)); math pipes are timed in 1/64 cycle, so fractional issue
  intervals accumulate; then CTA barrier releases and CTA completions; then the MIO backlog
  drains by one; last, an SM with a free CTA slot adds its starved schedulers (none of their
  warps eligible or throttled at the start of the cycle) to its launch credit, capped at
  `launch_idle_cycles`. A completing CTA updates its launch's closed-loop estimate for its SM
  (sections 9 and 13), in CTA-slot order. Each warp runs its own launch's program.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from .errors import check
from .isa import Op
from .kernel import FIXED, MAX_DEP_SLOTS, MEMORY, MIO
from .occupancy import REG_SHARE_ONE
from .policies import (DEFAULT_DISPATCH, DEFAULT_DISPATCH_START, DEFAULT_EMA_ALPHA, DEFAULT_EMA_PRIOR_NS,
                       DEFAULT_HOLD_LEFT, DEFAULT_HOLD_MARGIN, DEFAULT_HOLD_NOISE, DEFAULT_HOLD_QUEUE, DEFAULT_TRACE_LEN,
                       DEFAULT_WARP_POLICY, DISPATCH_MODULES, DISPATCH_POLICIES, MAX_HOLD_LEFT, MAX_HOLD_NOISE,
                       MAX_HOLD_QUEUE, WARP_MODULES, WARP_POLICIES)

MASK32 = 0xFFFFFFFF
GOLDEN32 = 0x9E3779B9
QUEUE_ONE_TICK = 1024  # memory-queue backlog units per tick (= lower.QUEUE_ONE_TICK)
ISSUE_ONE_CYCLE = 64  # pipe times are in 1/64 cycle (= arch.ISSUE_UNITS_PER_CYCLE)

# Stall reasons, in the order of the `sm_stalls` columns (model.md section 10).
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
SELECTED, NOT_SELECTED, LONG_SB, SHORT_SB, WAIT, BARRIER, MIO_THROTTLE, MATH_THROTTLE = range(8)
ELIGIBLE = -1  # "no block" marker used while classifying warps

PIPE_OPS = (Op.FMA, Op.ALU, Op.SFU)  # ops with a per-scheduler math pipe; pipe index = op value
MIO_OPS = (Op.LDS, Op.SHFL, Op.LDG)

EMA_ONE = 256  # closed-loop smoothing (ema_alpha_256) and hold margin (hold_margin_256) are in 1/256


# --- section 4: counter-based hashes -----------------------------------------------------------


def lowbias32(x: int) -> int:
    """Chris Wellons' lowbias32 integer hash on unsigned 32-bit integers (wrapping)."""
    x &= MASK32
    x ^= x >> 16
    x = (x * 0x7FEB352D) & MASK32
    x ^= x >> 15
    x = (x * 0x846CA68B) & MASK32
    x ^= x >> 16
    return x


def hash3(seed: int, stream: int, a: int, b: int) -> int:
    """`h(stream, a, b) = lowbias32(lowbias32(lowbias32(seed ^ (stream * 0x9E3779B9)) ^ a) ^ b)`.

    Every operand is taken as an unsigned 32-bit integer (a negative int32 seed wraps).
    """
    x = (seed & MASK32) ^ ((stream * GOLDEN32) & MASK32)
    x = lowbias32(x)
    x = lowbias32(x ^ (a & MASK32))
    return lowbias32(x ^ (b & MASK32))


def warp_lanes(w: int, warps_per_cta: int, lanes_last_warp: int) -> int:
    """Threads of warp `w` of a CTA: 32, except the partial last warp."""
    return lanes_last_warp if w == warps_per_cta - 1 else 32


def warp_trips(seed: int, trips: int, cta_spread: int, warp_spread: int, c: int, w: int, loop: int = 0) -> int:
    """Trip count of loop `loop` for warp `w` of CTA `c`: mean + per-CTA offset + per-warp
    extra, >= 0."""
    cta_off = hash3(seed, 1, c, loop) % (2 * cta_spread + 1) - cta_spread
    warp_add = hash3(seed, 2, c, w + 32 * loop) % (warp_spread + 1)
    return max(0, trips + cta_off + warp_add)


def warp_if_mask(seed: int, branch_threshold: int, c: int, w: int, lanes: int, branch: int = 0) -> int:
    """Lanes of warp `w` of CTA `c` that would take the if-path of branch `branch`, as a bit mask
    (bit l: lane l), before the paths around the branch."""
    return sum(1 << l for l in range(lanes) if (hash3(seed, 3, c, 1024 * branch + 32 * w + l) >> 8) < branch_threshold)


def warp_if_lanes(seed: int, branch_threshold: int, c: int, w: int, lanes: int, branch: int = 0) -> int:
    """How many lanes of warp `w` of CTA `c` take the if-path of branch `branch` (on its own)."""
    return bin(warp_if_mask(seed, branch_threshold, c, w, lanes, branch)).count("1")


# --- static program description ----------------------------------------------------------------


T_MIN_MK, T_MAX_MK = -273_000, 1_000_000  # section 12: temperatures saturate at -273 C and 1000 C


class Program:
    """The per-instruction and structure fields of a launch's `lower.Program` as Python ints and
    lists."""

    def __init__(self, program) -> None:
        ints = lambda a: [int(v) for v in np.asarray(a).reshape(-1)]  # noqa: E731
        self.op = ints(program.op)
        slots = lambda bits: tuple(d for d in range(MAX_DEP_SLOTS) if bits >> d & 1)  # noqa: E731
        # the dependence slots each instruction waits for, per kind of result (section 7)
        self.waits = [tuple(slots(b >> (MAX_DEP_SLOTS * kind)) for kind in (FIXED, MIO, MEMORY))
                      for b in ints(program.waits)]
        self.writes = [slots(b) for b in ints(program.writes)]  # the slots of its kind its result goes to
        self.lat_cycles = ints(program.lat_cycles)
        self.issue_cost64 = ints(program.issue_cost64)  # pipe issue interval, 1/64 cycle
        self.mio_cost = ints(program.mio_cost)
        self.mem_lat_ticks = ints(program.mem_lat_ticks)
        self.l2_cost = ints(program.l2_cost)
        self.dram_cost = ints(program.dram_cost)
        self.grid_sync = [bool(v) for v in np.asarray(program.grid_sync).reshape(-1)]
        self.loops = [(int(a), int(b)) for a, b in zip(ints(program.loop_start), ints(program.loop_end)) if a >= 0]
        self.branches = [(int(a), int(m), int(e), int(p)) for a, m, e, p in zip(
            ints(program.branch_start), ints(program.branch_mid), ints(program.branch_end), ints(program.branch_parent)) if a >= 0]
        # Regions opening at each instruction, outermost first: the longer first, a branch before
        # a loop of the same span, then in opening order (section 6).
        regions = [(e - a, 1, -k, "loop", k) for k, (a, e) in enumerate(self.loops)]
        regions += [(e - 1 - a, 2, -b, "branch", b) for b, (a, _, e, _) in enumerate(self.branches)]
        firsts = [self.loops[k][0] if kind == "loop" else self.branches[k][0] for *_, kind, k in regions]
        self.opening: dict[int, list[tuple[str, int]]] = {}
        for (_, _, _, kind, k), first in sorted(zip(regions, firsts), key=lambda rf: rf[0][:3], reverse=True):
            self.opening.setdefault(first, []).append((kind, k))

    def path_mask(self, b: int, side: int, lanes_mask: int, masks: list[int]) -> int:
        """Lanes on branch `b`'s if-path (`side` 0) or else-path (1): those of the path around it
        (`branch_parent`) that take it, or do not."""
        parent = self.branches[b][3]
        around = lanes_mask if parent < 0 else self.path_mask(parent // 2, parent % 2, lanes_mask, masks)
        return around & (masks[b] if side == 0 else ~masks[b])

    def active_lanes(self, pc: int, lanes_mask: int, masks: list[int]) -> int:
        """Section 6: lanes that execute the instruction at `pc` (SIMT serialisation): the warp's
        lanes on every if- or else-path that holds `pc`."""
        active = lanes_mask
        for b, (start, mid, end, _) in enumerate(self.branches):
            if start <= pc < mid:
                active &= masks[b]
            elif mid <= pc < end:
                active &= ~masks[b]
        return bin(active & 0xFFFFFFFF).count("1")

    def arrive(self, pc: int, warp: "Warp") -> int:
        """Section 6: the pc a warp arriving at `pc` fetches from. At an else-path without lanes
        the warp goes to the branch's end; at the regions opening here, outermost first, it skips
        an if-path without lanes, and enters a loop it is not in: with no trips it skips it, else
        its trips left start at its trip count. Repeated until nothing moves it."""
        while True:
            moved = False
            for b, (start, mid, end, _) in enumerate(self.branches):
                if mid == pc < end and not self.path_mask(b, 1, warp.lanes_mask, warp.masks):
                    pc, moved = end, True
                    break
            for kind, k in ([] if moved else self.opening.get(pc, [])):
                if kind == "branch" and not self.path_mask(k, 0, warp.lanes_mask, warp.masks):
                    pc, moved = self.branches[k][1], True
                    break
                if kind == "loop" and k not in warp.loops_left:
                    if warp.trips[k] == 0:
                        pc, moved = self.loops[k][1] + 1, True
                        break
                    warp.loops_left[k] = warp.trips[k]
            if not moved:
                return pc

    def leave(self, i: int, warp: "Warp") -> int | None:
        """Section 6: after instruction `i`, the start of the loop whose back-edge it takes (the
        innermost loop ending at `i` with trips left, one trip counted down), or None; a loop
        ending at `i` with its last trip done is left."""
        for k in sorted((k for k, (_, e) in enumerate(self.loops) if e == i),
                        key=lambda k: self.loops[k][1] - self.loops[k][0]):
            if warp.loops_left[k] > 1:
                warp.loops_left[k] -= 1
                return self.loops[k][0]
            del warp.loops_left[k]
        return None


# --- state (section 5) -------------------------------------------------------------------------


class Warp:
    """One warp slot of an SM."""

    __slots__ = ("active", "pc", "trips", "loops_left", "lanes", "lanes_mask", "masks", "age",
                 "at_barrier", "ready_fixed", "ready_mio", "ready_mem", "ready_fetch", "cta_slot",
                 "kernel")

    def __init__(self) -> None:
        self.active = False
        self.pc = 0
        self.trips: list[int] = []  # per loop: the warp's trip count
        self.loops_left: dict[int, int] = {}  # the loops it is in: their trips to go
        self.lanes = 0
        self.lanes_mask = 0  # bit l: lane l exists
        self.masks: list[int] = []  # per branch: lanes that would take its if-path
        self.age = 0
        self.at_barrier = False
        # per dependence slot (section 7): when the results it holds are ready
        self.ready_fixed = [0] * MAX_DEP_SLOTS  # SM cycle
        self.ready_mio = [0] * MAX_DEP_SLOTS  # SM cycle
        self.ready_mem = [0] * MAX_DEP_SLOTS  # global tick
        self.ready_fetch = 0  # SM cycle: the refetch after a taken branch
        self.cta_slot = -1
        self.kernel = None  # the `KernelRun` (launch) of the warp's CTA: program and variation


class SM:
    """One SM: clock phase, MIO backlog, CTA slots, per-scheduler pipes, warp slots, counters."""

    def __init__(self, index: int, freq: int, enabled: bool, rank: int, weight: int,
                 launch_credit: int, shapes) -> None:
        self.index = index
        self.freq = freq
        self.enabled = enabled
        self.rank = rank
        self.weight = weight  # weighted dispatch (section 9)
        self.acc = 0
        self.cycle = 0
        self.mio = 0
        self.cta_id = [-1] * shapes.cta_slots  # CTA in each CTA slot, -1 when free
        self.live = [0] * shapes.cta_slots  # live (not exited) warps of the CTA in the slot
        self.start = [0] * shapes.cta_slots  # start tick of the CTA in the slot
        self.usable = [0] * shapes.cta_slots  # tick from which the slot, once free, takes a CTA
        self.used = [False] * shapes.cta_slots  # has held a CTA: refilling it needs launch credit
        self.arrivals = [0] * shapes.cta_slots  # barrier arrivals
        self.base = [0] * shapes.cta_slots  # the first warp slot of the CTA in the slot (section 13)
        self.resident = 0  # occupied CTA slots
        # [sched][FMA/ALU/SFU]: the time in 1/64 cycle from which the pipe is free
        self.pipe_free64 = [[0, 0, 0] for _ in range(shapes.schedulers)]
        # starved scheduler-cycles collected towards the next refill (sections 7 and 9)
        self.launch_credit = launch_credit
        self.last = [-1] * shapes.schedulers  # per scheduler, the last issued q
        self.warps = [Warp() for _ in range(shapes.warp_slots)]
        # counters (section 10)
        self.busy = 0
        self.issued = 0
        self.issued_op = [0] * len(Op)  # issued instructions per isa.Op class
        self.active_lanes = 0
        self.warp_cycles = 0
        self.stalls = [0] * len(STALL_REASONS)
        self.ctas = 0
        self.items = 0  # persistent kernel: work items taken by this SM's warps


class Chip:
    """Chip-wide state: memory queues, grid barrier, work queue, round-robin pointer, per-CTA
    trace over the global CTA index `g` (section 13; per-launch state is in `KernelRun`)."""

    def __init__(self, cta_kernel: list[int]) -> None:
        n_ctas = len(cta_kernel)
        self.q_l2 = 0  # 1/1024 tick
        self.q_dram = 0
        self.g_arrived = 0  # warps arrived at the current grid barrier
        self.g_release: int | None = None  # tick at which a completed grid barrier releases
        self.items_taken = 0  # persistent kernel: the global work-queue counter
        self.rr_pointer = 0  # round-robin dispatch pointer, in dispatch-rank space
        # every estimate update of a learning policy (the closed loop) as (tick, sm, cta,
        # duration, est after), for inspection; not an output of section 10
        self.est_log: list[tuple[int, int, int, int, int]] = []
        self.completed = 0
        self.cta_kernel = list(cta_kernel)  # launch of each CTA g
        self.cta_sm = [-1] * n_ctas
        self.cta_start = [-1] * n_ctas
        self.cta_end = [-1] * n_ctas
        self.warp_issued: list[list[int]] = [[] for _ in range(n_ctas)]  # per CTA, per warp


def _ceil_div(a: int, b: int) -> int:
    return -(-a // b)


# --- section 12: DVFS --------------------------------------------------------------------------

DVFS_OFF, DVFS_ON, DVFS_LOCK = range(3)  # DvfsLaunch.mode (jaxsched.dvfs.MODES)
NOISE_STREAM = 6  # the sensor noise is h(6, n, id(d)), keyed by dvfs_seed
T_REF_MK = 25_000  # leakage is specified at 25 C


def sensor_noise_mw(dvfs_seed: int, n: int, domain_id: int, noise_mw: int) -> int:
    """The power sensor's reading error of clock domain `domain_id` at sample `n`, uniform in
    `[-noise_mw, noise_mw]`: `(h(6, n, id) mod (2 noise_mw + 1)) - noise_mw` (section 12)."""
    return hash3(dvfs_seed, NOISE_STREAM, n, domain_id) % (2 * noise_mw + 1) - noise_mw


def _groups(domain_of: list[int], sms: list[SM]) -> dict[int, list[SM]]:
    """Enabled SMs by domain id (0, the GPC index or the SM index), domains in id order."""
    groups: dict[int, list[SM]] = {}
    for sm in sms:
        if sm.enabled:
            groups.setdefault(domain_of[sm.index], []).append(sm)
    return dict(sorted(groups.items()))


class Dvfs:
    """Section 12's state and steps: domain clocks, droop, temperatures, energies and the
    controller's schedule (the simulated state, not `jaxsched.dvfs.Dvfs`, the parameters).

    It sets `sm.freq` (the `f_s` the phase accumulators add) at the start of the run and after
    every step, and reads the SMs' counters (`issued_op`, `cycle`) for the energy folds.

    Floorswept SMs (our reading; the document only says that their outputs are zero): they
    belong to no domain (they count in neither `n(d)` nor `N`), their `f_s` stays 0 (no clock),
    their power is 0 and their temperature and energy are held at 0, so every floorswept column
    of every output, trace included, is 0. A domain with no enabled SM does not exist.
    """

    def __init__(self, p, sms: list[SM], F: int, trace_len: int) -> None:
        i = lambda v: int(np.asarray(v))  # noqa: E731
        ints = lambda a: [int(v) for v in np.asarray(a).reshape(-1)]  # noqa: E731
        self.mode = i(p.mode)
        self.sms = sms
        self.F = F
        self.f_min, self.f_max, self.bin = i(p.f_min_mhz), i(p.f_max_mhz), i(p.bin_mhz)
        self.P, self.L, self.D = i(p.period_ticks), i(p.latency_ticks), i(p.droop_delay_ticks)
        self.tau = i(p.tau_ticks)
        self.cap_mw, self.uncore_mw, self.noise_mw = i(p.cap_mw), i(p.uncore_mw), i(p.noise_mw)
        self.leak_mw, self.leak_pm = i(p.leak_mw), i(p.leak_pm)
        self.ambient_mk, self.limit_mk, self.hyst_mk = i(p.ambient_mk), i(p.limit_mk), i(p.hyst_mk)
        self.r_mk = i(p.r_mk)
        self.v_min, self.v_max = i(p.v_min_mv), i(p.v_max_mv)
        self.e_op, self.e_cycle = ints(p.e_op_pj), i(p.e_cycle_pj)
        self.droop_m, self.seed, self.trace_every = i(p.droop_m), i(p.seed), i(p.trace_every)
        if self.mode not in (DVFS_ON, DVFS_LOCK):
            raise ValueError(f"Dvfs state needs mode dvfs (1) or lock (2), got {self.mode}")
        if self.P < 1 or self.tau < 1 or self.trace_every < 1 or self.v_max < 1:
            raise ValueError("period_ticks, tau_ticks, trace_every and v_max_mv must be >= 1")
        if not (0 <= self.L <= self.P and 0 <= self.D <= self.P):
            raise ValueError(f"latency {self.L} and droop delay {self.D} ticks must be in 0..P = {self.P}")
        if len(self.e_op) != len(Op):
            raise ValueError(f"e_op_pj has {len(self.e_op)} entries, isa.Op has {len(Op)}")
        n_sm = len(sms)
        self.cap_mhz = [sm.freq for sm in sms]  # the static map cap_s (0 if floorswept)
        self.cd = ints(p.clock_domain)
        self.clock_domains = _groups(self.cd, sms)
        self.thermal_domains = _groups(ints(p.thermal_domain), sms)
        self.n_enabled = sum(1 for sm in sms if sm.enabled)
        # per clock domain: fd (f_init is already lock_mhz in lock mode), the pending clocks
        self.fd = {d: i(p.f_init_mhz) for d in self.clock_domains}
        self.pending_fd: dict[int, int] | None = None
        self.clocks_at: int | None = None  # tick at which pending_fd applies
        # per SM
        self.droop = [0] * n_sm
        self.pending_droop: list[int] | None = None
        self.droop_at: int | None = None
        self.temp_mk = [i(p.temp0_mk) if sm.enabled else 0 for sm in sms]
        self.energy_pj = [0] * n_sm  # E_s
        self.energy_prev_pj = [0] * n_sm  # E'_s, at the previous sample
        self.snap_op = [[0] * len(Op) for _ in sms]  # counters at the last fold
        self.snap_cycles = [0] * n_sm
        # chip-wide
        self.next_sample = i(p.phase_ticks)
        self.n = 0  # samples taken
        self.trace_tick = [-1] * trace_len
        self.trace_mhz = [[0] * n_sm for _ in range(trace_len)]
        self.trace_mw = [[0] * n_sm for _ in range(trace_len)]
        self.trace_mk = [[0] * n_sm for _ in range(trace_len)]
        self.recompute_clocks()

    # V-f curve and clocks

    def voltage_mv(self, f: int) -> int:
        """`V(f)`: linear from `v_min` at `f_min` to `v_max` at `f_max`, clamped."""
        if self.f_max == self.f_min:
            return self.v_max
        f = min(max(f, self.f_min), self.f_max)
        return self.v_min + (self.v_max - self.v_min) * (f - self.f_min) // (self.f_max - self.f_min)

    def sm_voltage_mv(self, sm: SM) -> int:
        """`V_s = V(fd(cd(s)))`: an SM runs at its clock domain's voltage."""
        return self.voltage_mv(self.fd[self.cd[sm.index]])

    def recompute_clocks(self) -> None:
        """`f_s = max(1, min(fd(cd(s)), cap_s) - droop_s)` for enabled SMs (0 if floorswept)."""
        for sm in self.sms:
            if sm.enabled:
                s = sm.index
                sm.freq = max(1, min(self.fd[self.cd[s]], self.cap_mhz[s]) - self.droop[s])

    # energy

    def fold(self, sm: SM) -> None:
        """Energy fold: the activity since the last fold at the SM's present voltage."""
        s = sm.index
        activity_pj = sum(e * (now - then) for e, now, then in
                          zip(self.e_op, sm.issued_op, self.snap_op[s]))
        activity_pj += self.e_cycle * (sm.cycle - self.snap_cycles[s])
        v = self.sm_voltage_mv(sm)
        self.energy_pj[s] += activity_pj * (v * v * 1024 // (self.v_max * self.v_max)) // 1024
        self.snap_op[s] = list(sm.issued_op)
        self.snap_cycles[s] = sm.cycle

    def fold_all(self) -> None:
        for sm in self.sms:
            if sm.enabled:  # a floorswept SM has no activity and no voltage
                self.fold(sm)

    # the step's parts, in the document's order

    def apply_clocks(self, k: int) -> None:
        """Step 1: pending domain clocks that apply at `k` take effect (after a fold at the old
        voltage, so that V is constant between folds)."""
        if self.clocks_at == k:
            self.fold_all()
            self.fd = dict(self.pending_fd)
            self.pending_fd, self.clocks_at = None, None

    def apply_droop(self, k: int) -> None:
        """Step 2: a pending droop that applies at `k` takes effect."""
        if self.droop_at == k:
            self.droop = list(self.pending_droop)
            self.pending_droop, self.droop_at = None, None

    def sm_power_mw(self, sm: SM) -> int:
        """`p_s = pd_s + ps_s` of an enabled SM at a sample (after the fold)."""
        s = sm.index
        window_pj = self.energy_pj[s] - self.energy_prev_pj[s]
        self.energy_prev_pj[s] = self.energy_pj[s]
        # the window is the last P ticks (P * 1000 / F ns); pJ per ns is mW
        dynamic = window_pj * self.F // (1000 * self.P)
        v = self.sm_voltage_mv(sm)
        static = max(0, (self.leak_mw * v // self.v_max)
                     * (1000 + self.leak_pm * (self.temp_mk[s] - T_REF_MK) // 1000) // 1000)
        return dynamic + static

    def update_temperatures(self, p_mw: list[int]) -> None:
        """First-order RC per thermal domain, one explicit step of `min(P, tau)` ticks toward the
        target set by the domain's power (its SMs' resistances in parallel)."""
        for members in self.thermal_domains.values():
            total_mw = sum(p_mw[sm.index] for sm in members)
            target = self.ambient_mk + total_mw * (self.r_mk // len(members)) // 1000
            temp = self.temp_mk[members[0].index]  # one value per thermal domain
            temp += (target - temp) * min(self.P, self.tau) // self.tau
            temp = min(max(temp, T_MIN_MK), T_MAX_MK)  # a thermal runaway saturates
            for sm in members:
                self.temp_mk[sm.index] = temp

    def decide(self, d: int, members: list[SM], p_mw: list[int]) -> int:
        """The controller's next clock for clock domain `d` (one bin down, up or stay)."""
        f = self.fd[d]
        if self.mode == DVFS_LOCK:
            return f
        n_d = len(members)
        power = (sum(p_mw[sm.index] for sm in members) + self.uncore_mw * n_d // self.n_enabled
                 + sensor_noise_mw(self.seed, self.n, d, self.noise_mw))
        cap = self.cap_mw * n_d // self.n_enabled
        temp = max(self.temp_mk[sm.index] for sm in members)
        if power > cap or temp >= self.limit_mk:
            return max(self.f_min, f - self.bin)
        if f < self.f_max and power * (f + self.bin) <= cap * f and temp < self.limit_mk - self.hyst_mk:
            return min(self.f_max, f + self.bin)
        return f

    def sample(self, k: int) -> None:
        """Step 3: sample number `n` at tick `k`: power, temperature, the controller's decision,
        the droop, a trace row."""
        self.fold_all()
        p_mw = [self.sm_power_mw(sm) if sm.enabled else 0 for sm in self.sms]
        self.update_temperatures(p_mw)
        self.pending_fd = {d: self.decide(d, members, p_mw) for d, members in self.clock_domains.items()}
        self.clocks_at = k + self.L
        # activity-dependent IR drop, in whole bins
        self.pending_droop = [self.bin * ((pw * self.droop_m // 1_000_000) // self.bin) for pw in p_mw]
        self.droop_at = k + self.D
        row, keep = divmod(self.n, self.trace_every)
        if keep == 0 and row < len(self.trace_tick):
            self.trace_tick[row] = k
            self.trace_mhz[row] = [sm.freq for sm in self.sms]  # f_s in effect during tick k
            self.trace_mw[row] = list(p_mw)
            self.trace_mk[row] = list(self.temp_mk)
        self.next_sample += self.P
        self.n += 1

    def step(self, k: int) -> None:
        """The DVFS step at tick `k`, after the tick's SM cycles, dispatch and queue drain; the
        recomputed `f_s` apply from tick `k + 1`."""
        self.apply_clocks(k)
        self.apply_droop(k)
        if k == self.next_sample:
            self.sample(k)
        self.apply_clocks(k)  # L = 0 acts in the sample's own tick
        self.apply_droop(k)  # D = 0 likewise
        self.recompute_clocks()

    def finish(self) -> dict:
        """Section 12's outputs after the last tick (a final fold first)."""
        self.fold_all()
        i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
        n_sm = len(self.sms)
        return {
            "sm_energy_pj": i64(self.energy_pj),
            "sm_clock_end_mhz": i64([sm.freq for sm in self.sms]),
            "sm_temp_end_mk": i64(self.temp_mk),
            "trace_tick": i64(self.trace_tick),
            "trace_mhz": i64(self.trace_mhz).reshape(-1, n_sm),
            "trace_mw": i64(self.trace_mw).reshape(-1, n_sm),
            "trace_mk": i64(self.trace_mk).reshape(-1, n_sm),
        }


def dvfs_off_outputs(n_sm: int, trace_len: int) -> dict:
    """Section 12's outputs with DVFS off: all 0, trace ticks -1."""
    zeros = lambda *shape: np.zeros(shape, dtype=np.int64)  # noqa: E731
    return {
        "sm_energy_pj": zeros(n_sm),
        "sm_clock_end_mhz": zeros(n_sm),
        "sm_temp_end_mk": zeros(n_sm),
        "trace_tick": np.full(trace_len, -1, dtype=np.int64),
        "trace_mhz": zeros(trace_len, n_sm),
        "trace_mw": zeros(trace_len, n_sm),
        "trace_mk": zeros(trace_len, n_sm),
    }


# --- the simulation ----------------------------------------------------------------------------

# The `Launch` parts every launch of a workload shares: the clocks, the chip and the policies (each
# launch has its own program, CTA shape included: section 13).
SHARED_PARTS = ("clocks", "chip", "policy")


def _same_fields(a: object, b: object) -> bool:
    """Whether two lowered parts (`Launch.chip`, ...; numpy leaves, nested parts) hold equal values."""
    if not dataclasses.is_dataclass(a):
        return np.array_equal(np.asarray(a), np.asarray(b))
    return all(_same_fields(getattr(a, f.name), getattr(b, f.name)) for f in dataclasses.fields(a))


@dataclasses.dataclass(frozen=True)
class Plan:
    """Section 13's workload-level integers as Python values (`workload.WorkloadLaunch` with
    numpy leaves converts with `Plan.of`): per launch the submit tick, the dependencies (earlier
    launch indices), the grid and the global index of its CTA 0; the launch gap."""

    submit_ticks: tuple[int, ...]
    gap_ticks: int
    deps: tuple[tuple[int, ...], ...]
    grid_ctas: tuple[int, ...]
    cta_base: tuple[int, ...]

    @staticmethod
    def of(workload_launch) -> Plan:
        ints = lambda a: tuple(int(v) for v in np.asarray(a).reshape(-1))  # noqa: E731
        deps = np.asarray(workload_launch.deps, dtype=bool)
        return Plan(submit_ticks=ints(workload_launch.submit_ticks),
                    gap_ticks=int(np.asarray(workload_launch.gap_ticks)),
                    deps=tuple(tuple(int(d) for d in np.flatnonzero(row)) for row in deps),
                    grid_ctas=ints(workload_launch.grid_ctas),
                    cta_base=ints(workload_launch.cta_base))

    @staticmethod
    def single(n_ctas: int) -> Plan:
        """One launch with no overhead: `simulate(arch, kernel)` (section 13)."""
        return Plan(submit_ticks=(0,), gap_ticks=0, deps=((),), grid_ctas=(n_ctas,), cta_base=(0,))


class KernelRun:
    """One launch of a workload: its program and variation parameters (its own `Launch`) and
    section 13's per-launch state (next CTA, completions, ready / start / end ticks, a learning
    dispatch policy's estimates `est_{l,s}`)."""

    def __init__(self, index: int, launch, plan: Plan, n_sm: int) -> None:
        i = lambda v: int(np.asarray(v))  # noqa: E731
        self.index = index
        self.prog = Program(launch.program)
        self.n_ctas = i(launch.program.n_ctas)
        self.base = plan.cta_base[index]
        self.submit = plan.submit_ticks[index]
        self.deps = plan.deps[index]
        ints = lambda a: [int(v) for v in np.asarray(a).reshape(-1)]  # noqa: E731
        self.trips = ints(launch.program.trips)  # per loop
        self.cta_spread = ints(launch.program.trips_cta_spread)
        self.warp_spread = ints(launch.program.trips_warp_spread)
        self.branch_threshold = ints(launch.program.branch_threshold)  # per branch
        self.seed = i(launch.program.seed)
        # its CTA shape and what one CTA holds of an SM (section 13)
        self.W = i(launch.program.warps_per_cta)
        self.lanes_last_warp = i(launch.program.lanes_last_warp)
        self.reg_share = self.W * i(launch.program.warp_reg_share)
        self.smem = i(launch.program.cta_smem_bytes)
        # work from data (section 4): per CTA row, per warp column
        prog = launch.program
        self.trips_data = [np.asarray(t).tolist() if on else None
                           for t, on in zip(np.asarray(prog.trips_data), np.asarray(prog.trips_from_data))]
        self.if_data = [np.asarray(t).tolist() if on else None
                        for t, on in zip(np.asarray(prog.if_data), np.asarray(prog.if_from_data))]
        self.grid_sync_ticks = i(launch.program.grid_sync_ticks)
        self.work_items = i(launch.program.work_items)
        self.next = 0  # local index of the next CTA to dispatch
        self.completed = 0
        self.ready: int | None = None  # unknown until every dependency has completed
        self.start = -1  # tick of the first CTA's dispatch
        self.end = -1  # tick of the last CTA's completion
        # a learning policy's state (the closed loop's per-SM CTA durations, ticks): its `init`
        self.est = [0] * n_sm
        self.est_seen: set[int] = set()  # the SMs where one of its CTAs completed (the closed loop's first)
        self.sq = [0] * n_sm  # the closed loop's second moments of CTA durations (ticks^2)

    @property
    def complete(self) -> bool:
        return self.completed == self.n_ctas

    @property
    def left(self) -> int:
        """CTAs still to dispatch."""
        return self.n_ctas - self.next


class _Sim:
    """One run of a workload (a single kernel is a workload of one launch); methods follow the
    sections of docs/model.md."""

    def __init__(self, launches: list, plan: Plan, shapes) -> None:
        if not launches or len(plan.grid_ctas) != len(launches):
            raise ValueError(f"{len(launches)} launches, the plan has {len(plan.grid_ctas)}")
        first = launches[0]
        for l, launch in enumerate(launches[1:], start=1):
            for part in SHARED_PARTS:
                if not _same_fields(getattr(launch, part), getattr(first, part)):
                    raise ValueError(f"launch {l}'s {part} differs from launch 0's: the launches "
                                     "of a workload share the chip, clocks, policies and CTA shape")
        self.shapes = shapes
        self.S = shapes.schedulers
        self.Q = shapes.warp_slots // shapes.schedulers
        self.F = int(first.clocks.tick_mhz)
        # CTA slots and shared memory of the launch that needs the most (section 13)
        self.ctas_per_sm = max(int(launch.program.ctas_per_sm) for launch in launches)
        self.smem_per_sm = max(int(launch.program.smem_per_sm_bytes) for launch in launches)
        self.W = max(int(launch.program.warps_per_cta) for launch in launches)  # columns of `warp_issued`
        self.mio_depth = int(first.chip.mio_depth)
        number = int(first.policy.warp_policy)
        if not 0 <= number < len(WARP_POLICIES):
            raise ValueError(f"unknown warp policy {number}")
        self.warp_policy = WARP_MODULES[WARP_POLICIES[number]]  # jaxsched/reference_warp/
        number = int(first.policy.dispatch_policy)
        if not 0 <= number < len(DISPATCH_POLICIES):
            raise ValueError(f"unknown dispatch policy {number}")
        self.dispatch_policy = DISPATCH_MODULES[DISPATCH_POLICIES[number]]  # jaxsched/reference_dispatch/
        self.ema_alpha_256 = int(first.policy.ema_alpha_256)
        if not 0 <= self.ema_alpha_256 <= EMA_ONE:
            raise ValueError(f"ema_alpha_256 = {self.ema_alpha_256} outside 0..{EMA_ONE}")
        self.hold_margin_256 = int(first.policy.hold_margin_256)
        if not 0 <= self.hold_margin_256 <= EMA_ONE:
            raise ValueError(f"hold_margin_256 = {self.hold_margin_256} outside 0..{EMA_ONE}")
        self.hold_noise_256 = int(first.policy.hold_noise_256)
        if not 0 <= self.hold_noise_256 <= int(MAX_HOLD_NOISE * EMA_ONE):
            raise ValueError(f"hold_noise_256 = {self.hold_noise_256} outside 0..{int(MAX_HOLD_NOISE * EMA_ONE)}")
        self.hold_queue_256 = int(first.policy.hold_queue_256)
        if not 0 <= self.hold_queue_256 <= int(MAX_HOLD_QUEUE * EMA_ONE):
            raise ValueError(f"hold_queue_256 = {self.hold_queue_256} outside 0..{int(MAX_HOLD_QUEUE * EMA_ONE)}")
        self.hold_left_256 = int(first.policy.hold_left_256)
        if not 0 <= self.hold_left_256 <= int(MAX_HOLD_LEFT * EMA_ONE):
            raise ValueError(f"hold_left_256 = {self.hold_left_256} outside 0..{int(MAX_HOLD_LEFT * EMA_ONE)}")
        self.cta_launch_ticks = int(first.chip.cta_launch_ticks)
        if self.cta_launch_ticks < 0:
            raise ValueError(f"cta_launch_ticks = {self.cta_launch_ticks} < 0")
        self.taken_branch_cycles = int(first.chip.taken_branch_cycles)
        self.launch_idle_cycles = int(first.chip.launch_idle_cycles)
        if self.taken_branch_cycles < 0 or self.launch_idle_cycles < 0:
            raise ValueError(f"taken_branch_cycles = {self.taken_branch_cycles} and "
                             f"launch_idle_cycles = {self.launch_idle_cycles} must be >= 0")
        freq = [int(v) for v in np.asarray(first.clocks.sm_freq_mhz).reshape(-1)]
        enabled = [bool(v) for v in np.asarray(first.chip.sm_enabled).reshape(-1)]
        rank = [int(v) for v in np.asarray(first.policy.dispatch_rank).reshape(-1)]
        weight = [int(v) for v in np.asarray(first.policy.dispatch_weight).reshape(-1)]
        if len(freq) != shapes.n_sm:
            raise ValueError(f"launch has {len(freq)} SM slots, shapes.n_sm = {shapes.n_sm}")
        if self.ctas_per_sm < 1 or self.ctas_per_sm > shapes.cta_slots:
            raise ValueError(f"ctas_per_sm = {self.ctas_per_sm} outside 1..{shapes.cta_slots}")
        for launch in launches:
            if int(launch.program.ctas_per_sm) * int(launch.program.warps_per_cta) > shapes.warp_slots:
                raise ValueError("ctas_per_sm x warps_per_cta exceeds the SM's warp slots")
        self.sms = [SM(s, freq[s], enabled[s], rank[s], weight[s], self.launch_idle_cycles, shapes)
                    for s in range(shapes.n_sm)]
        self.enabled_sms = [sm for sm in self.sms if sm.enabled]
        self.n_enabled = len(self.enabled_sms)
        if hasattr(self.dispatch_policy, "check"):
            self.dispatch_policy.check(self)
        # section 13: the launches, their CTAs numbered globally g = base_l + c
        self.kernels = [KernelRun(l, launch, plan, shapes.n_sm) for l, launch in enumerate(launches)]
        if hasattr(self.dispatch_policy, "init"):
            for kernel, launch in zip(self.kernels, launches):
                kernel.est = self.dispatch_policy.init(launch, shapes.n_sm)
        self.gap_ticks = plan.gap_ticks
        self.check_plan(plan)
        for kernel in self.kernels:
            self.check_launch_modes(kernel)
        self.n_ctas = sum(kernel.n_ctas for kernel in self.kernels)
        self.chip = Chip([kernel.index for kernel in self.kernels for _ in range(kernel.n_ctas)])
        mode = int(first.clocks.dvfs.mode)
        if mode not in (DVFS_OFF, DVFS_ON, DVFS_LOCK):
            raise ValueError(f"unknown DVFS mode {mode}")
        # section 12: with DVFS off the static map is f_s for the whole run
        self.dvfs = None if mode == DVFS_OFF else Dvfs(first.clocks.dvfs, self.sms, self.F, shapes.trace_len)
        self.clock_log: list[list[int]] | None = None  # f_s of every tick, when asked for
        self.update_ready()  # launches without dependencies are ready before tick 0

    def check_plan(self, plan: Plan) -> None:
        """Section 13's workload invariants (`workload.validate_structure` reports them as
        `JaxschedError` earlier): grids and bases agree, dependencies are earlier launches,
        ticks are not negative, a cooperative or persistent kernel is the only launch."""
        base = 0
        for kernel in self.kernels:
            if plan.grid_ctas[kernel.index] != kernel.n_ctas or kernel.base != base:
                raise ValueError(f"launch {kernel.index}: the plan's grid / base disagree with its Launch")
            base += kernel.n_ctas
            if any(not 0 <= d < kernel.index for d in kernel.deps):
                raise ValueError(f"launch {kernel.index} depends on {kernel.deps}: not all earlier launches")
            if kernel.submit < 0:
                raise ValueError(f"launch {kernel.index}: submit tick {kernel.submit} < 0")
        if self.gap_ticks < 0:
            raise ValueError(f"gap_ticks = {self.gap_ticks} < 0")
        if len(self.kernels) > 1 and any(k.work_items > 0 or any(k.prog.grid_sync) for k in self.kernels):
            raise ValueError("a cooperative (gsync) or persistent kernel must be the workload's only launch")

    def check_launch_modes(self, kernel: KernelRun) -> None:
        """Section 9's launch checks, as invariants of the `Launch` the rules below rely on.

        `simulate` reports them as `JaxschedError` earlier (the kernel parser and
        `lower.validate`); here they guard a `Launch` built some other way. Section 8's grid
        barrier counts the live warps of the resident CTAs and releases every warp at a
        barrier, which is the grid's arrivals only if every CTA is resident and no CTA barrier
        exists; a persistent kernel takes its work items at the loop's back-edge."""
        prog = kernel.prog
        bars = [i for i, op in enumerate(prog.op) if op == Op.BAR]
        if any(prog.grid_sync[i] for i in bars):
            if not all(prog.grid_sync[i] for i in bars):
                raise ValueError("a program may not mix CTA barriers (bar) and grid barriers (gsync)")
            if kernel.n_ctas > self.ctas_per_sm * self.n_enabled:
                raise ValueError(
                    f"grid barriers need every CTA co-resident: {kernel.n_ctas} CTAs > "
                    f"{self.ctas_per_sm} per SM x {self.n_enabled} SMs")
        if kernel.work_items < 0:
            raise ValueError(f"work_items = {kernel.work_items} < 0")
        if kernel.work_items > 0 and len(prog.loops) != 1:
            raise ValueError("a persistent kernel (work_items > 0) needs a loop, exactly one")

    # section 13 --------------------------------------------------------------------------------

    def update_ready(self) -> None:
        """Every launch whose ready tick is unknown and whose dependencies have all completed
        gets `ready = max(submit, max_d (end_d + 1)) + gap` (before tick 0, and after the CTA
        completions of every tick's SM cycles)."""
        for kernel in self.kernels:
            if kernel.ready is None and all(self.kernels[d].complete for d in kernel.deps):
                kernel.ready = max([kernel.submit] + [self.kernels[d].end + 1 for d in kernel.deps]) \
                    + self.gap_ticks

    def head_launch(self, k: int) -> KernelRun | None:
        """The launch whose CTAs dispatch next: among those ready by tick `k` with CTAs left to
        dispatch, the smallest `(ready, l)` (the leftover policy)."""
        heads = [kernel for kernel in self.kernels
                 if kernel.ready is not None and kernel.ready <= k and kernel.left > 0]
        return min(heads, key=lambda kernel: (kernel.ready, kernel.index), default=None)

    # section 9 ---------------------------------------------------------------------------------

    def take_item(self, sm: SM, kernel: KernelRun) -> bool:
        """A persistent kernel's `atomicAdd` on the global queue counter by a warp of `sm`:
        True (and the item is counted) if an item was left."""
        if self.chip.items_taken >= kernel.work_items:
            return False
        self.chip.items_taken += 1
        sm.items += 1
        return True

    def launch_warp(self, sm: SM, warp: Warp, kernel: KernelRun, g: int, w: int, cta_slot: int) -> None:
        """Make `warp` warp `w` of global CTA `g` of `kernel`: variation from section 4 with the
        launch's parameters and local index `c = g - base`, pc 0 resolved, ready 0, age
        `32 g + w`.

        In a persistent kernel the warp takes its first work item here instead of a trip
        count: one trip if it got one, else zero (it skips the loop)."""
        c = g - kernel.base
        warp.active = True
        warp.kernel = kernel
        warp.cta_slot = cta_slot
        warp.lanes = warp_lanes(w, kernel.W, kernel.lanes_last_warp)
        warp.lanes_mask = (1 << warp.lanes) - 1
        if kernel.work_items > 0:
            warp.trips = [1 if self.take_item(sm, kernel) else 0]
        else:
            warp.trips = [data[c][w] if data is not None else warp_trips(kernel.seed, kernel.trips[k],
                          kernel.cta_spread[k], kernel.warp_spread[k], c, w, k)
                          for k, (data, _) in enumerate(zip(kernel.trips_data, kernel.prog.loops))]
        warp.masks = [(data[c][w] & warp.lanes_mask) if data is not None
                      else warp_if_mask(kernel.seed, kernel.branch_threshold[b], c, w, warp.lanes, b)
                      for b, (data, _) in enumerate(zip(kernel.if_data, kernel.prog.branches))]
        warp.loops_left = {}
        warp.age = 32 * g + w
        warp.at_barrier = False
        warp.ready_fixed = [0] * MAX_DEP_SLOTS
        warp.ready_mio = [0] * MAX_DEP_SLOTS
        warp.ready_mem = [0] * MAX_DEP_SLOTS
        warp.ready_fetch = 0
        warp.pc = kernel.prog.arrive(0, warp)

    def has_launch_credit(self, sm: SM) -> bool:
        """Section 9: `sm` has collected the starved scheduler-cycles a refill needs
        (`launch_credit >= launch_idle_cycles`; always true with the credit off, 0)."""
        return sm.launch_credit >= self.launch_idle_cycles

    def usable_slots(self, sm: SM) -> list[int]:
        """Section 9: the CTA slots of `sm` that can take a CTA at the current tick: free, below
        `ctas_per_sm`, past their launch latency (usable tick <= k), and either never used or on
        an SM with launch credit (a refill needs credit, a slot's first CTA does not), in slot
        order."""
        credit = self.has_launch_credit(sm)
        return [j for j in range(self.ctas_per_sm)
                if sm.cta_id[j] < 0 and sm.usable[j] <= self.now and (credit or not sm.used[j])]

    def cta_warp_slots(self, sm: SM, j: int) -> range:
        """The warp slots of the CTA in CTA slot `j` of `sm` (section 13)."""
        return range(sm.base[j], sm.base[j] + self.kernels[self.chip.cta_kernel[sm.cta_id[j]]].W)

    def warp_base(self, sm: SM, kernel: KernelRun, j: int) -> int | None:
        """Section 13: the first warp slot of a CTA of `kernel` placed in CTA slot `j` of `sm`:
        the first start `b` in the order `j W, j W + 1, ..., 0, 1, ...` whose `W` warp slots
        `b .. b + W - 1` are all free; None if no run of `W` free warp slots exists."""
        held = [False] * self.shapes.warp_slots
        for i, cta in enumerate(sm.cta_id):
            if cta >= 0:
                for slot in self.cta_warp_slots(sm, i):
                    held[slot] = True
        starts = range(self.shapes.warp_slots - kernel.W + 1)
        free = [b for b in starts if not any(held[b:b + kernel.W])]
        return min(free, key=lambda b: (b < j * kernel.W, b), default=None)

    def fits(self, sm: SM, kernel: KernelRun) -> int:
        """Section 13: how many more CTAs of `kernel` the registers and shared memory of `sm`
        hold beside its resident CTAs (of any launch), and 0 if no run of its warps' slots is
        free."""
        if self.warp_base(sm, kernel, 0) is None:
            return 0
        residents = [self.kernels[self.chip.cta_kernel[g]] for g in sm.cta_id if g >= 0]
        room = self.ctas_per_sm
        for need, cap, used in ((kernel.reg_share, self.S * REG_SHARE_ONE, [r.reg_share for r in residents]),
                                (kernel.smem, self.smem_per_sm, [r.smem for r in residents])):
            if need > 0:
                room = min(room, (cap - sum(used)) // need)
        return room

    def pick_sm(self, kernel: KernelRun) -> SM | None:
        """The SM the next CTA of the head launch `kernel` goes to, or None if no enabled SM has
        room (or the closed loop holds). "Room" counts usable free CTA slots only (used ones
        only on SMs with launch credit), whatever launch occupies the others, and no more than
        the SM's registers, shared memory and free warp slots hold (section 13)."""
        room = {sm.index: min(len(self.usable_slots(sm)), self.fits(sm, kernel)) for sm in self.enabled_sms}
        free = [sm for sm in self.enabled_sms if room[sm.index] > 0]
        if not free:
            return None
        policy = self.dispatch_policy
        sm = min(free, key=lambda sm: policy.key(self, kernel, sm, room[sm.index]))
        if hasattr(policy, "hold") and policy.hold(self, kernel, sm):
            return None
        if hasattr(policy, "placed"):
            policy.placed(self, sm)
        return sm

    @staticmethod
    def live_warps(sm: SM) -> int:
        """Active (not exited) warps resident on `sm`, summed over its CTAs."""
        return sum(live for cta, live in zip(sm.cta_id, sm.live) if cta >= 0)

    def dispatch(self, k: int) -> None:
        """Sections 9 and 13: place the head launch's CTAs in grid order, one at a time, then the
        next head launch's, while some SM has room (closed loop: and it does not hold)."""
        chip = self.chip
        self.now = k
        # a learning policy's estimates of every launch that may dispatch, as the tick's dispatch begins
        policy = self.dispatch_policy
        self.censored = {
            kernel.index: policy.estimates(self, kernel, k) for kernel in self.kernels
            if kernel.ready is not None and kernel.ready <= k and kernel.left > 0
        } if hasattr(policy, "estimates") else {}
        while (kernel := self.head_launch(k)) is not None:
            sm = self.pick_sm(kernel)
            if sm is None:
                break
            g = kernel.base + kernel.next
            if kernel.next == 0:
                kernel.start = k
            kernel.next += 1
            j = self.usable_slots(sm)[0]  # lowest usable free CTA slot
            sm.base[j] = self.warp_base(sm, kernel, j)
            if sm.used[j]:  # a refill spends the credit: at most one per SM and tick
                sm.launch_credit -= self.launch_idle_cycles
            sm.used[j] = True  # for the rest of the run, whatever launch comes next
            sm.cta_id[j] = g
            sm.live[j] = kernel.W
            sm.start[j] = k
            sm.arrivals[j] = 0
            sm.resident += 1
            sm.ctas += 1
            for w in range(kernel.W):
                self.launch_warp(sm, sm.warps[sm.base[j] + w], kernel, g, w, j)
            chip.cta_sm[g] = sm.index
            chip.cta_start[g] = k
            chip.warp_issued[g] = [0] * self.W

    # section 7 ---------------------------------------------------------------------------------

    def block_reason(self, sm: SM, slot: int, warp: Warp, k: int, c: int) -> int:
        """First-matching stall reason of an active warp at the start of cycle `c` (tick `k`),
        or ELIGIBLE. 'selected' / 'not_selected' are decided by the schedulers later.

        Every block, the MIO throttle included, is judged on the start-of-cycle state: an MIO
        instruction issued this cycle by a lower-numbered scheduler raises `mio` (and so the
        `m` of later issues) but does not throttle a warp already found eligible."""
        if warp.at_barrier:
            return BARRIER
        prog = warp.kernel.prog
        i = warp.pc
        fixed, mio, mem = prog.waits[i]
        if any(k < warp.ready_mem[d] for d in mem):
            return LONG_SB
        if any(c < warp.ready_mio[d] for d in mio):
            return SHORT_SB
        if any(c < warp.ready_fixed[d] for d in fixed):
            return WAIT
        if c < warp.ready_fetch:  # refetch after a taken branch, whatever it waits for
            return WAIT
        op = prog.op[i]
        if op in MIO_OPS:
            if sm.mio >= self.mio_depth:
                return MIO_THROTTLE
        elif op in PIPE_OPS:
            # busy in this cycle unless the pipe frees by its end: it may take an instruction
            # in any cycle in which it frees
            if sm.pipe_free64[slot % self.S][op] >= ISSUE_ONE_CYCLE * (c + 1):
                return MATH_THROTTLE
        return ELIGIBLE

    def select_key(self, sm: SM, sched: int, q: int, warp: Warp) -> int:
        """The key the scheduler minimises (section 7, "Selection")."""
        return self.warp_policy.key(q, sm.last[sched], self.Q, warp.age)

    def issue(self, sm: SM, sched: int, warp: Warp, k: int, c: int) -> None:
        """Section 7, "Issue": one instruction of `warp` (its launch's program) on scheduler
        `sched` at cycle c, tick k."""
        kernel = warp.kernel
        prog = kernel.prog
        chip = self.chip
        i = warp.pc
        op = prog.op[i]
        slots = prog.writes[i]  # where the result goes
        if op in PIPE_OPS:
            for d in slots:
                warp.ready_fixed[d] = max(warp.ready_fixed[d], c + prog.lat_cycles[i])
            # a fractional issue interval carries over: 66/64 loses one cycle in 33
            free64 = sm.pipe_free64[sched][op]
            sm.pipe_free64[sched][op] = max(free64, ISSUE_ONE_CYCLE * c) + prog.issue_cost64[i]
        elif op in MIO_OPS:
            m = sm.mio
            sm.mio = m + prog.mio_cost[i]
            if op == Op.LDG:
                chip.q_l2 += prog.l2_cost[i]
                chip.q_dram += prog.dram_cost[i]
                queue_ticks = max(_ceil_div(chip.q_l2, QUEUE_ONE_TICK),
                                  _ceil_div(chip.q_dram, QUEUE_ONE_TICK))
                for d in slots:
                    warp.ready_mem[d] = max(warp.ready_mem[d], k + prog.mem_lat_ticks[i] + queue_ticks)
            else:  # LDS, SHFL
                for d in slots:
                    warp.ready_mio[d] = max(warp.ready_mio[d], c + m + prog.mio_cost[i] + prog.lat_cycles[i])
        elif op == Op.BAR:
            warp.at_barrier = True
            if prog.grid_sync[i]:
                chip.g_arrived += 1  # grid.sync(): the arrival counts chip-wide (section 8)
            else:
                sm.arrivals[warp.cta_slot] += 1
        elif op == Op.EXIT:
            warp.active = False
            sm.live[warp.cta_slot] -= 1
        sm.issued += 1
        sm.issued_op[op] += 1
        self.chip.warp_issued[warp.age // 32][warp.age % 32] += 1
        sm.active_lanes += prog.active_lanes(i, warp.lanes_mask, warp.masks)
        if kernel.work_items > 0 and i == prog.loops[0][1]:
            # persistent kernel: the back-edge takes the next work item, or leaves the loop
            back = prog.loops[0][0] if self.take_item(sm, kernel) else prog.leave(i, warp)
        else:
            back = prog.leave(i, warp)
        if back is not None:  # the jump back to the loop start refetches
            warp.pc = back
            warp.ready_fetch = c + self.taken_branch_cycles
        else:
            warp.pc = i + 1
        if warp.active:  # an exited warp's pc no longer matters (it may point past the program)
            warp.pc = prog.arrive(warp.pc, warp)

    def complete_cta(self, sm: SM, j: int, k: int) -> None:
        """CTA slot `j` of `sm` completes at tick `k`: the CTA's end tick, its launch's
        completion count (and end tick, after its last CTA), the launch's closed-loop estimate
        on this SM, and the slot frees (usable again `cta_launch_ticks` later)."""
        g = sm.cta_id[j]
        kernel = self.kernels[self.chip.cta_kernel[g]]
        self.chip.cta_end[g] = k
        self.chip.completed += 1
        kernel.completed += 1
        if kernel.complete:
            kernel.end = k
        if hasattr(self.dispatch_policy, "observe"):
            self.dispatch_policy.observe(self, sm, kernel, g, sm.start[j], k)  # slots in order j = 0, 1, ...
        sm.cta_id[j] = -1
        sm.arrivals[j] = 0
        sm.resident -= 1
        sm.usable[j] = k + self.cta_launch_ticks  # section 9: the launch path's latency
        for slot in range(sm.base[j], sm.base[j] + kernel.W):
            sm.warps[slot].active = False

    def sm_cycle(self, sm: SM, k: int) -> None:
        """Section 7: one cycle of SM `sm` at tick `k` (cycle index `sm.cycle`)."""
        c = sm.cycle
        S = self.S
        # 1. classify every active warp at the start-of-cycle state; blocked warps count their
        #    stall reason now, eligible warps are 'selected' or 'not_selected' after selection
        eligible: list[list[int]] = [[] for _ in range(S)]  # per scheduler, eligible warp slots
        # per scheduler: some active warp is eligible or throttled (it would issue if the pipe or
        # MIO queue let it), so the scheduler is not starved (launch credit, below)
        occupied = [False] * S
        n_active = 0
        for j, cta in enumerate(sm.cta_id):
            if cta < 0:
                continue
            for slot in self.cta_warp_slots(sm, j):
                warp = sm.warps[slot]
                if not warp.active:
                    continue
                n_active += 1
                reason = self.block_reason(sm, slot, warp, k, c)
                if reason in (ELIGIBLE, MIO_THROTTLE, MATH_THROTTLE):
                    occupied[slot % S] = True
                if reason == ELIGIBLE:
                    eligible[slot % S].append(slot)
                else:
                    sm.stalls[reason] += 1
        if n_active:
            sm.busy += 1
            sm.warp_cycles += n_active
        # 2. schedulers in index order each issue from their eligible warps (minimal key)
        for sched in range(S):
            candidates = eligible[sched]
            if not candidates:
                continue
            slot = min(candidates, key=lambda s: self.select_key(sm, sched, s // S, sm.warps[s]))
            self.issue(sm, sched, sm.warps[slot], k, c)
            sm.last[sched] = slot // S
            sm.stalls[SELECTED] += 1
            sm.stalls[NOT_SELECTED] += len(candidates) - 1
        # 3. barrier releases and CTA completions
        for j, cta in enumerate(sm.cta_id):
            if cta < 0:
                continue
            if sm.arrivals[j] > 0 and sm.arrivals[j] == sm.live[j]:
                for slot in self.cta_warp_slots(sm, j):
                    sm.warps[slot].at_barrier = False
                sm.arrivals[j] = 0
            if sm.live[j] == 0:
                self.complete_cta(sm, j, k)
        # 4. the MIO backlog serves one instruction-cycle
        sm.mio = max(0, sm.mio - 1)
        # 5. launch credit: an SM with a free CTA slot (one freed this cycle too) collects its
        #    starved schedulers' idle issue cycles, up to one launch's worth
        if any(sm.cta_id[j] < 0 for j in range(self.ctas_per_sm)):
            starved = S - sum(occupied)
            sm.launch_credit = min(self.launch_idle_cycles, sm.launch_credit + starved)
        sm.cycle += 1

    # sections 2 and 8 --------------------------------------------------------------------------

    def grid_barrier(self, k: int) -> None:
        """Section 8, step 1b: when every live warp of the grid has arrived at a grid barrier
        (and no release is pending), it releases `grid_sync_ticks` later; a release due at `k`
        frees every warp at a barrier (they issue from their SM's next cycle). Only a workload
        of one launch can have grid barriers (section 13)."""
        chip = self.chip
        if chip.g_arrived > 0 and chip.g_release is None:
            live = sum(sum(sm.live[j] for j, cta in enumerate(sm.cta_id) if cta >= 0)
                       for sm in self.sms)
            if chip.g_arrived == live:
                chip.g_release = k + self.kernels[0].grid_sync_ticks
                chip.g_arrived = 0
        if chip.g_release == k:
            for sm in self.sms:
                for warp in sm.warps:
                    warp.at_barrier = False
            chip.g_release = None

    def tick(self, k: int) -> None:
        """Section 8: SM cycles in SM index order, then the launches' readiness (section 13),
        then the grid barrier, then dispatch, then the queues drain, then the DVFS step (if DVFS
        is on)."""
        if self.clock_log is not None:
            self.clock_log.append([sm.freq for sm in self.sms])
        for sm in self.sms:
            if sm.freq <= 0:
                continue  # floorswept: no clock
            sm.acc += sm.freq
            if sm.acc >= self.F:
                sm.acc -= self.F
                self.sm_cycle(sm, k)
        self.update_ready()
        self.grid_barrier(k)
        self.dispatch(k)
        self.chip.q_l2 = max(0, self.chip.q_l2 - QUEUE_ONE_TICK)
        self.chip.q_dram = max(0, self.chip.q_dram - QUEUE_ONE_TICK)
        if self.dvfs is not None:
            self.dvfs.step(k)

    def run(self, max_ticks: int) -> int:
        """Run ticks until the tick in which the last CTA of every launch has completed; return
        makespan_ticks (measured from the host's first call, tick 0)."""
        for k in range(max_ticks):
            self.tick(k)
            if self.chip.completed == self.n_ctas:
                return k + 1
        raise RuntimeError(
            f"reference simulation did not finish within max_ticks = {max_ticks} ticks "
            f"({self.chip.completed} of {self.n_ctas} CTAs completed, "
            f"{sum(kernel.next for kernel in self.kernels)} dispatched); raise max_ticks"
        )

    def outputs(self, makespan_ticks: int) -> dict:
        """Section 10's, section 12's and section 13's exact output arrays."""
        i64 = lambda v: np.asarray(v, dtype=np.int64)  # noqa: E731
        n_sm = len(self.sms)
        dvfs = (self.dvfs.finish() if self.dvfs is not None
                else dvfs_off_outputs(n_sm, self.shapes.trace_len))
        return {
            "makespan_ticks": int(makespan_ticks),
            "sm_cycles": i64([sm.cycle for sm in self.sms]),
            "sm_busy_cycles": i64([sm.busy for sm in self.sms]),
            "sm_items": i64([sm.items for sm in self.sms]),
            "sm_issued": i64([sm.issued for sm in self.sms]),
            "sm_issued_op": i64([sm.issued_op for sm in self.sms]).reshape(n_sm, len(Op)),
            "sm_active_lanes": i64([sm.active_lanes for sm in self.sms]),
            "sm_warp_cycles": i64([sm.warp_cycles for sm in self.sms]),
            "sm_stalls": i64([sm.stalls for sm in self.sms]).reshape(n_sm, len(STALL_REASONS)),
            "sm_ctas": i64([sm.ctas for sm in self.sms]),
            "cta_sm": i64(self.chip.cta_sm),
            "cta_start_tick": i64(self.chip.cta_start),
            "cta_end_tick": i64(self.chip.cta_end),
            "cta_kernel": i64(self.chip.cta_kernel),
            "warp_issued": i64([row or [0] * self.W for row in self.chip.warp_issued]),  # [cta, warp]
            "kernel_ready_tick": i64([kernel.ready for kernel in self.kernels]),
            "kernel_start_tick": i64([kernel.start for kernel in self.kernels]),
            "kernel_end_tick": i64([kernel.end for kernel in self.kernels]),
            **dvfs,
        }


def simulate_workload(launches: list, plan: Plan, shapes, max_ticks: int = 10**7, *,
                      dispatch_trace: bool = False, clock_trace: bool = False) -> dict:
    """Run the launches of a workload (one `Launch` per launch, numpy leaves, all lowered with
    the same chip, clocks and policies) under section 13's `plan`, tick by tick.

    Returns `simulate_launch`'s keys, with the per-CTA arrays over the global CTA index `g`
    (`Plan.cta_base`), plus `cta_kernel` ([n_ctas], the launch of each CTA) and per launch
    `kernel_ready_tick`, `kernel_start_tick` (its first CTA's dispatch) and `kernel_end_tick`
    (its last CTA's completion) ([L]). `dispatch_trace=True` adds `dispatch_est` and `dispatch_sq`
    ([L, n_sm]: each launch's closed-loop estimates and second moments at the end of the run)
    and `dispatch_est_log` (`cta` is `g`); `clock_trace` as in `simulate_launch`.
    """
    sim = _Sim(list(launches), plan, shapes)
    if clock_trace:
        sim.clock_log = []
    makespan = sim.run(max_ticks)
    out = sim.outputs(makespan)
    if dispatch_trace:
        out["dispatch_est"] = np.asarray([kernel.est for kernel in sim.kernels], dtype=np.int64)
        out["dispatch_sq"] = np.asarray([kernel.sq for kernel in sim.kernels], dtype=np.int64)
        out["dispatch_est_log"] = list(sim.chip.est_log)
    if clock_trace:
        out["sm_mhz_per_tick"] = np.asarray(sim.clock_log, dtype=np.int64).reshape(makespan, len(sim.sms))
    return out


def simulate_launch(launch, shapes, max_ticks: int = 10**7, *,
                    dispatch_trace: bool = False, clock_trace: bool = False) -> dict:
    """Run one `Launch` (numpy leaves) tick by tick; return sections 10's and 12's exact output
    arrays (and section 13's for the workload of this one launch with no overhead).

    Keys: `makespan_ticks` (int); int64 arrays `sm_cycles`, `sm_busy_cycles`, `sm_items` (work
    items taken; 0 unless persistent), `sm_issued`, `sm_active_lanes`, `sm_warp_cycles`,
    `sm_ctas` ([n_sm]), `sm_issued_op` ([n_sm, 8], columns
    in `isa.Op` order), `sm_stalls` ([n_sm, 8], columns in `STALL_REASONS` order), `cta_sm`,
    `cta_start_tick`, `cta_end_tick`, `cta_kernel` (all 0) ([n_ctas], grid order);
    `kernel_ready_tick` (0), `kernel_start_tick`, `kernel_end_tick` ([1]); section 12's
    `sm_energy_pj`, `sm_clock_end_mhz`, `sm_temp_end_mk` ([n_sm]), `trace_tick`
    ([shapes.trace_len], -1 where unused), `trace_mhz`, `trace_mw`, `trace_mk` ([trace_len,
    n_sm], 0 where unused); with DVFS off all of these are 0 (trace ticks -1).
    Debugging aids (not outputs of the model): `dispatch_trace=True` adds `dispatch_est` and
    `dispatch_sq` (int64 [n_sm], the closed-loop estimates and second moments at the end of the
    run, kept under every policy) and
    `dispatch_est_log` (every estimate update in order, as `(tick, sm, cta, duration, est
    after)`); `clock_trace=True` adds `sm_mhz_per_tick` (int64 [makespan_ticks, n_sm], the `f_s`
    each SM's phase accumulator added in each tick).
    Raises RuntimeError if the last CTA has not completed after `max_ticks` ticks.
    """
    out = simulate_workload([launch], Plan.single(int(launch.program.n_ctas)), shapes, max_ticks,
                            dispatch_trace=dispatch_trace, clock_trace=clock_trace)
    if dispatch_trace:
        out["dispatch_est"], out["dispatch_sq"] = out["dispatch_est"][0], out["dispatch_sq"][0]
    return out


def simulate(
    arch,
    kernel,
    clocks=None,
    *,
    warp_policy: str | int = DEFAULT_WARP_POLICY,
    dispatch: str | int = DEFAULT_DISPATCH,
    dispatch_start: int = DEFAULT_DISPATCH_START,
    dispatch_weight=None,
    ema_alpha: float = DEFAULT_EMA_ALPHA,
    ema_prior_ns: float = DEFAULT_EMA_PRIOR_NS,
    hold_margin: float = DEFAULT_HOLD_MARGIN,
    hold_noise: float = DEFAULT_HOLD_NOISE,
    hold_queue: float = DEFAULT_HOLD_QUEUE,
    hold_left: float = DEFAULT_HOLD_LEFT,
    max_ticks: int = 10**7,
    dispatch_trace: bool = False,
    dvfs=None,
    trace_len: int = DEFAULT_TRACE_LEN,
    clock_trace: bool = False,
) -> dict:
    """Validate, lower and run one configuration with the reference.

    `kernel` is a `Kernel` (one launch, no launch overhead) or a `jaxsched.workload.Workload`
    (section 13: every launch's kernel is lowered on its own with the same chip, clocks,
    policies and DVFS, so they share the tick rate). `dispatch_weight` ([n_sm] integers,
    default each SM's clock in MHz), `ema_alpha`, `ema_prior_ns`, `hold_margin`, `hold_noise`,
    `hold_queue` and `hold_left` parameterise the weighted and closed-loop dispatch policies
    (model.md sections 3 and 9). `dvfs` (a `jaxsched.dvfs.Dvfs`, default static clocks) turns on
    section 12, with `clocks` as the static map `cap_s`; `trace_len` is the number of trace rows.
    Returns `simulate_workload`'s arrays plus `makespan_ns = makespan_ticks * 1000 / F` and
    `makespan_cycles = makespan_ns * boost_clock_ghz` (floats; section 2).
    """
    # The shared lowering is written in jax.numpy; only this convenience wrapper needs it.
    from . import clocks as clocks_mod
    from . import dvfs as dvfs_mod
    from . import lower as lower_mod
    from . import workload as workload_mod

    is_workload = isinstance(kernel, workload_mod.Workload)
    kernels = list(kernel.kernels) if is_workload else [kernel]
    if clocks is None:
        clocks = clocks_mod.uniform(arch)
    if is_workload:
        workload_mod.validate_structure(kernel)
    for one in kernels:
        lower_mod.validate(arch, one, clocks)
    lower_mod.validate_dispatch(arch, dispatch_weight, ema_alpha, ema_prior_ns, hold_margin, hold_noise, hold_queue,
                                hold_left)
    if dvfs is not None:
        dvfs_mod.validate_dvfs(dvfs)
    check(isinstance(trace_len, (int, np.integer)) and 0 <= trace_len <= dvfs_mod.MAX_TRACE_ROWS, "trace_len",
          trace_len, f"an integer number of trace rows in 0 .. {dvfs_mod.MAX_TRACE_ROWS}")
    wp = lower_mod.policy_index(warp_policy, lower_mod.WARP_POLICIES, "warp_policy")
    dp = lower_mod.policy_index(dispatch, lower_mod.DISPATCH_POLICIES, "dispatch")
    launches = [lower_mod.to_numpy(lower_mod.lower(
        arch, one, clocks, wp, dp, dispatch_start, dispatch_weight=dispatch_weight,
        ema_alpha=ema_alpha, ema_prior_ns=ema_prior_ns, hold_margin=hold_margin, hold_noise=hold_noise,
        hold_queue=hold_queue, hold_left=hold_left, dvfs=dvfs)) for one in kernels]
    tick_mhz = int(launches[0].clocks.tick_mhz)
    shapes = dataclasses.replace(lower_mod.shapes_for(arch, kernels[0]), trace_len=int(trace_len),
                                 n_instr=max(one.n_instr for one in kernels),
                                 cta_slots=max(lower_mod.cta_slots_for(arch, one) for one in kernels),
                                 max_ctas=sum(int(one.grid_ctas) for one in kernels))
    plan = (Plan.of(lower_mod.to_numpy(workload_mod.lower_workload(kernel, arch, tick_mhz)))
            if is_workload else Plan.single(int(launches[0].program.n_ctas)))
    out = simulate_workload(launches, plan, shapes, max_ticks=max_ticks,
                            dispatch_trace=dispatch_trace, clock_trace=clock_trace)
    if dispatch_trace and not is_workload:
        out["dispatch_est"], out["dispatch_sq"] = out["dispatch_est"][0], out["dispatch_sq"][0]
    out["makespan_ns"] = out["makespan_ticks"] * 1000.0 / tick_mhz
    out["makespan_cycles"] = out["makespan_ns"] * float(arch.boost_clock_ghz)
    return out
