"""Random and Latin-hypercube designs, dispatch parameters as swept paths, infeasible points.

Sampling properties (hypothesis), determinism, validation before any compute, the engine inputs
a sweep builds, an end-to-end design sweep (zarr and netCDF, plain xarray `.sel` and
`to_dataframe`), resuming a design sweep, and the specs shipped in `sweeps/`. The sweeps use
the tiny spec of `helpers.py` with `chunk = 4`, the shapes of `test_sweep.py` (one compilation
per worker).
"""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import xarray as xr
from hypothesis import given, settings
from hypothesis import strategies as st

from helpers import tiny_sweep_spec

import jaxsched as js
from jaxsched import sweep, sweep_paths
from jaxsched.cli import main
from jaxsched.sweep_design import Design, Factor

ROOT = Path(__file__).resolve().parent.parent

DESIGN = """
[design]
kind = "lhs"
samples = 3
seed = 4

[design.ranges]
"clocks.sigma" = [0.0, 0.2]
"policy.dispatch" = ["weighted", "closed_loop"]
"policy.ema_alpha" = [0.1, 0.9]

[design.choices]
"kernel.threads" = [64, 2048]
"""
# grid (weights) x design (3 samples; threads = 2048 cannot launch) x 2 replicates = 12
SPEC = tiny_sweep_spec("design", 5, '"policy.weights" = ["clocks", "uniform"]\n', top="chunk = 4\n") + DESIGN


# --------------------------------------------------------------------------- sampling


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1),
       ranges=st.lists(st.tuples(st.floats(-100.0, 100.0), st.floats(1e-2, 1e3)), min_size=1, max_size=4))
def test_lhs_puts_one_sample_in_every_stratum(n, seed, ranges):
    factors = tuple(Factor(f"p{j}", "float", lo, lo + width) for j, (lo, width) in enumerate(ranges))
    values = Design("lhs", n, seed, factors).values
    for f in factors:
        v = values[f.path]
        assert v.shape == (n,) and np.all((v >= f.low) & (v <= f.high))
        strata = np.floor((v - f.low) / (f.high - f.low) * n).astype(int)
        np.testing.assert_array_equal(np.sort(strata), np.arange(n))


@settings(max_examples=40, deadline=None)
@given(n=st.integers(1, 300), seed=st.integers(0, 2**32 - 1), low=st.integers(-50, 50),
       span=st.integers(0, 40), m=st.integers(1, 6))
def test_lhs_balances_integer_and_categorical_factors(n, seed, low, span, m):
    integers = Factor("i", "int", low, low + span)
    choices = Factor("c", "choice", choices=tuple(f"v{k}" for k in range(m)))
    values = Design("lhs", n, seed, (integers, choices)).values
    ints, cats = values["i"], values["c"]
    assert ints.dtype.kind == "i" and np.all((ints >= low) & (ints <= low + span))
    for counts, k in ((np.bincount(ints - low, minlength=span + 1), span + 1),
                      (np.array([np.sum(cats == c) for c in choices.choices]), m)):
        assert counts.sum() == n and np.all(np.abs(counts - n / k) < 2), (counts, n / k)


def test_random_design_stays_in_range_and_differs_from_lhs():
    factors = (Factor("x", "float", 2.0, 3.0), Factor("k", "int", 4, 32), Factor("c", "choice", choices=("a", "b")))
    rnd, lhs = Design("random", 500, 9, factors).values, Design("lhs", 500, 9, factors).values
    assert np.all((rnd["x"] >= 2.0) & (rnd["x"] < 3.0)) and set(np.unique(rnd["k"])) <= set(range(4, 33))
    assert set(rnd["c"]) == {"a", "b"}
    # i.i.d. draws leave some of the 500 strata empty (about 1/e of them); a Latin hypercube none
    assert len(np.unique(np.floor((rnd["x"] - 2.0) * 500))) < 400
    assert len(np.unique(np.floor((lhs["x"] - 2.0) * 500))) == 500


def test_designs_are_deterministic_given_the_seed():
    a, b = sweep.loads(SPEC), sweep.loads(SPEC)
    assert a.design.values.keys() == b.design.values.keys()
    for path in a.design.values:
        np.testing.assert_array_equal(a.design.values[path], b.design.values[path])
    c = sweep.loads(SPEC.replace("seed = 4", "seed = 5"))
    assert not np.array_equal(a.design.values["clocks.sigma"], c.design.values["clocks.sigma"])
    assert sweep.fingerprint(a) == sweep.fingerprint(b) != sweep.fingerprint(c)
    # the design seed defaults to the spec's seed
    default = sweep.loads(SPEC.replace("seed = 4\n", ""))
    assert default.design.seed == 5


# --------------------------------------------------------------------------- validation


def _edit(old: str, new: str) -> str:
    assert old in SPEC, old
    return SPEC.replace(old, new)


@pytest.mark.parametrize("text, message", [
    (_edit('kind = "lhs"', 'kind = "sobol"'), "design.kind = 'sobol'"),
    (_edit("samples = 3", "samples = 0"), "design.samples = 0"),
    (_edit("samples = 3", "samples = 10000000000000000000000"), "design.samples = 10000000000000000000000: an integer in 1 .. 100000000"),
    (_edit("samples = 3", "sample = 3"), "design.sample = 3: unknown key"),
    (_edit('"clocks.sigma" = [0.0, 0.2]', '"clocks.sigmaa" = [0.0, 0.2]'), "design.ranges.clocks.sigmaa = \\[0.0, 0.2\\]: unknown field"),
    (_edit('"clocks.sigma" = [0.0, 0.2]', '"clocks.sigma" = [0.2, 0.0]'), "clocks.sigma = \\[0.2, 0.0\\]: low < high"),
    (_edit('"clocks.sigma" = [0.0, 0.2]', '"clocks.sigma" = [0.0, 0.1, 0.2]'), "design.choices"),
    (_edit('"clocks.sigma" = [0.0, 0.2]', '"clocks.sigma" = [-0.1, 0.2]'), "clocks.sigma = -0.1"),
    (_edit('"clocks.sigma" = [0.0, 0.2]', '"kernel.trips" = [1.5, 4]'), "kernel.trips = 1.5: an integer"),
    (_edit('"clocks.sigma" = [0.0, 0.2]', '"kernel.if_probability" = [0.1, 0.2]'), "has no branch"),
    (_edit('["weighted", "closed_loop"]', '["weighted", "fifo"]'), "policy.dispatch = 'fifo'"),
    (_edit('"policy.ema_alpha" = [0.1, 0.9]', '"policy.ema_alpha" = [0.1, 1.5]'), "policy.ema_alpha = 1.5"),
    (_edit('"kernel.threads" = [64, 2048]', '"kernel.threads" = [64, 64]'), "distinct values"),
    (_edit('"kernel.threads" = [64, 2048]', '"kernel.threads" = [2048]'), "no configuration of this sweep can launch"),
    (_edit('"kernel.threads" = [64, 2048]', '"policy.weights" = ["uniform"]'), "design.policy.weights = 'policy.weights': sets policy.weights, which grid.policy.weights also sets"),
    (_edit('"kernel.threads" = [64, 2048]', '"kernel.threads_per_cta" = [64]\n"kernel.threads_fixed_work" = [32]'),
     "design.kernel.threads_fixed_work = .*: sets kernel.threads_per_cta, which design.kernel.threads_per_cta"),
    (_edit('"policy.weights" = ["clocks", "uniform"]', '"policy.weights" = ["clocks", "fast"]'), "policy.weights = 'fast'"),
    (_edit("mean_ghz = 1.8", "mean_ghz = 1.8\n[policy]\nema_prior_ns = 1e9"), "policy.ema_prior_ns = 1000000000.0"),
    (_edit("mean_ghz = 1.8", "mean_ghz = 0.0"), "clocks.mean_ghz = 0.0"),
    (_edit('"kernel.threads" = [64, 2048]', '"kernel.threads" = [64, "many"]'),
     "design.choices.kernel.threads = 'many': an integer"),
    (_edit(DESIGN, '\n[design]\nsamples = 3\n'), "at least one path"),
])
def test_bad_designs_fail_before_compute(monkeypatch, text, message):
    def no_compute(*args, **kwargs):
        raise AssertionError("simulate_batch called while validating")

    monkeypatch.setattr(sweep.execution, "simulate_batch", no_compute)
    with pytest.raises(js.JaxschedError, match=message):
        sweep.loads(text)


def test_threads_fixed_work_keeps_the_total_thread_count():
    base = sweep.loads(SPEC).base
    for threads in (64, 100, 1024):
        k = sweep_paths.assign(base, "kernel.threads_fixed_work", threads, "test")["kernel"]
        assert int(k.threads_per_cta) == threads and int(k.grid_ctas) == math.ceil(40 * 64 / threads)


# --------------------------------------------------------------------------- infeasible points

OCCUPANCY = tiny_sweep_spec("occupancy", 1, '"kernel.threads" = [64, 1024]\n"kernel.regs" = [32, 128]\n', top="chunk = 2\n")


def test_infeasible_points_are_marked_and_never_run():
    spec = sweep.loads(OCCUPANCY)
    np.testing.assert_array_equal(spec.feasible, [[True, True], [True, False]])
    assert "1024 threads x 128 registers" in spec.infeasible_reason[1, 1] and "registers" in spec.infeasible_reason[1, 1]
    assert spec.infeasible_reason[0, 0] == ""
    assert len(list(sweep.configurations(spec))) == 6
    layout = sweep.make_layout(spec, 2)  # one point per chunk; chunk 3 is the infeasible one
    assert sweep.chunk_configs(spec, layout, 3) == []

    def runner(configs, batch):
        raise AssertionError("the engine ran for a chunk of infeasible points")

    values = sweep._compute_chunk(spec, layout, 3, runner, 2)
    assert np.isnan(values["makespan_ns"]).all() and (values["sm_ctas"] == 0).all()


# --------------------------------------------------------------------------- engine inputs


def test_dispatch_parameters_reach_the_engine(monkeypatch):
    spec = sweep.loads(SPEC)
    layout = sweep.make_layout(spec, 4)
    seen = []

    class Captured(Exception):
        pass

    def spy(*args, **kwargs):
        seen.append((args, kwargs))
        raise Captured

    monkeypatch.setattr(sweep.execution, "simulate_batch", spy)
    for i in range(layout.n_chunks):
        configs = sweep.chunk_configs(spec, layout, i)
        if not configs:
            continue
        with pytest.raises(Captured):
            sweep.Runner()(configs, 4)
        (params,), _ = seen[-1]
        for c, p in zip(configs, params):
            weights, sample = spec.grid["policy.weights"][c.index[0]], c.index[1]
            clocks_mhz = np.asarray(p.clocks.sm_freq_mhz, np.int32)  # the default weights: each SM's clock
            expected = clocks_mhz if weights == "clocks" else np.ones(spec.arch.n_sm_slots)
            assert np.array_equal(p.dispatch_weight, expected)
            assert float(p.ema_alpha) == pytest.approx(spec.design.values["policy.ema_alpha"][sample])
            assert js.DISPATCH_POLICIES[int(p.dispatch)] == spec.design.values["policy.dispatch"][sample]
    assert len(seen) == sum(1 for i in range(layout.n_chunks) if sweep.chunk_configs(spec, layout, i))


# --------------------------------------------------------------------------- end to end


@pytest.fixture(scope="module")
def design_run(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("design")
    (out / "spec.toml").write_text(SPEC)
    outcome = sweep.execute(sweep.load(out / "spec.toml"), out / "full", log=lambda _: None)
    assert outcome.complete and outcome.computed == 12
    return out


def test_design_sweep_dataset(design_run):
    spec = sweep.loads(SPEC)
    plain = xr.open_zarr(design_run / "full" / sweep.STORE)
    nc = xr.open_dataset(design_run / "full" / sweep.NETCDF, engine="h5netcdf")
    for ds in (plain, nc):
        assert ds["makespan_ns"].dims == ("policy_weights", "config", "replicate")
        assert list(ds["config"].values) == [0, 1, 2]
        for path, values in spec.design.values.items():
            coord = ds[path.replace(".", "_")]
            assert coord.dims == ("config",) and coord.attrs["path"] == path
            np.testing.assert_array_equal(coord.values, values)
        feasible = ds["feasible"].values
        assert feasible.shape == (2, 3)
        np.testing.assert_array_equal(feasible[0], spec.design.values["kernel.threads"] == 64)
        makespan = ds["makespan_ns"].values
        assert np.isfinite(makespan[feasible]).all() and np.isnan(makespan[~feasible]).all()
        np.testing.assert_array_equal(ds["sm_ctas"].sum("sm").values[feasible], 40)
        assert all("maxThreadsPerBlock" in r for r in ds["infeasible_reason"].values[~feasible])
    # plain xarray: .sel on the dimensions, filtering on a sampled coordinate, to_dataframe
    assert plain["makespan_ns"].sel(policy_weights="uniform", config=0).shape == (2,)
    fast = plain["makespan_ns"].where(plain["kernel_threads"] == 64, drop=True)
    assert int(fast["config"].size) == int((spec.design.values["kernel.threads"] == 64).sum())
    frame = plain["makespan_ns"].to_dataframe()
    assert len(frame) == 12 and {"clocks_sigma", "policy_dispatch", "kernel_threads"} <= set(frame.columns)
    by_value = nc.set_xindex("clocks_sigma")["makespan_ns"].sel(clocks_sigma=float(spec.design.values["clocks.sigma"][0]))
    assert by_value.sizes["policy_weights"] == 2


def test_design_sweep_equals_a_fresh_batch(design_run):
    """The chunk scatter (infeasible points skipped) puts every result at its own coordinates."""
    spec = sweep.loads(SPEC)
    ds = sweep.open_result(design_run / "full")
    configs = list(sweep.configurations(spec))
    picked = [configs[0], configs[-1]]
    fresh = sweep.Runner()(picked + picked, 4)
    for j, c in enumerate(picked):
        got = ds["makespan_ns"].values[c.index + (c.replicate,)]
        assert got == float(fresh.makespan_ns[j])


def test_info_describes_a_design_sweep(design_run, capsys):
    assert main(["info", str(design_run / "full")]) == 0
    text = capsys.readouterr().out
    assert "config (lhs, 3 samples, seed 4):" in text
    assert "clocks_sigma (clocks.sigma in [0, 0.2]):" in text
    assert "feasible    :" in text and "cannot launch" in text and "12/12 configurations, complete" in text


def _comparable(ds: xr.Dataset) -> xr.Dataset:
    ds = ds.copy()
    ds.attrs = {k: v for k, v in ds.attrs.items() if k not in ("history", "device")}
    return ds


def test_resume_a_design_sweep(design_run, capsys):
    spec_path, out = design_run / "spec.toml", design_run / "resumed"
    spec = sweep.load(spec_path)
    calls = iter(range(100))
    first = sweep.execute(spec, out, stop=lambda: next(calls) >= 1, log=lambda _: None)  # stops after 1 chunk
    assert first.interrupted and first.chunks_done == 1 and first.netcdf is None
    done_before = first.configs_done
    with pytest.raises(js.JaxschedError, match="unfinished sweep"):
        sweep.open_result(out)
    capsys.readouterr()
    assert main(["sweep", str(spec_path), "-o", str(out), "--resume"]) == 0
    err = capsys.readouterr().err
    assert f"resuming: {done_before} of 12 configurations already done (1/4 chunks)" in err
    for name in (sweep.STORE, sweep.NETCDF):
        opener = xr.open_zarr if name == sweep.STORE else (lambda p: xr.open_dataset(p, engine="h5netcdf"))
        xr.testing.assert_identical(_comparable(opener(out / name).load()),
                                    _comparable(opener(design_run / "full" / name).load()))
    assert (out / "makespan.png").is_file()  # the CLI's figure: scatter over a sampled parameter


# --------------------------------------------------------------------------- shipped specs


def test_shipped_specs_validate():
    occ = sweep.load(ROOT / "sweeps" / "occupancy_tuning.toml")
    assert occ.point_shape == (6, 4) and int((~occ.feasible).sum()) == 6
    reasons = occ.infeasible_reason[~occ.feasible]
    assert all("fits on no SM" in r and "registers" in r for r in reasons)
    layout = sweep.make_layout(occ, occ.chunk)
    assert layout.block == (1, 4, 2)  # every chunk holds every grid size: one compilation
    div = sweep.load(ROOT / "sweeps" / "divergence.toml")
    assert div.point_shape == (3, 6) and div.feasible.all()
    rnd = sweep.load(ROOT / "sweeps" / "random_design.toml")
    assert sweep.sweep_dims(rnd) == ("policy_dispatch", "config", "replicate") and rnd.n_configs == 64
    assert rnd.design.kind == "lhs" and len(rnd.design.factors) == 3
