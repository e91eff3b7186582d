"""The engine's performance mechanics, apart from the model they serve: how the step is made fast
and how batches are run, not what it simulates (docs/engine_performance.md gives each one's
reason and what it buys).

- `exact`: exact integer division through float64 (integer division is slow on CPU and GPU);
- `materialize`: work done once per step under a condition, where a batched select would do it
  for every configuration;
- `columns`: passes over only the SMs that need them (the marked SMs' columns);
- `sizes`: the static sizes a kernel compiles for, rounded so that nearby kernels share them;
- `devices`: the devices a batch is split over (one CPU device per core), and sharding;
- `batching`: chunking and padding a batch;
- `forms`: which forms of a scatter, gather and minimum the backend runs faster.
"""
