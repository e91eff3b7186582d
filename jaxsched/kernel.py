"""`Kernel`: a CUDA kernel launch as the simulator sees it.

A grid of CTAs of one shape, their resources (threads, registers, shared memory) and one warp
program written in a small instruction set (`isa.Op`) with loops and divergent if/else regions
nested as in real code (up to `structure.MAX_LOOPS` and `MAX_BRANCHES`; `structure.py` has the
rules). Per-CTA and per-warp variation (load imbalance, divergent loops, branch outcomes) comes
from counter-based hashes of (seed, CTA, warp, loop or branch), so a kernel is a few numbers
however large its grid, and every number is a traced leaf that can be swept; or, where the work
depends on the kernel's data, from arrays the user gives: a loop's trip count and a branch's
lanes per CTA or per warp (`loop @rows`, `if @mask`).

Programs are written in a tiny text form (also the TOML `program` field):

    loop 64 cta_spread=8 warp_spread=4     # trip count 64 +- 8 per CTA, + 0..4 per warp
      ldg bytes=128                        # global load, 128 B per warp
      fma dep                              # `dep`: waits for all earlier results
      lds ways=2                           # shared load with a 2-way bank conflict
    end
    if 0.25                                # each lane takes the if-path with p = 0.25
      sfu dep
    else
      fma dep
    end
    bar                                    # __syncthreads()
    exit                                   # appended if missing

See docs/model.md for what each instruction does, cycle by cycle.

Loops and branches nest (`loop 4` ... `if 0.5` ... `loop @rows` ... `end` ... `end` ... `alu`
... `end`), and `else` is optional. A loop's last instruction is its back-edge and must be its
own: no inner loop or if/else may end on it.

Register dependences: `out=r3` names the register an instruction writes, `dep=r1,r2` makes it
wait for the latest results of those registers only, and `dep=-2` for the result of the
instruction two before it, so independent chains overlap as on the hardware (`fma out=a dep=a`
next to `fma out=b dep=b`); a bare `dep` waits for every earlier result.

Work from data: `loop @rows` takes each warp's trip count from the array `rows` and `if @mask`
each warp's if-path lanes from the array `mask`, and `if @rows>0` runs its if-path in the warps
whose value in `rows` is above 0 (a zero-trip guard) (`make_kernel(..., arrays={"rows": a})`, or the
TOML's `[kernel.arrays]`: inline lists or `.npy` files). An array has one entry per CTA (shape
`[grid]`, the same for each of its warps) or per warp (`[grid, warps_per_cta]`). Trip counts are
integers in 0 .. MAX_TRIPS; a branch array holds booleans (the whole warp takes the if-path, or
none of it) or integer lane masks (bit `l` set: lane `l` takes it).

Launch modes: `gsync` (a program line) is a grid-wide barrier, cooperative groups'
`grid.sync()`; it needs a cooperative launch (`cooperative=True`: every CTA co-resident) and
excludes `bar` in the same program. A persistent kernel (`work_items=N`) is a grid of
co-resident CTAs whose warps take loop iterations from a global queue of N work items instead of
running a fixed trip count.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from pathlib import Path

import equinox as eqx
import numpy as np
from jaxtyping import Array, Bool, Float, Int

from . import depslots, once, tomldoc
from .errors import (INT32_MAX, INT32_MIN, JaxschedError, check, check_bools, check_floats, check_ints, check_rows,
                     check_values, is_traced)
from .isa import N_OPS, OP_NAMES, Op
from .structure import MAX_BRANCHES, MAX_LOOPS, NONE as _NO, padded_count, structure_ok

MAX_TRIPS = 2**24 - 1  # trip counts share a 32-bit word with the if-lanes (engine.dispatch.Variation)
MAX_LDG_BYTES = 4096
MAX_GRID_SYNC_NS = 1e6
MAX_WORK_ITEMS = 2**30 - 1
MAX_DEP_SLOTS = 8  # dependence slots per warp and kind of result: slot 0 for unnamed results, 1.. for registers
# Results of three kinds sit in slots of their own (docs/model.md section 7): fixed-latency (the
# FMA, ALU and SFU pipes), MIO (LDS, SHFL) and memory (LDG). `waits` holds a slot set per kind,
# `MAX_DEP_SLOTS` bits each, in this order; `writes` the slots of the instruction's own kind.
FIXED, MIO, MEMORY = range(3)
WAIT_BITS = 3 * MAX_DEP_SLOTS
MAX_WARPS = 32  # warps per CTA at most (1024 threads): the columns of a data table


class Kernel(eqx.Module):
    """One kernel launch: grid, resources, warp program and its variation parameters."""

    name: str = eqx.field(static=True)

    grid_ctas: Int[Array, ""]
    threads_per_cta: Int[Array, ""]
    regs_per_thread: Int[Array, ""]
    dynamic_smem_bytes: Int[Array, ""]
    static_smem_bytes: Int[Array, ""]

    # program, one entry per instruction (padded programs end in EXIT)
    op: Int[Array, " instr"]
    dep: Bool[Array, " instr"]  # waits for every earlier result (bare `dep`)
    waits: Int[Array, " instr"]  # register dependences: the dependence slots it waits for (bits, per kind)
    writes: Int[Array, " instr"]  # the dependence slots of its kind its result goes to (bits; 0: no result)
    bytes_per_warp: Int[Array, " instr"]  # LDG: bytes the warp requests (128 = coalesced fp32)
    bank_ways: Int[Array, " instr"]  # LDS: bank-conflict degree (1 = conflict-free)
    grid_sync: Bool[Array, " instr"]  # BAR that is a grid-wide barrier (`gsync`)

    # structure (structure.py): loops and if/else regions in opening order, -1 where absent
    loop_start: Int[Array, " loop"]
    loop_end: Int[Array, " loop"]  # the loop's last instruction, its back-edge
    branch_start: Int[Array, " branch"]  # if-path: branch_start .. branch_mid - 1
    branch_mid: Int[Array, " branch"]  # else-path: branch_mid .. branch_end - 1 (none if equal)
    branch_end: Int[Array, " branch"]
    branch_parent: Int[Array, " branch"]  # innermost enclosing path: 2 j (if of j), 2 j + 1 (else), -1

    # variation, per loop and per branch
    trips: Int[Array, " loop"]  # mean loop trip count
    trips_cta_spread: Int[Array, " loop"]  # per-CTA uniform offset in [-spread, +spread]
    trips_warp_spread: Int[Array, " loop"]  # per-warp extra in [0, spread] (longest lane)
    branch_if_probability: Float[Array, " branch"]  # per-lane probability of the if-path
    l2_hit_rate: Float[Array, ""]  # fraction of LDG bytes served by L2
    seed: Int[Array, ""]

    # launch modes
    cooperative: Bool[Array, ""]  # cudaLaunchCooperativeKernel: all CTAs must be co-resident
    grid_sync_ns: Float[Array, ""]  # cost of one grid.sync() after the last warp arrives
    work_items: Int[Array, ""]  # persistent kernel: global work-queue length (0: off)

    # work from data (docs/model.md section 4), per loop and per branch: row c holds CTA c's warps
    # (columns past the CTA's warps are 0; rows past the grid are padding). Without data the
    # tables have one row of zeros, and the hashes decide.
    trips_from_data: Bool[Array, " loop"]  # the loop's trip counts are `trips_data`
    trips_data: Int[Array, "loop cta 32"]
    if_from_data: Bool[Array, " branch"]  # the branch's if-path lanes are `if_data`'s lane masks
    if_data: Int[Array, "branch cta 32"]  # int32 bit patterns: bit l set, lane l takes the if-path

    def __check_init__(self) -> None:
        validate_kernel(self)

    @property
    def n_instr(self) -> int:
        return int(self.op.shape[-1])

    @property
    def n_loops(self) -> int:
        """Loops of the (concrete, unstacked) program."""
        return int(np.sum(np.asarray(self.loop_start) >= 0))

    @property
    def n_branches(self) -> int:
        """If/else regions of the (concrete, unstacked) program."""
        return int(np.sum(np.asarray(self.branch_start) >= 0))

    def replace(self, **changes: object) -> "Kernel":
        """A copy with some fields changed (validated)."""
        return dataclasses.replace(self, **changes)


def validate_kernel(kernel: Kernel, where: str = "kernel") -> None:
    """Check every field of a kernel (or of a stack of them, naming the configuration): integers
    in range and representable in the engine's int32, finite probabilities and costs, a legal
    program structure (docs/model.md section 6). Traced fields are left to the engine's guards.
    Raises `JaxschedError` naming the field. A kernel that passed, unchanged since, is not
    checked again (`jaxsched.once`)."""
    if once.passed(kernel, "kernel"):
        return
    _validate_kernel(kernel, where)
    once.remember(kernel, "kernel")


def _validate_kernel(kernel: Kernel, where: str) -> None:
    f = lambda name: f"{where}.{name}"  # noqa: E731
    for name, low in (("grid_ctas", 1), ("threads_per_cta", 1), ("regs_per_thread", 0),
                      ("dynamic_smem_bytes", 0), ("static_smem_bytes", 0)):
        check_ints(getattr(kernel, name), f(name), low, INT32_MAX)
    check_ints(kernel.seed, f("seed"), INT32_MIN, INT32_MAX, "a 32-bit integer")
    loop_fields = ("loop_start", "loop_end", "trips", "trips_cta_spread", "trips_warp_spread", "trips_from_data")
    branch_fields = ("branch_start", "branch_mid", "branch_end", "branch_parent", "branch_if_probability",
                     "if_from_data")
    for fields, what, limit in ((loop_fields, "loop", MAX_LOOPS), (branch_fields, "branch", MAX_BRANCHES)):
        first = np.shape(getattr(kernel, fields[0]))
        for name in fields:
            shape = np.shape(getattr(kernel, name))
            check(len(shape) >= 1 and shape == first and 1 <= shape[-1] <= limit, f(name), f"shape {shape}",
                  f"one entry per {what} (1 .. {limit}, -1 entries where absent), as {fields[0]} {first}")
    for name in ("trips", "trips_cta_spread", "trips_warp_spread"):
        check_ints(getattr(kernel, name), f(name), 0, MAX_TRIPS, rank=1)
    for name in ("loop_start", "loop_end", "branch_start", "branch_mid", "branch_end", "branch_parent"):
        check_ints(getattr(kernel, name), f(name), _NO, INT32_MAX, "an instruction index, or -1 (none)", rank=1)
    check_ints(kernel.work_items, f("work_items"), 0, MAX_WORK_ITEMS,
               f"a queue length in 0 .. {MAX_WORK_ITEMS} (0: not persistent)")
    check_floats(kernel.branch_if_probability, f("branch_if_probability"), 0.0, 1.0,
                 "a lane probability in [0, 1]", rank=1)
    check_floats(kernel.l2_hit_rate, f("l2_hit_rate"), 0.0, 1.0, "a fraction in [0, 1]")
    check_floats(kernel.grid_sync_ns, f("grid_sync_ns"), 0.0, MAX_GRID_SYNC_NS,
                 f"a barrier cost in [0, {MAX_GRID_SYNC_NS:g}] ns")
    check_bools(kernel.cooperative, f("cooperative"))
    for name in ("dep", "grid_sync"):
        check_bools(getattr(kernel, name), f(name), rank=1)
    check_ints(kernel.op, f("op"), 0, N_OPS - 1, f"an instruction class 0 .. {N_OPS - 1} (isa.Op)", rank=1)
    check_ints(kernel.bank_ways, f("bank_ways"), 1, 32, "bank-conflict ways in 1 .. 32", rank=1)
    check_ints(kernel.bytes_per_warp, f("bytes_per_warp"), 0, MAX_LDG_BYTES, rank=1)
    check_ints(kernel.waits, f("waits"), 0, (1 << WAIT_BITS) - 1,
               f"a bit set of 3 x {MAX_DEP_SLOTS} dependence slots (fixed-latency, MIO, memory)", rank=1)
    check_ints(kernel.writes, f("writes"), 0, (1 << MAX_DEP_SLOTS) - 1,
               f"a bit set of the {MAX_DEP_SLOTS} dependence slots of its kind", rank=1)
    for name in ("trips_from_data", "if_from_data"):
        check_bools(getattr(kernel, name), f(name), rank=1)
    for name, count in (("trips_data", "loop_start"), ("if_data", "branch_start")):
        shape, n = np.shape(getattr(kernel, name)), np.shape(getattr(kernel, count))[-1:]
        check(len(shape) >= 3 and shape[-3:-2] == n and shape[-1] == MAX_WARPS, f(name), f"shape {shape}",
              f"a table [{count.split('_')[0]}s, rows, {MAX_WARPS}]: per {count.split('_')[0]}, a row per CTA, "
              "a column per warp")
    check_ints(kernel.trips_data, f("trips_data"), 0, MAX_TRIPS, f"trip counts in 0 .. {MAX_TRIPS}", rank=3)
    check_ints(kernel.if_data, f("if_data"), INT32_MIN, INT32_MAX, "32-bit lane masks", rank=3)
    leaves = (kernel.op, kernel.dep, kernel.waits, kernel.writes, kernel.bytes_per_warp, kernel.bank_ways, kernel.grid_sync, kernel.trips,
              kernel.trips_cta_spread, kernel.trips_warp_spread, kernel.loop_start, kernel.loop_end,
              kernel.branch_start, kernel.branch_mid, kernel.branch_end, kernel.branch_parent, kernel.grid_ctas,
              kernel.work_items, kernel.trips_from_data, kernel.if_from_data)
    if any(is_traced(x) for x in leaves):
        return
    for name in ("trips", "if"):
        on, rows = np.asarray(getattr(kernel, f"{name}_from_data")).any(-1), np.shape(getattr(kernel, f"{name}_data"))[-2]
        check_values(np.asarray(kernel.grid_ctas), f(f"{name}_data"), lambda g: ~on | (rows >= g),
                     f"a row per CTA: {rows} rows for the grid")
    n_loops = np.sum(np.asarray(kernel.loop_start) >= 0, -1)
    check_values(np.asarray(kernel.work_items), f("work_items"),
                 lambda w: (w == 0) | ((n_loops == 1) & ~np.asarray(kernel.trips_from_data).any(-1)),
                 "a persistent kernel has one loop, whose trips come from the work queue (not from data)")
    op = np.asarray(kernel.op)
    n = op.shape[-1]
    for name in ("dep", "waits", "writes", "bytes_per_warp", "bank_ways", "grid_sync"):
        shape = np.shape(getattr(kernel, name))
        check(shape == op.shape, f(name), f"shape {shape}", f"one entry per instruction, as op {op.shape}")
    check(n >= 2, f("op"), f"{n} instructions", "a program needs an instruction and its exit")
    check_values(kernel.bytes_per_warp, f("bytes_per_warp"), lambda b: (b >= 1) | (op != Op.LDG),
                 f"ldg bytes per warp in 1 .. {MAX_LDG_BYTES}", rank=1)
    longest = (np.asarray(kernel.trips, np.int64) + np.asarray(kernel.trips_cta_spread, np.int64)
               + np.asarray(kernel.trips_warp_spread, np.int64))
    check_values(longest, f("trips"), lambda t: t <= MAX_TRIPS,
                 f"trips + cta_spread + warp_spread <= {MAX_TRIPS} (the longest warp's trip count)", rank=1)
    is_exit = op == Op.EXIT
    exit_at = np.where(is_exit.any(-1), np.argmax(is_exit, -1), n)
    tail = np.arange(n) >= exit_at[..., None]
    check_rows(op, np.all(~tail | is_exit, -1) & (exit_at < n), f("op"),
               "the program ends in exit (op 7), and only exits follow the first one", rank=1)
    i = lambda name: np.asarray(getattr(kernel, name), np.int64)  # noqa: E731
    ok, rule = structure_ok(i("loop_start"), i("loop_end"), i("branch_start"), i("branch_mid"), i("branch_end"),
                            i("branch_parent"), exit_at)
    check_rows(np.concatenate([i("loop_start"), i("loop_end"), i("branch_start"), i("branch_mid"),
                               i("branch_end"), i("branch_parent")], -1), ok,
               f"{where}.(loop_start, loop_end, branch_start, branch_mid, branch_end, branch_parent)", rule, rank=1)


@dataclasses.dataclass(frozen=True)
class Instr:
    """One instruction of a program (`parse_program` makes these)."""

    op: Op
    dep: bool = False  # waits for every earlier result
    bytes_per_warp: int = 0
    bank_ways: int = 1
    grid_sync: bool = False
    waits: int = 0  # dependence slots it waits for (bits per kind; `assign_slots`)
    writes: int = 0  # dependence slots of its kind its result goes to (bits)


@dataclasses.dataclass
class _Structure:
    """A parsed program's loops and branches, in the order they open (`structure.py`)."""

    # start, end, trips (a number, or the name of an array), cta spread, warp spread
    loops: list[tuple[int, int, int | str, int, int]] = dataclasses.field(default_factory=list)
    # start, mid, end, probability or array name, parent path (structure.py)
    branches: list[tuple[int, int, int, float | str, int]] = dataclasses.field(default_factory=list)


def parse_program(text: str) -> tuple[list[Instr], _Structure]:
    """Parse the program text form (module docstring); errors name the line."""
    check(isinstance(text, str), "program", text, "a string in the program text form")
    instrs: list[Instr] = []
    names: dict[tuple[int, str], list[str]] = {}  # (instruction, "out" or "dep") -> register names
    lines: list[int] = []  # the program line of each instruction
    loops: dict[int, tuple] = {}  # by number, in opening order
    branches: dict[int, tuple] = {}
    stack: list[list] = []  # [kind, number, start index, params, line] of the open regions
    closed: list[tuple[int, int]] = []  # (start, last instruction) of every region closed so far
    exit_line = 0
    for lineno, raw in enumerate(text.splitlines(), start=1):
        line = raw.split("#", 1)[0].strip()
        if not line:
            continue
        words = line.split()
        head, rest = words[0].lower(), words[1:]
        where = f"program line {lineno}"
        check(not exit_line, where, line, f"nothing may follow `exit` (line {exit_line})")
        if head == "loop":
            check(len(loops) < MAX_LOOPS, where, line, f"at most {MAX_LOOPS} loops per program")
            if rest and rest[0].startswith("@"):
                check(len(rest) == 1, where, line, "`loop @NAME` takes its trip counts from the array NAME, "
                      "without spreads")
                trips, opts = _array_name(rest[0], where), {}
            else:
                trips, opts = _args(rest, where, ("cta_spread", "warp_spread"))
            loops[len(loops)] = None
            stack.append(["loop", len(loops) - 1, len(instrs),
                          (trips, opts.get("cta_spread", 0), opts.get("warp_spread", 0)), lineno])
        elif head == "if":
            check(len(branches) < MAX_BRANCHES, where, line, f"at most {MAX_BRANCHES} if/else regions per program")
            check(len(rest) == 1, where, line, "`if P` takes one lane probability (or `if @NAME` an array, "
                  "`if @NAME>0` the warps whose value in NAME is above 0)")
            if rest[0].startswith("@"):
                word = rest[0].removesuffix(POSITIVE)
                p = _array_name(word, where) + rest[0][len(word):]
            else:
                p = _number(rest[0], where, float)
                check(0.0 <= p <= 1.0, where, p, "the if-probability must be in [0, 1]")
            path = next((2 * s[1] + (s[0] == "else") for s in reversed(stack) if s[0] != "loop"), _NO)
            branches[len(branches)] = None
            stack.append(["if", len(branches) - 1, len(instrs), (p, path), lineno])
        elif head == "else":
            check(bool(stack) and stack[-1][0] == "if", where, line, "`else` without `if`")
            check(len(instrs) > stack[-1][2], where, line, "the if-block is empty")
            stack[-1][0] = "else"
            stack[-1][3] += (len(instrs),)
        elif head == "end":
            check(bool(stack), where, line, "`end` without `loop` or `if`")
            kind, number, start, params, _ = stack.pop()
            check(len(instrs) > start, where, line, f"the {kind}-block is empty")
            last = len(instrs) - 1
            if kind == "loop":
                check(not any(s >= start and e == last for s, e in closed), where, line,
                      "the loop's last instruction (its back-edge) ends an inner loop or if/else: add an "
                      "instruction after the inner `end` (the loop's own branch, e.g. `alu`)")
                loops[number] = (start, last, *params)
            elif kind == "if":
                branches[number] = (start, len(instrs), len(instrs), *params)
            else:
                p, path, mid = params
                check(len(instrs) > mid, where, line, "the else-block is empty (drop the `else`)")
                branches[number] = (start, mid, len(instrs), p, path)
            closed.append((start, last))
        else:
            check(head in OP_NAMES or head == "gsync", where, head,
                  f"unknown instruction; expected one of {OP_NAMES}, gsync or loop/if/else/end")
            op = Op.BAR if head == "gsync" else Op[head.upper()]
            if op == Op.EXIT:
                check(not stack, where, line, "`exit` must be the program's last instruction, "
                      "outside any loop or if/else")
                exit_line = lineno
            flags = [w for w in rest if "=" not in w]
            for f in flags:
                check(f == "dep", where, f, "the only flag is `dep`")
            regs = {k: v for k, v in (w.split("=", 1) for w in rest if w.startswith(("out=", "dep=")))}
            for key, value in regs.items():
                names[len(instrs), key] = _register_list(value, key, where, len(instrs))
            _, opts = _args([w for w in rest if "=" in w and not w.startswith(("out=", "dep="))], where,
                            ("bytes", "ways"), positional=False)
            nbytes = opts.get("bytes", 128 if op == Op.LDG else 0)
            ways = opts.get("ways", 1)
            check(op == Op.LDG or "bytes" not in opts, where, line, "bytes= applies to ldg only")
            check(op == Op.LDS or "ways" not in opts, where, line, "ways= applies to lds only")
            instrs.append(Instr(op, dep="dep" in flags, bytes_per_warp=nbytes, bank_ways=ways,
                                grid_sync=head == "gsync"))
            lines.append(lineno)
    if stack:
        kind, _, _, _, opened = stack[-1]
        raise JaxschedError(f"program line {opened}", kind, f"this `{kind}` has no `end`")
    if not instrs or instrs[-1].op != Op.EXIT:
        instrs.append(Instr(Op.EXIT))
    check(len(instrs) >= 2, "program", "empty", "needs at least one instruction before exit")
    struct = _Structure(loops=[loops[k] for k in range(len(loops))],
                        branches=[branches[b] for b in range(len(branches))])
    instrs = assign_slots(instrs, names, struct, lines)
    bars = {ins.grid_sync for ins in instrs if ins.op == Op.BAR}
    check(len(bars) < 2, "program", "bar and gsync", "a program uses either CTA barriers or grid "
          "barriers (grid.sync() already synchronises the CTA)")
    return instrs, struct


_PRODUCERS = (Op.FMA, Op.ALU, Op.SFU, Op.LDS, Op.LDG, Op.SHFL)  # instructions with a result


def result_kind(op: int) -> int:
    """The kind of a producer's result: `FIXED`, `MIO` or `MEMORY`."""
    return MEMORY if op == Op.LDG else MIO if op in (Op.LDS, Op.SHFL) else FIXED


def _register_list(value: str, key: str, where: str, index: int) -> list[str]:
    """`out=a,b` / `dep=a,b` register names, or `dep=-D` (the instruction D before)."""
    items = value.split(",")
    if key == "dep" and len(items) == 1 and items[0].startswith("-"):
        d = _number(items[0][1:], where, int)
        check(1 <= d <= index, where, f"dep={value}", f"a distance 1 .. {index} back to an earlier instruction")
        return [f"-{d}"]
    for name in items:
        check(name.replace(".", "_").isidentifier(), where, f"{key}={value}",
              "register names: letters, digits, _ and ., comma-separated (out=r3 dep=r1,r2), or dep=-D")
    return items


def assign_slots(instrs: list[Instr], names: dict[tuple[int, str], list[str]], struct: _Structure,
                 lines: list[int]) -> list[Instr]:
    """Register dependences (`out=`, `dep=`) as dependence slots: each register some instruction
    waits for gets a slot among those of the kind of its writers' results (1 .. MAX_DEP_SLOTS - 1,
    in order of first use; past them registers of one kind share slots round-robin, which only
    adds waits). An instruction's result goes to the slots of its kind of its `out=` registers,
    an unnamed result to slot 0; `dep=r` waits for `r`'s slot in the kind of each write of `r`
    that reaches it (`depslots.reaching`), `dep=-D` for the results of the instruction D before
    (docs/model.md section 7). A register waited for must be written earlier, or anywhere in the
    loop around the wait (a loop-carried dependence)."""
    outs = {i: list(v) for (i, key), v in names.items() if key == "out"}
    deps = {i: list(v) for (i, key), v in names.items() if key == "dep"}
    for i, regs in deps.items():
        if regs[0].startswith("-"):
            j = i - int(regs[0][1:])
            check(instrs[j].op in _PRODUCERS, f"program line {lines[i]}", f"dep={regs[0]}",
                  f"waits for instruction {j} ({instrs[j].op.name.lower()}), which has no result")
            outs.setdefault(j, []).append(f"%{j}") if not outs.get(j) else None
            deps[i] = outs[j]
    for i, regs in outs.items():
        check(instrs[i].op in _PRODUCERS, f"program line {lines[i] if i < len(lines) else 0}",
              instrs[i].op.name.lower(), "out= applies to instructions with a result")
    read = list(dict.fromkeys(r for i in sorted(deps) for r in deps[i]))
    kinds = {r: sorted({result_kind(instrs[j].op) for j, o in outs.items() if r in o}) for r in read}
    slot: dict[tuple[int, str], int] = {}
    loops = [(start, end) for start, end, *_ in struct.loops]
    reach = depslots.reaching(len(instrs), outs, loops, [(b0, mid, b1) for b0, mid, b1, *_ in struct.branches])
    # the kinds of result each read waits for: those of the writes that reach it
    read_kinds = {(i, r): sorted({result_kind(instrs[j].op) for j in reach[i].get(r, ())}) or kinds[r]
                  for i, regs in deps.items() for r in regs}
    for kind in (FIXED, MIO, MEMORY):  # a slot each in order of first use, then round-robin
        slot.update({(kind, r): 1 + n % (MAX_DEP_SLOTS - 1)
                     for n, r in enumerate(r for r in read if kind in kinds[r])})
    for i, regs in deps.items():
        for r in regs:
            writers = [j for j, o in outs.items() if r in o]
            carried = any(start <= i <= end and any(start <= j <= end for j in writers)
                          for start, end, *_ in struct.loops)
            check(any(j < i for j in writers) or carried, f"program line {lines[i]}", f"dep={r}",
                  "a dependence on a register no earlier instruction writes (nor one in the same loop)")
    out = []
    for i, ins in enumerate(instrs):
        producer = ins.op in _PRODUCERS
        kind = result_kind(ins.op)
        writes = sum({1 << slot.get((kind, r), 0) for r in outs.get(i, [])}) if outs.get(i) else 1
        waits = ((1 << WAIT_BITS) - 1 if ins.dep else
                 sum({1 << (slot[k, r] + MAX_DEP_SLOTS * k) for r in deps.get(i, []) for k in read_kinds[i, r]}))
        out.append(dataclasses.replace(ins, waits=waits, writes=writes if producer else 0))
    return out


POSITIVE = ">0"  # `if @NAME>0`: the warps whose value in array NAME is above 0 take the if-path


def _array_name(word: str, where: str) -> str:
    """The array name of an `@NAME` word."""
    name = word[1:]
    check(name.isidentifier(), where, word, "`@NAME` names an array: a letter or _, then letters, digits or _")
    return name


def _number(word: str, where: str, kind: type) -> float | int:
    try:
        return kind(word)
    except ValueError:
        raise JaxschedError(where, word, f"expected a {kind.__name__}") from None


# The range of each `key=value` option of a program line, and its description.
_OPTION_LIMITS = {"cta_spread": (0, MAX_TRIPS, f"must be in 0 .. {MAX_TRIPS}"),
                  "warp_spread": (0, MAX_TRIPS, f"must be in 0 .. {MAX_TRIPS}"),
                  "bytes": (1, MAX_LDG_BYTES, f"ldg bytes per warp in 1..{MAX_LDG_BYTES}"),
                  "ways": (1, 32, "bank-conflict ways in 1..32")}


def _args(words: list[str], where: str, keys: tuple[str, ...], positional: bool = True):
    pos = None
    opts: dict[str, int] = {}
    for w in words:
        if "=" in w:
            k, v = w.split("=", 1)
            check(k in keys, where, k, f"unknown option; expected one of {keys}")
            opts[k] = int(_number(v, where, int))
            low, high, limit = _OPTION_LIMITS[k]
            check(low <= opts[k] <= high, where, w, limit)
        else:
            check(positional and pos is None, where, w, "unexpected word")
            pos = int(_number(w, where, int))
            check(0 <= pos <= MAX_TRIPS, where, w, f"a trip count in 0 .. {MAX_TRIPS}")
    if positional:
        check(pos is not None, where, " ".join(words), "`loop N` needs a trip count")
    return pos, opts


_REAL = (int, float, np.integer, np.floating)  # numbers a keyword of `make_kernel` takes (NaN fails its range)


def make_kernel(
    program: str,
    *,
    grid: int,
    threads: int,
    regs: int = 32,
    smem_bytes: int = 0,
    static_smem_bytes: int = 0,
    l2_hit_rate: float = 0.5,
    seed: int = 0,
    name: str = "kernel",
    pad_to: int | None = None,
    cooperative: bool = False,
    grid_sync_ns: float = 1500.0,
    work_items: int = 0,
    arrays: Mapping[str, object] | None = None,
) -> Kernel:
    """Build a `Kernel` from the program text form and launch parameters.

    `pad_to` pads the program with trailing EXITs to a fixed length, so kernels of different
    programs share one compiled simulation. `cooperative` launches it with
    `cudaLaunchCooperativeKernel` (needed by `gsync`); `grid_sync_ns` is the cost of one grid
    barrier (a lead: ~1-2 us on Hopper); `work_items > 0` makes it a persistent kernel whose
    warps take loop iterations from a global queue (see `resident_grid` for its usual grid).
    `arrays` holds the arrays the program names (`loop @rows`, `if @mask`; module docstring).
    """
    for field, value, low in (("grid", grid, 1), ("threads", threads, 1), ("regs", regs, 0),
                              ("smem_bytes", smem_bytes, 0), ("static_smem_bytes", static_smem_bytes, 0)):
        check(isinstance(value, (int, np.integer)) and not isinstance(value, bool), field, value, "an integer")
        check(low <= value < 2**31, field, value, f"between {low} and 2^31 - 1")
    check(isinstance(seed, (int, np.integer)) and -(2**31) <= seed < 2**31, "seed", seed, "a 32-bit integer")
    check(isinstance(l2_hit_rate, _REAL) and 0.0 <= l2_hit_rate <= 1.0, "l2_hit_rate",
          l2_hit_rate, "a fraction in [0, 1]")
    check(isinstance(name, str), "name", name, "a string")
    check(isinstance(cooperative, (bool, np.bool_)), "cooperative", cooperative, "true or false")
    check(isinstance(grid_sync_ns, _REAL) and 0.0 <= grid_sync_ns <= 1e6, "grid_sync_ns",
          grid_sync_ns, "a barrier cost in [0, 1e6] ns")
    check(isinstance(work_items, (int, np.integer)) and 0 <= work_items < 2**30, "work_items",
          work_items, "a queue length in 0 .. 2^30 - 1 (0: not persistent)")
    instrs, struct = parse_program(program)
    if any(ins.grid_sync for ins in instrs):
        check(bool(cooperative), "program", "gsync", "grid.sync() needs a cooperative launch "
              "(cooperative = true), as in CUDA")
    check(work_items == 0 or len(struct.loops) == 1, "work_items", work_items,
          "a persistent kernel needs a loop, exactly one: each work item is one iteration of it")
    n = len(instrs)
    if pad_to is not None:
        check(pad_to >= n, "pad_to", pad_to, f"the program has {n} instructions")
        instrs = instrs + [Instr(Op.EXIT)] * (pad_to - n)
    loops = struct.loops or [(_NO, _NO, 0, 0, 0)]
    branches = struct.branches or [(_NO, _NO, _NO, 0.0, _NO)]
    tables = _data_tables([lp[2] for lp in loops], [br[3] for br in branches], {} if arrays is None else arrays,
                          grid, -(-threads // 32))
    check(work_items == 0 or not isinstance(loops[0][2], str), "work_items", work_items,
          "a persistent kernel's loop takes its trips from the work queue, not from an array")
    i32 = lambda v: np.asarray(v, dtype=np.int32)  # noqa: E731
    col = lambda rows, k, named=0: [named if isinstance(r[k], str) else r[k] for r in rows]  # noqa: E731
    return Kernel(
        name=name,
        grid_ctas=i32(grid),
        threads_per_cta=i32(threads),
        regs_per_thread=i32(regs),
        dynamic_smem_bytes=i32(smem_bytes),
        static_smem_bytes=i32(static_smem_bytes),
        op=i32([int(ins.op) for ins in instrs]),
        dep=np.asarray([ins.dep for ins in instrs], dtype=bool),
        waits=i32([ins.waits for ins in instrs]),
        writes=i32([ins.writes for ins in instrs]),
        bytes_per_warp=i32([ins.bytes_per_warp for ins in instrs]),
        bank_ways=i32([ins.bank_ways for ins in instrs]),
        grid_sync=np.asarray([ins.grid_sync for ins in instrs], dtype=bool),
        loop_start=i32(col(loops, 0)),
        loop_end=i32(col(loops, 1)),
        branch_start=i32(col(branches, 0)),
        branch_mid=i32(col(branches, 1)),
        branch_end=i32(col(branches, 2)),
        branch_parent=i32(col(branches, 4)),
        trips=i32(col(loops, 2)),
        trips_cta_spread=i32(col(loops, 3)),
        trips_warp_spread=i32(col(loops, 4)),
        branch_if_probability=np.asarray(col(branches, 3, 0.0), dtype=np.float32),
        l2_hit_rate=np.asarray(l2_hit_rate, dtype=np.float32),
        seed=i32(seed),
        cooperative=np.asarray(bool(cooperative)),
        grid_sync_ns=np.asarray(grid_sync_ns, dtype=np.float32),
        work_items=i32(work_items),
        **tables,
    )


def _data_tables(trips: list[int | str], branches: list[float | str], arrays: Mapping[str, object], grid: int,
                 warps: int) -> dict[str, np.ndarray]:
    """The `Kernel` data fields for the arrays the program names (per loop `trips`, per branch
    `branches`: an array name or a number), each checked: its shape, its values, and that every
    array is used. Loops and branches may share an array."""
    check(isinstance(arrays, Mapping), "arrays", type(arrays).__name__, "a mapping of array names to arrays")
    base = lambda name: name.removesuffix(POSITIVE)  # noqa: E731  (`if @rows>0` uses `rows`)
    used = list(dict.fromkeys(base(name) for name in trips + branches if isinstance(name, str)))
    for name in arrays:
        check(name in used, f"arrays.{name}", "unused", f"the program names {used or 'no array'} "
              "(`loop @NAME`, `if @NAME`)")
    for name in used:
        check(name in arrays, f"arrays.{name}", "missing", f"the program names it; give it in arrays= "
              f"(shape [{grid}] per CTA or [{grid}, {warps}] per warp)")
    named = lambda xs: [isinstance(x, str) for x in xs]  # noqa: E731
    rows = grid if any(named(trips) + named(branches)) else 1
    trips_data = np.zeros((len(trips), rows, MAX_WARPS), np.int32)
    if_data = np.zeros((len(branches), rows, MAX_WARPS), np.int32)
    for k, name in enumerate(trips):
        if isinstance(name, str):
            trips_data[k] = _table(arrays[name], f"arrays.{name}", grid, warps, 0, MAX_TRIPS,
                                   f"trip counts in 0 .. {MAX_TRIPS}")
    for b, name in enumerate(branches):
        if isinstance(name, str) and name.endswith(POSITIVE):
            values = np.asarray(arrays[base(name)])
            check(values.dtype.kind in "iub", f"arrays.{base(name)}", f"dtype {values.dtype}",
                  f"integers or booleans (`if @{name}`)")
            if_data[b] = _table(np.where(values > 0, -1, 0), f"arrays.{base(name)}", grid, warps,
                                INT32_MIN, INT32_MAX, "")
        elif isinstance(name, str):
            if_data[b] = _table(_lane_masks(arrays[name], f"arrays.{name}"), f"arrays.{name}", grid, warps,
                                INT32_MIN, INT32_MAX, "booleans or 32-bit lane masks")
    return {"trips_from_data": np.asarray(named(trips)), "trips_data": trips_data,
            "if_from_data": np.asarray(named(branches)), "if_data": if_data}


def _lane_masks(values: object, field: str) -> np.ndarray:
    """A branch array as int32 lane masks: booleans (the whole warp, or none of it) or 32-bit
    patterns (unsigned, or int32 bit patterns)."""
    a = np.asarray(values)
    if a.dtype == bool:
        return np.where(a, -1, 0)
    if a.dtype.kind == "u" or (a.dtype.kind == "i" and a.size and a.max() > INT32_MAX):
        a = a.astype(np.int64)
        check(bool(np.all((a >= 0) & (a < 2**32))), field, f"{a.min()} .. {a.max()}",
              "32-bit lane masks (0 .. 2^32 - 1, or int32 bit patterns)")
        a = np.where(a > INT32_MAX, a - 2**32, a)
    return a


def _table(values: object, field: str, grid: int, warps: int, low: int, high: int, what: str) -> np.ndarray:
    """A per-CTA `[grid]` or per-warp `[grid, warps]` array as a data table `[grid, MAX_WARPS]`."""
    a = np.asarray(values)
    check(a.shape in ((grid,), (grid, warps)), field, f"shape {a.shape}",
          f"[{grid}] (one value per CTA) or [{grid}, {warps}] (one per warp of each CTA)")
    check(a.dtype.kind in "iu" or (a.dtype == bool and low == INT32_MIN), field, f"dtype {a.dtype}", what)
    check_ints(a.astype(np.int64), field, low, high, what, rank=a.ndim)
    table = np.zeros((grid, MAX_WARPS), np.int32)
    table[:, :warps] = a.reshape(grid, -1).astype(np.int32)
    return table


def pad_program(kernel: Kernel, n_instr: int, loops: int | None = None, branches: int | None = None) -> Kernel:
    """`kernel` with its program padded by trailing EXITs to `n_instr` instructions, and its loop
    and branch fields by absent entries to `loops` and `branches` (default: as they are), so that
    kernels of different programs share one compiled simulation."""
    extra = n_instr - kernel.n_instr
    check(extra >= 0, "pad_to", n_instr, f"the program has {kernel.n_instr} instructions")

    def pad(x: object, v: object, n: int | None = None, axis: int = -1) -> np.ndarray:
        a = np.asarray(x)
        more = extra if n is None else n - a.shape[axis]
        check(more >= 0, "pad_program", n, f"the program has {a.shape[axis]} loops or branches")
        shape = list(a.shape)
        shape[axis] = more
        return np.concatenate([a, np.full(shape, v, a.dtype)], axis)

    n_l = np.shape(kernel.loop_start)[-1] if loops is None else loops
    n_b = np.shape(kernel.branch_start)[-1] if branches is None else branches
    per_loop = {name: pad(getattr(kernel, name), v, n_l) for name, v in (
        ("loop_start", _NO), ("loop_end", _NO), ("trips", 0), ("trips_cta_spread", 0), ("trips_warp_spread", 0),
        ("trips_from_data", False))}
    per_branch = {name: pad(getattr(kernel, name), v, n_b) for name, v in (
        ("branch_start", _NO), ("branch_mid", _NO), ("branch_end", _NO), ("branch_parent", _NO),
        ("branch_if_probability", 0.0), ("if_from_data", False))}
    return kernel.replace(op=pad(kernel.op, int(Op.EXIT)), dep=pad(kernel.dep, False),
                          waits=pad(kernel.waits, 0), writes=pad(kernel.writes, 0),
                          bytes_per_warp=pad(kernel.bytes_per_warp, 0), bank_ways=pad(kernel.bank_ways, 1),
                          grid_sync=pad(kernel.grid_sync, False), **per_loop, **per_branch,
                          trips_data=pad(kernel.trips_data, 0, n_l, -3), if_data=pad(kernel.if_data, 0, n_b, -3))


def structure_sizes(kernel: Kernel) -> tuple[int, int]:
    """(loops, branches) a compiled simulation of a (concrete) kernel pads to
    (`structure.padded_count` of its real loops and branches)."""
    return padded_count(kernel.n_loops, MAX_LOOPS), padded_count(kernel.n_branches, MAX_BRANCHES)


def data_rows(kernel: Kernel) -> int:
    """Rows a (concrete) kernel's data tables need in a compiled simulation: its grid if the
    program takes anything from data, else 1 (the tables are then never read)."""
    on = bool(np.any(kernel.trips_from_data)) or bool(np.any(kernel.if_from_data))
    return int(kernel.grid_ctas) if on else 1


def pad_data(kernel: Kernel, rows: int) -> Kernel:
    """`kernel` with its data tables padded with zero rows, or cut, to `rows` rows (at least
    `data_rows(kernel)`), so that kernels of one batch share their shapes."""
    def fit(x: object) -> np.ndarray:
        a = np.asarray(x)[..., :rows, :]
        pad = list(a.shape)
        pad[-2] = rows - a.shape[-2]
        return np.concatenate([a, np.zeros(pad, a.dtype)], -2)

    return kernel.replace(trips_data=fit(kernel.trips_data), if_data=fit(kernel.if_data))


def resident_grid(arch, kernel: Kernel) -> int:
    """The number of CTAs that fit on `arch` at once: a persistent or cooperative kernel's grid."""
    from .occupancy import occupancy

    occ = occupancy(arch, kernel.threads_per_cta, kernel.regs_per_thread, kernel.dynamic_smem_bytes,
                    kernel.static_smem_bytes)
    return int(occ.blocks_per_sm) * arch.sm_count


_KERNEL_KEYS = ("name", "program", "grid", "threads", "regs", "smem_bytes", "static_smem_bytes",
                "l2_hit_rate", "seed", "cooperative", "grid_sync_ns", "work_items", "arrays")


def kernel_from_dict(doc: dict, source: str = "<dict>", base_dir: Path | None = None) -> Kernel:
    """A `Kernel` from a TOML table with keys `_KERNEL_KEYS` (program and grid, threads required).
    Its `arrays` table holds inline lists or `.npy` files, relative to `base_dir` (default: the
    working directory)."""
    table = doc.get("kernel", doc)
    for key in table:
        check(key in _KERNEL_KEYS, f"{source}: kernel.{key}", table[key], f"unknown key; expected one of {_KERNEL_KEYS}")
    for key in ("program", "grid", "threads"):
        check(key in table, f"{source}: kernel.{key}", None, "required")
    args = {k: v for k, v in table.items() if k != "program"}
    try:
        if "arrays" in args:
            args["arrays"] = _read_arrays(args["arrays"], base_dir)
        return make_kernel(table["program"], **args)
    except JaxschedError as exc:  # the value's field, in the file it came from
        raise JaxschedError(f"{source}: kernel.{exc.field}", exc.value, exc.limit, exc.hint) from None


def _read_arrays(table: object, base_dir: Path | None) -> dict[str, np.ndarray]:
    """A TOML `arrays` table: each entry an inline list (of numbers, or of lists per warp) or
    the path of a `.npy` file."""
    check(isinstance(table, dict), "arrays", table, "a table of NAME = [values] or NAME = \"file.npy\"")
    out = {}
    for name, value in table.items():
        if isinstance(value, str):
            path = Path(value) if base_dir is None or Path(value).is_absolute() else base_dir / value
            check(path.suffix == ".npy", f"arrays.{name}", value, "a .npy file (numpy.save), or an inline list")
            try:
                out[name] = np.load(path, allow_pickle=False)
            except (OSError, ValueError) as exc:
                raise JaxschedError(f"arrays.{name}", str(path), f"a readable .npy file ({exc})") from None
        else:
            check(isinstance(value, list), f"arrays.{name}", value, "an inline list, or a .npy file's path")
            try:
                out[name] = np.asarray(value)
            except ValueError:
                raise JaxschedError(f"arrays.{name}", "ragged rows", "one value per CTA, or equal rows per warp") \
                    from None
    return out


def load_kernel(path: str | Path) -> Kernel:
    """Read a kernel TOML file (a `[kernel]` table; see `sweeps/kernels/`); array files are
    relative to it."""
    return kernel_from_dict(tomldoc.read(path, "kernel file"), str(path), Path(path).parent)

