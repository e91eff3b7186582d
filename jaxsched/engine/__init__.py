"""The JAX engine (`run.simulate`, `run.simulate_batch`). Importing it leaves JAX's configuration
as it is: `devices.use_host_cores()` (`js.use_host_cores()`), which the command line calls before
`run`, `sweep` and `fit`, exposes one CPU device per core, before JAX's backends start."""
