"""How much of hardware dispatch's gap to the clairvoyant schedule an online dispatcher could win
back if it knew every SM's speed, in `jaxsched.bounds`' work model (docs/studies.md, "Clock
regression"): the ceiling for policies that learn speeds, such as the closed loop.

The kernel's per-CTA work comes from two uniform runs (1980 and 1188 MHz, as
`experiments/die_scaling_report.py`), with the architecture's CTA launch latency between a
slot's CTAs. On each Gaussian chip (mean 1.8 GHz) three schedules of the grid, CTAs in grid
order, each slot running one CTA at a time:
- *greedy*: a CTA goes to a free slot as soon as one frees, on the SM with the most free slots
  (hardware dispatch's rule, knowing nothing);
- *known speeds*: the closed loop's placement and tail hold (docs/model.md section 9) with the
  true mean CTA time of each SM as its estimate, the kernel's mean CTA work at the SM's clock,
  and a hold margin (a share of the candidate's estimate); it does not know a CTA's own work;
- the clairvoyant earliest-finish schedule (`bounds.clairvoyant_ns`: every CTA's work known).
Printed per spread and margin: the known-speed schedule's mean change against greedy, its mean
share `(T_greedy - T) / (T_greedy - T_clairvoyant)` and the share of chips it wins.

    python experiments/known_speeds.py [--kernel few_long_ctas] [--grid 1056] [--chips 16]
"""

from __future__ import annotations

import argparse
import functools
from pathlib import Path

import jax
import jax.numpy as jnp
import numpy as np

import jaxsched as js
from jaxsched import bounds, clocks, presets
from jaxsched.bounds import Work
from jaxsched.kernel import load_kernel

KERNELS = Path(__file__).resolve().parent.parent / "sweeps" / "kernels"
MARGINS = (0.0, 1 / 32, 1 / 16, 1 / 8, 1 / 4)


@functools.partial(jax.jit, static_argnames=("knows_speeds",))
def online_ns(work: Work, sm_freq_mhz: jax.Array, launch_ns: float, margin: float, knows_speeds: bool) -> jax.Array:
    """Makespan (ns) of the greedy (`knows_speeds=False`) or known-speed online schedule, plus
    the launch tick, as `bounds.clairvoyant_ns` counts it."""
    f = jnp.asarray(sm_freq_mhz, jnp.float32)
    work = bounds._plus_latency(work, launch_ns)
    a = bounds._cta_ns(work, f)  # [cta, sm]: true times
    k = work.slots_per_sm
    usable = jnp.repeat(f > 0, k)
    n = jnp.sum(work.valid)
    expected = jnp.where(usable, jnp.repeat(jnp.sum(jnp.where(work.valid[:, None], a, 0.0), 0) / n, k), jnp.inf)
    sm_of = jnp.arange(usable.shape[0]) // k

    def place(carry, cta):
        now, end, start, left = carry
        a_c, valid = cta

        def body(st):
            now, end, start, _ = st
            free = usable & (end <= now)
            if knows_speeds:
                s = jnp.argmin(jnp.where(free, expected, jnp.inf))
                busy_finish = jnp.maximum(now, start + expected) + expected
                better = usable & ~free & (busy_finish + margin * expected[s] < now + expected[s])
                hold = left <= jnp.sum(better)
            else:
                room = jax.ops.segment_sum(free.astype(jnp.int32), sm_of, num_segments=f.shape[0])
                s = jnp.argmax(jnp.where(free, room[sm_of] * usable.shape[0] - sm_of, -1))
                hold = jnp.bool_(False)
            go = jnp.any(free) & ~hold
            later = jnp.min(jnp.where(usable & (end > now), end, jnp.inf))
            return (jnp.where(go, now, later), jnp.where(go, end.at[s].set(now + jnp.repeat(a_c, k)[s]), end),
                    jnp.where(go, start.at[s].set(now), start), go)

        now, end, start, _ = jax.lax.while_loop(lambda st: ~st[3], body, (now, end, start, ~valid))
        return (now, end, start, left - valid.astype(left.dtype)), None

    zeros = jnp.zeros(usable.shape, jnp.float32)
    (_, end, _, _), _ = jax.lax.scan(place, (jnp.float32(0), zeros, zeros, n.astype(jnp.int32)), (a, work.valid))
    return jnp.max(jnp.where(usable, end, 0.0)) - launch_ns + bounds._launch_tick_ns(f)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--kernel", default="few_long_ctas", help="a kernel of sweeps/kernels/")
    parser.add_argument("--grid", type=int, default=1056, help="CTAs (1056: 4 waves of few long CTAs)")
    parser.add_argument("--chips", type=int, default=16, help="chips per spread")
    args = parser.parse_args()
    arch = presets.get("h200")
    kernel = load_kernel(KERNELS / f"{args.kernel}.toml").replace(grid_ctas=np.asarray(args.grid, np.int32))
    work = bounds.work_from_uniform(*(js.simulate(arch, kernel, clocks.uniform(arch, ghz)) for ghz in (1.98, 1.188)))
    launch_ns = float(arch.cta_launch_ns)
    print(f"{args.kernel}, {args.grid} CTAs, {args.chips} chips per spread (seeds 1000..)")
    for sigma in (0.1, 0.2):
        maps = [np.asarray(clocks.gaussian(arch, 1000 + i, 1.8, sigma).sm_freq_mhz, np.float32)
                for i in range(args.chips)]
        clairvoyant = np.array([float(bounds.clairvoyant_ns(work, f, launch_ns)) for f in maps])
        greedy = np.array([float(online_ns(work, f, launch_ns, 0.0, knows_speeds=False)) for f in maps])
        print(f"sigma {sigma}: greedy {100 * np.mean(greedy / clairvoyant - 1):.2f} % above the clairvoyant schedule")
        for margin in MARGINS:
            known = np.array([float(online_ns(work, f, launch_ns, margin, knows_speeds=True)) for f in maps])
            share = bounds.recovered(greedy, known, clairvoyant)
            print(f"  margin {margin:.4f}: {100 * np.mean(known / greedy - 1):+.2f} % against greedy, "
                  f"recovered {100 * np.nanmean(share):.0f} %, faster on {100 * np.mean(known < greedy):.0f} % of chips")


if __name__ == "__main__":
    main()
