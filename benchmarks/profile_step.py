"""Where a simulation step's time goes: times each phase of the event loop in isolation.

Uses the throughput workload (benchmarks/throughput.py) at a given batch and prints, per phase,
milliseconds per batched step and microseconds per configuration-step, plus the loop's step
count and ticks per step (how much event skipping saves).

    python benchmarks/profile_step.py --batch 1024
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp

from jaxsched.engine.cycle import run_tick
from jaxsched.engine.dispatch import dispatch, variation_tables
from jaxsched.engine.events import skip_to_next_event
from jaxsched.engine.launches import single
from jaxsched.engine.run import run_launch, stack
from jaxsched.engine.state import initial_state
from jaxsched.lower import lower, shapes_for
from throughput import workload


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--batch", type=int, default=256)
    parser.add_argument("--trips", type=int, default=4)
    parser.add_argument("--iters", type=int, default=20)
    args = parser.parse_args()
    arch, kernel, maps, _ = workload(args.batch, args.trips)
    shapes = shapes_for(arch, kernel)
    out: dict = {"device": str(jax.devices()[0].device_kind), "batch": args.batch}
    with jax.enable_x64(True):
        launches = jax.jit(jax.vmap(lambda c: lower(arch, kernel, c, 1, 0, 0)))(stack(maps))

        def timed(name, fn, *xs, per_step=True):
            f = jax.jit(fn)
            jax.block_until_ready(f(*xs))
            t0 = time.perf_counter()
            r = jax.block_until_ready(f(*xs))
            dt = time.perf_counter() - t0
            if per_step:
                dt /= args.iters
                out[name] = {"ms_per_step": round(dt * 1e3, 3),
                             "us_per_config_step": round(dt / args.batch * 1e6, 3)}
            else:
                out[name] = {"seconds": round(dt, 3)}
            return r

        variation = timed("variation_tables", jax.vmap(lambda L: variation_tables(L, shapes)),
                          launches, per_step=False)
        filled = timed("initial_dispatch", jax.vmap(
            lambda L, V: dispatch(initial_state(shapes), L, shapes, V, jnp.int32(0), single(L, shapes))),
            launches, variation, per_step=False)

        def repeat(step):
            return jax.vmap(lambda s, L, V: jax.lax.fori_loop(0, args.iters, lambda i, x: step(x, L, V), s))

        timed("run_tick", repeat(lambda s, L, V: run_tick(s, L, shapes, single(L, shapes))), filled, launches, variation)
        timed("dispatch_no_room", repeat(lambda s, L, V: dispatch(s, L, shapes, V, s.tick, single(L, shapes))),
              filled, launches, variation)
        timed("skip_to_next_event",
              repeat(lambda s, L, V: skip_to_next_event(s, L, shapes, jnp.bool_(False), single(L, shapes))),
              filled, launches, variation)
        final = timed("whole_run", jax.vmap(lambda L: run_launch(L, shapes, 1 << 30)), launches,
                      per_step=False)
        ticks = int(jnp.max(final.last_exit_tick)) + 1
        out["makespan_ticks_max"] = ticks
    print(json.dumps(out, indent=2))


if __name__ == "__main__":
    main()
