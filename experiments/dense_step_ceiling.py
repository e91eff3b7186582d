"""How fast could *any* dense XLA step be? A lower bound on the engine's per-step cost (issue 3).

The engine evaluates every warp slot of every SM at every simulated cycle (docs/engine_performance.md, "Where the
time goes"). This script times a deliberately minimal step with the same shape and the same
structure, but a fraction of the work: per warp slot, only what any cycle-level model of issue
must do. It is *not* a simulator and its numbers mean nothing; its speed is a ceiling for a
rewrite of the engine's step that keeps the dense layout (a `while_loop` over ticks, state as
`[batch, SM, warp slot]` arrays):

- eligibility: active and the scoreboard's ready cycle reached (one compare, one and);
- selection: the oldest eligible warp per scheduler (a masked argmin over 16 warps);
- issue: the selected warp's ready cycle moves on by a fixed latency and its age to the back;
- accounting: per SM, issued and eligible-but-not-selected warps (two sums).

About 15 element operations per warp slot and cycle, against about 1,100 in the engine.
Throughput is reported like `throughput.py`: simulated SM-cycles per second, with the device,
the batch, the compile time and the CPU time of the run.

    python experiments/dense_step_ceiling.py [--batch 8] [--steps 20000] [--sms 132]
"""

from __future__ import annotations

import argparse
import json
import time

import jax
import jax.numpy as jnp
import numpy as np

WARPS, SCHEDULERS, LATENCY = 64, 4, 4


def make(batch: int, sms: int):
    """A compiled function: `steps` (traced) minimal cycles of `batch` chips of `sms` SMs, which
    returns the instructions issued per chip and SM."""
    slots = jnp.arange(WARPS, dtype=jnp.int32)

    def chip(seed, steps):
        ready = (slots * 7 + seed) % 5  # staggered start
        age = jnp.broadcast_to(slots, (sms, WARPS))
        state = (jnp.int32(0), jnp.broadcast_to(ready, (sms, WARPS)), age,
                 jnp.zeros((sms,), jnp.int32), jnp.zeros((sms,), jnp.int32))

        def step(_, s):
            cycle, ready, age, issued, waiting = s
            eligible = ready <= cycle
            key = jnp.where(eligible, age, jnp.iinfo(jnp.int32).max).reshape(sms, -1, SCHEDULERS)
            q_sel = jnp.argmin(key, axis=1)
            has = jnp.any(eligible.reshape(sms, -1, SCHEDULERS), axis=1)
            sel = ((jnp.arange(WARPS // SCHEDULERS)[None, :, None] == q_sel[:, None, :]) & has[:, None, :]).reshape(sms, WARPS)
            ready = jnp.where(sel, cycle + LATENCY, ready)
            age = jnp.where(sel, age + WARPS, age)
            issued = issued + jnp.sum(sel, axis=1, dtype=jnp.int32)
            waiting = waiting + jnp.sum(eligible & ~sel, axis=1, dtype=jnp.int32)
            return cycle + 1, ready, age, issued, waiting

        return jax.lax.fori_loop(0, steps, step, state)[3]

    batched = jax.jit(jax.vmap(chip, in_axes=(0, None)))
    return lambda steps: batched(jnp.arange(batch, dtype=jnp.int32), jnp.int32(steps))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=8)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--sms", type=int, default=132)
    args = parser.parse_args()
    run = make(args.batch, args.sms)
    t0 = time.perf_counter()
    run(8).block_until_ready()  # compiles (the step count is traced)
    compile_s = time.perf_counter() - t0
    c0, t0 = time.process_time(), time.perf_counter()
    issued = run(args.steps).block_until_ready()
    wall_s, cpu_s = time.perf_counter() - t0, time.process_time() - c0
    print(json.dumps({
        "device": str(jax.devices()[0].device_kind), "batch": args.batch, "sms": args.sms, "steps": args.steps,
        "sm_cycles_per_s": args.batch * args.sms * args.steps / wall_s, "wall_s": round(wall_s, 2),
        "cpu_s": round(cpu_s, 2), "compile_s_with_a_short_run": round(compile_s, 2),
        "issued_per_sm_cycle": float(np.asarray(issued, np.int64).sum()) / (args.batch * args.sms * args.steps)}))


if __name__ == "__main__":
    main()
