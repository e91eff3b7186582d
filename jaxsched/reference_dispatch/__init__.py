"""The reference's CTA-dispatch policies, one module per policy (docs/model.md section 9), each
the plain twin of `jaxsched/engine/dispatch_policies/NAME.py`.

A policy module says what the dispatcher asks of it when the head launch's next CTA is placed
among the enabled SMs with room (`_Sim.pick_sm`):

- `NUMBER`: its index in `jaxsched.DISPATCH_POLICIES` (0, the default, is `hardware`);
- `key(sim, kernel, sm, room) -> tuple`: the SM with the smallest key takes the CTA (keys end in
  the SM's dispatch rank, so they are distinct);

and, where the policy has them:

- `hold(sim, kernel, sm) -> bool`: keep the CTA back this tick although `sm` has room;
- `placed(sim, sm)`: what the policy remembers of a placement;
- `check(sim)`: a run this policy cannot make, as a `ValueError`;
- `READS_ESTIMATES = True`, with `init(launch, n_sm) -> list` (a launch's estimates before its
  first CTA completes), `observe(sim, sm, kernel, g, t0, k)` (CTA `g` of `kernel`
  completed on `sm` at tick `k`, started at `t0`: learn from it, in the launch's `est`) and
  `estimates(sim, kernel, k) -> list` (what its key and hold read at the dispatch of tick `k`,
  as `sim.censored`): a policy that learns from the run; its engine twin has the same hooks
  (`policies.ESTIMATE_DISPATCH`).

The modules are pure Python, so `jaxsched.policies` reads their names and numbers without JAX.
"""
