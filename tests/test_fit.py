"""The optax fits: per-SM clocks from traces (speeds), dispatch parameters through the surrogate
(dispatch_fit, dispatch_spec), and `jaxsched fit` on the command line."""

from __future__ import annotations

import itertools
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
import xarray as xr
from helpers import small_arch

import jaxsched as js
from jaxsched import archio, bounds, fitted_policy, trace
from jaxsched import surrogate as sg
from jaxsched.cli import main
from jaxsched.surrogate import dispatch_fit, dispatch_spec, speeds

ARCH = small_arch(4)  # 8 SMs x 8 CTA slots
PROGRAM = "loop 48\n fma dep\nend"
KERNEL = js.make_kernel(PROGRAM, grid=256, threads=256, regs=32, name="fma4")  # 4 waves, compute-bound
SEEDS = (11, 12)  # two chips: the same batch size as the references, one compilation


@pytest.fixture(scope="module")
def traces() -> list[xr.Dataset]:
    """Exact-engine traces on two chips with 10 % Gaussian clock spread (one batched call)."""
    clk = [js.clocks.gaussian(ARCH, s, 1.8, 0.1) for s in SEEDS]
    n = len(clk)
    batch = js.simulate_batch([ARCH] * n, [KERNEL] * n, clk, [1] * n, [0] * n, [0] * n)
    return [trace.from_result(jax.tree.map(lambda x, i=i: x[i], batch), ARCH, KERNEL, c, program=PROGRAM)
            for i, c in enumerate(clk)]


@pytest.fixture(scope="module")
def references() -> list[xr.Dataset]:
    return speeds.reference_traces(ARCH, KERNEL, PROGRAM)


def test_speed_fit_recovers_clocks_within_one_percent(traces, references):
    ds = speeds.fit_traces(traces, references)
    assert ds.attrs["mode"] == "reference" and ds.sizes["chip"] == 2
    for c in range(2):
        err = speeds.rms_relative_error(ds["sm_freq_mhz_fit"].values[c], ds["sm_freq_mhz_true"].values[c])
        assert err < 0.01  # measured: 0.1-0.3 %
    assert np.all(np.isfinite(ds["sm_freq_sd_mhz"].values[:, np.asarray(ARCH.sm_enabled)]))
    assert np.isfinite(ds.attrs["rms_error_ema"])
    loss = ds["loss"].values
    assert np.all(loss[:, -1] <= loss[:, 0] + 1e-6)  # Adam ends no worse than the median start


def test_one_vmapped_call_equals_fitting_each_chip_alone(traces, references):
    batch = speeds.fit_traces(traces, references)
    alone = speeds.fit_traces(traces[1:2], references)
    np.testing.assert_allclose(batch["sm_freq_mhz_fit"].values[1], alone["sm_freq_mhz_fit"].values[0], rtol=1e-5)


def test_relative_speeds_scale_to_the_given_mean(traces):
    truth = traces[0]["sm_freq_mhz"].values
    ds = speeds.fit_traces(traces[:1], mean_mhz=float(np.nanmean(truth)))
    fit = ds["sm_freq_mhz_fit"].values[0]
    assert np.nanmean(fit) == pytest.approx(np.nanmean(truth), rel=1e-5)
    assert speeds.rms_relative_error(fit, truth) < 0.01


def test_clock64_readings_give_the_clock_directly():
    rng = np.random.default_rng(3)
    mhz = rng.uniform(1200, 1980, 6)
    sm = np.repeat(np.arange(6), 10)
    start = rng.uniform(0, 1000, sm.size)
    dur = rng.uniform(100, 900, sm.size)
    cycles0 = rng.integers(0, 10**6, sm.size)
    ds = trace.make(sm, start, start + dur, np.full(6, np.nan), source="probe", arch="x", kernel="k",
                    threads_per_cta=64, ctas_per_sm=2, program="", cta_start_cycles=cycles0,
                    cta_end_cycles=cycles0 + np.rint(dur * mhz[sm] / 1000.0).astype(np.int64))
    fit = speeds.fit_traces([ds])
    assert fit.attrs["mode"] == "clock64"
    np.testing.assert_allclose(fit["sm_freq_mhz_fit"].values[0], mhz, rtol=2e-3)


def test_speed_fit_refuses_what_it_cannot_scale(traces, references):
    with pytest.raises(js.JaxschedError, match="mean_mhz"):
        speeds.fit_traces(traces[:1])
    other = traces[0].assign_attrs(program="loop 8\n fma dep\nend")
    with pytest.raises(js.JaxschedError, match="one kernel"):
        speeds.fit_traces([other], references)


def test_fit_speeds_command(traces, references, tmp_path, capsys):
    paths = [str(trace.save(t, tmp_path / f"chip{i}.nc")) for i, t in enumerate(traces)]
    refs = [str(trace.save(r, tmp_path / f"ref{i}.nc")) for i, r in enumerate(references)]
    assert main(["fit", "speeds", *paths, "--reference", *refs, "-o", str(tmp_path / "out"), "--steps", "50"]) == 0
    ds = xr.open_dataset(tmp_path / "out" / "speeds.nc", engine="h5netcdf")
    assert list(ds["chip"].values) == ["chip0", "chip1"] and ds.sizes["step"] == 50
    assert (tmp_path / "out" / "speeds.png").stat().st_size > 10_000
    assert "RMS error fit" in capsys.readouterr().out
    assert main(["fit", "speeds", str(tmp_path / "none.nc"), "-o", str(tmp_path / "x")]) == 2
    assert "no such file" in capsys.readouterr().err


# ----------------------------------------------------------------------------- dispatch


# load imbalance (the closed loop's EMA then matters); KERNEL's shapes: the same compiled engine
SPREAD = js.make_kernel("loop 48 cta_spread=12\n fma dep\nend", grid=256, threads=256, regs=32)


@pytest.fixture(scope="module")
def spread_work():
    return sg.measure_work(ARCH, SPREAD)


def _problem(work, seeds) -> dispatch_fit.Problem:
    launches, fluid = [], []
    for s in seeds:
        mhz = np.asarray(js.clocks.gaussian(ARCH, s, 1.8, 0.15).sm_freq_mhz, np.float32)
        launches.append(sg.make_launch(ARCH, SPREAD, mhz, work))
        fluid.append(float(js.bounds.fluid_ns(work, mhz)))
    return dispatch_fit.Problem(sg.launch.stack_launches(launches), jnp.asarray(fluid, jnp.float32),
                                jnp.arange(len(seeds), dtype=jnp.int32))


def test_per_chip_dispatch_fits_are_independent_fits_in_one_call(spread_work):
    kw = {"steps": 3, "learning_rate": 0.1, "temperature": 0.05, "max_slots": 8, "per_chip": True}
    first = dispatch_fit.fit(_problem(spread_work, (0, 1)), "closed_loop", **kw)
    second = dispatch_fit.fit(_problem(spread_work, (0, 2)), "closed_loop", **kw)
    assert first.loss.shape == (4, 2) and first.theta["alpha_logit"].shape == (2,)  # 3 steps and the last iterate
    for name in first.theta:  # chip 0's fit does not depend on which chip it was batched with
        assert first.theta[name][0] == pytest.approx(second.theta[name][0], rel=1e-5, abs=1e-6)
    # each chip keeps its iterate of lowest loss
    problem = _problem(spread_work, (0, 1))
    again = dispatch_fit.losses({k: jnp.asarray(v) for k, v in first.theta.items()}, problem, jnp.float32(0.05),
                                family="closed_loop", max_slots=8, n_groups=2)
    np.testing.assert_allclose(np.asarray(again), first.loss.min(axis=0), rtol=1e-4)  # float32, other fusion
    assert np.all(first.loss.min(axis=0) < first.loss[0])  # and has moved from the start


def test_engine_inputs_of_the_learned_families():
    mhz = np.asarray(js.clocks.gaussian(ARCH, 0, 1.8, 0.1).sm_freq_mhz)
    w = dispatch_fit.engine_inputs("weighted", {"gamma": 2.0}, ARCH, mhz, 500.0)["dispatch_weight"]
    on = np.asarray(ARCH.sm_enabled)
    ratio = mhz[on] / mhz[on].mean()
    np.testing.assert_allclose(w[on], np.rint(1000 * ratio**2))
    cl = dispatch_fit.engine_inputs("closed_loop", {"alpha_logit": 0.0, "log_prior": np.log(2.0)}, ARCH, mhz, 500.0)
    assert cl == {"dispatch": "closed_loop", "ema_alpha": 0.5, "ema_prior_ns": pytest.approx(1000.0)}
    tail = dispatch_fit.engine_inputs("closed_loop_tail", {"alpha_logit": 0.0, "margin_logit": np.log(1 / 3)}, ARCH,
                                      mhz, 500.0)
    assert tail == {"dispatch": "closed_loop", "ema_alpha": 0.5, "ema_prior_ns": 0.0,
                    "hold_margin": pytest.approx(0.25), "hold_noise": 0.0, "hold_queue": 0.0, "hold_left": 1.0}
    noise = dispatch_fit.engine_inputs("closed_loop_noise", {"alpha_logit": 0.0, "margin_logit": np.log(1 / 3),
                                                             "noise_logit": 0.0}, ARCH, mhz, 500.0)
    assert noise == {**tail, "hold_noise": pytest.approx(js.policies.MAX_HOLD_NOISE / 2)}
    score = dispatch_fit.engine_inputs("closed_loop_score", {"alpha_logit": 0.0, "margin_logit": np.log(1 / 3),
                                                             "queue_logit": 0.0, "left_logit": np.log(1 / 3)},
                                       ARCH, mhz, 500.0)
    assert score == {**tail, "hold_queue": pytest.approx(0.5), "hold_left": pytest.approx(1.0)}
    for family in dispatch_fit.PORTABLE_FAMILIES:  # theta_of inverts portable_inputs
        theta = {k: float(v[0]) for k, v in dispatch_fit.initial_theta(family).items()}
        back = dispatch_fit.theta_of(family, dispatch_fit.portable_inputs(family, theta))
        assert back == pytest.approx(theta), family
    start = {k: float(v[0]) for k, v in dispatch_fit.initial_theta("closed_loop_tail").items()}
    assert dispatch_fit.portable_inputs("closed_loop_tail", start)["hold_margin"] == pytest.approx(
        js.policies.DEFAULT_HOLD_MARGIN)  # the fit starts from the engine's default closed loop


def test_per_sm_inputs_per_enabled_sm():
    """The surrogate's per-SM inputs take one value per enabled SM (132 on the H200) as well as
    one per SM slot of the die (144)."""
    h200 = js.presets.get("h200")
    on = np.asarray(h200.sm_enabled)
    mhz = np.asarray(js.clocks.gaussian(h200, 0, 1.8, 0.1).sm_freq_mhz)
    for a, b in zip(jax.tree.leaves(sg.dispatch_params(h200, mhz)), jax.tree.leaves(sg.dispatch_params(h200, mhz[on]))):
        np.testing.assert_array_equal(a, b)
    weights = [dispatch_fit.engine_inputs("weighted", {"gamma": 2.0}, h200, m, 500.0)["dispatch_weight"]
               for m in (mhz, mhz[on])]
    np.testing.assert_array_equal(*weights)
    with pytest.raises(js.JaxschedError, match="144 .one per SM slot.* or 132 .one per enabled SM"):
        sg.dispatch_params(h200, mhz[:100])


SPEC = """
title = "tiny dispatch fit"
arch = "small.toml"
families = ["weighted", "closed_loop"]
[[kernels]]
name = "fma2"
grid = 128
threads = 256
program = "loop 24 cta_spread=4\\n fma dep\\n sfu dep\\nend"
[clocks]
sigma = 0.15
train_maps = 2
test_maps = 1
[fit]
steps = 2
"""


@pytest.mark.parametrize("old, new, field", [
    ('families = ["weighted", "closed_loop"]', 'families = ["fastest"]', "families"),
    ('title =', 'colour = 1\ntitle =', "colour"),
    ("steps = 2", "steps = 0", "fit.steps"),
    ("sigma = 0.15", 'sigma = 0.15\nmodel = "flat"', "clocks.model"),
    ("grid = 128", "grid = 128\nwarps = 3", "warps"),
    ("steps = 2", "steps = 10000000000000000000000", "fit.steps = 10000000000000000000000: an integer in 1 .. 2147483647"),
    ("steps = 2", 'steps = 2\nlearning_rate = "fast"', "fit.learning_rate = 'fast'"),
    ('title =', 'seed = 10000000000000000000000\ntitle =', "seed = 10000000000000000000000: an integer in 0 .. 2147483647"),
    ("steps = 2", 'steps = 2\nmethod = "grid"', "fit.method = 'grid'"),
    ("steps = 2", 'steps = 2\nmode = "hard"', "fit.mode = 'hard': soft or straight_through"),
    ("steps = 2", 'steps = 2\nmethod = "engine"', "families = 'weighted'"),
    ("sigma = 0.15", 'sigma = "wide"', "clocks.sigma = 'wide'"),
    ("steps = 2", 'steps = 2\nuniform_tolerance = 0.005', 'fit.uniform_tolerance = 0.005: set only with fit.method'),
    ("steps = 2", 'steps = 2\nobjective = "recovered"', "fit.objective = 'recovered': set only with fit.method"),
    ('families = ["weighted", "closed_loop"]', 'families = ["clock_regression"]',
     "families = 'clock_regression': a family the surrogate models"),
])
def test_dispatch_spec_errors_name_the_field(tmp_path, old, new, field):
    (tmp_path / "small.toml").write_text(archio.dumps(ARCH))
    dispatch_spec.loads(SPEC, base_dir=tmp_path)  # the spec itself is fine
    with pytest.raises(js.JaxschedError, match=field):
        dispatch_spec.loads(SPEC.replace(old, new), base_dir=tmp_path)


def _engine_spec(tmp_path, *, fit_lines: str = "", sigma: str = "[0.0, 0.15]") -> str:
    (tmp_path / "small.toml").write_text(archio.dumps(ARCH))
    return (SPEC.replace('families = ["weighted", "closed_loop"]', 'families = ["closed_loop_tail"]')
            .replace("sigma = 0.15", f"sigma = {sigma}")
            .replace("steps = 2", f'steps = 2\nmethod = "engine"\n{fit_lines}'))


@pytest.mark.parametrize("tolerance, sigma, message", [
    ("uniform_tolerance = -0.1", "[0.0, 0.15]", "-0.1: a number in"),
    ("uniform_tolerance = 0.005", "0.15", "0.005: set only where a training map is uniform"),
])
def test_uniform_tolerance_errors_name_the_field(tmp_path, tolerance, sigma, message):
    with pytest.raises(js.JaxschedError, match=f"fit.uniform_tolerance = {message}"):
        dispatch_spec.loads(_engine_spec(tmp_path, fit_lines=tolerance, sigma=sigma), base_dir=tmp_path)


@pytest.mark.parametrize("objective, sigma, message", [
    ('objective = "fastest"', "[0.0, 0.15]", "'fastest': one of ('fluid', 'recovered')"),
    ('objective = "recovered"', "0.0", "'recovered': set only where a training map is unequal"),
])
def test_objective_errors_name_the_field(tmp_path, objective, sigma, message):
    with pytest.raises(js.JaxschedError, match=re.escape(f"fit.objective = {message}")):
        dispatch_spec.loads(_engine_spec(tmp_path, fit_lines=objective, sigma=sigma), base_dir=tmp_path)


def _makespans(spec, kernel, runs: list, size: int) -> np.ndarray:
    """The makespans (ns) of `runs` ((clocks, policy keywords) pairs) in the exact engine, run
    apart from the search: a batch of `size` configurations (the runs, then copies of the
    first), so that it shares the search's compilation where `size` is the search's batch
    (single runs compiled two programs more, one per policy family; a batch gives each member
    what it gets alone, tests/test_engine_vs_reference.py::test_batch_equals_single). The
    members come in another order than the search's, so a mix-up of its rows shows here."""
    params = [js.make_params(spec.arch, kernel, clk, warp_policy=spec.warp_policy, **policy) for clk, policy in runs]
    batch = js.simulate_batch(params + [params[0]] * (size - len(params)))
    return np.asarray(batch.makespan_ns, np.float64)[:len(runs)]


def test_engine_search_picks_the_best_admitted_candidate_in_the_exact_engine(tmp_path, monkeypatch):
    """`method = "engine"`: every candidate runs in the exact engine on the training chips (one
    uniform, one at sigma 0.15); theta is the one with the lowest mean makespan over the fluid
    bound among those no slower than hardware dispatch on the uniform chip (`uniform_tolerance =
    0`), written back as logits (a grid of 2 x 3 candidates, for the suite's time). Losses and
    slowdowns are checked against separate exact runs."""
    grid = {"ema_alpha": (0.25, 0.5), "hold_margin": (1 / 32, 1 / 8, 1 / 2)}
    monkeypatch.setitem(dispatch_spec.ENGINE_GRID, "closed_loop_tail", grid)
    spec = dispatch_spec.loads(_engine_spec(tmp_path, fit_lines="uniform_tolerance = 0.0"), base_dir=tmp_path)
    prep = dispatch_spec.prepare(spec)
    prob, _ = dispatch_spec.problem(spec, prep)
    (kernel,) = spec.kernels  # one kernel: the problem's configurations are the training chips
    assert spec.map_sigma(0) == 0.0 and spec.map_sigma(1) > 0
    result = dispatch_spec.engine_search(spec, prep, prob, "closed_loop_tail")
    candidates = list(itertools.product(*grid.values()))
    assert result.loss.shape == (len(candidates), 1)
    size = (len(candidates) + 1) * len(prep.train_clocks)  # the search's batch

    clk0 = prep.train_clocks[0]
    runs = [(clk0, dict(dispatch="closed_loop", ema_alpha=a, hold_margin=m)) for a, m in candidates]
    ns = _makespans(spec, kernel, [*runs, (clk0, dict(dispatch="hardware"))], size)
    uniform = ns[:-1, None]  # [candidate, map 0]
    slower = uniform[:, 0] / ns[-1] - 1
    best = dispatch_fit.portable_inputs("closed_loop_tail", {k: float(v[0]) for k, v in result.theta.items()})
    i = dispatch_spec.best_admitted(result.loss[:, 0], slower, 0.0, "closed_loop_tail")
    assert [best[k] for k in grid] == pytest.approx(list(candidates[i]))
    again = _makespans(spec, kernel, [(clk, dict(dispatch="closed_loop", ema_alpha=best["ema_alpha"],
                                                 hold_margin=best["hold_margin"])) for clk in prep.train_clocks], size)
    assert np.mean(again / np.asarray(prob.fluid_ns)) == pytest.approx(result.loss[i, 0], rel=1e-9)


def test_engine_search_fits_the_clock_regressions_margin(tmp_path, monkeypatch):
    """The `clock_regression` family (exact engine only): its candidates are hold margins of that
    policy; the lowest loss is kept, written back as a logit, and its policy file runs the policy
    with that margin (a grid of 2 margins, for the suite's time)."""
    monkeypatch.setitem(dispatch_spec.ENGINE_GRID, "clock_regression", {"hold_margin": (1 / 16, 255 / 256)})
    text = _engine_spec(tmp_path).replace('families = ["closed_loop_tail"]', 'families = ["clock_regression"]')
    spec = dispatch_spec.loads(text, base_dir=tmp_path)
    prep = dispatch_spec.prepare(spec)
    prob, _ = dispatch_spec.problem(spec, prep)
    (kernel,) = spec.kernels
    result = dispatch_spec.engine_search(spec, prep, prob, "clock_regression")
    theta = {k: float(v[0]) for k, v in result.theta.items()}
    assert list(theta) == ["margin_logit"]
    best = dispatch_fit.portable_inputs("clock_regression", theta)
    margins = (1 / 16, 255 / 256)
    assert best == {"dispatch": "clock_regression",
                    "hold_margin": pytest.approx(margins[int(np.argmin(result.loss[:, 0]))])}
    size = (len(margins) + 1) * len(prep.train_clocks)  # the search's batch
    again = _makespans(spec, kernel, [(clk, best) for clk in prep.train_clocks], size)
    assert np.mean(again / np.asarray(prob.fluid_ns)) == pytest.approx(result.loss[:, 0].min(), rel=1e-9)
    written = fitted_policy.loads(fitted_policy.dumps(best.pop("dispatch"), best, "test"), "policy.toml")
    assert written.dispatch == "clock_regression"
    assert written.values["hold_margin"] == pytest.approx(best["hold_margin"])


def test_recovered_objective_is_minus_the_mean_share_on_unequal_chips(tmp_path):
    """`objective = "recovered"`: a candidate as fast as hardware dispatch scores 0, one halfway to
    the clairvoyant schedule (with the CTA launch latency) -0.5; the uniform training chip (map 0)
    counts for nothing, whatever the candidate's makespan there."""
    spec = dispatch_spec.loads(_engine_spec(tmp_path, fit_lines='objective = "recovered"'), base_dir=tmp_path)
    prep = dispatch_spec.prepare(spec)
    prob, _ = dispatch_spec.problem(spec, prep)
    clk = prep.train_clocks[1]
    clairvoyant = float(bounds.clairvoyant_ns(prep.works_bound[0], clk.sm_freq_mhz, float(spec.arch.cta_launch_ns)))
    hardware = np.array([[1.0], [1.2 * clairvoyant]])  # [map, kernel]; map 0 is uniform
    makespan = np.stack([hardware, hardware - 0.5 * (hardware - clairvoyant)])
    makespan[:, 0] = 1e9
    loss = dispatch_spec.engine_loss(spec, prep, prob, makespan, hardware)
    np.testing.assert_allclose(loss, [0.0, -0.5], atol=1e-9)
    with pytest.raises(js.JaxschedError, match="fit.objective = 'recovered': training chips where hardware"):
        dispatch_spec.engine_loss(spec, prep, prob, makespan, np.array([[1.0], [0.9 * clairvoyant]]))


def test_best_admitted_skips_candidates_slower_than_the_tolerance():
    loss, slower = np.array([1.10, 1.05, 1.20]), np.array([0.0, 0.01, -0.02])
    assert dispatch_spec.best_admitted(loss, slower, None, "f") == 1  # no tolerance: the lowest loss
    assert dispatch_spec.best_admitted(loss, slower, 0.005, "f") == 0  # the lowest loss is 1 % slower
    assert dispatch_spec.best_admitted(loss, slower, 0.01, "f") == 1  # at the tolerance: admitted
    with pytest.raises(js.JaxschedError, match=r"fit.uniform_tolerance = 0.0: a tolerance some f candidate meets "
                                               r"\(the closest is \+1.00 %"):
        dispatch_spec.best_admitted(loss, slower + 0.03, 0.0, "f")


@pytest.mark.slow
def test_fit_dispatch_command(tmp_path, capsys):
    """The command fits, evaluates on held-out chips and writes the policy file of the portable
    family, which a sweep then runs as `dispatch = "fitted"`: bit for bit what the evaluation ran."""
    (tmp_path / "small.toml").write_text(archio.dumps(ARCH))
    (tmp_path / "spec.toml").write_text(SPEC.replace('"closed_loop"]', '"closed_loop_tail"]'))
    assert main(["fit", "dispatch", str(tmp_path / "spec.toml"), "-o", str(tmp_path / "out")]) == 0
    ds = xr.open_dataset(tmp_path / "out" / "dispatch.nc", engine="h5netcdf")
    assert list(ds["policy"].values) == ["hardware", "weighted_clocks", "closed_loop_default", "weighted_fit",
                                         "closed_loop_tail_fit"]
    policy = fitted_policy.load(tmp_path / "out" / "policy_closed_loop_tail.toml")
    assert not (tmp_path / "out" / "policy_weighted.toml").exists()  # its weights depend on the chip
    spec = dispatch_spec.load(tmp_path / "spec.toml")
    (kernel,), clk = spec.kernels, spec.map_clocks(0, test=True)
    run = js.simulate(spec.arch, kernel, clk, warp_policy=spec.warp_policy, dispatch=policy.dispatch, **policy.values)
    assert float(run.makespan_ns) == float(ds["makespan_ns"].sel(policy="closed_loop_tail_fit").values[0, 0])
    assert ds.sizes["step"] == 3 and np.isfinite(ds["makespan_ns"].values).all()  # 2 steps and the last iterate
    assert (ds["gap_fluid"].values >= 0).all()  # every policy, learned or not, above the fluid bound
    np.testing.assert_array_equal(ds["fluid_ns"], np.maximum(ds["fluid_slot_ns"], ds["fluid_issue_ns"]))
    assert (tmp_path / "out" / "dispatch.png").stat().st_size > 10_000
    assert "above the fluid bound" in capsys.readouterr().out
