"""Issue 7, dispatch-fit acceptance: learned dispatch parameters on held-out chips, in the exact engine.

Fits the `weighted` family (`w_s = (f_s / mean f)^gamma`) and the `closed_loop` family
(`ema_alpha`, `ema_prior_ns`) through the soft surrogate on `--train-maps` chips, then runs every
policy with `js.simulate_batch` on `--test-maps` *other* chips (other seeds) and prints, per
kernel, the mean and worst gap of each policy's makespan to each reference:

- `fluid`: `bounds.fluid_ns` of the slot work model (docs/bounds.md), the issue's fluid lower
  bound: per-CTA slot occupancy, measured on uniform chips at two clocks;
- `fluid+L`: the same LP with the engine's CTA launch latency `L` (a freed slot waits `L` before
  its next CTA, docs/model.md section 9) added to every CTA, minus one `L` (a slot's last CTA is
  not followed by a wait): `max(fluid(work + L) - L, fluid(work))`. Still a bound of the slot
  model, which the default bound is not aware of; it keeps the first wave's short occupancies;
- `fluid_sm`: `bounds.fluid_ns` of the SM-attributed work (each SM's busy time split among its
  resident CTAs, one server per SM): tighter, *not strict* (it carries the uniform run's tail);
- `fluid_ss+L`: `fluid+L` with each first-wave CTA's occupancy replaced by its steady-state one
  (its work times the median occupancy per unit of work of the later CTAs, at both clocks): under
  GTO the first wave's CTAs finish staggered and occupy their slots ~30 % less long, which the
  SM pays back in its tail. *Not strict* (a reference for "no first-wave credit");
- `uniform`: the exact engine on a uniform chip at the map's mean clock (what perfect balancing
  would give, the kernel's own tail included): a reference, not a bound;
- `clairvoyant`: `bounds.clairvoyant_ns` of the slot work model (an upper bound on the slot
  model's optimum, not a bound on the engine).

Policies: `hardware`, `weighted` by the true clocks, the learned weights, `closed_loop` with the
engine's defaults (alpha 0.25, prior 0) and with the fitted parameters.

    python benchmarks/dispatch_fit_eval.py [--waves 4 8 16] [--train-maps 8] [--test-maps 12]
        [--loop 256] [--steps 30] [--out results/dispatch_fit_eval] > dispatch_fit_eval.json

Default chip: `sweeps/arches/h200_8sm.toml` (the H200 SM, 8 SMs) so that the engine runs of a
multi-wave kernel take minutes on a 2-core CPU; 10 % Gaussian clock spread around 1.8 GHz.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxsched as js
from jaxsched import bounds, trace
from jaxsched.surrogate import dispatch_fit, dispatch_spec, launch

ROOT = Path(__file__).resolve().parent.parent
REFERENCES = ("fluid", "fluid+L", "fluid_ss+L", "fluid_sm", "uniform", "clairvoyant")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _spec_text(args) -> str:
    kernels = []
    for waves in args.waves:
        for spread in args.spreads:
            body = f"loop {args.loop}" + (f" cta_spread={spread}" if spread else "") + "\\n fma dep\\nend"
            kernels.append(f'[[kernels]]\nname = "fma{args.loop}_spread{spread}_{waves}wave"\ngrid = {waves * 64}\n'
                           f'threads = 256\nregs = 32\nprogram = "{body}"\n')
    return (f'title = "issue 7 dispatch-fit acceptance"\narch = "{args.arch}"\nwarp_policy = "gto"\nseed = {args.seed}\n'
            f'families = ["weighted", "closed_loop"]\n' + "\n".join(kernels) +
            f'[clocks]\nmodel = "gaussian"\nmean_ghz = 1.8\nsigma = {args.sigma}\ntrain_maps = {args.train_maps}\n'
            f'test_maps = {args.test_maps}\n[fit]\nsteps = {args.steps}\nlearning_rate = {args.learning_rate}\n'
            f'temperature = {args.temperature}\nper_chip = false\n')


def _steady_state_work(spec, kernel: js.Kernel) -> bounds.Work:
    """Slot work with first-wave occupancies replaced by steady-state ones (module doc)."""
    runs = launch.uniform_runs(spec.arch, kernel, spec.warp_policy)
    occupancy = []
    for run in runs:
        work = trace.cta_work(spec.arch, kernel, js.clocks.uniform(spec.arch, float(run.tick_mhz) / 1000.0))
        ticks = np.asarray(run.cta_end_tick, np.float64) - np.asarray(run.cta_start_tick, np.float64)
        d = ticks * 1000.0 / float(run.tick_mhz)
        first = np.asarray(run.cta_start_tick) == 0
        occupancy.append(np.where(first, work * np.median(d[~first] / work[~first]), d))
    (d_a, d_b), (f_a, f_b) = occupancy, (float(r.tick_mhz) for r in runs)
    cycles = np.clip((d_a - d_b) / (1000.0 / f_a - 1000.0 / f_b), 0.0, d_a * f_a / 1000.0)
    reference = bounds.work_from_uniform(*runs)
    return bounds.Work(cycles=jnp.asarray(cycles, jnp.float32), ns=jnp.asarray(d_a - cycles * 1000.0 / f_a, jnp.float32),
                       valid=reference.valid, slots_per_sm=reference.slots_per_sm)


def _fluid_with_latency(work: bounds.Work, clk, latency_ns: float) -> float:
    """The fluid bound when a slot waits `L` between its CTAs (`bounds.fluid_ns`'s `launch_ns`)."""
    return float(bounds.fluid_ns(work, jnp.asarray(clk.sm_freq_mhz), latency_ns))


def _table(ds, spec, kernel: str, extra: dict[str, np.ndarray]) -> tuple[list[str], dict]:
    refs = {"fluid": ds["fluid_ns"].sel(kernel=kernel).values, "fluid+L": extra["fluid+L"],
            "fluid_ss+L": extra["fluid_ss+L"],
            "fluid_sm": ds["fluid_sm_ns"].sel(kernel=kernel).values,
            "uniform": ds["uniform_equivalent_ns"].sel(kernel=kernel).values,
            "clairvoyant": ds["clairvoyant_ns"].sel(kernel=kernel).values}
    rows, out = [], {}
    head = "| policy | " + " | ".join(f"{r}: mean / worst" for r in REFERENCES) + " |"
    rows += [head, "|" + "---|" * (len(REFERENCES) + 1)]
    entries = [(str(p), ds["makespan_ns"].sel(kernel=kernel, policy=p).values) for p in ds["policy"].values]
    entries += [("(uniform chip)", refs["uniform"]), ("(clairvoyant)", refs["clairvoyant"])]
    for label, makespan in entries:
        gaps = {r: makespan / refs[r] - 1 for r in REFERENCES}
        out[label] = {r: {"mean": float(np.mean(g)), "worst": float(np.max(g)), "min": float(np.min(g))}
                      for r, g in gaps.items()}
        rows.append(f"| {label} | " + " | ".join(f"{100 * np.mean(g):+.2f} / {100 * np.max(g):+.2f} %"
                                                 for g in gaps.values()) + " |")
    return rows, out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--arch", default=str(ROOT / "sweeps" / "arches" / "h200_8sm.toml"))
    parser.add_argument("--waves", type=int, nargs="+", default=[4, 8, 16])
    parser.add_argument("--spreads", type=int, nargs="+", default=[0, 32], help="cta_spread of the loop trip")
    parser.add_argument("--loop", type=int, default=256, help="trip count of the dependent-FMA loop")
    parser.add_argument("--sigma", type=float, default=0.1)
    parser.add_argument("--train-maps", type=int, default=8)
    parser.add_argument("--test-maps", type=int, default=12)
    parser.add_argument("--steps", type=int, default=30)
    parser.add_argument("--learning-rate", type=float, default=0.1)
    parser.add_argument("--temperature", type=float, default=0.05)
    parser.add_argument("--seed", type=int, default=7)
    parser.add_argument("--out", default=None, help="folder for dispatch.nc and dispatch.png")
    args = parser.parse_args()

    spec = dispatch_spec.loads(_spec_text(args), base_dir=ROOT, source="dispatch_fit_eval")
    t0 = time.perf_counter()
    _say(f"measuring work: {len(spec.kernels)} kernels, two uniform-chip runs each")
    prep = dispatch_spec.prepare(spec)
    prob, slots = dispatch_spec.problem(spec, prep)
    t_prep = time.perf_counter() - t0
    fits = {}
    for fam in spec.families:
        t1 = time.perf_counter()
        fits[fam] = dispatch_fit.fit(prob, fam, steps=args.steps, learning_rate=args.learning_rate,
                                     temperature=args.temperature, max_slots=slots,
                                     progress=lambda i, n, v, fam=fam: _say(f"  {fam} {i}/{n}: loss {v:.4f}")
                                     if i in (1, n) or i % 10 == 0 else None)
        _say(f"fit {fam}: {time.perf_counter() - t1:.0f} s, theta {({k: float(v[0]) for k, v in fits[fam].theta.items()})}")
    t_fit = time.perf_counter() - t0 - t_prep
    evaluation = dispatch_spec.evaluate(spec, prep, fits, slots, _say)
    ds = dispatch_spec.fit_dataset(spec, fits, evaluation)
    t_eval = time.perf_counter() - t0 - t_prep - t_fit

    latency_ns = float(spec.arch.cta_launch_ns)
    report = {"arch": spec.arch.name, "sm_count": spec.arch.sm_count, "sigma": args.sigma, "loop": args.loop,
              "train_maps": args.train_maps, "test_maps": args.test_maps, "steps": args.steps,
              "temperature": args.temperature, "cta_launch_ns": latency_ns,
              "learned": {fam: {k: float(v[0]) for k, v in r.theta.items()} for fam, r in fits.items()},
              "loss_first_last": {fam: [float(r.loss[0].mean()), float(r.loss[-1].mean())] for fam, r in fits.items()},
              "seconds": {"work": t_prep, "fit": t_fit, "engine_evaluation": t_eval}, "kernels": {}}
    lines = []
    for ki, kernel in enumerate(spec.kernels):
        steady = _steady_state_work(spec, kernel)
        extra = {"fluid+L": np.array([_fluid_with_latency(prep.works_bound[ki], c, latency_ns) for c in prep.test_clocks]),
                 "fluid_ss+L": np.array([_fluid_with_latency(steady, c, latency_ns) for c in prep.test_clocks])}
        rows, gaps = _table(ds, spec, kernel.name, extra)
        surrogate_err = np.abs(ds["surrogate_ns"].sel(kernel=kernel.name) / ds["makespan_ns"].sel(kernel=kernel.name) - 1)
        report["kernels"][kernel.name] = {
            "grid": int(kernel.grid_ctas), "gaps": gaps,
            "hard_surrogate_mean_abs_error": {str(p): float(surrogate_err.sel(policy=p).mean()) for p in ds["policy"].values}}
        title = f"\n{kernel.name} (grid {int(kernel.grid_ctas)}; makespan / reference - 1, {args.test_maps} held-out chips)"
        lines += [title, *rows]
    print("\n".join(lines), file=sys.stderr)
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        ds.to_netcdf(out / "dispatch.nc", engine="h5netcdf")
        from jaxsched.surrogate import plots

        plots.dispatch(ds, out / "dispatch.png")
    report["device"] = str(jax.devices()[0])
    report["js_version"] = getattr(js, "__version__", "")
    print(json.dumps(report, indent=1))


if __name__ == "__main__":
    main()
