"""Workloads in the JAX engine (docs/model.md section 13): several kernels on streams, event
dependencies, CUDA graphs, the leftover dispatch policy, launch checks and batching. Exact
equality with the reference is in test_workload_vs_reference.py."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import jaxsched as js
from jaxsched import archio
from jaxsched.cli import main
from jaxsched.errors import JaxschedError
from jaxsched.kernel import resident_grid
from jaxsched.workload import make_workload, single, workload_from_dict

from helpers import simulate_pinned, small_arch

ARCH = small_arch(4)
N_SM = ARCH.sm_count
PAD = 8
# Kernels of one CTA shape. Most two-launch workloads below have 12 CTAs and three-launch ones
# 20, so that they share compiled simulations (the CTA trace length is a static shape).
# A long kernel of one CTA per SM on half the chip, the same on the whole chip, a short one.
LONG = js.make_kernel("loop 60\n fma dep\n fma dep\nend", grid=N_SM // 2, threads=128, pad_to=PAD)
WIDE = js.make_kernel("loop 60\n fma dep\n fma dep\nend", grid=N_SM, threads=128, pad_to=PAD, seed=1)
SHORT = js.make_kernel("loop 4\n fma dep\nend", grid=N_SM, threads=128, pad_to=PAD, seed=3)
# Small overheads (ns) so that concurrency, not the host, decides the timeline.
QUICK = dict(launch_api_ns=20.0, launch_gap_ns=10.0)
# The static sizes of the file's single runs: every CTA slot the kernels below use, the largest
# grid (the leftover test's 392 CTAs, rounded as the engine rounds it), the closed loop's
# learning and fast-forward's search compiled in, so that the runs share one compilation per
# number of launches (13 compilations before, one per grid, occupancy and policy family). The
# batch test's single runs are such runs too: a batch of one, sized apart from the batch.
STATICS = dict(cta_slots=16, max_ctas=448, closed_loop_step=True, fast_forward_step=True)


def simulate(arch: js.Arch, kernel, clocks: js.Clocks | None = None, **config) -> js.Result:
    """`js.simulate` with the file's `STATICS` (`helpers.simulate_pinned`)."""
    return simulate_pinned(arch, kernel, clocks, statics=STATICS, **config)


ARRAYS = [name for name in js.Result.__dataclass_fields__ if name != "max_warps_per_sm"]


def ticks(ns: float, result: js.Result) -> int:
    return int(round(ns * int(result.tick_mhz) / 1000))


def test_independent_streams_overlap() -> None:
    r = simulate(ARCH, make_workload([LONG, WIDE], streams=[0, 1], **QUICK))
    start, end = np.asarray(r.kernel_start_tick), np.asarray(r.kernel_end_tick)
    assert start[1] < end[0]  # the second kernel runs beside the first
    api, gap = ticks(20, r), ticks(10, r)  # rounded each on its own (section 13)
    assert np.asarray(r.kernel_ready_tick).tolist() == [api + gap, 2 * api + gap]
    assert np.asarray(r.kernel_start_tick).tolist() == [api + gap, 2 * api + gap]
    kernel = np.asarray(r.cta_kernel)[: 3 * N_SM // 2]
    assert kernel.tolist() == [0] * (N_SM // 2) + [1] * N_SM
    # Together they take hardly longer than one of them.
    assert end[1] - start[0] < 1.3 * (end[0] - start[0])


def test_event_dependency_serialises() -> None:
    w = make_workload([LONG, WIDE], streams=[0, 1], after=[[], [0]], **QUICK)
    r = simulate(ARCH, w)
    ready, start, end = (np.asarray(x) for x in (r.kernel_ready_tick, r.kernel_start_tick, r.kernel_end_tick))
    gap = ticks(10, r)
    assert ready[1] == end[0] + 1 + gap  # the host submitted it long before
    assert start[1] > end[0] + gap
    assert start[1] == ready[1]  # an idle chip takes it at once
    assert int(r.makespan_ticks) == end[1] + 1
    # The same order by stream: one stream runs its launches one after another.
    same = simulate(ARCH, make_workload([LONG, WIDE], streams=[0, 0], **QUICK))
    assert np.asarray(same.kernel_start_tick).tolist() == start.tolist()


def test_graph_removes_most_of_the_launch_overhead_of_a_chain() -> None:
    n = 12
    chain = [SHORT] * n
    # Overheads of the order measured on an H200 (the presets' calibrated values may move).
    over = dict(launch_api_ns=2000.0, launch_gap_ns=1000.0, graph_api_ns=2500.0, graph_gap_ns=400.0)
    stream = simulate(ARCH, make_workload(chain, mode="stream", **over))
    graph = simulate(ARCH, make_workload(chain, mode="graph", **over))
    busy_ns = float(simulate(ARCH, SHORT).makespan_ns)  # one kernel without any overhead
    overhead_per_kernel = (float(stream.makespan_ns) - n * busy_ns) / n
    saving_per_kernel = (float(stream.makespan_ns) - float(graph.makespan_ns)) / n
    assert overhead_per_kernel > 0.9 * over["launch_api_ns"]  # the host's calls set the pace
    assert float(graph.makespan_ns) < 0.4 * float(stream.makespan_ns)
    assert saving_per_kernel > 0.6 * overhead_per_kernel
    # Every launch waits for its predecessor: kernels never overlap on one stream.
    for r in (stream, graph):
        start, end = np.asarray(r.kernel_start_tick), np.asarray(r.kernel_end_tick)
        assert np.all(start[1:] > end[:-1])


@pytest.mark.parametrize("dispatch", ["hardware", "closed_loop"])
def test_one_launch_without_overhead_is_the_kernel(dispatch: str) -> None:
    kernel = js.make_kernel("loop 6 cta_spread=2 warp_spread=3\n ldg bytes=512\n if 0.5\n fma dep\n else\n sfu dep\n"
                            " end\n lds ways=2\nend\nbar", grid=3 * N_SM + 3, threads=96, regs=128, pad_to=PAD,
                            seed=11)
    clk = js.clocks.from_array(ARCH, np.linspace(1400, 1980, ARCH.n_sm_slots))
    plain = simulate(ARCH, kernel, clk, dispatch=dispatch, ema_prior_ns=50.0)
    zero = {k: 0.0 for k in ("launch_api_ns", "launch_gap_ns", "graph_api_ns", "graph_gap_ns")}
    for workload in (single(kernel), make_workload([kernel], mode="graph", **zero)):
        got = simulate(ARCH, workload, clk, dispatch=dispatch, ema_prior_ns=50.0)
        for name in ARRAYS:
            np.testing.assert_array_equal(np.asarray(getattr(got, name)), np.asarray(getattr(plain, name)), err_msg=name)
    assert np.asarray(plain.kernel_ready_tick).tolist() == [0]
    assert np.asarray(plain.kernel_start_tick).tolist() == [0]
    assert np.asarray(plain.kernel_end_tick).tolist() == [int(plain.makespan_ticks) - 1]


def test_leftover_policy_a_full_kernel_delays_a_concurrent_one() -> None:
    big = js.make_kernel("loop 30\n fma dep\n fma dep\nend", grid=3 * resident_grid(ARCH, LONG), threads=128,
                         pad_to=PAD)
    r = simulate(ARCH, make_workload([big, SHORT], streams=[0, 1], **QUICK))
    kernel = np.asarray(r.cta_kernel)
    starts = np.asarray(r.cta_start_tick)
    last_big = starts[kernel == 0].max()
    ready, start = np.asarray(r.kernel_ready_tick), np.asarray(r.kernel_start_tick)
    assert ready[1] < starts[kernel == 0].min() + 100 < last_big  # ready early on ...
    assert start[1] >= last_big  # ... but it gets room only once the big kernel's last CTA is placed
    assert np.all(starts[kernel == 1] >= last_big)
    # A kernel that leaves room lets the concurrent one in beside it at once.
    r = simulate(ARCH, make_workload([LONG, SHORT], streams=[0, 1], **QUICK))
    assert int(r.kernel_start_tick[1]) == int(r.kernel_ready_tick[1])


def test_ages_prefer_the_earlier_launch() -> None:
    # Oldest-first with two launches sharing SMs: the earlier launch's warps are older (age
    # 32 g + w) and take every issue slot they can, so its CTAs finish first.
    busy = js.make_kernel("loop 40\n alu\n fma\n alu\nend", grid=N_SM, threads=128, pad_to=PAD)
    w = make_workload([busy, busy.replace(grid_ctas=np.int32(N_SM // 2))], streams=[0, 1],
                      launch_api_ns=0.0, launch_gap_ns=0.0)
    r = simulate(ARCH, w, warp_policy="oldest")
    end, kernel, sm = (np.asarray(x)[: 3 * N_SM // 2] for x in (r.cta_end_tick, r.cta_kernel, r.cta_sm))
    assert np.asarray(r.kernel_start_tick).tolist() == [0, 0]
    shared = np.isin(sm, sm[kernel == 1])
    assert end[(kernel == 0) & shared].max() < end[kernel == 1].min()


@pytest.mark.parametrize(("kwargs", "field"), [
    (dict(kernels=[LONG, js.make_kernel("loop 2\n fma\n gsync\nend", grid=4, threads=128, cooperative=True)]),
     "cooperative"),
    (dict(kernels=[js.make_kernel("loop 2\n fma\nend", grid=4, threads=128, work_items=8), LONG]), "work_items"),
    (dict(kernels=[LONG, LONG], after=[[1], []]), "after"),
    (dict(kernels=[LONG, LONG], streams=[0, -1]), "stream"),
    (dict(kernels=[LONG, LONG], after=[[], [1]]), "after"),
    (dict(kernels=[LONG], mode="fifo"), "mode"),
    (dict(kernels=[LONG], launch_api_ns=-1.0), "launch_api_ns"),
    (dict(kernels=[LONG] * 65), "launches"),
])
def test_bad_workloads_name_the_field(kwargs: dict, field: str) -> None:
    with pytest.raises(JaxschedError) as err:
        make_workload(**kwargs)
    assert field in err.value.field


def test_workload_table_errors_name_the_launch() -> None:
    kernel = {"program": "fma", "grid": 4, "threads": 128}
    with pytest.raises(JaxschedError, match=r"launch\[1\]\.after"):
        workload_from_dict({"workload": {"launch": [{"kernel": kernel}, {"kernel": kernel, "after": [3]}]}})
    with pytest.raises(JaxschedError, match="workload.queue"):
        workload_from_dict({"workload": {"queue": 1, "launch": [{"kernel": kernel}]}})


def test_batch_of_workloads_equals_single_runs() -> None:
    # Structures and modes may differ within a batch (they are traced); programs are padded.
    other = js.make_kernel("loop 9 cta_spread=3\n lds\n fma dep\nend", grid=N_SM, threads=128, seed=7)
    workloads = [
        make_workload([LONG, SHORT, SHORT], streams=[0, 1, 0], after=[[], [0], []], **QUICK),
        make_workload([SHORT, other, LONG], streams=[0, 1, 2], launch_api_ns=0.0, mode="graph"),
        make_workload([other, LONG, SHORT], streams=[0, 1, 0], after=[[], [0], [1]], launch_gap_ns=300.0),
    ]
    clk = [js.clocks.uniform(ARCH, f) for f in (1.0, 0.8, 0.9)]
    batch = js.simulate_batch([ARCH] * 3, workloads, clk, [1, 2, 0], [0, 4, 3], [0, 1, 2])
    for i, (w, c, wp, dp, ds) in enumerate(zip(workloads, clk, ["gto", "oldest", "lrr"],
                                               ["hardware", "closed_loop", "weighted"], [0, 1, 2])):
        one = simulate(ARCH, w, c, warp_policy=wp, dispatch=dp, dispatch_start=ds)
        n = sum(int(k.grid_ctas) for k in w.kernels)
        for name in ARRAYS:
            want, got = np.asarray(getattr(one, name)), np.asarray(getattr(batch, name))[i]
            if name.startswith("cta_"):
                want, got = want[:n], got[:n]
            np.testing.assert_array_equal(got, want, err_msg=f"config {i}: {name}")


def test_batch_rejects_mixed_configurations() -> None:
    a = make_workload([LONG, SHORT], streams=[0, 1])
    with pytest.raises(JaxschedError, match="same number of launches"):
        js.simulate_batch([ARCH] * 2, [a, make_workload([LONG])], [js.clocks.uniform(ARCH)] * 2, [1, 1], [0, 0], [0, 0])
    with pytest.raises(JaxschedError, match="one kind per batch"):
        js.simulate_batch([ARCH] * 2, [a, LONG], [js.clocks.uniform(ARCH)] * 2, [1, 1], [0, 0], [0, 0])


@settings(max_examples=8, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(first=st.integers(1, 9), second=st.integers(1, 9),
       trips=st.lists(st.integers(0, 12), min_size=3, max_size=3),
       api_ns=st.sampled_from([0.0, 15.0, 400.0]), gap_ns=st.sampled_from([0.0, 25.0]),
       dispatch=st.sampled_from(["hardware", "least_loaded", "closed_loop"]))
def test_launch_timeline_invariants(first, second, trips, api_ns, gap_ns, dispatch) -> None:
    grids = [first, second, 20 - first - second]  # one total: one compilation
    kernels = [js.make_kernel(f"loop {t} cta_spread=1\n fma dep\n alu\nend", grid=g, threads=128, pad_to=PAD, seed=l)
               for l, (g, t) in enumerate(zip(grids, trips))]
    w = make_workload(kernels, streams=[0, 1, 1], after=[[], [], [0]], launch_api_ns=api_ns, launch_gap_ns=gap_ns)
    r = simulate(ARCH, w, dispatch=dispatch)
    ready, start, end = (np.asarray(x) for x in (r.kernel_ready_tick, r.kernel_start_tick, r.kernel_end_tick))
    api, gap = ticks(api_ns, r), ticks(gap_ns, r)
    submit = api * np.arange(1, 4)
    assert np.all(ready >= submit + gap) and np.all(start >= ready)
    assert ready[0] == submit[0] + gap and ready[1] == submit[1] + gap
    assert ready[2] == max(submit[2], end[0] + 1, end[1] + 1) + gap  # stream 1's previous launch and the event
    n = sum(grids)
    kernel, cta_start, cta_end = (np.asarray(x)[:n] for x in (r.cta_kernel, r.cta_start_tick, r.cta_end_tick))
    assert kernel.tolist() == np.repeat(np.arange(3), grids).tolist()
    for l in range(3):
        assert cta_start[kernel == l].min() == start[l] and cta_end[kernel == l].max() == end[l]
    assert int(r.makespan_ticks) == end.max() + 1
    assert int(np.sum(r.sm_ctas)) == n


def test_cli_runs_a_workload_file(tmp_path, capsys) -> None:
    archio.save(ARCH, tmp_path / "chip.toml")
    kernel = '{ program = "loop 60\\n fma dep\\n fma dep\\nend", grid = 4, threads = 128 }'
    (tmp_path / "w.toml").write_text(
        "[workload]\nmode = \"stream\"\nlaunch_api_ns = 20.0\nlaunch_gap_ns = 10.0\n"
        f"[[workload.launch]]\nkernel = {kernel}\n"
        f"[[workload.launch]]\nstream = 1\nafter = [0]\nkernel = {kernel}\n")
    argv = ["run", str(tmp_path / "w.toml"), "--arch", str(tmp_path / "chip.toml")]
    assert main([*argv, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    first, second = doc["launches"]
    assert doc["ctas"] == 8 and doc["cta_trace"]["kernel"] == [0] * 4 + [1] * 4
    assert second["start_ns"] > first["end_ns"] and doc["makespan_ns"] == pytest.approx(second["end_ns"])
    assert main(argv) == 0
    text = capsys.readouterr().out
    assert "2 launches, stream mode" in text and "ready / first CTA / end" in text
