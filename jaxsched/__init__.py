"""jaxsched: vectorised simulation of NVIDIA GPU warp and CTA scheduling on chips whose SMs run
at different, changing clocks.

    import jaxsched as js
    arch = js.presets.get("h200")
    kernel = js.make_kernel("loop 16\n ldg\n fma dep\nend", grid=1056, threads=256)
    result = js.simulate(arch, kernel, warp_policy="gto", dispatch="hardware")

Several kernels on streams, with events, or as one CUDA graph:

    workload = js.make_workload([kernel, kernel], streams=[0, 1], after=[[], [0]])
    result = js.simulate(arch, workload)  # result.kernel_start_ns, kernel_end_ns, ...
"""

from __future__ import annotations

import importlib

from . import presets
from .archio import load as load_arch
from .errors import JaxschedError
from .isa import Op
from .occupancy import Occupancy, max_active_blocks, occupancy
from .policies import DISPATCH_POLICIES, WARP_POLICIES
from .sass_import import from_sass

# Imported on first use (PEP 562): these need JAX, and `import jaxsched` does not start it, so
# that the command line's `arch`, `occupancy` and `--help` answer in a fraction of a second.
# Nothing here changes JAX's configuration: `use_host_cores()` does, when called.
_LAZY = {
    "Arch": "arch", "make_arch": "arch", "Clocks": "clocks",
    "Result": "engine.result", "simulate": "engine.run", "simulate_batch": "engine.run", "stack": "stacking",
    "Kernel": "kernel", "load_kernel": "kernel", "make_kernel": "kernel", "resident_grid": "kernel",
    "Workload": "workload", "load_workload": "workload", "make_workload": "workload",
    "use_host_cores": "engine.mechanics.devices", "Params": "params", "make_params": "params",
}
_LAZY_MODULES = ("bounds", "clocks", "dvfs", "freqmap", "workload")


def __getattr__(name: str) -> object:
    if name in _LAZY:
        return getattr(importlib.import_module(f".{_LAZY[name]}", __name__), name)
    if name in _LAZY_MODULES:
        return importlib.import_module(f".{name}", __name__)
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(__all__))


__version__ = "0.1.0"

__all__ = [
    "DISPATCH_POLICIES",
    "WARP_POLICIES",
    "Arch",
    "Clocks",
    "JaxschedError",
    "Kernel",
    "Occupancy",
    "Op",
    "Params",
    "Result",
    "Workload",
    "bounds",
    "clocks",
    "dvfs",
    "freqmap",
    "from_sass",
    "load_arch",
    "load_kernel",
    "load_workload",
    "make_arch",
    "make_kernel",
    "make_params",
    "make_workload",
    "max_active_blocks",
    "occupancy",
    "presets",
    "resident_grid",
    "simulate",
    "simulate_batch",
    "stack",
    "use_host_cores",
    "workload",
]
