"""A sweep's host time per configuration, printed as JSON: building the chunks' `Params`
(`sweep.chunk_configs`) and `simulate_batch`'s work up to the compiled call (checks, padding,
stacking), without running the engine. On a GPU this time is not hidden behind the simulation.

    python benchmarks/sweep_host_time.py [sweeps/demo.toml] [--chunk 32] [--chunks 4]

Each chunk is timed twice and the second time counts (the first imports and warms up).
"""

from __future__ import annotations

import argparse
import json
import time

from jaxsched import sweep
from jaxsched.engine import run as engine_run


class _Stop(Exception):
    """Raised instead of the compiled call."""


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("spec", nargs="?", default="sweeps/demo.toml")
    parser.add_argument("--chunk", type=int, default=32, help="configurations per chunk")
    parser.add_argument("--chunks", type=int, default=4, help="chunks timed (the first ones)")
    args = parser.parse_args()
    spec = sweep.load(args.spec)
    layout = sweep.make_layout(spec, args.chunk)
    runner = sweep.execution.runner_for(spec, None)

    def stop(*_args: object, **_kwargs: object) -> None:
        raise _Stop

    engine_run._compiled = stop
    build = prepare = 0.0
    n = 0
    for timed in (False, True):
        for i in range(min(layout.n_chunks, args.chunks)):
            t0 = time.perf_counter()
            configs = sweep.chunk_configs(spec, layout, i)
            t1 = time.perf_counter()
            try:
                runner(configs, len(configs))
            except _Stop:
                pass
            t2 = time.perf_counter()
            if timed:
                build, prepare, n = build + t1 - t0, prepare + t2 - t1, n + len(configs)
    print(json.dumps({"spec": args.spec, "configurations": n, "build_ms_per_config": round(1e3 * build / n, 2),
                      "simulate_batch_ms_per_config": round(1e3 * prepare / n, 2)}, indent=1))


if __name__ == "__main__":
    main()
