"""Summarise `sweeps/die_scaling.toml`: median makespan by kernel shape, dispatch policy and
per-SM clock spread, each policy's gap to the fluid lower bound and to the clairvoyant
earliest-finish schedule (`jaxsched.bounds`), markdown tables (stdout) and a figure.

The oracles need each kernel's per-CTA work: it is tabulated here from runs of the kernel on
uniform chips at `--table-clocks` clocks, evenly spaced in period from the boost clock to the
slowest SM clock of the sweep (`bounds.work_table_from_uniform`, each CTA's share of the
fastest run, the total of each run; docs/bounds.md section 1), then evaluated on every
configuration's clock map, with the architecture's CTA launch latency between a slot's CTAs
(`bounds.fluid_ns`'s `launch_ns`). The fluid lower bound is the larger of the two-clock work
model's slot bound (below; a strict bound in every measurement, docs/bounds.md section 5) and
the issue-slot bound (`issue_bound.issue_ns`: the kernel's instructions and the launch credit
its refills need, over the schedulers' issue cycles; docs/bounds.md section 7), whose demand
is counted from the run at the boost clock. The two runs at 1980 and 1188 MHz (`uniform_runs`)
give the uniform chip at each chip's mean clock (`bounds.uniform_chip`) and the two-clock
work model (`bounds.work_from_uniform`), whose clairvoyant schedule is printed beside.

A table gives each policy's share of hardware dispatch's loss that it wins back
(`bounds.recovered`, median over the chips), against the clairvoyant schedule, against the
uniform chip at each chip's mean clock and against the two-clock model's clairvoyant schedule;
the last one, per policy, the mean share against the clairvoyant schedule (and in brackets
against the two-clock model's), the share of chips on which it beats hardware dispatch, and
its change against hardware dispatch on the uniform chip (sigma 0): issue 35's acceptance test.

A sweep with a `kernel.grid` dimension beside `kernel.variant` (sweeps/dispatch_recovery.toml)
is reported per variant and grid; one that also sweeps the policies' parameters (`policy.
hold_margin`, `policy.ema_alpha`, ...) reports each combination as a policy of its own.

    python experiments/die_scaling_report.py OUT|reduced.nc [--png docs/img/die_scaling.png]
        [--spec sweeps/die_scaling_ms.toml] [--table-clocks 8]
"""

from __future__ import annotations

import argparse
import dataclasses
import itertools
from pathlib import Path

import jax
import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt
import numpy as np
import xarray as xr

import jaxsched as js
from jaxsched import bounds, issue_bound, sweep

SPEC = Path(__file__).resolve().parent.parent / "sweeps" / "die_scaling.toml"  # default --spec
TWO_CLOCKS = "two-clock model's clairvoyant schedule"  # bounds.work_from_uniform


def uniform_runs(arch: js.Arch, kernel: js.Kernel) -> list[js.Result]:
    """The kernel on a uniform chip at 1980 and 1188 MHz (hardware dispatch)."""
    return [js.simulate(arch, kernel, js.clocks.uniform(arch, ghz)) for ghz in (1.98, 1.188)]


def table_runs(arch: js.Arch, kernel: js.Kernel, slowest_mhz: float, n: int) -> list[js.Result]:
    """The kernel on uniform chips at `n` clocks evenly spaced in period from the boost clock to
    `slowest_mhz` (hardware dispatch): the runs of the tabulated work model."""
    boost_mhz = 1000.0 * float(arch.boost_clock_ghz)
    periods = np.linspace(1000.0 / boost_mhz, 1000.0 / min(slowest_mhz, boost_mhz - 1.0), n)
    chips = [js.clocks.uniform(arch, 1.0 / p) for p in periods]
    warp = js.WARP_POLICIES.index(js.policies.DEFAULT_WARP_POLICY)
    batch = js.simulate_batch([arch] * n, [kernel] * n, chips, [warp] * n, [js.DISPATCH_POLICIES.index("hardware")] * n,
                              [0] * n)  # one compilation, the same runs as one by one
    return [jax.tree.map(lambda leaf, i=i: leaf[i], batch) for i in range(n)]


def policies_by_parameters(ds):
    """`ds` with one `policy_dispatch` entry per policy and combination of the swept policy
    parameters (other `policy_*` dimensions than the dispatch policy and the warp policy), named
    `closed_loop (hold_margin 0.125, hold_noise 0.5)`; hardware dispatch, which reads none of
    them, once (its runs are the same for every combination)."""
    dims = [str(d) for d in ds.dims if str(d).startswith("policy_") and d not in ("policy_dispatch", "policy_warp")]
    if not dims:
        return ds
    parts, labels = [], []
    combos = list(itertools.product(*(ds[d].values for d in dims)))
    for policy in (str(p) for p in ds.policy_dispatch.values):
        for combo in combos[:1] if policy == "hardware" else combos:
            parts.append(ds.sel(policy_dispatch=policy, **dict(zip(dims, combo))).drop_vars(dims + ["policy_dispatch"]))
            values = ", ".join(f"{d.removeprefix('policy_')} {v:g}" for d, v in zip(dims, combo))
            labels.append(policy if policy == "hardware" else f"{policy} ({values})")
    return xr.concat(parts, dim="policy_dispatch").assign_coords(policy_dispatch=labels)


def cases(ds, spec: sweep.Sweep) -> list[tuple[str, dict, js.Kernel]]:
    """(label, selection, kernel) of each kernel the sweep ran: per variant, and per grid where
    `kernel.grid` is swept too."""
    variants = spec.base[sweep.sweep_paths.VARIANTS]
    out = []
    for variant in (str(v) for v in ds.kernel_variant.values):
        if "kernel_grid" in ds.dims:
            out += [(f"{variant}, {int(g)} CTAs", {"kernel_variant": variant, "kernel_grid": g},
                     variants[variant].replace(grid_ctas=np.asarray(int(g), np.int32))) for g in ds.kernel_grid.values]
        else:
            out.append((variant, {"kernel_variant": variant}, variants[variant]))
    return out


def clock_maps(ds, arch: js.Arch, where: dict) -> tuple[np.ndarray, tuple[int, ...]]:
    """Every configuration's clock map of the case `where`, one row per configuration with one
    clock per SM slot (0 on disabled ones), and the configurations' shape [dispatch, sigma,
    replicate]."""
    mhz = np.asarray(ds.sm_freq_mhz.sel(where), dtype=np.float32)
    full = np.zeros(mhz.shape[:-1] + (arch.n_sm_slots,), np.float32)
    full[..., : mhz.shape[-1]] = mhz  # enabled SMs are the first slots
    return full.reshape(-1, arch.n_sm_slots), mhz.shape[:-1]


def per_map(fn, maps: np.ndarray, shape: tuple[int, ...]):
    """`fn(clock map)` over the rows of `maps` (an array or a tree of them), shaped `shape`; in
    batches of `lax.map`: one vmap over every map would hold CTAs x SMs per map at once (30 GB)."""
    out = jax.jit(lambda fs: jax.lax.map(fn, fs, batch_size=64))(maps)
    return jax.tree.map(lambda b: np.asarray(b).reshape(shape), out)


def oracle_bounds(arch: js.Arch, kernel: js.Kernel, work: bounds.AnyWork, first: js.Result, maps: np.ndarray,
                  shape: tuple[int, ...]) -> bounds.Bounds:
    """Fluid lower bound and clairvoyant schedules (ns) of `work` on each clock map of `maps`,
    shaped `shape`; the issue-slot bound's demand from the run `first`."""
    demand = issue_bound.issue_demand(first, arch, kernel)
    launch_ns = float(arch.cta_launch_ns)  # a freed slot's next CTA starts this much later
    out = per_map(lambda f: bounds.bounds(work, f, launch_ns), maps, shape)
    issue_ns = np.asarray(jax.vmap(issue_bound.issue_ns, (None, 0))(demand, maps)).reshape(shape)
    return dataclasses.replace(out, fluid_ns=np.maximum(out.fluid_ns, issue_ns))


def paired_table(ds, sigmas: list[float], where: list[tuple[str, dict]]) -> str:
    """Each policy against hardware dispatch on the same chips (common random numbers): mean and
    worst per-chip change of the makespan, and the share of chips where the policy wins."""
    rows = ["| kernel | policy | " + " | ".join(f"σ = {s:g}" for s in sigmas) + " |",
            "|---|---|" + "---|" * len(sigmas)]
    for label, sel in where:
        make = ds.makespan_ns.sel(sel)
        for policy in (p for p in ds.policy_dispatch.values if p != "hardware"):
            change = np.asarray(make.sel(policy_dispatch=policy) / make.sel(policy_dispatch="hardware") - 1.0)
            cells = [f"{100 * c.mean():+.1f} % (worst {100 * c.max():+.1f} %, wins {100 * np.mean(c < 0):.0f} %)"
                     for c in change]
            rows.append(f"| {label} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def _shares(ds, sel: dict, policy: str, reference: np.ndarray, j: int) -> np.ndarray:
    """[replicate] recovered shares of `policy` at the `j`-th spread against `reference`
    [dispatch, sigma, replicate]."""
    make = ds.makespan_ns.sel(sel).isel(clocks_sigma=j)
    index = list(ds.policy_dispatch.values).index(policy)
    return bounds.recovered(np.asarray(make.sel(policy_dispatch="hardware")),
                            np.asarray(make.sel(policy_dispatch=policy)), reference[index, j])


def recovered_table(ds, sigmas: list[float], where: list[tuple[str, dict]],
                    references: dict[str, dict[str, np.ndarray]]) -> str:
    """Per kernel, policy and spread: the median share of hardware dispatch's loss a policy wins
    back against each reference (`references[label][name]`: ns per [dispatch, sigma,
    replicate]); no share at a spread where hardware dispatch loses nothing."""
    names = list(next(iter(references.values())))
    rows = ["| kernel | policy | " + " | ".join(f"σ = {s:g}" for s in sigmas if s > 0) + " |",
            "|---|---|" + "---|" * sum(s > 0 for s in sigmas)]
    for label, sel in where:
        for policy in (p for p in ds.policy_dispatch.values if p != "hardware"):
            cells = [" / ".join(f"{100 * np.nanmedian(_shares(ds, sel, policy, references[label][n], j)):.0f} %"
                                for n in names) for j, s in enumerate(sigmas) if s > 0]
            rows.append(f"| {label} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def acceptance_table(ds, sigmas: list[float], where: list[tuple[str, dict]],
                     references: dict[str, dict[str, np.ndarray]]) -> str:
    """Per kernel and policy: at each spread the mean recovered share of hardware dispatch's mean
    gap to the clairvoyant schedule (and in brackets to the two-clock model's) and the share of
    chips faster than hardware dispatch; at sigma 0 the change against hardware dispatch (every
    replicate is the same uniform chip)."""
    spread = [(j, s) for j, s in enumerate(sigmas) if s > 0]
    uniform = [j for j, s in enumerate(sigmas) if s == 0]
    rows = ["| kernel | policy | " + " | ".join(f"σ = {s:g}: recovered of the gap, faster" for _, s in spread)
            + (" | uniform chip |" if uniform else " |"), "|---|---|" + "---|" * (len(spread) + bool(uniform))]
    for label, sel in where:
        make = ds.makespan_ns.sel(sel)
        hw = np.asarray(make.sel(policy_dispatch="hardware"))
        for policy in (p for p in ds.policy_dispatch.values if p != "hardware"):
            mine = np.asarray(make.sel(policy_dispatch=policy))

            def won(name: str, j: int) -> str:
                ref = references[label][name][list(ds.policy_dispatch.values).index(policy), j]
                share = np.nanmean(_shares(ds, sel, policy, references[label][name], j))
                return f"{100 * share:.0f} % of {100 * np.mean(hw[j] / ref - 1):.1f} %"

            cells = [f"{won('clairvoyant', j)} ({won(TWO_CLOCKS, j)}), {100 * np.mean(mine[j] < hw[j]):.0f} %"
                     for j, _ in spread]
            cells += [f"{100 * np.mean(mine[j] / hw[j] - 1):+.2f} %" for j in uniform]
            rows.append(f"| {label} | {policy} | " + " | ".join(cells) + " |")
    return "\n".join(rows)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("out")
    parser.add_argument("--png", default=None)
    parser.add_argument("--spec", default=str(SPEC), help="the sweep spec OUT ran (its arch and kernels)")
    parser.add_argument("--table-clocks", type=int, default=8, help="uniform runs of the tabulated work model")
    args = parser.parse_args()
    ds = xr.open_dataset(args.out, engine="h5netcdf") if args.out.endswith(".nc") else sweep.open_result(args.out)
    ds = policies_by_parameters(ds)
    spec = sweep.load(args.spec)
    arch = spec.arch
    where = cases(ds, spec)
    policies = list(ds.policy_dispatch.values)
    sigmas = [float(s) for s in ds.clocks_sigma.values]
    fig, axes = plt.subplots(1, len(where), figsize=(5 * len(where), 4), squeeze=False)
    references: dict[str, dict[str, np.ndarray]] = {}
    print("Median makespan (median gap to the fluid bound; to the clairvoyant schedule)")
    print("| kernel | policy | " + " | ".join(f"σ = {s:g}" for s in sigmas) + " |")
    print("|---|---|" + "---|" * len(sigmas))
    for ax, (variant, sel, kernel) in zip(axes[0], where):
        runs = uniform_runs(arch, kernel)
        maps, shape = clock_maps(ds, arch, sel)
        table = table_runs(arch, kernel, float(np.min(maps[maps > 0])), args.table_clocks)
        work = bounds.work_table_from_uniform(*table)
        clairvoyant = per_map(lambda f: bounds.clairvoyant_ns(work, f, float(arch.cta_launch_ns)), maps, shape)
        two_clocks = oracle_bounds(arch, kernel, bounds.work_from_uniform(*runs), runs[0], maps, shape)
        mean_mhz = np.asarray(ds.sm_freq_mhz.sel(sel), np.float64).mean(axis=-1)
        references[variant] = {"clairvoyant": clairvoyant,
                               "uniform chip": np.asarray(bounds.uniform_chip(*runs).makespan_ns(mean_mhz)),
                               TWO_CLOCKS: two_clocks.clairvoyant_ns}
        fluid = two_clocks.fluid_ns
        make = np.asarray(ds.makespan_ns.sel(sel))  # [dispatch, sigma, replicate]
        gap = make / fluid - 1.0
        gap_cv = make / clairvoyant - 1.0
        for i, policy in enumerate(policies):
            med = np.median(make[i], axis=-1)
            cells = [f"{m / 1000:.2f} µs ({100 * np.median(g):+.1f} %; {100 * np.median(h):+.1f} %)"
                     for m, g, h in zip(med, gap[i], gap_cv[i])]
            print(f"| {variant} | {policy} | " + " | ".join(cells) + " |")
            ax.plot(sigmas, med / 1000, marker="o", label=policy)
            lo, hi = np.percentile(make[i], [25, 75], axis=-1)
            ax.fill_between(sigmas, lo / 1000, hi / 1000, alpha=0.15)
        ax.plot(sigmas, np.median(fluid, axis=(0, -1)) / 1000, "k--", label="fluid lower bound")
        ax.set_title(variant)
        ax.set_xlabel("per-SM clock spread σ")
        ax.set_ylabel("makespan (µs), median and IQR")
    labels = [(label, sel) for label, sel, _ in where]
    print()
    print(paired_table(ds, sigmas, labels))
    print()
    print("Share of hardware dispatch's loss won back (median over chips): against the clairvoyant "
          f"schedule / the uniform chip at the chip's mean clock / the {TWO_CLOCKS}")
    print(recovered_table(ds, sigmas, labels, references))
    print()
    print("Mean share of hardware dispatch's gap to the clairvoyant schedule won back, of its mean gap (in "
          f"brackets: to the {TWO_CLOCKS}), share of chips faster than hardware dispatch; change against "
          "hardware dispatch on the uniform chip")
    print(acceptance_table(ds, sigmas, labels, references))
    axes[0][0].legend(fontsize=8)
    fig.tight_layout()
    if args.png:
        fig.savefig(args.png, dpi=120)


if __name__ == "__main__":
    main()
