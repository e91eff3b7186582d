"""Programs with real structure (docs/model.md section 6): nested loops, several if/else regions,
`if` without `else`, loops inside branches, in both engines; imported SASS and Accel-Sim traces
run, and a trace gives each warp exactly its traced instruction count."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from jaxsched import accelsim_import, clocks, reference, trace
from jaxsched.engine.run import simulate_batch
from jaxsched.kernel import make_kernel, pad_program
from jaxsched.sass_import import describe, from_sass

from helpers import data_arrays, examples, programs, simulate_padded, small_arch
from test_engine_vs_reference import assert_same

DATA = Path(__file__).parent / "data"
ARCH = small_arch(1)
CLOCKS = clocks.from_array(ARCH, np.full(ARCH.n_sm_slots, 1500.0))


def _both(kernel) -> dict:
    """The reference's outputs, after checking that the engine gives the same (every kernel
    padded to one shape and fast-forward's search compiled in whatever the kernel, so that the
    tests share one compilation: two before, one with the search and one without; the
    differential tests meet both forms against the reference)."""
    cfg = dict(arch=ARCH, kernel=pad_program(kernel, 40, 2, 2), clocks=CLOCKS)
    ref = reference.simulate(**cfg)
    assert_same(simulate_padded(**cfg, fast_forward_step=True), ref)
    return ref


def test_an_inner_loop_runs_its_trips_on_every_trip_of_the_outer() -> None:
    """3 outer trips x (4 inner trips of one fma + the outer's own alu) + exit, per warp; the
    inner count starts again at every entry."""
    ref = _both(make_kernel("loop 3\n loop 4\n  fma dep\n end\n alu\nend", grid=2, threads=64))
    assert ref["warp_issued"].tolist() == [[3 * (4 + 1) + 1] * 2] * 2


def test_inner_trips_from_data_per_warp() -> None:
    """An inner loop whose trips come from an array per warp, inside an outer loop of 2."""
    rows = np.array([[0, 3], [5, 1]])
    k = make_kernel("alu\nloop 2\n loop @rows\n  fma\n end\n alu\nend", grid=2, threads=64, arrays={"rows": rows})
    ref = _both(k)
    assert ref["warp_issued"].tolist() == (1 + 2 * (rows + 1) + 1).tolist()


def test_if_without_else_runs_only_where_lanes_take_it() -> None:
    """Whole warps take the if-path or skip it (booleans per warp); the skipped warps issue only
    what is around it."""
    take = np.array([[True, False], [False, True]])
    ref = _both(make_kernel("alu\nif @take\n fma\n fma\nend\nalu", grid=2, threads=64, arrays={"take": take}))
    assert ref["warp_issued"].tolist() == np.where(take, 5, 3).tolist()


def test_nested_branches_run_the_lanes_of_both_paths() -> None:
    """Lane masks: the outer if-path has lanes 0-15, the inner branch inside it takes lanes where
    bit l of 0x00FF00FF is set: its if-path runs 8 lanes, its else-path 8, the outer else-path
    16. Active lanes are counted per instruction."""
    outer, inner = np.array([0x0000FFFF]), np.array([0x00FF00FF])
    k = make_kernel("if @outer\n if @inner\n  fma\n else\n  alu\n  alu\n end\nelse\n sfu\nend",
                    grid=1, threads=32, arrays={"outer": outer, "inner": inner})
    ref = _both(k)
    assert ref["warp_issued"].tolist() == [[5]]  # fma, alu, alu, sfu, exit
    assert int(np.sum(ref["sm_active_lanes"])) == 8 + 2 * 8 + 16 + 32


def test_a_loop_inside_a_branch_is_skipped_with_it() -> None:
    """Warps that skip the if-path never enter the loop inside it."""
    take = np.array([True, False, True])
    k = make_kernel("if @take\n loop 5\n  fma dep\n  alu\n end\nelse\n sfu\nend", grid=3, threads=32,
                    arrays={"take": take})
    assert _both(k)["warp_issued"].ravel().tolist() == [11, 2, 11]


@settings(max_examples=examples(15, fixed=10), deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(data=st.data())
def test_the_reference_issues_what_the_structure_counts(data) -> None:
    """Per warp, the reference issues each instruction as often as `structure.executions` says
    (the loops around it, if its paths have lanes), from the engine's own per-warp variation
    (`trace.cta_work`), on random structured programs with numbers or arrays."""
    data_loop, data_if = data.draw(st.booleans()), data.draw(st.booleans())
    program = data.draw(programs(data_loop, data_if, structured=True))
    grid, threads = data.draw(st.integers(1, 4)), data.draw(st.integers(1, 96))
    kernel = make_kernel(program, grid=grid, threads=threads, seed=data.draw(st.integers(0, 99)),
                         arrays=data.draw(data_arrays(program, grid, -(-threads // 32))))
    ref = reference.simulate(arch=ARCH, kernel=kernel, clocks=CLOCKS)
    np.testing.assert_array_equal(ref["warp_issued"].sum(axis=1), trace.cta_work(ARCH, kernel, CLOCKS))


@pytest.mark.parametrize("folder", ["my_app", "vectoradd"])
def test_an_accelsim_trace_gives_each_warp_its_traced_instruction_count(folder: str) -> None:
    (imported,) = accelsim_import.import_traces(DATA / "accelsim" / folder, regs=32)
    kernel = make_kernel(imported.program, grid=imported.grid, threads=imported.threads, regs=imported.regs,
                         smem_bytes=imported.smem_bytes, arrays=imported.arrays)
    ref = _both(kernel)
    np.testing.assert_array_equal(ref["warp_issued"], imported.warp_insts)


def test_five_compiled_kernels_import_from_sass_and_run() -> None:
    """The reduction, tiled matmul, stencil, SpMV and softmax (sm_90) import with a trip count
    for every loop and an outcome for every branch, no hand edits, and run: the engine equals
    the reference on each (one compilation for the five, run one at a time: a chunk of five
    steps until the longest ends, 59 s here against 41 s)."""
    kernels = []
    for name in ("reduction", "matmul", "stencil", "spmv", "softmax"):
        text = (DATA / "sass" / f"{name}.sm_90.sass").read_text()
        listing = describe(text)
        trips = {loop: 3 for loop in re.findall(r"\b(L\d+)\s+loop", listing)}
        branches = {b: 0.6 for b in re.findall(r"\b(B\d+)\s+if", listing)}
        kernels.append(make_kernel(from_sass(text, trips=trips, branches=branches), grid=3, threads=64, seed=5))
    n_instr = max(k.n_instr for k in kernels)
    loops, branches = (max(np.shape(getattr(k, f))[-1] for k in kernels) for f in ("loop_start", "branch_start"))
    kernels = [pad_program(k, n_instr, loops, branches) for k in kernels]
    batch = simulate_batch([ARCH] * 5, kernels, [CLOCKS] * 5, [1] * 5, [0] * 5, [0] * 5, chunk=1)
    for i, kernel in enumerate(kernels):
        assert kernel.n_loops >= 1 and kernel.n_branches >= 1
        assert_same(batch, reference.simulate(arch=ARCH, kernel=kernel, clocks=CLOCKS), i)
