"""The warp-scheduling and CTA-dispatch policies by name, in the order the engines number them
(docs/model.md sections 7 and 9), the defaults of the policy parameters and of the run options
(the clock trace's rows, fast-forward). Apart from `lower`,
so that the command line lists them without importing JAX. Every front end (`js.simulate`, the
reference, sweep specs, the command line, the fits) takes its defaults from here.

The policies are modules: the warp policies those of `jaxsched/reference_warp/`, the dispatch
policies those of `jaxsched/reference_dispatch/` (pure Python), numbered by their `NUMBER`; each
has its engine twin in `jaxsched/engine/warp_policies/` or `jaxsched/engine/dispatch_policies/`.
"""

import importlib
import pkgutil
from types import ModuleType

from . import reference_dispatch, reference_warp

# closed loop: the tail hold's score, here before the policy modules are imported (they read it).
# A better slot counts 1, and `hold_queue` for each later CTA it is expected to finish before the
# candidate would (its queue: at most HOLD_QUEUE_CTAS CTAs in all); the CTA is held where that sum
# reaches `hold_left` times the launch's CTAs left (`hold_queue = 0` and `hold_left = 1`: the
# count of better slots against the CTAs left)
DEFAULT_HOLD_QUEUE = 0.0
MAX_HOLD_QUEUE = 1.0
DEFAULT_HOLD_LEFT = 1.0
MAX_HOLD_LEFT = 4.0
HOLD_QUEUE_CTAS = 4


def _modules(package: ModuleType) -> dict[str, ModuleType]:
    """The policy modules of `package` by name, in `NUMBER` order (0, 1, ... without gaps)."""
    found = [importlib.import_module(f"{package.__name__}.{m.name}") for m in pkgutil.iter_modules(package.__path__)]
    by_number = sorted(found, key=lambda mod: mod.NUMBER)
    numbers = [mod.NUMBER for mod in by_number]
    if numbers != list(range(len(by_number))):
        raise ImportError(f"{package.__name__}: policy NUMBERs {numbers}, expected 0..{len(numbers) - 1}")
    return {mod.__name__.rsplit(".", 1)[1]: mod for mod in by_number}


def engine_twins(package: str, path: list[str], names: tuple[str, ...]) -> dict[str, ModuleType]:
    """The engine's policy modules of `package` (its `__path__`), one per reference twin in
    `names`, in that order; a policy with only one twin is an error at import."""
    found = {m.name for m in pkgutil.iter_modules(path)}
    if found != set(names):
        raise ImportError(f"{package} has {sorted(found)}, the reference's policies are {sorted(names)}: "
                          "each policy needs both twins")
    return {name: importlib.import_module(f"{package}.{name}") for name in names}


WARP_MODULES = _modules(reference_warp)
WARP_POLICIES = tuple(WARP_MODULES)
DISPATCH_MODULES = _modules(reference_dispatch)
DISPATCH_POLICIES = tuple(DISPATCH_MODULES)
# The policies that read the closed loop's per-SM CTA-duration estimates: both engines learn
# them only where a configuration dispatches by one of these.
ESTIMATE_DISPATCH = tuple(name for name, mod in DISPATCH_MODULES.items() if getattr(mod, "READS_ESTIMATES", False))

DEFAULT_WARP_POLICY = "gto"
DEFAULT_DISPATCH = "hardware"
DEFAULT_DISPATCH_START = 0  # no rotation of the hardware SM order
DEFAULT_EMA_ALPHA = 0.25  # closed loop: weight of the newest CTA duration in the per-SM estimate
DEFAULT_EMA_PRIOR_NS = 0.0  # closed loop: the estimate before an SM's first CTA ends
# closed loop: a CTA is held for a slot expected to finish it earlier by this share of its estimate
DEFAULT_HOLD_MARGIN = 0.125
# closed loop: and by this many times the SM's deviation (the smoothed standard deviation of its
# CTA durations), so that durations that vary by CTA do not pass for a slow SM; at most MAX_HOLD_NOISE
DEFAULT_HOLD_NOISE = 0.0
MAX_HOLD_NOISE = 8.0
# clock regression: its int64 least-squares sums are exact on chips of at most this many enabled SMs
MAX_FIT_SMS = 256
# Run options of `js.simulate`, `js.simulate_batch` and the reference: no DVFS clock trace kept,
# and fast-forward on (it never changes a result).
DEFAULT_TRACE_LEN = 0
DEFAULT_FAST_FORWARD = True
# A sweep's dispatch value that runs the policy of a file `jaxsched fit dispatch` wrote
# (`jaxsched.fitted_policy`), rather than a policy of the engines.
FITTED_DISPATCH = "fitted"
