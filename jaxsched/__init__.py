"""jaxsched: vectorised simulation of NVIDIA GPU warp and CTA scheduling on chips whose SMs run
at different, changing clocks."""

from . import presets
from .arch import Arch, make_arch
from .errors import JaxschedError
from .isa import Op
from .occupancy import Occupancy, max_active_blocks, occupancy

__version__ = "0.1.0"

__all__ = [
    "Arch",
    "JaxschedError",
    "Occupancy",
    "Op",
    "make_arch",
    "max_active_blocks",
    "occupancy",
    "presets",
]
