"""The surrogate's loss over the closed loop's hold-score weights (`hold_queue`, `hold_left`),
hard (the T -> 0 limit) and soft at two temperatures, at the family's starting smoothing and
margin, on a dispatch-fit spec's training configurations (docs/studies.md, "The hold score,
fitted through the surrogate"): where the soft model's minimum is not the hard model's, a soft
fit descends towards the wrong policy.

    python experiments/score_landscape.py [sweeps/fit_dispatch_score.toml]
"""

from __future__ import annotations

import argparse
import itertools
import time

import jax.numpy as jnp

from jaxsched.policies import MAX_HOLD_LEFT, MAX_HOLD_QUEUE
from jaxsched.surrogate import dispatch_fit as df
from jaxsched.surrogate import dispatch_spec as ds

QUEUES = (1e-3, 0.25, 1 - 1e-3)  # sigmoid weights: 0 and 1 are out of reach of a logit
LEFTS = (0.5, 1.0, 2.0)
MODES = (("hard", 0.0), ("soft", 0.05), ("soft", 0.3))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("spec", nargs="?", default="sweeps/fit_dispatch_score.toml")
    args = parser.parse_args()
    spec = ds.load(args.spec)
    start = time.time()
    prep = ds.prepare(spec)
    problem, slots = ds.problem(spec, prep)
    problem = problem._replace(group=jnp.zeros_like(problem.group))
    base = {k: float(v[0]) for k, v in df.initial_theta("closed_loop_score").items()}
    print(f"prepared in {time.time() - start:.0f} s; alpha and margin at the family's start")
    print("| mode | T | hold_queue | hold_left | loss |\n|---|---|---|---|---|")
    for (mode, temperature), queue, left in itertools.product(MODES, QUEUES, LEFTS):
        theta = dict(base, queue_logit=df.logit(queue / MAX_HOLD_QUEUE), left_logit=df.logit(left / MAX_HOLD_LEFT))
        loss = df.losses({k: jnp.full((1,), v, jnp.float32) for k, v in theta.items()}, problem,
                         jnp.float32(max(temperature, 1e-9)), family="closed_loop_score", max_slots=slots,
                         n_groups=1, mode=mode)
        print(f"| {mode} | {temperature:g} | {queue:g} | {left:g} | {float(loss[0]):.4f} |", flush=True)


if __name__ == "__main__":
    main()
