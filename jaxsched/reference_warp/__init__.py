"""The reference's warp-scheduling policies, one module per policy (docs/model.md section 7,
"Selection"), each the plain twin of `jaxsched/engine/warp_policies/NAME.py`.

A policy module gives `NUMBER` (its index in `jaxsched.WARP_POLICIES`) and
`key(q, last, n_q, age) -> int`: each scheduler issues the eligible warp with the smallest key
(`q`: the warp's position among the scheduler's `n_q` warp slots, `last`: the position that issued
last, `age`: `32 * CTA + warp`); keys are unique per scheduler. Pure Python, so that
`jaxsched.policies` reads names and numbers without JAX.
"""
