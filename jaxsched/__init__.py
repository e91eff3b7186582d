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

from .engine.devices import use_host_cores

use_host_cores()  # before anything starts JAX's backends: one CPU device per core

from . import bounds, clocks, dvfs, freqmap, presets, workload
from .arch import Arch, make_arch
from .archio import load as load_arch
from .clocks import Clocks
from .engine.run import Result, simulate, simulate_batch, stack
from .errors import JaxschedError
from .isa import Op
from .kernel import Kernel, load_kernel, make_kernel, resident_grid
from .lower import DISPATCH_POLICIES, WARP_POLICIES
from .occupancy import Occupancy, max_active_blocks, occupancy
from .workload import Workload, load_workload, make_workload

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
    "Result",
    "Workload",
    "bounds",
    "clocks",
    "dvfs",
    "freqmap",
    "load_arch",
    "load_kernel",
    "load_workload",
    "make_arch",
    "make_kernel",
    "make_workload",
    "max_active_blocks",
    "occupancy",
    "presets",
    "resident_grid",
    "simulate",
    "simulate_batch",
    "stack",
    "workload",
]
