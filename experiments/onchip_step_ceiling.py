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
queues. Triton's blocks are powers of two, so 132 SMs take 256 columns; `--split` holds them in column
groups of 128 and 4 instead, and `--sms 128` shows one group without padding.

Like `dense_step_ceiling.py` it is not a simulator; its speed is a ceiling for such a design.
`--check` compares its counters with `dense_step_ceiling.py`'s step on the same chips (both run
the same rules; on the CPU the kernel runs in Pallas's interpreter).

    python experiments/onchip_step_ceiling.py [--batch 4096] [--steps 20000] [--sms 132] [--fields 0]
        [--coupled] [--split] [--num-warps 8] [--check]
"""

from __future__ import annotations

import argparse
import functools
import json
import time
from typing import NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plt

import dense_step_ceiling as dense

WARPS, SCHEDULERS, LATENCY = dense.WARPS, dense.SCHEDULERS, dense.LATENCY
PER_SCHEDULER = WARPS // SCHEDULERS
BIG = np.iinfo(np.int32).max


class _Group(NamedTuple):
    """A column group's state: per scheduler, its warps' ready cycles and ages ([16, width]
    each), the extra fields (scheduler-major), and the per-SM counters ([width])."""

    ready: tuple
    age: tuple
    extra: tuple
    issued: jax.Array
    waiting: jax.Array
    picked: jax.Array


def column_groups(sms: int, split: bool) -> list[int]:
    """Widths of the column blocks that hold a chip's SMs: one padded power of two, or with
    `split` the powers of two that sum to `sms` (132 = 128 + 4), so that no column is padding."""
    if not split:
        return [pl.next_power_of_2(sms)]
    return [1 << b for b in reversed(range(sms.bit_length())) if sms >> b & 1]


def _init(seed, width: int, live: int, fields: int) -> _Group:
    """A column group's state at cycle 0, `live` of its `width` columns being SMs. Slot
    w = 4 q + s is warp q of scheduler s, as in `dense_step_ceiling.py`; each scheduler's warps
    are a [16, width] block."""
    q = jax.lax.broadcasted_iota(jnp.int32, (PER_SCHEDULER, width), 0)
    on = jax.lax.broadcasted_iota(jnp.int32, (PER_SCHEDULER, width), 1) < live
    slots = [q * SCHEDULERS + s for s in range(SCHEDULERS)]
    ready = tuple(jnp.where(on, (w * 7 + seed) % 5, BIG) for w in slots)  # padding never issues
    extra = tuple(w * (f + 1) for w in slots for f in range(fields))
    zeros = jnp.zeros((width,), jnp.int32)
    return _Group(ready, tuple(slots), extra, zeros, zeros, zeros)


def _chip(seed, sms: int, groups: list[int], fields: int) -> tuple:
    """A chip's state at cycle 0: its column groups, then the chip-wide queue."""
    offsets = np.cumsum([0] + groups[:-1])
    return tuple(_init(seed, w, min(max(sms - o, 0), w), fields) for w, o in zip(groups, offsets)) + (
        jnp.zeros((), jnp.int32),)


def _select(ready, age, extra, waiting, picked, cycle, fields: int) -> tuple:
    """One cycle's issue in one column group, before the issuing warps' ready cycles move."""
    new_age, new_extra, sels = [], [], []
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
    return sels, tuple(new_age), tuple(new_extra), waiting, picked


def _step(cycle, chip: tuple, fields: int, coupled: bool) -> tuple:
    """One cycle of a chip (`_chip`'s layout). With `coupled`, every issue joins a chip-wide
    queue in (SM, scheduler) order, as the engine's L2 and DRAM queues do, and waits for the
    requests before it: a prefix sum across the SMs in every cycle, the one cross-SM dependence
    that stops an SM's cycles from running apart from the others'."""
    *groups, queue = chip
    out, ahead_of_group = [], queue
    for g in groups:
        sels, age, extra, waiting, picked = _select(g.ready, g.age, g.extra, g.waiting, g.picked, cycle, fields)
        has = [jnp.max(sel.astype(jnp.int32), axis=0) for sel in sels]  # [width] per scheduler
        per_sm = sum(has)
        new_ready = []
        if coupled:
            sm_ahead = ahead_of_group + jnp.cumsum(per_sm) - per_sm
            ahead_of_group = ahead_of_group + jnp.sum(per_sm)
        for s in range(SCHEDULERS):
            latency = LATENCY
            if coupled:  # requests ahead in (SM, scheduler) order
                latency = LATENCY + jnp.minimum((sm_ahead + sum(has[:s])) >> 6, 400)[None, :]
            new_ready.append(jnp.where(sels[s], cycle + latency, g.ready[s]))
        out.append(_Group(tuple(new_ready), age, extra, g.issued + per_sm, waiting, picked))
    if coupled:
        queue = jnp.maximum(ahead_of_group - 256, 0)
    return tuple(out) + (queue,)


def _run(seed, sms: int, groups: list[int], steps: int, fields: int, coupled: bool) -> tuple[list, list]:
    """A chip's `steps` cycles: per column group, the issued instructions per SM ([width]) and
    the other counters folded into one array."""
    chip = jax.lax.fori_loop(0, steps, lambda c, x: _step(c, x, fields, coupled), _chip(seed, sms, groups, fields))
    return [g.issued for g in chip[:-1]], [g.waiting ^ g.picked for g in chip[:-1]]


def _kernel(*refs, steps: int, sms: int, groups: list[int], fields: int, coupled: bool):
    """One chip, with every warp slot's state in registers across its cycles; then its counters
    into the output refs ([1, width] each: issued per group, then the others per group)."""
    issued, other = _run(pl.program_id(0), sms, groups, steps, fields, coupled)
    for ref, value in zip(refs, issued + other):
        ref[...] = value[None, :]


def twin(batch: int, sms: int, steps: int, fields: int, coupled: bool, split: bool = False):
    """The same chips as `make`, as an XLA loop (the check of the kernel's lowering)."""
    groups = column_groups(sms, split)

    def chip(seed):
        issued, other = _run(seed, sms, groups, steps, fields, coupled)
        return jnp.concatenate(issued)[:sms], jnp.concatenate(other)

    return jax.jit(lambda: jax.vmap(chip)(jnp.arange(batch, dtype=jnp.int32)))


def make(batch: int, sms: int, steps: int, fields: int, coupled: bool, num_warps: int, interpret: bool,
         split: bool = False):
    """A compiled function of no arguments: `steps` cycles of `batch` chips, one program each;
    returns the instructions issued per chip and SM ([batch, sms]) and the other counters."""
    groups = column_groups(sms, split)
    call = pl.pallas_call(
        functools.partial(_kernel, steps=steps, sms=sms, groups=groups, fields=fields, coupled=coupled),
        out_shape=[jax.ShapeDtypeStruct((batch, w), jnp.int32) for w in groups * 2],
        grid=(batch,),
        out_specs=[pl.BlockSpec((1, w), lambda i: (i, 0)) for w in groups * 2],
        compiler_params=None if interpret else plt.CompilerParams(num_warps=num_warps),
        interpret=interpret,
    )

    def run():
        out = call()
        return jnp.concatenate(out[:len(groups)], axis=1)[:, :sms], jnp.concatenate(out[len(groups):], axis=1)

    return jax.jit(run)


def check(batch: int, sms: int, steps: int, fields: int, coupled: bool, split: bool) -> dict:
    """Whether the kernel's counters equal its XLA twin's and, for the plain rules,
    `dense_step_ceiling.py`'s on the same chips."""
    ours = make(batch, sms, steps, fields, coupled, 4, jax.default_backend() == "cpu", split)()
    theirs = twin(batch, sms, steps, fields, coupled, split)()
    out = {"equal_to_xla_twin": all(np.array_equal(a, b) for a, b in zip(ours, theirs))}
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
    parser.add_argument("--split", action="store_true", help="SMs in power-of-two column groups, no padding")
    parser.add_argument("--num-warps", type=int, default=8, help="CUDA warps per Triton program")
    parser.add_argument("--check", action="store_true", help="compare with the dense step and the XLA twin, and stop")
    args = parser.parse_args()
    if args.check:
        print(json.dumps(check(args.batch, args.sms, args.steps, args.fields, args.coupled, args.split)))
        return
    run = make(args.batch, args.sms, args.steps, args.fields, args.coupled, args.num_warps,
               jax.default_backend() == "cpu", args.split)
    t0 = time.perf_counter()
    compiled = run.lower().compile()
    compile_s = time.perf_counter() - t0
    jax.block_until_ready(compiled())  # warm
    t0 = time.perf_counter()
    issued = jax.block_until_ready(compiled())[0]
    wall_s = time.perf_counter() - t0
    print(json.dumps({
        "device": str(jax.devices()[0].device_kind), "batch": args.batch, "sms": args.sms, "steps": args.steps,
        "fields": args.fields, "coupled": args.coupled, "split": args.split, "num_warps": args.num_warps,
        "sm_cycles_per_s": args.batch * args.sms * args.steps / wall_s, "wall_s": round(wall_s, 3),
        "compile_s": round(compile_s, 2),
        "issued_per_sm_cycle": float(np.asarray(issued, np.int64).sum()) / (args.batch * args.sms * args.steps)}))


if __name__ == "__main__":
    main()
