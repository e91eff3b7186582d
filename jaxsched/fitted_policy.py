"""A fitted dispatch policy as a file: what `jaxsched fit dispatch` writes for each fitted family
that the exact engine runs, and what a sweep runs where `[policy] dispatch = "fitted"` with
`fitted = "PATH"` (relative to the spec):

    # jaxsched fit dispatch sweeps/fit_dispatch.toml: family closed_loop_tail, ...
    [policy]
    dispatch = "closed_loop"     # the engine policy (one of jaxsched.DISPATCH_POLICIES)
    ema_alpha = 0.41             # its parameters (sweep paths policy.*; absent: jaxsched's defaults)
    ema_prior_ns = 0.0
    hold_margin = 0.05
    hold_noise = 1.5
    hold_queue = 0.0
    hold_left = 1.0

Only per-configuration scalars are written, so that one file runs on any chip and kernel; a
family whose parameters depend on the chip (fitted static weights) has no file.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

from . import sweep_paths, tomldoc
from .errors import check
from .policies import (DEFAULT_EMA_ALPHA, DEFAULT_EMA_PRIOR_NS, DEFAULT_HOLD_LEFT, DEFAULT_HOLD_MARGIN,
                       DEFAULT_HOLD_NOISE, DEFAULT_HOLD_QUEUE, DISPATCH_POLICIES, FITTED_DISPATCH)

# The policy parameters a file may set, with the defaults it runs where it does not (not the
# spec's values: a fitted policy runs the same in every sweep).
DEFAULTS = {"ema_alpha": DEFAULT_EMA_ALPHA, "ema_prior_ns": DEFAULT_EMA_PRIOR_NS, "hold_margin": DEFAULT_HOLD_MARGIN,
            "hold_noise": DEFAULT_HOLD_NOISE, "hold_queue": DEFAULT_HOLD_QUEUE, "hold_left": DEFAULT_HOLD_LEFT}
FIELDS = tuple(DEFAULTS)


@dataclasses.dataclass(frozen=True)
class FittedPolicy:
    """An engine dispatch policy with every one of its parameters (`FIELDS`), and the file's text."""

    dispatch: str
    values: dict[str, float]
    text: str


def dumps(dispatch: str, values: dict[str, float], header: str) -> str:
    """The file of a fitted policy (`header`: a comment saying where it came from)."""
    text = tomldoc.dumps({"policy": {"dispatch": dispatch, **{k: float(v) for k, v in values.items()}}}, header)
    loads(text, "<fitted policy>")  # what is written can be read back
    return text


def loads(text: str, source: str) -> FittedPolicy:
    """Parse and check a fitted-policy file (module docstring)."""
    doc = tomldoc.parse(text, source)
    check(set(doc) == {"policy"}, f"{source}", sorted(doc), "one [policy] table")
    table = doc["policy"]
    check(isinstance(table, dict), f"{source}: policy", table, "a table")
    for key in table:
        check(key in ("dispatch", *FIELDS), f"{source}: policy.{key}", table[key],
              f"unknown key; expected dispatch or one of {FIELDS}")
    dispatch = table.get("dispatch")
    check(dispatch in DISPATCH_POLICIES, f"{source}: policy.dispatch", dispatch,
          f"one of the engine's policies {DISPATCH_POLICIES} (not {FITTED_DISPATCH!r})")
    params = sweep_paths.GROUPS["policy"].params
    values = {k: float(params[k].check(f"{source}: policy.{k}", table.get(k, v))) for k, v in DEFAULTS.items()}
    return FittedPolicy(dispatch=dispatch, values=values, text=text)


def load(path: str | Path) -> FittedPolicy:
    return loads(tomldoc.read_text(Path(path), "fitted policy"), str(path))
