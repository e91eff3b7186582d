"""The hardware probe (issue 8) on the CPU: the clear error without a GPU, the suite definition,
the kernels' SASS (where nvcc is installed), and the analysis on synthetic stamps whose truth is
known. The live run is skipped unless CuPy sees a CUDA GPU."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import jaxsched as js
from jaxsched import trace
from jaxsched.cli import main
from jaxsched.probe import calibrate, kernels, layout, metrics, sass, store, timing
from jaxsched.probe.suite import ProbeCase, default_suite, select
from jaxsched.reference import warp_trips

from helpers import cuda_tools

H200 = js.presets.get("h200")
DATA = Path(__file__).resolve().parent.parent / "data" / "h200"


def _gpu_present() -> bool:
    try:
        import cupy

        return cupy.cuda.runtime.getDeviceCount() > 0
    except Exception:
        return False


GPU = _gpu_present()


# --------------------------------------------------------------------------- no GPU, CLI


@pytest.mark.skipif(GPU, reason="a CUDA GPU is present")
def test_probe_without_gpu_is_one_clear_error(capsys, tmp_path):
    rc = main(["probe", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2
    assert err.startswith("jaxsched probe: error: probe = ")
    assert "CuPy is not installed" in err or "no usable CUDA GPU" in err
    assert "Traceback" not in err


def test_probe_without_cupy_names_the_extra(monkeypatch, capsys, tmp_path):
    monkeypatch.setitem(sys.modules, "cupy", None)  # `import cupy` raises ImportError
    rc = main(["probe", "-o", str(tmp_path / "out")])
    err = capsys.readouterr().err
    assert rc == 2 and "CuPy is not installed" in err and "jaxsched[probe]" in err


def test_probe_cli_rejects_bad_input_before_any_gpu_work(capsys, tmp_path):
    assert main(["probe", "-o", str(tmp_path), "--cases", "nope"]) == 2
    assert "cases = 'nope': unknown probe case" in capsys.readouterr().err
    assert main(["probe"]) == 2
    assert "--output" in capsys.readouterr().err
    assert main(["probe", "-o", str(tmp_path), "--repeats", "0"]) == 2


def test_probe_list_cases(capsys):
    assert main(["probe", "--list-cases"]) == 0
    out = capsys.readouterr().out
    for case in default_suite():
        assert case.name in out


# --------------------------------------------------------------------------- the suite


SUITE = default_suite()


def test_suite_covers_the_issue_shapes():
    assert len({c.name for c in SUITE}) == len(SUITE)
    assert {c.kernel for c in SUITE} == {"fma_dep", "fma_dep_bank", "fma_ilp", "ldg"}
    assert {c.memory for c in SUITE if c.kernel == "ldg"} == {"l2", "dram"}
    assert len({c.threads for c in SUITE}) >= 5  # block sizes
    assert any(c.cta_spread for c in SUITE) and any(c.warp_spread for c in SUITE)  # imbalance
    assert any(c.role == "calibration" for c in SUITE) and any(c.role == "prediction" for c in SUITE)
    waves = [c.grid / (132 * c.occupancy(H200, 32)) for c in SUITE]
    assert min(waves) <= 1 and max(waves) >= 3 and any(w != int(w) for w in waves)  # partial waves


@pytest.mark.parametrize("case", SUITE, ids=lambda c: c.name)
def test_case_launch_and_program(case):
    occ = case.occupancy(H200, 32)
    assert occ >= 1
    if case.ctas_per_sm is not None:  # shared memory caps residency exactly where asked
        assert occ == case.ctas_per_sm
    kernel = case.sim_kernel(H200, 32)
    assert int(kernel.grid_ctas) == case.grid and int(kernel.threads_per_cta) == case.threads
    ops = np.asarray(kernel.op)
    per_trip = {"fma_dep": kernels.FMA_UNROLL, "fma_dep_bank": kernels.FMA_UNROLL,
                "fma_ilp": kernels.ILP_CHAINS * kernels.ILP_UNROLL, "ldg": kernels.LDG_UNROLL}[case.kernel]
    assert int(np.sum(ops == js.Op.FMA)) == per_trip  # one loop trip = what the CUDA loop does
    assert int(np.sum(ops == js.Op.LDG)) == 1 + (kernels.LDG_UNROLL if case.kernel == "ldg" else 0)
    issue = np.asarray(case.sim_arch(H200).issue_cycles)
    assert issue[js.Op.FMA] == (2 if case.kernel == "fma_dep_bank" else 1)
    assert np.array_equal(np.delete(issue, js.Op.FMA), np.delete(np.asarray(H200.issue_cycles), js.Op.FMA))


def test_trip_counts_are_the_simulators_hash():
    case = ProbeCase("t", "fma_dep", 96, 50, trips=5, cta_spread=2, warp_spread=3, seed=7)
    trips = case.trip_counts().reshape(50, 3)
    for c in (0, 17, 49):
        for w in range(3):
            assert trips[c, w] == warp_trips(7, 5, 2, 3, c, w)
    assert trips.min() >= 3 and trips.max() <= 10 and len(np.unique(trips)) > 3


def test_select_and_bad_case():
    assert select(SUITE, None) == SUITE
    assert [c.name for c in select(SUITE, [SUITE[3].name, SUITE[0].name])] == [SUITE[0].name, SUITE[3].name]
    with pytest.raises(js.JaxschedError, match="unknown probe case"):
        select(SUITE, ["nope"])
    with pytest.raises(js.JaxschedError, match="memory"):
        ProbeCase("x", "ldg", 256, 10, trips=1)


# --------------------------------------------------------------------------- kernels and SASS


def test_source_has_every_kernel():
    src = kernels.source()
    names = (["work_fma_dep", "work_fma_dep_bank", "work_fma_ilp", "work_ldg", "stamp_spin", "timer_samples"]
             + [f"lat_{k}" for k in kernels.LATENCY_KERNELS] + [f"thr_{k}" for k in kernels.THROUGHPUT_KERNELS]
             + [f"cluster_smid_{s}" for s in kernels.CLUSTER_SIZES])
    for name in names:
        assert f" {name}(" in src, name
    assert src.count("%%globaltimer") == 1 and src.count("%%smid") == 1


SASS_SNIPPET = """
        code for sm_90
                Function : lat_fma
        .headerflags    @"EF_CUDA_SM90 EF_CUDA_VIRTUAL_SM(EF_CUDA_SM90)"
        /*0000*/                   LDC R1, c[0x0][0x28] ;
        /*0010*/                   CS2R R4, SR_CLOCKLO ;
        /*0020*/                   FFMA R0, R0, R2, R3 ;
        /*0030*/                   FFMA R0, R0, R2, R3 ;
        /*0040*/                   FFMA R0, R0, R2, R3 ;
        /*0050*/               @P0 BRA 0x10 ;
        /*0060*/                   EXIT ;
                Function : other
        /*0000*/                   IADD3 R1, R1, 0x1, RZ ;
        /*0010*/                   EXIT ;
"""


def test_sass_loop_counts():
    funcs = sass.functions(SASS_SNIPPET)
    assert set(funcs) == {"lat_fma", "other"}
    body = sass.loop_with(SASS_SNIPPET, "lat_fma", "FFMA")
    assert body == {"CS2R": 1, "FFMA": 3, "BRA": 1}
    assert sass.loop_with(SASS_SNIPPET, "other", "IADD3") is None


@pytest.mark.skipif(cuda_tools() is None, reason="no nvcc (pip install -e '.[test]' brings it) or no host C++ compiler")
def test_kernels_compile_for_hopper(tmp_path):
    src = tmp_path / "probe.cu"
    src.write_text(kernels.source())
    flags = [f"-D{k}={v}" for k, v in kernels.defines().items()]
    subprocess.run([cuda_tools()["nvcc"], "-cubin", "-arch=sm_90", "-O3", *flags, "-o", str(tmp_path / "p.cubin"), str(src)],
                   check=True, capture_output=True)


# --------------------------------------------------------------------------- timing


def _synthetic_launch(rng, n_sm=16, per_sm=6, mhz=1837.0, quantum=32, sm_spread=0.0):
    """CTAs with known true times on SMs whose clock64 counters have random origins and whose
    clocks are `mhz` times (1 + uniform(-sm_spread, sm_spread))."""
    sm = np.repeat(np.arange(n_sm), per_sm)
    start = rng.uniform(0, 400, sm.size) + np.tile(np.arange(per_sm) * 900.0, n_sm)
    end = start + rng.uniform(800, 3000, sm.size)
    t_origin = 5_000_000_000
    origin = rng.integers(10**9, 10**12, n_sm)
    sm_mhz = mhz * (1 + rng.uniform(-sm_spread, sm_spread, n_sm))
    cyc = lambda t: (origin[sm] + np.floor(t * sm_mhz[sm] / 1000.0)).astype(np.int64)  # noqa: E731
    stamp = lambda t: ((t_origin + t) // quantum * quantum).astype(np.int64)  # noqa: E731
    return sm, start, end, stamp(start), stamp(end), cyc(start), cyc(end)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), quantum=st.sampled_from([1, 32]), mhz=st.floats(1200.0, 1980.0),
       spread=st.sampled_from([0.0, 0.03]))
def test_align_recovers_clocks_and_times(seed, quantum, mhz, spread):
    rng = np.random.default_rng(seed)
    sm, start, end, t0, t1, c0, c1 = _synthetic_launch(rng, mhz=mhz, quantum=quantum, sm_spread=spread)
    al = timing.align(sm, t0, t1, c0, c1, quantum)
    true_mhz = (c1 - c0) / (end - start) * 1000.0  # per CTA, exact up to one cycle
    per_sm = np.asarray([np.median(true_mhz[sm == s]) for s in al.sm_ids])
    # ~7 us of stamps per SM: each SM's clock is as good as the timer's quantum allows
    assert np.allclose(al.sm_clock_mhz, per_sm, rtol={1: 5e-4, 32: 6e-3}[quantum])
    true_start = start - start.min()
    # clock64 gives the fine timing; the per-SM offset is known to a fraction of the quantum
    tol = 2.0 + quantum
    assert np.max(np.abs(al.start_ns - true_start)) < tol
    assert np.max(np.abs(al.end_ns - (end - start.min()))) < tol
    assert al.start_ns.min() == 0.0 and np.all(al.end_ns > al.start_ns)


def test_align_coarse_timer_and_short_spans():
    # a 1-us timer: per-SM spans too short for own slopes, one clock from all SMs' stamps
    sm, start, end, t0, t1, c0, c1 = _synthetic_launch(np.random.default_rng(4), mhz=1500.0, quantum=1000)
    al = timing.align(sm, t0, t1, c0, c1, 1000)
    assert np.ptp(al.sm_clock_mhz) == 0 and al.clock_mhz == pytest.approx(1500.0, rel=0.05)
    assert np.max(np.abs(al.start_ns - (start - start.min()))) < 1000


def test_sm_clock_and_timer_quantum():
    rng = np.random.default_rng(1)
    sm, start, end, t0, t1, c0, c1 = _synthetic_launch(rng, mhz=1755.0, quantum=1)
    mhz = timing.sm_clock_mhz(sm, t0, t1, c0, c1, 20)
    assert np.allclose(mhz[:16], 1755.0, rtol=1e-3) and np.all(np.isnan(mhz[16:]))
    t = 10**9 + (np.arange(4000) * 11) // 32 * 32
    q = timing.timer_quantum(t, np.arange(4000) * 20)
    assert q.step_ns == 32.0 and q.min_step_ns == 32.0
    assert q.read_period_ns == pytest.approx(11.0, rel=0.01) and q.read_period_cycles == 20.0
    with pytest.raises(js.JaxschedError, match="never advanced"):
        timing.timer_quantum(np.full(10, 5), np.arange(10))


# --------------------------------------------------------------------------- layout


@settings(max_examples=20, deadline=None)
@given(seed=st.integers(0, 2**31 - 1), n=st.integers(6, 140))
def test_cyclic_order_recovers_a_rotating_dispatcher(seed, n):
    rng = np.random.default_rng(seed)
    order = rng.permutation(n)
    starts = rng.integers(0, n, 12)
    seqs = [np.roll(order, -s) for s in starts]
    cyc = layout.cyclic_order(seqs)
    assert cyc.complete and min(cyc.match) == 1.0
    p = cyc.order.index(int(order[0]))
    assert cyc.order[p:] + cyc.order[:p] == order.tolist()  # the same cycle
    assert cyc.starts == [cyc.order.index(int(order[s])) for s in starts]  # where CTA 0 went


def test_common_lead():
    assert layout.common_lead([[5, 4, 1, 2], [4, 5, 2, 1], [5, 4, 3, 0]]) == [4, 5]
    assert layout.common_lead([[1, 2, 3], [2, 1, 3]]) == [1, 2]
    assert layout.common_lead([[1, 2], [3, 1]]) == []


def test_gpc_groups_from_clusters():
    rng = np.random.default_rng(3)
    gpcs = [list(range(g * 18, g * 18 + 18)) if g < 2 else list(range(36 + (g - 2) * 16, 52 + (g - 2) * 16))
            for g in range(8)]
    clusters = [sorted(rng.choice(gpcs[g], 4, replace=False).tolist()) for _ in range(40) for g in range(8)]
    assert layout.gpc_groups(clusters) == gpcs
    # clusters recorded per CTA: grouped by %clusterid
    assert layout.clusters_from_records([5, 9, 7, 2], [0, 0, 1, 1]) == [[5, 9], [2, 7]]
    assert layout.tpc_pairs_adjacent([0, 1, 4, 5, 2, 3]) == 1.0
    assert layout.tpc_pairs_adjacent([0, 2, 1, 3]) == 0.0


# --------------------------------------------------------------------------- metrics


def test_first_wave_stagger():
    # SM 0: four CTAs start together and end at 1, 2, 3, 4 us; SM 1: two end together
    sm = np.array([0, 0, 0, 0, 1, 1, 1])
    start = np.array([0, 0, 0, 0, 0, 0, 3000.0])
    end = np.array([1000, 2000, 3000, 4000, 2000, 2000, 5000.0])
    s = metrics.first_wave_stagger(sm, start, end, together_ns=100.0)
    assert s.sms == 2
    assert s.first_over_last == pytest.approx((0.25 + 1.0) / 2)
    assert s.spread == pytest.approx((0.75 + 0.0) / 2)
    assert metrics.sm_counts(sm, 3).tolist() == [4, 3, 0]
    order = np.asarray(H200.dispatch_order)[:132]
    for start in (0, 8, 57):
        assert metrics.dispatch_start(np.roll(order, -start), H200.dispatch_order, 132) == start
    # the fixed first block, then the rest rotated by 40: the rotation matching the rest wins
    seq = np.concatenate([order[:8], np.roll(order[8:], -40)])
    assert metrics.dispatch_start(seq, H200.dispatch_order, 132) == 40


# --------------------------------------------------------------------------- store and derive


def _fake_probe_out(tmp_path: Path, case: ProbeCase) -> tuple[dict, dict]:
    """Raw arrays as the GPU would return them, from synthetic launches."""
    rng = np.random.default_rng(5)
    recs, ends = [], []
    for _ in range(2):
        sm, start, end, t0, t1, c0, c1 = _synthetic_launch(rng, n_sm=16, per_sm=case.grid // 16, quantum=32)
        recs.append(np.stack([sm, t0, t1, c0, c1], axis=1))
        ends.append(np.repeat(c1, case.warps_per_cta) - rng.integers(0, 500, c1.size * case.warps_per_cta))
    suite_raw = {case.name: {"rec": np.stack(recs), "warp_end": np.stack(ends), "regs": 24, "smem_bytes": 0,
                             "driver_ctas_per_sm": 8, "jaxsched_ctas_per_sm": 8}}
    order = rng.permutation(16)
    one = np.stack([np.stack([np.roll(order, -s), np.zeros(16), np.zeros(16), np.zeros(16), np.ones(16)], axis=1)
                    for s in (0, 3, 9)]).astype(np.int64)
    raw = {"timer_t": 10**9 + (np.arange(1000) * 13) // 32 * 32, "timer_c": np.arange(1000) * 25,
           "dispatch_one_rec": one, "dispatch_one_filler": np.array([0, 3, 6], np.int32),
           "cluster2_out": np.stack([np.stack([np.arange(16), np.arange(16) // 2], axis=1)]).astype(np.int32)}
    return raw, suite_raw


def test_store_writes_traces_jaxsched_can_load(tmp_path):
    case = ProbeCase("fake", "fma_dep", 256, 96, trips=2)
    raw, suite_raw = _fake_probe_out(tmp_path, case)
    store.save_raw(tmp_path, raw, suite_raw)
    raw2, suite2 = store.load_raw(tmp_path)
    assert suite2["fake"]["regs"] == 24 and np.array_equal(suite2["fake"]["rec"], suite_raw["fake"]["rec"])
    summary = store.write_derived(tmp_path, raw2, suite2, (case,), H200, "", 16, "h200")
    launches = summary["cases"]["fake"]["launches"]
    assert len(launches) == 2 and summary["timer_quantum_ns"] == 32.0
    assert launches[0]["clock_mhz"] == pytest.approx(1837.0, rel=3e-3)
    assert sum(launches[0]["sm_ctas"]) == 96
    ds = trace.load(tmp_path / "traces" / "fake_r1.nc")
    assert ds.attrs["source"] == "probe" and ds.attrs["kernel"] == "fake" and ds.sizes["cta"] == 96
    # each SM's clock in the trace is the one its own cycle counters imply
    cyc = (ds.cta_end_cycles - ds.cta_start_cycles).values
    ns = (ds.cta_end_ns - ds.cta_start_ns).values
    sm = ds.cta_sm.values
    assert np.allclose(cyc / ns * 1000.0, ds.sm_freq_mhz.values[sm], rtol=1e-6)
    cal = json.loads((tmp_path / "calibration.json").read_text())
    d = cal["dispatch"]
    assert d["complete_cycle"] and d["match_per_launch"]["min"] == 1.0
    assert d["lead_sms"] == [] and d["fillers"] == [0, 3, 6]
    assert len(d["after_lead_sm"]) == 3 and d["tpc_pairs_adjacent"] >= 0
    assert cal["gpcs"]["size2_pairs_are_tpcs"] == 1.0


def test_calibrate_latency_and_clock_units():
    n = 4
    span = np.tile(np.array([0, 1_000_000, 0, 1_900_000]), (n, 1))  # 1.9 GHz
    raw = {"lat_fma_cycles": np.full((n, kernels.LAT_REPS), 4 * kernels.LAT_N), "lat_fma_sm": np.arange(n),
           "lat_fma_span": span,
           "lat_dram_cycles": np.full((n, kernels.LAT_REPS), 1140 * kernels.LAT_N), "lat_dram_sm": np.arange(n),
           "lat_dram_span": span}
    lat = calibrate.latencies(raw, "")
    assert lat["fma"]["cycles"]["median"] == 4.0 and lat["fma"]["clock_mhz"]["median"] == pytest.approx(1900.0)
    assert lat["dram"]["ns"]["median"] == pytest.approx(600.0)


SWEEP_SASS = """
                Function : work_fma_dep
        /*0000*/                   LDG.E R2, desc[UR4][R2.64] ;
        /*0010*/                   FFMA R9, R9, R9, UR4 ;
        /*0020*/                   FFMA R9, R9, R9, UR4 ;
        /*0030*/                   IADD3 R0, R0, 0x1, RZ ;
        /*0040*/                   ISETP.GE.AND P0, PT, R0, R2, PT ;
        /*0050*/              @!P0 BRA 0x10 ;
        /*0060*/                   EXIT ;
"""


def test_issue_sweep_cycles_per_instruction():
    from jaxsched.probe.experiments import SWEEP_TRIPS, SWEEP_WARPS_PER_SCHEDULER

    raw = {}
    for m in SWEEP_WARPS_PER_SCHEDULER:  # 2 SMs, m CTAs each; SM 1 runs 10 % slower
        rows = []
        for sm, slow in ((0, 1.0), (1, 1.1)):
            span = slow * 1.25 * m * SWEEP_TRIPS * 5  # 1.25 cycles per instruction, 5 per trip
            rows += [[sm, 0, 0, 100 + c, 100 + span - c] for c in range(m)]
        raw[f"sweep_fma_dep_m{m}_rec"] = np.asarray(rows, dtype=np.int64)
    out = calibrate.issue_sweep(raw, SWEEP_SASS)
    assert set(out) == {"fma_dep"}  # no SASS for the other kernels: skipped
    assert out["fma_dep"]["loop_body"] == {"FFMA": 2, "IADD3": 1, "ISETP": 1, "BRA": 1}
    for m in SWEEP_WARPS_PER_SCHEDULER:
        row = out["fma_dep"]["warps_per_scheduler"][str(m)]
        assert row["cycles_per_instruction"] == pytest.approx(1.25 * 1.05)  # median of 1.0 and 1.1
        assert row["cycles_per_fma"] == pytest.approx(1.25 * 1.05 * 5 / 2)


def test_refill_delays_pair_each_refill_with_the_slot_that_freed_first():
    # one SM, two slots: CTAs 0 and 1 start at 0; 0 ends at 100, 1 at 500; CTA 2 starts at 130
    # (slot of 0), CTA 3 at 520 (slot of 1); CTA 2 ends at 900, 3 at 950
    sm = np.zeros(4, dtype=np.int64)
    start = np.array([0.0, 0.0, 130.0, 520.0])
    end = np.array([100.0, 500.0, 900.0, 950.0])
    d = calibrate.refill_delays(sm, start, end, per_sm=2)
    assert d["delay_ns"].tolist() == [30.0, 20.0]
    assert d["before_other_end_ns"].tolist() == [370.0, 380.0]  # CTA 1 ends 370 after; CTA 2 380 after
    d1 = calibrate.refill_delays(np.zeros(2, dtype=np.int64), np.array([0.0, 150.0]), np.array([100.0, 300.0]), 1)
    assert d1["delay_ns"].tolist() == [50.0] and np.isnan(d1["before_other_end_ns"][0])


# --------------------------------------------------------------------------- committed data


@pytest.mark.skipif(not (DATA / "summary.json").exists(), reason="no committed H200 probe data")
def test_committed_h200_data_is_consistent():
    summary = json.loads((DATA / "summary.json").read_text())
    names = {c.name for c in SUITE}
    assert set(summary["cases"]) <= names and len(summary["cases"]) >= 10
    for name, case in summary["cases"].items():
        assert case["driver_ctas_per_sm"] == case["jaxsched_ctas_per_sm"], name
        for launch in case["launches"]:
            assert sum(launch["sm_ctas"]) == case["grid"]
    for path in sorted((DATA / "traces").glob("*.nc")):
        ds = trace.load(path)
        assert ds.attrs["source"] == "probe" and ds.attrs["arch"] == "h200"
        cyc = (ds.cta_end_cycles - ds.cta_start_cycles).values
        ns = (ds.cta_end_ns - ds.cta_start_ns).values
        assert np.allclose(cyc / ns * 1000.0, ds.sm_freq_mhz.values[ds.cta_sm.values], rtol=1e-6)


@pytest.mark.skipif(not (DATA / "sass_work.txt").exists(), reason="no committed SASS")
@pytest.mark.parametrize("kernel", ["fma_dep", "fma_dep_bank", "fma_ilp", "ldg"])
def test_simulated_program_mirrors_the_committed_sass(kernel):
    """Per loop trip, the simulated loop issues what the compiled loop issues: the same FMAs
    and loads, and the other instructions (loop counter, compare, branch, addresses) as ALU.
    (The SASS outside the loop is simulated by ALU stand-ins before and after it.)"""
    body = sass.loop_with((DATA / "sass_work.txt").read_text(), f"work_{kernel}", "FFMA")
    case = next(c for c in SUITE if c.kernel == kernel)
    per_trip = {"fma_dep": kernels.FMA_UNROLL, "fma_dep_bank": kernels.FMA_UNROLL,
                "fma_ilp": kernels.ILP_CHAINS * kernels.ILP_UNROLL, "ldg": kernels.LDG_UNROLL}[kernel]
    unroll = body["FFMA"] / per_trip  # ptxas unrolls work_ldg's trip loop 4 times
    sim = case.sim_kernel(H200, 32)
    ops = np.asarray(sim.op)[int(sim.loop_start[0]): int(sim.loop_end[0]) + 1]
    n_ldg = int(np.sum(ops == js.Op.LDG))
    assert int(np.sum(ops == js.Op.FMA)) == body["FFMA"] / unroll
    assert n_ldg == body["LDG"] / unroll
    others = (sum(body.values()) - body["FFMA"] - body["LDG"]) / unroll
    assert abs(int(np.sum(ops == js.Op.ALU)) - others) <= 0.5


# --------------------------------------------------------------------------- live


@pytest.mark.skipif(not GPU, reason="needs CuPy and a CUDA GPU")
def test_live_probe_one_case(tmp_path):
    from jaxsched import probe

    summary = probe.run(tmp_path, ["fma_dep_t256_w1"], repeats=1, calibration=False, log=lambda s: None)
    case = summary["cases"]["fma_dep_t256_w1"]
    assert case["driver_ctas_per_sm"] == case["jaxsched_ctas_per_sm"] == 8
    assert trace.load(tmp_path / "traces" / "fma_dep_t256_w1_r0.nc").sizes["cta"] == case["grid"]


def test_every_probe_case_imports_from_its_own_sass():
    """Each case's program imported from the committed SASS (`probe.imported`) builds a kernel
    with the case's per-warp trips: the trip loop (and ldg's remainder loop) and the stamps; the
    memory instructions outside the loops (stamps, the trip count's load) move one sector each."""
    from jaxsched.probe import imported

    listing = (DATA / "sass_work.txt").read_text()
    for case in SUITE:
        text, arrays = imported.program(case, listing)
        kernel = imported.kernel(case, listing, H200, 32)
        trips = case.trip_counts().reshape(case.grid, case.warps_per_cta)
        unroll = 1 if "rest" not in arrays else 4
        np.testing.assert_array_equal(arrays["trips"] * unroll + arrays.get("rest", 0), trips)
        assert kernel.n_loops == (2 if case.kernel == "ldg" else 1) and "@stamp" in text
        assert set(re.findall(r"bytes=(\d+)", text)) == ({"32", "128"} if case.kernel == "ldg" else {"32"})
        assert text.count("bytes=128") == (5 * kernels.LDG_UNROLL if case.kernel == "ldg" else 0)
