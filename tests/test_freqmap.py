"""`jaxsched.freqmap`: statistics of the process-variation generator over many chips (mean,
within-die and die-to-die spread, spatial correlation), IR-drop maps (slower far from the bumps
and under more current, the alpha-power law's normalisation), binning and caps, floorswept SMs,
jit/vmap with traced parameters (one trace for many values), bad input, and file round trips.

Statistical tolerances are stated next to each check as multiples of the estimator's standard
error for N_CHIPS draws; keys are fixed, so the tests are deterministic.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from helpers import small_arch

import jaxsched as js
from jaxsched import freqmap as fm
from jaxsched import presets

N_CHIPS = 2000
MEAN_MHZ = 1800.0
SIGMA_WITHIN = 0.04
SIGMA_DIE = 0.03
CORR_MM = 5.0


@pytest.fixture(scope="module")
def h200() -> js.Arch:
    return presets.get("h200")


def sample(arch: js.Arch, n: int, seed: int, **params) -> np.ndarray:
    """[n, sm] maps of `n` chips, one jitted vmap over keys."""
    keys = jax.random.split(jax.random.key(seed), n)
    draw = jax.jit(jax.vmap(lambda k: fm.process_variation(k, arch, **params)))
    return np.asarray(draw(keys), dtype=np.float64)


@pytest.fixture(scope="module")
def chips(h200) -> np.ndarray:
    return sample(h200, N_CHIPS, 0, mean_mhz=MEAN_MHZ, sigma_within=SIGMA_WITHIN,
                  sigma_die=SIGMA_DIE, corr_length_mm=CORR_MM)


def model_cov(arch: js.Arch, length: float) -> np.ndarray:
    """exp(-d^2 / 2L^2) between enabled SMs, computed here in NumPy (float64)."""
    xy = np.asarray(arch.sm_xy_mm, dtype=np.float64)[np.asarray(arch.sm_enabled)]
    d2 = ((xy[:, None] - xy[None]) ** 2).sum(-1)
    return np.exp(-d2 / (2 * length**2)) if length > 0 else np.eye(len(xy))


def pair_distances(arch: js.Arch) -> np.ndarray:
    xy = np.asarray(arch.sm_xy_mm, dtype=np.float64)[np.asarray(arch.sm_enabled)]
    return np.sqrt(((xy[:, None] - xy[None]) ** 2).sum(-1))


def rank(x: np.ndarray) -> np.ndarray:
    """Ranks with ties averaged (for Spearman's rho)."""
    _, inv, counts = np.unique(x, return_inverse=True, return_counts=True)
    return (np.cumsum(counts) - (counts - 1) / 2.0)[inv]


def spearman(x: np.ndarray, y: np.ndarray) -> float:
    return float(np.corrcoef(rank(x), rank(y))[0, 1])


# --------------------------------------------------------------------------- process variation


def test_sample_mean(h200, chips):
    on = np.asarray(h200.sm_enabled)
    k_bar = model_cov(h200, CORR_MM).mean()
    # The grand mean's error is the chip mean's, whose variance is mu^2 (s_die^2 + s_w^2 Kbar).
    se = MEAN_MHZ * np.sqrt((SIGMA_DIE**2 + SIGMA_WITHIN**2 * k_bar) / N_CHIPS)
    assert abs(chips[:, on].mean() - MEAN_MHZ) < 4 * se  # 4 SE: ~1.3 MHz here
    assert np.all(chips[:, ~on] == 0)


def test_within_die_spread(h200, chips):
    on = np.asarray(h200.sm_enabled)
    # E[population variance over one chip's SMs] = mu^2 s_w^2 (1 - mean(K)): correlated SMs
    # share part of the field, which shows up as chip-to-chip rather than within-chip spread.
    expected = (MEAN_MHZ * SIGMA_WITHIN) ** 2 * (1 - model_cov(h200, CORR_MM).mean())
    measured = chips[:, on].var(axis=1).mean()
    assert measured == pytest.approx(expected, rel=0.05)  # per-chip var ~45% rel. sd; /sqrt(2000)
    # With short correlation the within-die std is sigma_within itself.
    iid = sample(h200, 500, 1, mean_mhz=MEAN_MHZ, sigma_within=SIGMA_WITHIN, sigma_die=0.0,
                 corr_length_mm=0.0)[:, on]
    assert iid.std(axis=1).mean() / MEAN_MHZ == pytest.approx(SIGMA_WITHIN, rel=0.03)


def test_die_to_die_spread(h200, chips):
    on = np.asarray(h200.sm_enabled)
    chip_means = chips[:, on].mean(axis=1)
    expected = MEAN_MHZ * np.sqrt(SIGMA_DIE**2 + SIGMA_WITHIN**2 * model_cov(h200, CORR_MM).mean())
    assert chip_means.std() == pytest.approx(expected, rel=0.07)  # sample std: 1.6% rel. SE
    # Without within-die variation every SM of a chip moves together, by sigma_die.
    die_only = sample(h200, N_CHIPS, 2, mean_mhz=MEAN_MHZ, sigma_within=0.0,
                      sigma_die=SIGMA_DIE)[:, on]
    assert np.allclose(die_only, die_only[:, :1], rtol=1e-6)
    assert die_only[:, 0].std() / MEAN_MHZ == pytest.approx(SIGMA_DIE, rel=0.07)


@pytest.mark.parametrize("length", [CORR_MM, 0.0])
def test_spatial_correlation(h200, length):
    on = np.asarray(h200.sm_enabled)
    f = sample(h200, N_CHIPS, 3, mean_mhz=MEAN_MHZ, sigma_within=SIGMA_WITHIN, sigma_die=0.0,
               corr_length_mm=length)[:, on]
    emp = np.corrcoef(f.T)
    dist = pair_distances(h200)
    model = model_cov(h200, length)
    se = 1 / np.sqrt(N_CHIPS)  # SE of a sample correlation near 0 (smaller near 1): 0.022
    iu = np.triu_indices(len(dist), 1)
    if length > 0:
        near = np.unravel_index(np.argmin(np.abs(dist - length) + np.eye(len(dist)) * 1e9),
                                dist.shape)  # a pair about L apart: rho ~ 0.6
        far = np.unravel_index(np.argmin(np.abs(dist - 3 * length)), dist.shape)  # rho ~ 0.01
        for i, j in (near, far):
            assert emp[i, j] == pytest.approx(model[i, j], abs=4 * se), (dist[i, j], model[i, j])
        assert model[near] > 0.5 and model[far] < 0.02
    else:  # independent SMs, even adjacent ones (1.4 mm apart)
        closest = np.unravel_index(np.argmin(dist + np.eye(len(dist)) * 1e9), dist.shape)
        assert abs(emp[closest]) < 4 * se
    # Over all 8646 pairs the error is at the level of sampling noise (mean |err| ~ 0.8 SE).
    assert np.mean(np.abs(emp[iu] - model[iu])) < 1.2 * se


def test_variation_defaults_and_other_presets():
    for name in presets.names():
        arch = presets.get(name)
        f = np.asarray(fm.process_variation(jax.random.key(4), arch))
        on = np.asarray(arch.sm_enabled)
        assert np.all(np.isfinite(f)) and np.all(f[on] > 0) and np.all(f[~on] == 0), name
        assert abs(f[on].mean() / (float(arch.boost_clock_ghz) * 1000) - 1) < 0.2, name
    # Very long correlation (the hardest case for float32 Cholesky) stays finite.
    arch = presets.get("h200")
    f = fm.process_variation(jax.random.key(5), arch, corr_length_mm=1e4, sigma_die=0.0)
    on = np.asarray(arch.sm_enabled)
    # One value per chip, but for the 1e-4 nugget: white noise of 1% of sigma_within (0.8 MHz).
    assert np.all(np.isfinite(f)) and np.ptp(np.asarray(f)[on]) < 8.0


# --------------------------------------------------------------------------- IR drop


def test_ir_slower_far_from_bumps(h200):
    on = np.asarray(h200.sm_enabled)
    d = np.asarray(fm.bump_distance_mm(h200.sm_xy_mm, fm.default_bumps(h200)))[on]
    f = np.asarray(fm.ir_drop(h200))[on]
    v = np.asarray(fm.supply_voltage(h200))[on]
    assert spearman(d, f) < -0.9 and spearman(d, v) < -0.9
    assert f[np.argmax(d)] <= f.min() * 1.0005  # ties in d aside, the farthest SM is slowest
    assert v[np.argmax(d)] < v[np.argmin(d)] < 0.9
    # With each SM's own current only, frequency is a decreasing function of d: exact ordering.
    f0 = np.asarray(fm.ir_drop(h200, current_radius_mm=0.0))[on]
    order = np.argsort(d, kind="stable")
    assert np.all(np.diff(f0[order]) <= 1e-3)
    assert f0[np.argmax(d)] == pytest.approx(f0.min(), abs=1e-3)
    # Defaults: the worst SM loses a few percent (45 mV of 0.9 V: ~6% under alpha = 1.3).
    loss = 1 - f.min() / 1980.0
    assert 0.03 < loss < 0.10


def test_ir_edge_bumps_slow_the_centre():
    arch = presets.get("a100")
    w, h = (float(x) for x in arch.die_mm)
    edge = np.array([[x, y] for x in np.linspace(0, w, 9) for y in (0.0, h)]
                    + [[x, y] for x in (0.0, w) for y in np.linspace(0, h, 7)[1:-1]])
    on = np.asarray(arch.sm_enabled)
    f = np.asarray(fm.ir_drop(arch, bumps_xy_mm=edge))[on]
    xy = np.asarray(arch.sm_xy_mm)[on]
    centre = np.linalg.norm(xy - np.array([w / 2, h / 2]), axis=1)
    assert f[np.argmin(centre)] < f[np.argmax(centre)]
    assert spearman(centre, f) > 0.7  # faster towards the rim, where the bumps are


def test_ir_more_current_lower_frequency(h200):
    on = np.asarray(h200.sm_enabled)
    i0 = float(fm.ir_defaults(h200)["current_a"])
    lo = np.asarray(fm.ir_drop(h200, current_a=i0))[on]
    hi = np.asarray(fm.ir_drop(h200, current_a=2 * i0))[on]
    assert np.all(hi < lo)
    # A hot spot: one busy SM slows itself and its neighbours, not SMs far away.
    amps = np.full(h200.n_sm_slots, i0, dtype=np.float32)
    amps[40] *= 4
    hot = np.asarray(fm.ir_drop(h200, current_a=amps))
    base = np.asarray(fm.ir_drop(h200, current_a=i0))
    dist = np.linalg.norm(np.asarray(h200.sm_xy_mm) - np.asarray(h200.sm_xy_mm)[40], axis=1)
    assert hot[40] < base[40]
    near = (dist > 0) & (dist < 2.0) & on
    assert near.any() and np.all(hot[near] < base[near])
    far = (dist > 10.0) & on
    np.testing.assert_allclose(hot[far], base[far], rtol=1e-5)


def test_alpha_power_law(h200):
    on = np.asarray(h200.sm_enabled)
    # No drop (no current or no resistance): f(vdd) = f_nominal on every enabled SM.
    for kw in (dict(current_a=0.0), dict(r_ohm_per_mm=0.0)):
        f = np.asarray(fm.ir_drop(h200, f_nominal_mhz=1700.0, **kw))
        np.testing.assert_allclose(f[on], 1700.0, rtol=1e-6)
        assert np.all(f[~on] == 0)
    # Against the formula in float64: f = f_nom ((V - Vth)^a / V) / ((Vdd - Vth)^a / Vdd).
    params = dict(vdd=0.95, v_th=0.3, alpha=1.2, r_ohm_per_mm=0.004, current_a=3.0)
    v = np.asarray(fm.supply_voltage(h200, vdd=0.95, r_ohm_per_mm=0.004, current_a=3.0),
                   dtype=np.float64)
    g = lambda x: (x - 0.3) ** 1.2 / x  # noqa: E731
    expected = 1500.0 * g(v) / g(0.95)
    f = np.asarray(fm.ir_drop(h200, f_nominal_mhz=1500.0, **params))
    np.testing.assert_allclose(f[on], expected[on], rtol=1e-5)
    # Speed rises with voltage and is 0 at or below threshold.
    vs = jnp.linspace(0.2, 1.2, 101)
    s = np.asarray(fm.alpha_power(vs, v_th=0.35, alpha=1.3))
    assert np.all(s[vs <= 0.35] == 0) and np.all(np.diff(s[vs > 0.35]) > 0)


# --------------------------------------------------------------------------- bins, caps, masks


@pytest.mark.parametrize("step", [15.0, 12.5, 25.0])
def test_bin_and_cap(step):
    rng = np.random.default_rng(int(step * 10))
    n = 144
    mhz = rng.uniform(0, 2500, size=(50, n)).astype(np.float32)
    mhz[:, -12:] = 0  # floorswept
    caps = rng.uniform(1000, 2200, size=n).astype(np.float32)
    binned = jax.jit(jax.vmap(lambda m: fm.bin_and_cap(m, step_mhz=step, cap_mhz=caps,
                                                         floor_mhz=210.0)))
    out = np.asarray(binned(mhz), dtype=np.float64)
    assert np.all(out <= caps)
    assert np.allclose(out / step, np.round(out / step), atol=1e-6, rtol=0)
    assert np.all(out[:, -12:] == 0)
    live = out[:, :-12]
    assert np.all(live >= np.ceil(210.0 / step) * step)
    # Inside [floor, cap] a value is floored to its bin: less than one step lower, never higher
    # (but for bin_and_cap's 1e-4-bin slack against float32 rounding).
    inside = (mhz[:, :-12] >= 300) & (mhz[:, :-12] <= caps[:-12] - step)
    drop = mhz[:, :-12][inside] - live[inside]
    assert np.all((drop >= -1e-4 * step) & (drop < step))
    # Exact bins are kept; the default floor is one step.
    exact = fm.bin_and_cap(jnp.array([1980.0, 1995.0, 3.0, 0.0]), step_mhz=15.0)
    np.testing.assert_array_equal(np.asarray(exact), [1980.0, 1995.0, 15.0, 0.0])


def test_disabled_sms_are_zero_and_combine():
    arch = small_arch(3)  # 8 SM slots, 6 enabled
    on = np.asarray(arch.sm_enabled)
    assert (~on).sum() == 2
    maps = {
        "uniform": fm.uniform(arch),
        "from_array": fm.from_array(arch, np.full(8, 1500.0)),
        "variation": fm.process_variation(jax.random.key(0), arch),
        "ir_drop": fm.ir_drop(arch),
        "ir_factor": fm.ir_factor(arch),
        "combine": fm.combine(arch, fm.process_variation(jax.random.key(0), arch),
                              fm.ir_factor(arch), cap_mhz=1980.0),
    }
    for name, m in maps.items():
        m = np.asarray(m)
        assert m.dtype == np.float32 and m.shape == (8,), name
        assert np.all(m[~on] == 0) and np.all(m[on] > 0), name
    c = np.asarray(maps["combine"])
    assert np.all(c <= 1980.0) and np.all(c % 15 == 0)
    clocks = fm.to_clocks(arch, c)
    assert clocks.sm_freq_mhz.dtype == np.int32
    np.testing.assert_array_equal(clocks.sm_freq_mhz, c.astype(np.int32))


# --------------------------------------------------------------------------- jit and vmap


def test_traced_parameters_compile_once(h200):
    traces = {"var": 0, "ir": 0, "bin": 0}

    @jax.jit
    def var(key, mean, sw, sd, length):
        traces["var"] += 1
        return fm.process_variation(key, h200, mean_mhz=mean, sigma_within=sw, sigma_die=sd,
                                    corr_length_mm=length)

    @jax.jit
    def ir(arch, vdd, v_th, alpha, r, amps):
        traces["ir"] += 1
        return fm.ir_drop(arch, vdd=vdd, v_th=v_th, alpha=alpha, r_ohm_per_mm=r, current_a=amps)

    @jax.jit
    def binned(m, step, cap):
        traces["bin"] += 1
        return fm.bin_and_cap(m, step_mhz=step, cap_mhz=cap)

    f32 = np.float32
    outs = [var(jax.random.key(i), f32(1500 + 100 * i), f32(0.01 * i), f32(0.02), f32(i))
            for i in range(3)]
    assert not np.allclose(outs[0], outs[2])
    irs = [ir(h200, f32(0.9 + 0.05 * i), f32(0.3), f32(1.2 + 0.1 * i), f32(0.003),
              np.full(144, 3.0 + i, f32)) for i in range(3)]
    assert not np.allclose(irs[0], irs[2])
    for step in (15.0, 12.5, 25.0):
        binned(outs[0], f32(step), f32(1700.0))
    assert traces == {"var": 1, "ir": 1, "bin": 1}

    # vmap over parameters: sigma and correlation length swept together.
    sws = jnp.array([0.0, 0.02, 0.05])
    lengths = jnp.array([0.0, 3.0, 8.0])
    sweep = jax.vmap(lambda sw, length: fm.process_variation(
        jax.random.key(7), h200, mean_mhz=1800.0, sigma_within=sw, sigma_die=0.0,
        corr_length_mm=length))(sws, lengths)
    on = np.asarray(h200.sm_enabled)
    assert np.allclose(np.asarray(sweep)[0, on], 1800.0)
    assert np.asarray(sweep)[2, on].std() > np.asarray(sweep)[1, on].std() > 0


# --------------------------------------------------------------------------- bad input


@pytest.mark.parametrize(
    "call, field",
    [
        (lambda a: fm.process_variation(jax.random.key(0), a, sigma_within=-0.1), "sigma_within"),
        (lambda a: fm.process_variation(jax.random.key(0), a, sigma_die=-0.01), "sigma_die"),
        (lambda a: fm.process_variation(jax.random.key(0), a, corr_length_mm=-1.0),
         "corr_length_mm"),
        (lambda a: fm.process_variation(jax.random.key(0), a, mean_mhz=0.0), "mean_mhz"),
        (lambda a: fm.ir_drop(a, v_th=0.9), "v_th"),
        (lambda a: fm.ir_drop(a, vdd=0.8, v_th=0.85), "v_th"),
        (lambda a: fm.ir_drop(a, alpha=0.0), "alpha"),
        (lambda a: fm.ir_drop(a, alpha=-1.3), "alpha"),
        (lambda a: fm.ir_drop(a, r_ohm_per_mm=-0.1), "r_ohm_per_mm"),
        (lambda a: fm.ir_drop(a, current_a=np.full(144, -1.0)), "current_a"),
        (lambda a: fm.ir_drop(a, current_a=np.ones(7)), "current_a"),
        (lambda a: fm.ir_drop(a, bumps_xy_mm=np.ones(3)), "bumps_xy_mm"),
        (lambda a: fm.ir_drop(a, f_nominal_mhz=-5.0), "f_nominal_mhz"),
        (lambda a: fm.bin_and_cap(np.ones(144), step_mhz=0.0), "step_mhz"),
        (lambda a: fm.bin_and_cap(np.ones(144), step_mhz=-15.0), "step_mhz"),
        (lambda a: fm.bin_and_cap(np.ones(144), step_mhz=15.0, cap_mhz=100.0, floor_mhz=200.0),
         "floor_mhz"),
        (lambda a: fm.uniform(a, mhz=float("nan")), "mhz"),
        (lambda a: fm.from_array(a, np.ones(10)), "mhz"),
        (lambda a: fm.from_array(a, np.r_[0.0, np.ones(143)]), "mhz"),
    ],
)
def test_bad_parameters(h200, call, field):
    with pytest.raises(js.JaxschedError) as err:
        call(h200)
    assert err.value.field == f"freqmap.{field}"
    assert err.value.limit and str(err.value).startswith(f"freqmap.{field} = ")


# --------------------------------------------------------------------------- files


def test_from_file_round_trip(h200, tmp_path):
    on = np.asarray(h200.sm_enabled)
    f = np.asarray(fm.process_variation(jax.random.key(9), h200))
    np.save(tmp_path / "slots.npy", f)
    np.testing.assert_array_equal(np.asarray(fm.from_file(h200, tmp_path / "slots.npy")), f)
    np.savetxt(tmp_path / "enabled.csv", f[on], delimiter=",")  # one per enabled SM, a column
    np.testing.assert_allclose(np.asarray(fm.from_file(h200, tmp_path / "enabled.csv")), f,
                               rtol=1e-6)
    np.savetxt(tmp_path / "row.csv", f[None], delimiter=",", fmt="%.3f")  # one row
    assert np.asarray(fm.from_file(h200, tmp_path / "row.csv")).shape == (144,)
    clocks = fm.to_clocks(h200, fm.from_file(h200, tmp_path / "slots.npy"))
    np.testing.assert_array_equal(clocks.sm_freq_mhz, np.rint(f).astype(np.int32))

    np.save(tmp_path / "short.npy", f[:100])
    with pytest.raises(js.JaxschedError, match="one per SM slot"):
        fm.from_file(h200, tmp_path / "short.npy")
    bad = f.copy()
    bad[3] = -1.0
    np.save(tmp_path / "neg.npy", bad)
    with pytest.raises(js.JaxschedError, match="SM 3"):
        fm.from_file(h200, tmp_path / "neg.npy")
    (tmp_path / "map.txt").write_text("1 2 3")
    with pytest.raises(js.JaxschedError, match=r"\.npy, \.csv, \.toml"):
        fm.from_file(h200, tmp_path / "map.txt")
    (tmp_path / "words.csv").write_text("fast,slow\n")
    with pytest.raises(js.JaxschedError, match="numbers only"):
        fm.from_file(h200, tmp_path / "words.csv")
    (tmp_path / "map.toml").write_text(f"sm_freq_mhz = {f[on].round(1).tolist()}\n")
    np.testing.assert_allclose(np.asarray(fm.from_file(h200, tmp_path / "map.toml")), f, atol=0.06)
    (tmp_path / "other.toml").write_text("clocks = [1980]\n")
    with pytest.raises(js.JaxschedError, match="sm_freq_mhz"):
        fm.from_file(h200, tmp_path / "other.toml")
    np.save(tmp_path / "ghz.npy", f[on] / 1000.0)
    with pytest.raises(js.JaxschedError, match="in MHz"):
        fm.from_file(h200, tmp_path / "ghz.npy")


def test_per_enabled_sm_arrays(h200):
    """Maps and per-SM parameters given per enabled SM (132 on the H200) equal the die-slot form
    with the floorswept slots left out."""
    on = np.asarray(h200.sm_enabled)
    f = np.asarray(fm.process_variation(jax.random.key(3), h200))
    np.testing.assert_array_equal(np.asarray(fm.from_array(h200, f[on])), f)
    current = np.linspace(0.5, 2.0, 144) * on
    np.testing.assert_array_equal(np.asarray(fm.ir_drop(h200, current_a=current[on])),
                                  np.asarray(fm.ir_drop(h200, current_a=current)))


@pytest.mark.parametrize("model", fm.MODELS)
def test_random_clocks(h200, model):
    """One random chip per seed, spread by sigma around the mean, capped at the boost clock."""
    on = np.asarray(h200.sm_enabled)
    a, b = (np.asarray(fm.random_clocks(h200, model, s, 1.8, 0.1).sm_freq_mhz)[on] for s in (1, 2))
    again = np.asarray(fm.random_clocks(h200, model, 1, 1.8, 0.1).sm_freq_mhz)[on]
    np.testing.assert_array_equal(a, again)
    assert not np.array_equal(a, b)
    assert a.max() <= 1980 and 0.03 < a.std() / 1800 < 0.2 and abs(np.median(a) - 1800) < 100
    flat = np.asarray(fm.random_clocks(h200, model, 1, 1.8, 0.0).sm_freq_mhz)[on]
    assert np.ptp(flat) == 0 and abs(int(flat[0]) - 1800) <= 15
    for bad, field in ((dict(seed=-1), "seed"), (dict(model="flat"), "model"), (dict(mean_ghz=0.0), "mean_ghz")):
        with pytest.raises(js.JaxschedError, match=field):
            fm.random_clocks(h200, **{"model": model, "seed": 1, "mean_ghz": 1.8, "sigma": 0.1, **bad})
