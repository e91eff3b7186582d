"""How fast could a hand-written step be that keeps a chip's warp state on chip? (issue 3)

`dense_step_ceiling.py` bounds any XLA step that keeps the dense layout: its `while_loop` body
reads and writes every array in HBM at every cycle, so on the H200 it is bound by memory
bandwidth at 1.7e9 SM-cycles/s, below the issue's 3e9. The way out named there is a kernel that
holds a configuration's warp state in registers across all of its cycles. This script measures
that way: the same minimal rules as `dense_step_ceiling.py` (eligibility, the oldest eligible warp
per scheduler, the issue update, two per-SM counters), as one Pallas (Triton) program per chip
that loops over the cycles inside the kernel and writes only its counters back. With
`--fields N`, each warp slot carries N more fields, each written back at the issuing warp and
read at it through a masked sum (as the engine's write-back and picks do), to see what a fuller
state costs once it no longer fits the register file. With `--coupled`, every issue also joins a
chip-wide queue in (SM, scheduler) order, the cross-SM dependence of the engine's L2 and DRAM
queues. Triton's blocks are powers of two, so 132 SMs take 256 columns; `--sms 128` shows the
layout without padding.

Like `dense_step_ceiling.py` it is not a simulator; its speed is a ceiling for such a design.
`--check` compares its counters with `dense_step_ceiling.py`'s step on the same chips (both run
the same rules; on the CPU the kernel runs in Pallas's interpreter).

    python benchmarks/onchip_step_ceiling.py [--batch 4096] [--steps 20000] [--sms 132] [--fields 0]
        [--coupled] [--num-warps 8] [--check]
"""

from __future__ import annotations

import argparse
import functools
import json
import time

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

import dense_step_ceiling as dense

WARPS, SCHEDULERS, LATENCY = dense.WARPS, dense.SCHEDULERS, dense.LATENCY
PER_SCHEDULER = WARPS // SCHEDULERS
BIG = np.iinfo(np.int32).max


def _init(seed, sms: int, sms_pad: int, fields: int) -> tuple:
    """A chip's state at cycle 0. Slot w = 4 q + s is warp q of scheduler s, as in
    `dense_step_ceiling.py`; each scheduler's warps are a [16, sms_pad] block."""
    q = jax.lax.broadcasted_iota(jnp.int32, (PER_SCHEDULER, sms_pad), 0)
    live = jax.lax.broadcasted_iota(jnp.int32, (PER_SCHEDULER, sms_pad), 1) < sms
    slots = [q * SCHEDULERS + s for s in range(SCHEDULERS)]
    ready = tuple(jnp.where(live, (w * 7 + seed) % 5, BIG) for w in slots)  # padding never issues
    extra = tuple(w * (f + 1) for w in slots for f in range(fields))
    zeros = jnp.zeros((sms_pad,), jnp.int32)
    return ready, tuple(slots), extra, zeros, zeros, zeros, jnp.zeros((), jnp.int32)


def _step(cycle, carry: tuple, fields: int, coupled: bool) -> tuple:
    """One cycle of a chip. With `coupled`, every issue joins a chip-wide queue in (SM,
    scheduler) order, as the engine's L2 and DRAM queues do, and waits for the requests before
    it: a prefix sum across the SMs in every cycle, the one cross-SM dependence that stops an SM's
    cycles from running apart from the others'. Blocks are [16 warps, sms_pad] per scheduler."""
    ready, age, extra, issued, waiting, picked, queue = carry
    new_ready, new_age, new_extra, sels = [], [], [], []
    for s in range(SCHEDULERS):
        eligible = ready[s] <= cycle
        key = jnp.where(eligible, age[s], BIG)
        least = jnp.min(key, axis=0)
        sel = (key == least[None, :]) & (least < BIG)[None, :]
        sels.append(sel)
        waiting = waiting + jnp.sum((eligible & ~sel).astype(jnp.int32), axis=0)
        new_age.append(jnp.where(sel, age[s] + WARPS, age[s]))
        for f in range(fields):
            x = extra[s * fields + f]
            value = jnp.sum(jnp.where(sel, x, 0), axis=0)  # the issuing warp's field
            picked = picked + value
            new_extra.append(jnp.where(sel, x + value + cycle, x))
    has = [jnp.max(sel.astype(jnp.int32), axis=0) for sel in sels]  # [sms_pad] per scheduler
    per_sm = sum(has)
    issued = issued + per_sm
    if coupled:
        sm_before = jnp.cumsum(per_sm) - per_sm
    for s in range(SCHEDULERS):
        latency = LATENCY
        if coupled:
            ahead = queue + sm_before + sum(has[:s])  # requests ahead in (SM, scheduler) order
            latency = LATENCY + jnp.minimum(ahead >> 6, 400)[None, :]
        new_ready.append(jnp.where(sels[s], cycle + latency, ready[s]))
    if coupled:
        queue = jnp.maximum(queue + jnp.sum(per_sm) - 256, 0)
    return tuple(new_ready), tuple(new_age), tuple(new_extra), issued, waiting, picked, queue


def _kernel(out_ref, other_ref, *, steps: int, sms: int, sms_pad: int, fields: int, coupled: bool):
    """One chip: `steps` cycles with every warp slot's state in registers, then the issued
    instructions per SM into `out_ref` ([1, sms_pad]) and the other counters into `other_ref`."""
    carry = _init(pl.program_id(0), sms, sms_pad, fields)
    _, _, _, issued, waiting, picked, _ = jax.lax.fori_loop(
        0, steps, lambda c, x: _step(c, x, fields, coupled), carry)
    out_ref[...] = issued[None, :]
    other_ref[...] = (waiting ^ picked)[None, :]


def twin(batch: int, sms: int, steps: int, fields: int, coupled: bool):
    """The same chips as `make`, as an XLA loop (the check of the kernel's lowering)."""
    sms_pad = pl.next_power_of_2(sms)

    def chip(seed):
        carry = jax.lax.fori_loop(0, steps, lambda c, x: _step(c, x, fields, coupled),
                                  _init(seed, sms, sms_pad, fields))
        return carry[3][:sms], carry[4] ^ carry[5]

    return jax.jit(lambda: jax.vmap(chip)(jnp.arange(batch, dtype=jnp.int32)))


def make(batch: int, sms: int, steps: int, fields: int, coupled: bool, num_warps: int, interpret: bool):
    """A compiled function of no arguments: `steps` cycles of `batch` chips, one program each;
    returns the instructions issued per chip and SM ([batch, sms]) and the other counters."""
    sms_pad = pl.next_power_of_2(sms)
    call = pl.pallas_call(
        functools.partial(_kernel, steps=steps, sms=sms, sms_pad=sms_pad, fields=fields, coupled=coupled),
        out_shape=[jax.ShapeDtypeStruct((batch, sms_pad), jnp.int32)] * 2,
        grid=(batch,),
        out_specs=[pl.BlockSpec((1, sms_pad), lambda i: (i, 0))] * 2,
        compiler_params=None if interpret else plt.CompilerParams(num_warps=num_warps),
        interpret=interpret,
    )
    return jax.jit(lambda: tuple(x[:, :sms] if i == 0 else x for i, x in enumerate(call())))


def check(batch: int, sms: int, steps: int, fields: int, coupled: bool) -> dict:
    """Whether the kernel's counters equal its XLA twin's and, for the plain rules,
    `dense_step_ceiling.py`'s on the same chips."""
    ours = make(batch, sms, steps, fields, coupled, 4, jax.default_backend() == "cpu")()
    out = {"equal_to_xla_twin": all(np.array_equal(a, b) for a, b in zip(ours, twin(batch, sms, steps, fields,
                                                                                       coupled)()))}
    if not (fields or coupled):
        out["equal_to_dense_step"] = bool(np.array_equal(ours[0], dense.make(batch, sms)(steps)))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--batch", type=int, default=4096)
    parser.add_argument("--steps", type=int, default=20000)
    parser.add_argument("--sms", type=int, default=132)
    parser.add_argument("--fields", type=int, default=0, help="more per-warp fields, written back and read")
    parser.add_argument("--coupled", action="store_true", help="a chip-wide queue in (SM, scheduler) order")
    parser.add_argument("--num-warps", type=int, default=8, help="CUDA warps per Triton program")
    parser.add_argument("--check", action="store_true", help="compare with dense_step_ceiling.py and stop")
    args = parser.parse_args()
    if args.check:
        print(json.dumps(check(args.batch, args.sms, args.steps, args.fields, args.coupled)))
        return
    run = make(args.batch, args.sms, args.steps, args.fields, args.coupled, args.num_warps,
               jax.default_backend() == "cpu")
    t0 = time.perf_counter()
    compiled = run.lower().compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled())  # warm
    t0 = time.perf_counter()
    issued = jax.block_until_ready(compiled())[0]
    wall_s = time.perf_counter() - t0
    print(json.dumps({
        "device": str(jax.devices()[0].device_kind), "batch": args.batch, "sms": args.sms, "steps": args.steps,
        "fields": args.fields, "coupled": args.coupled, "num_warps": args.num_warps,
        "sm_cycles_per_s": args.batch * args.sms * args.steps / wall_s, "wall_s": round(wall_s, 3),
        "compile_s": round(compile_s, 2),
        "issued_per_sm_cycle": float(np.asarray(issued, np.int64).sum()) / (args.batch * args.sms * args.steps)}))


if __name__ == "__main__":
    main()
