"""The JAX engine (`run.simulate`, `run.simulate_batch`). Importing it first makes XLA's CPU
client expose one device per core (`devices.use_host_cores`), before JAX's backends start."""

from .devices import use_host_cores

use_host_cores()
