"""Issue 7, dispatch-fit acceptance: learned dispatch parameters on held-out chips, in the exact engine.

Fits the `weighted` family (`w_s = (f_s / mean f)^gamma`) and the `closed_loop` family
(`ema_alpha`, `ema_prior_ns`) through the soft surrogate on `--train-maps` chips, then runs every
policy with `js.simulate_batch` on `--test-maps` *other* chips (other seeds) and prints, per
kernel, the mean and worst gap of each policy's makespan to each reference, and each policy's mean
makespan change against hardware dispatch on the same chips (`against_hardware`):

- `fluid`: the fluid lower bound, the larger of the two below (the issue's reference);
- `fluid_slot`: `bounds.fluid_ns` of the slot work model (docs/bounds.md): per-CTA slot
  occupancy, measured on uniform chips at two clocks;
- `fluid_issue`: `issue_bound.issue_ns` (docs/bounds.md section 7): the launch's instructions,
  plus the starved scheduler-cycles its refills must collect as launch credit, over the chip's
  scheduler-cycles per ns;
- `fluid_sm`: `bounds.fluid_ns` of the SM-attributed work (each SM's busy time split among its
  resident CTAs, one server per SM): tighter, *not strict* (it carries the uniform run's tail);
- `uniform`: the exact engine on a uniform chip at the map's mean clock (what perfect balancing
  would give, the kernel's own tail included): a reference, not a bound;
- `clairvoyant`: `bounds.clairvoyant_ns` of the slot work model (an upper bound on the slot
  model's optimum, not a bound on the engine).

Policies: `hardware`, `weighted` by the true clocks, the learned weights, `closed_loop` with the
engine's defaults (alpha 0.25, prior 0) and with the fitted parameters.

    python experiments/dispatch_fit_eval.py [--waves 4 8 16] [--train-maps 8] [--test-maps 12]
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
import numpy as np

import jaxsched as js
from jaxsched.surrogate import dispatch_fit, dispatch_spec

ROOT = Path(__file__).resolve().parent.parent
REFERENCES = ("fluid", "fluid_slot", "fluid_issue", "fluid_sm", "uniform", "clairvoyant")


def _say(message: str) -> None:
    print(message, file=sys.stderr, flush=True)


def _against_hardware(ds, kernel: str) -> dict:
    """Per policy, over the held-out chips: the mean of `makespan / hardware makespan - 1` on the
    same chip, and the share of chips where the policy is faster than hardware dispatch."""
    m = ds["makespan_ns"].sel(kernel=kernel)
    change = m / m.sel(policy="hardware") - 1
    return {str(p): {"mean_change": float(change.sel(policy=p).mean()),
                     "faster_share": float((change.sel(policy=p) < 0).mean())} for p in ds["policy"].values}


def _spec_text(args, wave_ctas: int) -> str:
    """The spec: per `--waves` and `--spreads`, a kernel of `waves * wave_ctas` CTAs."""
    kernels = []
    for waves in args.waves:
        for spread in args.spreads:
            body = f"loop {args.loop}" + (f" cta_spread={spread}" if spread else "") + "\\n fma dep\\nend"
            kernels.append(f'[[kernels]]\nname = "fma{args.loop}_spread{spread}_{waves}wave"\ngrid = {waves * wave_ctas}\n'
                           f'threads = 256\nregs = 32\nprogram = "{body}"\n')
    return (f'title = "issue 7 dispatch-fit acceptance"\narch = "{args.arch}"\nwarp_policy = "gto"\nseed = {args.seed}\n'
            f'families = ["weighted", "closed_loop"]\n' + "\n".join(kernels) +
            f'[clocks]\nmodel = "gaussian"\nmean_ghz = 1.8\nsigma = {args.sigma}\ntrain_maps = {args.train_maps}\n'
            f'test_maps = {args.test_maps}\n[fit]\nsteps = {args.steps}\nlearning_rate = {args.learning_rate}\n'
            f'temperature = {args.temperature}\nper_chip = false\n')


def _table(ds, kernel: str) -> tuple[list[str], dict]:
    variable = {"fluid": "fluid_ns", "fluid_slot": "fluid_slot_ns", "fluid_issue": "fluid_issue_ns",
                "fluid_sm": "fluid_sm_ns", "uniform": "uniform_equivalent_ns", "clairvoyant": "clairvoyant_ns"}
    refs = {r: ds[variable[r]].sel(kernel=kernel).values for r in REFERENCES}
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

    one_wave = dispatch_spec.loads(_spec_text(args, 1), base_dir=ROOT, source="dispatch_fit_eval")
    wave_ctas = js.resident_grid(one_wave.arch, one_wave.kernels[0])  # CTAs resident at once
    spec = dispatch_spec.loads(_spec_text(args, wave_ctas), base_dir=ROOT, source="dispatch_fit_eval")
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
    for kernel in spec.kernels:
        rows, gaps = _table(ds, kernel.name)
        surrogate_err = np.abs(ds["surrogate_ns"].sel(kernel=kernel.name) / ds["makespan_ns"].sel(kernel=kernel.name) - 1)
        against = _against_hardware(ds, kernel.name)
        report["kernels"][kernel.name] = {
            "grid": int(kernel.grid_ctas), "gaps": gaps, "against_hardware": against,
            "hard_surrogate_mean_abs_error": {str(p): float(surrogate_err.sel(policy=p).mean()) for p in ds["policy"].values}}
        title = f"\n{kernel.name} (grid {int(kernel.grid_ctas)}; makespan / reference - 1, {args.test_maps} held-out chips)"
        vs = ", ".join(f"{p} {100 * a['mean_change']:+.2f} % ({100 * a['faster_share']:.0f} % of chips faster)"
                       for p, a in against.items() if p != "hardware")
        lines += [title, *rows, f"against hardware dispatch: {vs}"]
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
