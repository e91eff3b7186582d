"""Shared test helpers: a small test chip and hypothesis strategies for whole configurations."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
from hypothesis import assume
from hypothesis import strategies as st

import jax

import jaxsched as js
from jaxsched import clocks
from jaxsched.engine.run import MAX_TICKS, Result, simulate_batch
from jaxsched.hierarchy import build_hierarchy
from jaxsched.isa import Op
from jaxsched.kernel import MAX_DEP_SLOTS, make_kernel, pad_program
from jaxsched.lower import DISPATCH_POLICIES, WARP_POLICIES

N_INSTR = 16  # programs are padded to this length so one compilation serves every example
STRUCTURED_LOOPS = STRUCTURED_BRANCHES = 4  # structured programs pad to these (a second compilation)
MAX_GRID = 48

# Hypothesis examples per differential test scale with JAXSCHED_TEST_DEPTH (default 1, what CI
# runs; README, "Tests"): the engine-against-reference tests of the core, workloads and
# structured programs keep their depth in CI, the tests of a mechanism the core tests already
# cross (DVFS, launch modes, batching, the GPU's forms, fast-forward, own time) run fewer.
DEPTH = float(os.environ.get("JAXSCHED_TEST_DEPTH", "1"))
# The fixed profile (conftest.py; CI's) draws the same examples on every run, so past the
# examples that reach each feature more of them check again what the first checked: a test
# whose examples each run the reference for many ticks says how many the fixed profile draws
# (`fixed`), and the explore profile, which draws anew each run, keeps the full count.
FIXED_PROFILE = os.environ.get("HYPOTHESIS_PROFILE", "fixed") == "fixed"


def examples(n: int, fixed: int | None = None) -> int:
    """`n` hypothesis examples at depth 1 (`fixed` of them under the fixed profile, where
    given), scaled by `DEPTH` (at least 1)."""
    return max(1, round((fixed if FIXED_PROFILE and fixed is not None else n) * DEPTH))


# The H200's fitted taken-branch refetch and launch credit (docs/calibration.md) switched off, so
# that hand-derived numbers follow the core rules of docs/model.md; tests of those rules set them.
RULES_OFF = {"taken_branch_cycles": np.int32(0), "cta_launch_idle_cycles": np.int32(0)}


def small_arch(n_enabled_tpcs: int = 4, **overrides) -> js.Arch:
    """An H200-like chip with 2 GPCs x 2 TPC sites (8 SM slots), some TPCs enabled, with
    `RULES_OFF` unless `overrides` set those fields."""
    per_gpc = [min(2, max(0, n_enabled_tpcs - 2 * g)) for g in range(2)]
    base = js.presets.get("h200")
    return base.replace(name="test8", **build_hierarchy([2, 2], per_gpc, die_mm=(10.0, 10.0)),
                        **{**RULES_OFF, **overrides})


def hand_h200(n_sms: int = 1, *, cta_launch_ns: float = 0.0, fma_issue_cycles: float = 1.0,
              taken_branch_cycles: int = 0, launch_idle_cycles: int = 0) -> js.Arch:
    """The h200 with its first `n_sms` SM slots enabled, at 1.98 GHz, and the numbers hand
    computations use pinned: FMA and ALU latency 4, ALU issue 2, FMA issue `fma_issue_cycles`."""
    base = js.presets.get("h200")
    lat = np.asarray(base.latency_cycles).copy()
    lat[[Op.FMA, Op.ALU]] = 4
    issue = np.asarray(base.issue_cycles, dtype=np.float32).copy()
    issue[Op.FMA], issue[Op.ALU] = fma_issue_cycles, 2.0
    return base.replace(
        sm_enabled=np.arange(base.n_sm_slots) < n_sms,
        latency_cycles=lat,
        issue_cycles=issue,
        boost_clock_ghz=np.float32(1.98),
        cta_launch_ns=np.float32(cta_launch_ns),
        taken_branch_cycles=np.int32(taken_branch_cycles),
        cta_launch_idle_cycles=np.int32(launch_idle_cycles),
    )


_BODY_OPS = ["fma", "alu", "sfu", "lds", "ldg", "shfl"]


@st.composite
def programs(draw, data_loop: bool = False, data_if: bool = False, structured: bool = False) -> str:
    """A legal program text: straight-line code, optionally one loop and one if/else; or, with
    `structured`, up to `STRUCTURED_LOOPS` loops and `STRUCTURED_BRANCHES` branches nested at
    random (loops in branches, branches in loops, `if` without `else`) in at most `N_INSTR - 1`
    instructions.
    Loop trips come from the array `trips` (`data_loop`) and if-lanes from the array `lanes`
    (`data_if`) where asked (`data_arrays` draws them)."""

    written: list[str] = []  # registers earlier lines write
    counts = {"instr": 0, "loop": 0, "if": 0}

    def instruction() -> str:
        counts["instr"] += 1
        op = draw(st.sampled_from(_BODY_OPS + ["bar"]))
        kind = draw(st.sampled_from(["none", "all", "regs", "regs"] if written else ["none", "all"]))
        line = op + {"none": "", "all": " dep"}.get(kind, "")
        if kind == "regs":
            line += " dep=" + ",".join(draw(st.lists(st.sampled_from(written), min_size=1, max_size=2,
                                                     unique=True)))
        if op != "bar" and draw(st.booleans()):
            name = draw(st.sampled_from(["r0", "r1", "r2"]))
            line += f" out={name}"
            written.append(name)
        if op == "ldg":
            line += f" bytes={draw(st.sampled_from([32, 128, 512, 4096]))}"
        if op == "lds":
            line += f" ways={draw(st.integers(1, 8))}"
        return line

    def block(n_min: int, n_max: int) -> list[str]:
        return [instruction() for _ in range(draw(st.integers(n_min, n_max)))]

    def loop_head() -> str:
        counts["loop"] += 1
        if data_loop:
            return "loop @trips"
        spreads = f"cta_spread={draw(st.integers(0, 3))} warp_spread={draw(st.integers(0, 3))}"
        return f"loop {draw(st.integers(0, 6 if not structured else 3))} {spreads}"

    def if_head() -> str:
        counts["if"] += 1
        return "if @lanes" if data_if else f"if {draw(st.sampled_from([0.0, 0.1, 0.5, 0.97, 1.0]))}"

    def branch() -> list[str]:
        return [if_head(), *block(1, 2), "else", *block(1, 2), "end"]

    def nested(depth: int) -> list[str]:
        lines: list[str] = []
        for _ in range(draw(st.integers(1, 3))):
            room = N_INSTR - 6 - counts["instr"]  # slack for the back-edges and else-paths still to come
            kinds = ["instr"]
            if depth < 3 and room >= 2 and counts["loop"] < STRUCTURED_LOOPS:
                kinds.append("loop")
            if depth < 3 and room >= 2 and counts["if"] < STRUCTURED_BRANCHES:
                kinds += ["if", "if/else"]
            kind = draw(st.sampled_from(kinds)) if room >= 1 else None
            if kind == "instr":
                lines.append(instruction())
            elif kind == "loop":
                head = loop_head()
                # the loop's own last instruction (its back-edge) follows whatever nests inside it
                lines += [head, *nested(depth + 1), instruction(), "end"]
            elif kind is not None:
                head = if_head()
                body = nested(depth + 1)
                if kind == "if/else":
                    body += ["else", *nested(depth + 1)]
                lines += [head, *body, "end"]
        return lines or [instruction()]

    if structured:
        lines = nested(0)
        assume(counts["instr"] <= N_INSTR - 1)
    else:
        layout = draw(st.sampled_from(["flat", "loop", "loop+if_inside", "if+loop", "loop+if"]))
        if layout == "flat":
            lines = block(1, 6)
        elif layout == "loop":
            lines = block(0, 2) + [loop_head(), *block(1, 4), "end"] + block(0, 2)
        elif layout == "loop+if_inside":
            lines = [loop_head(), *block(0, 1), *branch(), *block(1, 2), "end"]
        elif layout == "if+loop":
            lines = [*branch(), loop_head(), *block(1, 3), "end"]
        else:
            lines = [loop_head(), *block(1, 3), "end", *branch()]
    lines.append("exit dep" if draw(st.booleans()) else "exit")
    return "\n".join(lines)


@st.composite
def data_arrays(draw, program: str, grid: int, warps: int) -> dict[str, np.ndarray]:
    """The arrays a `programs` text names: trip counts 0..8 and if-path lanes (booleans or lane
    masks), each per CTA or per warp."""
    arrays = {}
    shape = lambda: draw(st.sampled_from([(grid,), (grid, warps)]))  # noqa: E731
    if "@trips" in program:
        arrays["trips"] = np.asarray(draw(st.lists(st.integers(0, 8), min_size=grid * warps, max_size=grid * warps)))
        arrays["trips"] = arrays["trips"][:int(np.prod(s := shape()))].reshape(s)
    if "@lanes" in program:
        s = shape()
        n = int(np.prod(s))
        if draw(st.booleans()):
            arrays["lanes"] = np.asarray(draw(st.lists(st.booleans(), min_size=n, max_size=n))).reshape(s)
        else:
            arrays["lanes"] = np.asarray(draw(st.lists(st.integers(-(2**31), 2**31 - 1), min_size=n, max_size=n)),
                                         np.int32).reshape(s)
    return arrays


@st.composite
def configurations(draw) -> dict:
    """Random small chip, kernel, clock map and policies (all with the same static shapes)."""
    lat = [draw(st.integers(1, 24)) for _ in Op]
    # issue intervals in 1/64 cycle (docs/model.md section 3): whole cycles and fractions like 1.03
    issue = [draw(st.one_of(st.integers(1, 4).map(float), st.integers(64, 256).map(lambda n: n / 64)))
             for _ in Op]
    arch = small_arch(
        draw(st.integers(1, 4)),
        latency_cycles=np.asarray(lat, np.int32),
        issue_cycles=np.asarray(issue, np.float32),
        taken_branch_cycles=np.int32(draw(st.sampled_from([0, 0, 1, 2, 7, 20]))),
        cta_launch_idle_cycles=np.int32(draw(st.sampled_from([0, 0, 1, 4, 30, 250]))),
        mio_queue_depth=np.int32(draw(st.integers(1, 12))),
        l2_hit_latency_ns=np.float32(draw(st.floats(5.0, 200.0))),
        dram_latency_ns=np.float32(draw(st.floats(200.0, 600.0))),
        l2_bytes_per_ns=np.float32(draw(st.floats(20.0, 6000.0))),
        dram_bytes_per_ns=np.float32(draw(st.floats(5.0, 5000.0))),
    )
    threads = draw(st.integers(1, 1024))
    grid = draw(st.integers(1, MAX_GRID))
    data_loop, data_if = draw(st.sampled_from([(False, False)] * 4 + [(True, False), (False, True), (True, True)]))
    structured = draw(st.booleans())
    program = draw(programs(data_loop, data_if, structured))
    kernel = make_kernel(
        program,
        grid=grid,
        arrays=draw(data_arrays(program, grid, -(-threads // 32))),
        threads=threads,
        regs=draw(st.sampled_from([16, 32, 40, 64, 128])),
        smem_bytes=draw(st.sampled_from([0, 1000, 30000, 100000])),
        l2_hit_rate=draw(st.floats(0.0, 1.0)),
        seed=draw(st.integers(-(2**31), 2**31 - 1)),
        pad_to=N_INSTR,
    )
    if structured:
        kernel = pad_program(kernel, N_INSTR, STRUCTURED_LOOPS, STRUCTURED_BRANCHES)
    freqs = [draw(st.integers(300, 2000)) for _ in range(arch.n_sm_slots)]
    return dict(
        arch=arch,
        kernel=kernel,
        clocks=clocks.from_array(arch, np.asarray(freqs, dtype=np.float64)),
        warp_policy=draw(st.sampled_from(["lrr", "gto", "oldest"])),
        dispatch=draw(st.sampled_from(js.DISPATCH_POLICIES)),
        dispatch_start=draw(st.integers(0, 7)),
        dispatch_weight=draw(st.one_of(st.none(), st.lists(
            st.integers(1, 3000), min_size=arch.n_sm_slots, max_size=arch.n_sm_slots).map(np.asarray))),
        ema_alpha=draw(st.sampled_from([0.0, 0.1, 0.25, 0.5, 1.0])),
        ema_prior_ns=draw(st.sampled_from([0.0, 50.0, 1000.0])),
        hold_margin=draw(st.sampled_from([0.0, 0.0625, 0.125, 0.3, 1.0])),
        hold_noise=draw(st.sampled_from([0.0, 0.0, 1.0, 2.5])),
        hold_queue=draw(st.sampled_from([0.0, 0.0, 0.5, 1.0])),
        hold_left=draw(st.sampled_from([1.0, 1.0, 0.0, 0.5, 2.5])),
    )


def tiny_sweep_spec(title: str, seed: int, grid: str, top: str = "") -> str:
    """A sweep spec of the H200 preset with a 40-CTA kernel (fast), for sweep tests."""
    return f"""
title = "{title}"
arch = "h200"
replicates = 2
seed = {seed}
{top}
[kernel]
name = "tiny"
grid = 40
threads = 64
program = "loop 3\\n ldg\\n fma dep\\nend"

[clocks]
mean_ghz = 1.8

[grid]
{grid}
"""


# The per-CTA trace of a padded run with more than `MAX_GRID` CTAs (its power of two beyond).
LARGE_GRID = 256

# Clock-trace rows every padded run compiles (the most a differential test asks for): rows are
# written from the first on, so a run keeps what a shorter trace keeps, and runs without DVFS
# (which write none) share the compilation of runs with it.
TRACE_ROWS = 8


def _padded_program(kernel):
    """A kernel (or each launch of a workload) with its program padded by trailing EXITs to at
    least `N_INSTR` instructions, so that hand-written programs of any length share the
    compilations of the strategies' programs. A workload's launches also pad their loop and
    branch tables to the structured programs' (`STRUCTURED_LOOPS`, `STRUCTURED_BRANCHES`):
    the engine's form for programs of one loop is checked against the reference by every
    single-kernel differential test, and a workload's launch tables, streams and events do
    not depend on it, so each number of launches compiles once per fast-forward form rather
    than twice (the random workloads compiled 6-7 programs, 4 now)."""
    if isinstance(kernel, js.Workload):
        n = max(N_INSTR, *(k.n_instr for k in kernel.kernels))
        return dataclasses.replace(kernel, kernels=tuple(pad_program(k, n, STRUCTURED_LOOPS, STRUCTURED_BRANCHES)
                                                         for k in kernel.kernels))
    return pad_program(kernel, max(N_INSTR, kernel.n_instr))


def simulate_padded(*, arch: js.Arch, kernel, clocks: js.Clocks, warp_policy: str = "gto", dispatch: str = "hardware",
                    dispatch_start: int = 0, dispatch_weight=None, ema_alpha: float = 0.25, ema_prior_ns: float = 0.0,
                    hold_margin: float = 0.125, hold_noise: float = 0.0, hold_queue: float = 0.0,
                    hold_left: float = 1.0, dvfs=None, trace_len: int = 0,
                    max_ticks: int = MAX_TICKS, fast_forward_step: bool | None = None) -> Result:
    """`simulate` with `reference.simulate`'s arguments, as one configuration of a batch padded to
    the largest static sizes the strategies draw (every CTA slot of the chip, `MAX_GRID` CTAs,
    programs of `N_INSTR` instructions, `TRACE_ROWS` rows of the clock trace cut to `trace_len`,
    data tables, the DVFS step and the closed loop's learning compiled in): a kernel's sizes
    otherwise follow its occupancy, grid and program, and every hypothesis example would compile
    anew. Fast-forward (where the kernel may use it) and a kernel's loop tables (one loop, or
    the structured programs' `STRUCTURED_LOOPS`; a workload's launches always the latter,
    `_padded_program`) follow the kernel as in a plain run: each selects a form of the engine,
    and every form must meet the reference. A larger grid pads to
    `LARGE_GRID` (beyond it, to its power of two), so that the examples with one (persistent
    and cooperative grids of the launch-mode and fast-forward tests) share a compilation.
    `fast_forward_step=True` compiles fast-forward's search in whatever the kernel (a test
    that checks something other than the forms pins it, with the structured loop tables, to
    compile once)."""
    grid = sum(int(k.grid_ctas) for k in kernel.kernels) if isinstance(kernel, js.Workload) else int(kernel.grid_ctas)
    grid = MAX_GRID if grid <= MAX_GRID else max(LARGE_GRID, 1 << (grid - 1).bit_length())
    assert 0 <= trace_len <= TRACE_ROWS, "raise TRACE_ROWS"
    batch = simulate_batch([arch], [_padded_program(kernel)], [clocks], [WARP_POLICIES.index(warp_policy)],
                           [DISPATCH_POLICIES.index(dispatch)], [dispatch_start], dispatch_weight=[dispatch_weight],
                           ema_alpha=ema_alpha, ema_prior_ns=ema_prior_ns, hold_margin=hold_margin,
                           hold_noise=hold_noise, hold_queue=hold_queue, hold_left=hold_left, dvfs=[dvfs],
                           trace_len=TRACE_ROWS,
                           dvfs_step=True, closed_loop_step=True, cta_slots=int(arch.max_blocks_per_sm),
                           max_ctas=grid, dep_slots=MAX_DEP_SLOTS, data_tables=True, max_ticks=max_ticks,
                           fast_forward_step=fast_forward_step)
    one = jax.tree.map(lambda x: x[0], batch)
    return dataclasses.replace(one, **{key: getattr(one, key)[:trace_len]
                                       for key in ("trace_tick", "trace_mhz", "trace_mw", "trace_mk")})


def simulate_pinned(arch: js.Arch, kernel, clocks: js.Clocks | None = None, *, statics: dict, trace_len: int = 0,
                    max_ticks: int = MAX_TICKS, **config) -> Result:
    """`js.simulate(arch, kernel, clocks, **config)` as a batch of one with the static choices
    `statics` (`simulate_batch`'s keywords: `cta_slots`, `max_ctas`, `closed_loop_step`, ...),
    its per-CTA trace cut to the run's CTAs as `js.simulate` cuts it. `js.simulate` sizes each
    run by its own occupancy, grid and policies, so a file of hand-written cases compiled once
    per case (several seconds each); with one `statics` for the file they share a compilation
    per program length and number of launches. Results are the same either way: every padded
    size is exact (`engine/mechanics/sizes.py`, tests/test_cta_slots.py, tests/test_sizes.py)."""
    batch = simulate_batch([js.make_params(arch, kernel, clocks, **config)], trace_len=trace_len,
                           max_ticks=max_ticks, **statics)
    one = jax.tree.map(lambda x: x[0], batch)
    kernels = kernel.kernels if isinstance(kernel, js.Workload) else (kernel,)
    n = sum(int(k.grid_ctas) for k in kernels)
    return dataclasses.replace(one, **{key: getattr(one, key)[:n]
                                       for key in ("cta_sm", "cta_start_tick", "cta_end_tick", "cta_kernel")})


def cuda_tools() -> dict[str, str] | None:
    """Paths of `nvcc` and `cuobjdump` for compiling test kernels: the test extra's wheels
    (nvidia-cuda-nvcc, nvidia-cuda-cuobjdump, nvidia-cuda-nvdisasm: `pip install -e '.[test]'`),
    else a CUDA toolkit on PATH; None where neither has both, or no host C++ compiler (nvcc
    preprocesses with it)."""
    import shutil
    from pathlib import Path

    if shutil.which("g++") is None and shutil.which("c++") is None:
        return None
    try:
        import nvidia

        folders = sorted({nvcc.parent for root in nvidia.__path__ for nvcc in Path(root).glob("cu*/bin/nvcc")})
    except ImportError:
        folders = []
    for folder in folders:
        if (folder / "cuobjdump").exists():
            return {"nvcc": str(folder / "nvcc"), "cuobjdump": str(folder / "cuobjdump")}
    nvcc, cuobjdump = shutil.which("nvcc"), shutil.which("cuobjdump")
    return {"nvcc": nvcc, "cuobjdump": cuobjdump} if nvcc and cuobjdump else None
