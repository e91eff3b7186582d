"""`Params`: one configuration as one typed pytree, everything a user sweeps: the chip (`Arch`),
the program (`Kernel` or `Workload`), the clocks, the warp policy, the dispatch policy with its
parameters, and DVFS. `make_params` writes the defaults (`jaxsched.policies`) and validates once;
`js.stack` of equal-shaped `Params` is a batch, so `js.simulate(params)` and
`js.simulate_batch(js.stack([...]))` run what the keyword forms run.

Every field is concrete and resolved: policies are indices into `WARP_POLICIES` and
`DISPATCH_POLICIES`, the dispatch weights are one integer per SM slot (by default each SM's clock
in MHz), DVFS is a `Dvfs` (off by default), so that any two `Params` of one shape stack.

A `Params` is checked when it is made; where it enters the engine it is checked again
(`checked`) unless it is the very object checked then, with the same bytes in its arrays
(`jaxsched.once`): a sweep's configurations are checked once, while one built around the checks
(`eqx.tree_at`) or changed in place is caught.
"""

from __future__ import annotations

import equinox as eqx
import numpy as np
from jaxtyping import Array, ArrayLike, Float, Int

from . import clocks as clocks_mod
from . import once
from .arch import Arch
from .archvalues import validate as validate_arch
from .clocks import Clocks
from .dvfs import Dvfs, off, validate_dvfs
from .errors import check
from .kernel import Kernel
from .lower import policy_index, validate_dispatch
from .policies import (DEFAULT_DISPATCH, DEFAULT_DISPATCH_START, DEFAULT_EMA_ALPHA, DEFAULT_EMA_PRIOR_NS,
                       DEFAULT_HOLD_LEFT, DEFAULT_HOLD_MARGIN, DEFAULT_HOLD_NOISE, DEFAULT_HOLD_QUEUE,
                       DEFAULT_WARP_POLICY, DISPATCH_POLICIES, MAX_FIT_SMS,
                       WARP_POLICIES)
from .workload import Workload


class Params(eqx.Module):
    """One configuration (or, stacked, a batch: a leading axis on every array)."""

    arch: Arch
    kernel: Kernel | Workload
    clocks: Clocks
    warp_policy: Int[Array, ""]  # index into WARP_POLICIES
    dispatch: Int[Array, ""]  # index into DISPATCH_POLICIES
    dispatch_start: Int[Array, ""]  # rotation of the hardware SM order
    dispatch_weight: Int[Array, " sm"]  # weighted dispatch: one integer per SM slot
    ema_alpha: Float[Array, ""]  # closed loop: weight of the newest CTA duration
    ema_prior_ns: Float[Array, ""]  # closed loop: the estimate before an SM's first CTA ends
    hold_margin: Float[Array, ""]  # closed loop: the tail hold's margin, a share of the estimate
    hold_noise: Float[Array, ""]  # closed loop: and a multiple of the SM's deviation
    hold_queue: Float[Array, ""]  # closed loop: the hold's weight of a better slot's later CTAs
    hold_left: Float[Array, ""]  # closed loop: the hold's weight of the CTAs left
    dvfs: Dvfs

    def __check_init__(self) -> None:
        """Every field fits the chip and the engines' ranges (a `Params` built directly, not by
        `make_params`, is checked too). The kernel and clocks are checked where they are made."""
        check(isinstance(self.arch, Arch), "arch", type(self.arch).__name__, "a jaxsched.Arch")
        check(isinstance(self.kernel, (Kernel, Workload)), "kernel", type(self.kernel).__name__,
              "a jaxsched.Kernel or Workload")
        check(isinstance(self.clocks, Clocks), "clocks", type(self.clocks).__name__, "a jaxsched.Clocks")
        validate_arch(self.arch)
        clocks_mod.validate_clocks(self.arch, self.clocks)
        policy_index(int(self.warp_policy), WARP_POLICIES, "warp_policy")
        policy_index(int(self.dispatch), DISPATCH_POLICIES, "dispatch")
        check(DISPATCH_POLICIES[int(self.dispatch)] != "clock_regression" or self.arch.sm_count <= MAX_FIT_SMS,
              "dispatch", "clock_regression", f"a chip of at most {MAX_FIT_SMS} enabled SMs (its int64 fit; "
              f"this one has {self.arch.sm_count})")
        check(0 <= int(self.dispatch_start) < 2**31, "dispatch_start", int(self.dispatch_start),
              "an integer in 0 .. 2^31 - 1")
        validate_dispatch(self.arch, self.dispatch_weight, float(self.ema_alpha), float(self.ema_prior_ns),
                          float(self.hold_margin), float(self.hold_noise), float(self.hold_queue),
                          float(self.hold_left))
        dvfs_input(self.arch, self.dvfs)
        once.remember(self, "params")


def checked(params: Params) -> Params:
    """`params`, checked again (`Params.__check_init__`) unless it is a `Params` checked when it
    was made and unchanged since."""
    check(isinstance(params, Params), "params", type(params).__name__, "a jaxsched.Params")
    if not once.passed(params, "params"):
        params.__check_init__()
    return params


def dispatch_inputs(arch: Arch, clocks: Clocks, weight: ArrayLike | None, alpha: float, prior_ns: float,
                    hold_margin: float, hold_noise: float, hold_queue: float, hold_left: float
                    ) -> tuple[np.ndarray, np.float32, np.float32, np.float32, np.float32, np.float32, np.float32]:
    """Validated dispatch parameters as arrays (weights per enabled SM or per SM slot; None: the
    SM clocks in MHz)."""
    weight = None if weight is None else clocks_mod.per_slot(arch, weight, "dispatch_weight", fill=0)
    validate_dispatch(arch, weight, alpha, prior_ns, hold_margin, hold_noise, hold_queue, hold_left)
    w = np.asarray(clocks.sm_freq_mhz if weight is None else weight, dtype=np.int32)
    return (w, np.float32(alpha), np.float32(prior_ns), np.float32(hold_margin), np.float32(hold_noise),
            np.float32(hold_queue), np.float32(hold_left))


def dvfs_input(arch: Arch, dvfs: Dvfs | None) -> Dvfs:
    """Validated DVFS parameters (None: static clocks)."""
    dvfs = off(arch) if dvfs is None else dvfs
    check(isinstance(dvfs, Dvfs), "dvfs", type(dvfs).__name__, "a jaxsched.dvfs.Dvfs (dvfs.default, dvfs.locked) or None")
    validate_dvfs(dvfs)
    return dvfs


def make_params(
    arch: Arch,
    kernel: Kernel | Workload,
    clocks: Clocks | None = None,
    *,
    warp_policy: str | int = DEFAULT_WARP_POLICY,
    dispatch: str | int = DEFAULT_DISPATCH,
    dispatch_start: int = DEFAULT_DISPATCH_START,
    dispatch_weight: ArrayLike | None = None,
    ema_alpha: float = DEFAULT_EMA_ALPHA,
    ema_prior_ns: float = DEFAULT_EMA_PRIOR_NS,
    hold_margin: float = DEFAULT_HOLD_MARGIN,
    hold_noise: float = DEFAULT_HOLD_NOISE,
    hold_queue: float = DEFAULT_HOLD_QUEUE,
    hold_left: float = DEFAULT_HOLD_LEFT,
    dvfs: Dvfs | None = None,
) -> Params:
    """One configuration, validated, with every default resolved (`clocks`: the arch's base clock
    on every SM; policies by name or index; see `js.simulate` for each parameter)."""
    check(isinstance(arch, Arch), "arch", type(arch).__name__, "a jaxsched.Arch")
    validate_arch(arch)  # before anything reads it
    clocks = clocks_mod.uniform(arch) if clocks is None else clocks
    check(isinstance(clocks, Clocks), "clocks", type(clocks).__name__, "a jaxsched.Clocks or None")
    clocks_mod.validate_clocks(arch, clocks)  # before the weights default to it
    check(isinstance(dispatch_start, (int, np.integer)) and 0 <= dispatch_start < 2**31,
          "dispatch_start", dispatch_start, "an integer in 0 .. 2^31 - 1")
    weight, alpha, prior, margin, noise, queue, left = dispatch_inputs(
        arch, clocks, dispatch_weight, ema_alpha, ema_prior_ns, hold_margin, hold_noise, hold_queue, hold_left)
    return Params(arch=arch, kernel=kernel, clocks=clocks,
                  warp_policy=np.int32(policy_index(warp_policy, WARP_POLICIES, "warp_policy")),
                  dispatch=np.int32(policy_index(dispatch, DISPATCH_POLICIES, "dispatch")),
                  dispatch_start=np.int32(dispatch_start), dispatch_weight=weight, ema_alpha=alpha,
                  ema_prior_ns=prior, hold_margin=margin, hold_noise=noise,
                  hold_queue=queue, hold_left=left,
                  dvfs=off(arch) if dvfs is None else dvfs)  # checked by __check_init__
