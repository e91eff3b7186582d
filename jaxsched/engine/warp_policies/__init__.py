"""The engine's warp-scheduling policies, one module per policy (docs/model.md section 7,
"Selection"), each the JAX twin of `jaxsched/reference_warp/NAME.py` and numbered as
`jaxsched.WARP_POLICIES`.

A policy module gives `key(q, last, n_q, age) -> Int[Array, "warp sm"]`: per warp slot, the key
its scheduler minimises over the eligible warps (`q`: the slot's position among its scheduler's
`n_q`, `last`: the position that issued last there, `age`: `32 * CTA + warp`), unique per
scheduler. `warp_scheduler.select` computes the configuration's key (or, for a batch of one, only it).
"""

from __future__ import annotations

from ...policies import WARP_POLICIES, engine_twins


MODULES = engine_twins(__name__, __path__, WARP_POLICIES)
