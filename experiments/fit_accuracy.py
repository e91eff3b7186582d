"""Issue 7's acceptance numbers on the H200 preset, printed as JSON (progress on stderr).

Sections (`--only` picks some; all by default):

- `speeds`: per-SM clocks fitted from exact-engine traces of a compute-bound kernel (dependent
  FMA chain, 256 threads, 8 CTAs per SM) with 1, 2 and 4 waves, on `--chips` chips with 10 %
  Gaussian clock spread (mean 1.8 GHz, capped at boost), all chips in one vmapped fit; the
  calibration from two uniform-chip runs (1980 and 1485 MHz). RMS relative error of the fit and
  of the closed-loop EMA estimate, and how well the sandwich standard deviations describe the
  errors (RMS of error / sd). Also with per-CTA work variation (+-25 %) and on the memory-bound
  `sweeps/kernels/fma_ldg.toml` shape, where the clock hardly shows in the timing.
- `surrogate`: the surrogate against the exact engine on `--maps` chips (4-wave kernel with load
  imbalance; every dispatch policy): error of the hard model, and of the soft model at each
  temperature (against the engine and against the hard model, per policy); the straight-through
  forward pass against the hard one. For scale, the engine's own makespan spread over four
  rotations of the hardware SM order on one chip.
- `gradients`: `jax.grad` of the soft surrogate (float64, T = 0.05) against central finite
  differences, for SM clocks, a dispatch weight, the EMA smoothing and an EMA prior.
- `dispatch`: `sweeps/fit_dispatch.toml` (or `--spec`): fit through the surrogate, then every
  policy in the exact engine on held-out chips (gaps to the fluid bound, to the uniform chip of
  the same mean clock); plus the proposed per-SM EMA prior (`closed_loop_per_sm`), run through
  the engine's internal entry point as a *prototype* (the public API takes one prior).

    python experiments/fit_accuracy.py [--only speeds surrogate gradients dispatch] [--arch h200] [--chips 4]
        [--maps 4] [--spec sweeps/fit_dispatch.toml] [--out results/fit_accuracy] > fit_accuracy.json
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxsched as js
from jaxsched import surrogate as sg
from jaxsched import trace
from jaxsched.surrogate import dispatch_fit, dispatch_spec, speeds
from jaxsched.policies import DEFAULT_HOLD_MARGIN

ARCH = js.presets.get("h200")  # `--arch` replaces it (a preset name or an arch TOML)
COMPUTE = "loop 64\n fma dep\nend"
SPREAD16 = "loop 64 cta_spread=16\n fma dep\nend"
FMA_LDG = "loop 4 cta_spread=2\n ldg bytes=128\n fma\n fma dep\n fma dep\n fma dep\nend"
IMBALANCED = "loop 64 cta_spread=8\n fma dep\nend"
TEMPERATURES = (0.3, 0.1, 0.03, 0.01, 1e-3, 1e-4, 1e-5, 1e-6, 1e-7)
POLICIES = js.DISPATCH_POLICIES


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _row(result: js.Result, i: int) -> js.Result:
    return jax.tree.map(lambda x: x[i], result)


def _kernel(program: str, waves: float, name: str) -> js.Kernel:
    return js.make_kernel(program, grid=round(waves * 8 * ARCH.sm_count), threads=256, regs=32,
                          l2_hit_rate=0.6, name=name)


# ----------------------------------------------------------------------------- speeds


def speed_case(name: str, program: str, waves: float, n_chips: int) -> dict:
    kernel = _kernel(program, waves, name)
    chips = [js.clocks.gaussian(ARCH, 100 + i, 1.8, 0.1) for i in range(n_chips)]
    uniform = [js.clocks.uniform(ARCH, 1.98), js.clocks.uniform(ARCH, 1.485)]
    clk = chips + uniform
    n = len(clk)
    t0 = time.perf_counter()
    runs = js.simulate_batch([ARCH] * n, [kernel] * n, clk, [1] * n, [0] * n, [0] * n)
    engine_s = time.perf_counter() - t0
    traces = [trace.from_result(_row(runs, i), ARCH, kernel, c, program=program) for i, c in enumerate(clk)]
    t0 = time.perf_counter()
    ds = speeds.fit_traces(traces[:n_chips], traces[n_chips:])
    fit_s = time.perf_counter() - t0
    fit, sd, truth = (ds[v].values for v in ("sm_freq_mhz_fit", "sm_freq_sd_mhz", "sm_freq_mhz_true"))
    ema = ds["sm_freq_mhz_ema"].values
    per_chip = [speeds.rms_relative_error(fit[c], truth[c]) for c in range(n_chips)]
    ok = np.isfinite(fit) & np.isfinite(truth)
    z = (fit - truth)[ok] / sd[ok]
    _say(f"speeds {name} {waves} waves: fit RMS {100 * np.mean(per_chip):.3f} %, EMA "
         f"{100 * ds.attrs['rms_error_ema']:.3f} %")
    return {
        "kernel": name, "program": program, "waves": waves, "chips": n_chips,
        "rms_error_fit_per_chip": per_chip, "rms_error_fit": ds.attrs["rms_error_fit"],
        "rms_error_ema": ds.attrs["rms_error_ema"],
        "rms_error_ema_per_chip": [speeds.rms_relative_error(ema[c], truth[c]) for c in range(n_chips)],
        "median_relative_sd": float(np.nanmedian(sd / fit)), "rms_of_error_over_sd": float(np.sqrt(np.mean(z**2))),
        "fraction_within_2sd": float(np.mean(np.abs(z) <= 2)),
        "calibration_cycles": ds.attrs["calibration_cycles"], "calibration_ns": ds.attrs["calibration_ns"],
        "engine_seconds": engine_s, "fit_seconds_all_chips": fit_s,
    }


def speed_section(args) -> list[dict]:
    cases = [("compute", COMPUTE, w) for w in (1, 2, 4)]
    cases += [("compute_cta_spread16", SPREAD16, 4), ("fma_ldg", FMA_LDG, 4)]
    return [speed_case(name, program, waves, args.chips) for name, program, waves in cases]


# ----------------------------------------------------------------------------- surrogate


def _exact_and_work(kernel: js.Kernel, clk: list, policies: list[str], starts: list[int] | None = None):
    """One batched engine call: every (clock map, policy) plus the two uniform runs of the
    surrogate's work (`launch.WORK_CLOCKS`)."""
    uniform = [js.clocks.uniform(ARCH, 1.98 * k) for k in sg.launch.WORK_CLOCKS]
    configs = [(c, p, s) for c in clk for p in policies for s in (starts or [0])]
    all_clk = uniform + [c for c, _, _ in configs]
    n = len(all_clk)
    runs = js.simulate_batch([ARCH] * n, [kernel] * n, all_clk, [1] * n,
                             [0, 0] + [js.DISPATCH_POLICIES.index(p) for _, p, _ in configs],
                             [0, 0] + [s for _, _, s in configs])
    work = sg.launch.work_from_runs(_row(runs, 0), _row(runs, 1), float(ARCH.cta_launch_ns))
    return work, np.asarray(runs.makespan_ns)[2:]


def surrogate_section(args) -> dict:
    kernel = _kernel(IMBALANCED, 4, "compute_4wave")
    clk = [js.clocks.gaussian(ARCH, 200 + i, 1.8, 0.1) for i in range(args.maps)]
    _say(f"surrogate: {len(clk) * len(POLICIES) + 2} exact runs")
    work, exact = _exact_and_work(kernel, clk, list(POLICIES))
    exact = exact.reshape(len(clk), len(POLICIES))
    hard = np.zeros_like(exact)
    straight = np.zeros_like(exact)
    soft = np.zeros((len(TEMPERATURES),) + exact.shape)
    for i, c in enumerate(clk):
        mhz = np.asarray(c.sm_freq_mhz, np.float32)
        launch = sg.make_launch(ARCH, kernel, mhz, work)
        params = sg.dispatch_params(ARCH, mhz)

        def run(pol, t, mode, launch=launch, params=params):
            return float(sg.schedule(launch, params, t, policy=pol, mode=mode, max_slots=8).makespan_ns)

        for j, pol in enumerate(POLICIES):
            hard[i, j] = run(pol, 0.0, "hard")
            straight[i, j] = run(pol, 0.1, "straight_through")
            for k, t in enumerate(TEMPERATURES):
                soft[k, i, j] = run(pol, t, "soft")
            _say(f"surrogate map {i} {pol}: hard {hard[i, j] / exact[i, j] - 1:+.4f} vs engine; soft vs hard "
                 + " ".join(f"{t:g}:{soft[k, i, j] / hard[i, j] - 1:+.2e}" for k, t in enumerate(TEMPERATURES)))
    _, rotations = _exact_and_work(kernel, clk[:1], ["hardware"], starts=[0, 33, 66, 99])
    table = []
    for k, t in enumerate(TEMPERATURES):
        vs_exact, vs_hard = np.abs(soft[k] / exact - 1), np.abs(soft[k] / hard - 1)
        table.append({"temperature": t, "mean_abs_error_vs_exact": float(vs_exact.mean()),
                      "max_abs_error_vs_exact": float(vs_exact.max()),
                      "mean_abs_error_vs_hard": float(vs_hard.mean()), "max_abs_error_vs_hard": float(vs_hard.max()),
                      "per_policy_mean_vs_exact": dict(zip(POLICIES, vs_exact.mean(0).tolist())),
                      "per_policy_mean_vs_hard": dict(zip(POLICIES, vs_hard.mean(0).tolist())),
                      "per_policy_max_vs_hard": dict(zip(POLICIES, vs_hard.max(0).tolist()))})
    hard_err = hard / exact - 1
    return {
        "kernel": "compute_4wave (loop 64 cta_spread=8, fma dep; 4224 CTAs)", "maps": len(clk),
        "hard_vs_exact": {"mean_abs": float(np.abs(hard_err).mean()), "max_abs": float(np.abs(hard_err).max()),
                          "per_policy_mean_abs": dict(zip(POLICIES, np.abs(hard_err).mean(0).tolist()))},
        "soft_by_temperature": table,
        "straight_through_vs_hard_max_abs": float(np.abs(straight / hard - 1).max()),
        "engine_spread_over_dispatch_start": float(rotations.max() / rotations.min() - 1),
        "exact_makespan_ns": exact.tolist(),
    }


# ----------------------------------------------------------------------------- gradients


def gradient_section(args) -> dict:
    kernel = _kernel(IMBALANCED, 4, "compute_4wave")
    clk = js.clocks.gaussian(ARCH, 300, 1.8, 0.1)
    work, _ = _exact_and_work(kernel, [], [])
    out = []
    with jax.enable_x64(True):
        work64 = jax.tree.map(lambda x: jnp.asarray(x, jnp.float64) if x.dtype.kind == "f" else x, work)
        launch = sg.make_launch(ARCH, kernel, np.asarray(clk.sm_freq_mhz, np.float32), work64)
        f64 = jnp.asarray(launch.sm_freq_mhz, jnp.float64)
        for policy in ("weighted", "closed_loop"):
            def fn(mhz, weight, alpha, prior, policy=policy):
                moved = dataclasses.replace(launch, sm_freq_mhz=mhz)
                params = dataclasses.replace(sg.dispatch_params(ARCH, np.asarray(clk.sm_freq_mhz)), weight=weight,
                                             ema_alpha=alpha, ema_prior_ns=prior,
                                             hold_margin=jnp.float64(DEFAULT_HOLD_MARGIN))
                return sg.schedule(moved, params, 0.05, policy=policy, max_slots=8).makespan_ns

            # distinct priors: equal ones tie every SM at the start, a kink at exactly that point
            args0 = [f64, f64, jnp.float64(0.25), 300.0 + 0.37 * jnp.arange(f64.shape[0], dtype=jnp.float64)]
            grads = jax.grad(fn, argnums=(0, 1, 2, 3))(*args0)
            for name, i, idx, h in [("sm_freq_mhz[3]", 0, 3, 1e-3), ("sm_freq_mhz[50]", 0, 50, 1e-3),
                                    ("weight[3]", 1, 3, 1e-3), ("ema_alpha", 2, None, 1e-6),
                                    ("ema_prior_ns[3]", 3, 3, 1e-4)]:
                def bump(d, i=i, idx=idx, args0=args0, fn=fn):
                    a = list(args0)
                    a[i] = a[i] + d if idx is None else a[i].at[idx].add(d)
                    return float(fn(*a))

                steps = (h, h / 10, h / 100)
                fds = [(bump(s) - bump(-s)) / (2 * s) for s in steps]
                ad = float(grads[i] if idx is None else grads[i][idx])
                # the surrogate is piecewise smooth: the smallest step whose difference quotient
                # agrees with the next larger one has no event swap inside it; if none does, an
                # event lies within +-h/10 and the quotients measure a jump, not the slope
                agree = [k for k in (2, 1) if abs(fds[k] - fds[k - 1]) <= 1e-3 * max(abs(fds[k]), abs(fds[k - 1]), 1e-9)]
                fd = fds[agree[0]] if agree else fds[-1]
                out.append({"policy": policy, "parameter": name, "autodiff": ad, "finite_differences": fds,
                            "steps": list(steps), "relative_error": abs(ad - fd) / max(abs(fd), abs(ad), 1e-12),
                            "event_within_step": not agree})
                _say(f"gradient {policy} {name}: {ad:.6g} vs {fds}")
    checked = [r["relative_error"] for r in out if not r["event_within_step"] and abs(r["autodiff"]) > 1e-9]
    return {"temperature": 0.05, "dtype": "float64", "checks": out,
            "max_relative_error_nonzero_smooth": float(max(checked)) if checked else 0.0,
            "checks_nonzero_smooth": len(checked),
            "checks_with_an_event_within_the_step": sum(r["event_within_step"] for r in out)}


# ----------------------------------------------------------------------------- dispatch


def _prototype_per_sm_prior(arch, kernel, clk, alpha: float, prior_ns: np.ndarray, warp: int) -> float:
    """PROTOTYPE of the proposed engine change: closed_loop with one EMA prior per SM. The engine
    already keeps one estimate per SM; only `simulate`'s validation takes a scalar, so this calls
    the internal compiled entry point. Not public API; docs/surrogate.md, "Proposal"."""
    import equinox as eqx

    from jaxsched.engine import run as engine_run
    from jaxsched.engine.configure import engine_params
    from jaxsched.lower import shapes_for

    params = js.make_params(arch, kernel, clk, warp_policy=warp, dispatch="closed_loop", ema_alpha=alpha)
    params = eqx.tree_at(lambda p: p.ema_prior_ns, params, np.asarray(prior_ns, np.float32))  # one per SM
    shapes = shapes_for(arch, kernel)
    with jax.enable_x64(True):
        result = engine_run._compiled(engine_params(params, kernel, shapes), shapes=shapes,
                                      max_ticks=engine_run.MAX_TICKS, batched=False)
    return float(result.makespan_ns)


def dispatch_section(args) -> dict:
    spec = dispatch_spec.load(args.spec)
    t0 = time.perf_counter()
    _say("dispatch: measuring work")
    prep = dispatch_spec.prepare(spec)
    prob, slots = dispatch_spec.problem(spec, prep)
    fits = {}
    for fam in (*spec.families, "closed_loop_per_sm"):
        _say(f"dispatch: fitting {fam}")
        fits[fam] = dispatch_fit.fit(prob, fam, steps=spec.fit["steps"], learning_rate=spec.fit["learning_rate"],
                                     temperature=spec.fit["temperature"], max_slots=slots,
                                     progress=lambda i, n, v, fam=fam: _say(f"  {fam} {i}/{n}: {v:.4f}"))
    fit_s = time.perf_counter() - t0
    engine_fits = {k: v for k, v in fits.items() if k in spec.families}
    ds = dispatch_spec.fit_dataset(spec, engine_fits, dispatch_spec.evaluate(spec, prep, engine_fits, slots, _say))
    proposal = fits["closed_loop_per_sm"]
    theta = {k: float(v[0]) for k, v in proposal.theta.items()}
    per_sm = np.full((len(spec.kernels), len(prep.test_clocks)), np.nan)
    for ki, (kernel, work) in enumerate(zip(spec.kernels, prep.works)):
        for mi, clk in enumerate(prep.test_clocks):
            mhz = np.asarray(clk.sm_freq_mhz, np.float32)
            d = float(dispatch_fit.mean_occupancy_ns(sg.make_launch(spec.arch, kernel, mhz, work)))
            kw = dispatch_fit.engine_inputs("closed_loop_per_sm", theta, spec.arch, mhz, d)
            per_sm[ki, mi] = _prototype_per_sm_prior(spec.arch, kernel, clk, kw["ema_alpha"], kw["ema_prior_ns"],
                                                     js.WARP_POLICIES.index(spec.warp_policy))
            _say(f"prototype per-SM prior: {kernel.name} map {mi}: {per_sm[ki, mi]:.1f} ns")
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        ds.to_netcdf(out / "dispatch.nc", engine="h5netcdf")
        from jaxsched.surrogate import plots

        plots.dispatch(ds, out / "dispatch.png")
    gap = ds["gap_fluid"].mean("map")
    uni_gap = (ds["uniform_equivalent_ns"] / ds["fluid_ns"] - 1).mean("map")
    proposal_gap = np.nanmean(per_sm / ds["fluid_ns"].values - 1, axis=1)
    proposal_uni = np.nanmean(per_sm / ds["uniform_equivalent_ns"].values - 1, axis=1)
    kernels = [str(k) for k in ds["kernel"].values]
    return {
        "spec": args.spec, "train_maps": spec.clocks["train_maps"], "test_maps": spec.clocks["test_maps"],
        "fit_seconds": fit_s,
        "learned": {fam: {k: float(v[0]) for k, v in r.theta.items()} for fam, r in fits.items()},
        "loss_first_last": {fam: [float(r.loss[0].mean()), float(r.loss[-1].mean())] for fam, r in fits.items()},
        "mean_gap_to_fluid": {k: {**{str(p): float(gap.sel(kernel=k, policy=p)) for p in ds["policy"].values},
                                  "closed_loop_per_sm_fit (prototype)": float(proposal_gap[i]),
                                  "uniform_chip_same_mean_clock": float(uni_gap.sel(kernel=k))}
                              for i, k in enumerate(kernels)},
        "mean_gap_to_uniform_chip": {k: {**{str(p): float(ds["gap_uniform"].mean("map").sel(kernel=k, policy=p))
                                            for p in ds["policy"].values},
                                         "closed_loop_per_sm_fit (prototype)": float(proposal_uni[i])}
                                     for i, k in enumerate(kernels)},
        "mean_gap_to_fluid_sm_attribution": {
            k: {str(p): float((ds["makespan_ns"] / ds["fluid_sm_ns"] - 1).mean("map").sel(kernel=k, policy=p))
                for p in ds["policy"].values} for k in kernels},
        "surrogate_hard_vs_exact_mean_abs": {
            k: {str(p): float(np.abs(ds["surrogate_ns"] / ds["makespan_ns"] - 1).mean("map").sel(kernel=k, policy=p))
                for p in ds["policy"].values} for k in kernels},
    }


SECTIONS = {"speeds": speed_section, "surrogate": surrogate_section, "gradients": gradient_section,
            "dispatch": dispatch_section}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default="h200", help="preset name or arch TOML (e.g. sweeps/arches/h200_8sm.toml)")
    parser.add_argument("--only", nargs="+", choices=sorted(SECTIONS), default=list(SECTIONS))
    parser.add_argument("--chips", type=int, default=4, help="chips per speed-fit case")
    parser.add_argument("--maps", type=int, default=4, help="chips for the surrogate's error table")
    parser.add_argument("--spec", default=str(Path(__file__).resolve().parent.parent / "sweeps" / "fit_dispatch.toml"))
    parser.add_argument("--out", default=None, help="folder for the dispatch dataset and figure")
    args = parser.parse_args()
    global ARCH
    ARCH = js.load_arch(args.arch) if args.arch.endswith(".toml") else js.presets.get(args.arch)
    report = {"device": str(jax.devices()[0]), "arch": ARCH.name}
    for name in args.only:
        t0 = time.perf_counter()
        report[name] = SECTIONS[name](args)
        report[f"{name}_seconds"] = time.perf_counter() - t0
        _say(f"partial: {json.dumps({name: report[name]})}")  # survives a kill of a long run
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
