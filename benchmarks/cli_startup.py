"""Wall and CPU time of the command line as a person uses it: `jaxsched --help`, `arch`,
`occupancy`, and `run` of a small kernel, first with an empty compile cache, then repeated.

    .venv/bin/python benchmarks/cli_startup.py [--repeat 5] [--jaxsched PATH]

Each command runs `--repeat` times in a fresh process (the console script, as a user types it);
the table gives the fastest, median and slowest wall time and the median CPU time (user +
system, the process and its children), and the load average before and after, since other work
on the machine slows every number. `run` gets a compile cache of its own in a temporary folder:
its first call compiles, the rest read the cache (`jaxsched.compile_cache`). Results go to
benchmarks/RESULTS.md, "Command-line start-up".
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
KERNEL = str(ROOT / "sweeps" / "kernels" / "compute_bound.toml")
COMMANDS = {
    "jaxsched --help": ["--help"],
    "jaxsched arch h200": ["arch", "h200"],
    "jaxsched occupancy --threads 256 --regs 64": ["occupancy", "--threads", "256", "--regs", "64"],
    "jaxsched run compute_bound.toml": ["run", KERNEL],
}


def timed(argv: list[str], env: dict) -> tuple[float, float]:
    """(wall s, CPU s) of one run of `argv`; it must succeed."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    start = time.perf_counter()
    proc = subprocess.run(argv, capture_output=True, text=True, env=env, cwd=ROOT)
    wall = time.perf_counter() - start
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    if proc.returncode != 0:
        sys.exit(f"{' '.join(argv)} failed:\n{proc.stderr}")
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def row(name: str, times: list[tuple[float, float]]) -> str:
    walls = [w for w, _ in times]
    return (f"| {name} | {len(times)} | {min(walls):.2f} | {statistics.median(walls):.2f} | {max(walls):.2f} | "
            f"{statistics.median(c for _, c in times):.2f} |")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeat", type=int, default=5, help="runs of each command (default 5)")
    parser.add_argument("--jaxsched", default=str(Path(sys.executable).parent / "jaxsched"),
                        help="the console script (default: next to this Python)")
    args = parser.parse_args()
    print(f"load average before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}, {os.cpu_count()} CPUs")
    print("| command | runs | fastest (s) | median (s) | slowest (s) | median CPU (s) |")
    print("|---|---|---|---|---|---|")
    with tempfile.TemporaryDirectory() as cache:
        env = {**os.environ, "JAXSCHED_CACHE_DIR": cache}
        for name, argv in COMMANDS.items():
            cmd = [args.jaxsched, *argv]
            if argv[0] == "run":
                print(row(f"{name}, empty cache (compiles)", [timed(cmd, env)]), flush=True)
                name += ", repeated"
            print(row(name, [timed(cmd, env) for _ in range(args.repeat)]), flush=True)
    print(f"load average after: {' '.join(f'{x:.2f}' for x in os.getloadavg())}")


if __name__ == "__main__":
    main()
