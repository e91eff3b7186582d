"""Measure a real GPU: microbenchmarks that stamp every CTA with `%smid`, `%globaltimer` and
`clock64`, written in the simulator's trace format, plus the numbers that calibrate a preset.

    from jaxsched import probe
    summary = probe.run(Path("results/probe"))      # needs CuPy and a CUDA GPU

`run` measures (`experiments.py`), saves the raw arrays first (`store.py`), then derives the
calibration (`calibrate.py`) and one trace per launch. Only `gpu.py` and `experiments.py` touch
CuPy, which is imported when `run` is called; without it, or without a GPU, `run` raises a
`JaxschedError` saying so.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import numpy as np

from .. import presets
from ..errors import JaxschedError
from . import experiments, store
from .gpu import ClockSampler, Gpu, load_cupy, nvidia_smi, save_json
from .suite import ProbeCase, default_suite, select

__all__ = ["ProbeCase", "default_suite", "preset_for", "run", "select"]

# compute capability -> the preset whose limits size the suite's launches
_PRESET_BY_CC = {"70": "v100", "80": "a100", "86": "rtx3090", "90": "h200"}


def preset_for(cc: str, name: str) -> str:
    """The preset matching a device (H100 and H200 share CC 9.0; the name tells them apart)."""
    if cc == "90" and "H100" in name.upper():
        return "h100"
    if cc not in _PRESET_BY_CC:
        raise JaxschedError("compute capability", cc, f"no preset for it; known: {sorted(_PRESET_BY_CC)}")
    return _PRESET_BY_CC[cc]


def run(out: Path, case_names: list[str] | None = None, repeats: int = 6, calibration: bool = True,
        log: Callable[[str], None] = print) -> dict[str, Any]:
    """Probe the current GPU into `out`; return the suite summary (see `store.py`)."""
    select(default_suite(), case_names)  # unknown case names fail before any GPU work
    cp = load_cupy()
    out = Path(out)
    out.mkdir(parents=True, exist_ok=True)
    gpu = Gpu(cp, out / "build")
    arch_name = preset_for(gpu.cc, str(gpu.props.get("name", "")))
    arch = presets.get(arch_name)
    (out / "sass.txt").write_text(gpu.sass)
    meta: dict[str, Any] = {"props": gpu.props, "cc": gpu.cc, "arch": arch_name, "compiler": gpu.compiler,
                            "cupy": cp.__version__, "nvidia_smi_before": nvidia_smi(), "errors": [],
                            "repeats": repeats}
    sampler = ClockSampler()
    sampler.start()
    rng = np.random.default_rng(0)
    raw: dict[str, np.ndarray] = {}

    def measure(steps: list[tuple[str, Callable[[], dict[str, np.ndarray]]]]) -> None:
        for name, step in steps:
            t = time.perf_counter()
            sampler.mark(name)
            try:
                raw.update(step())
                log(f"probe: {name} done ({time.perf_counter() - t:.1f} s)")
            except Exception as exc:  # one failed experiment must not lose the others
                meta["errors"].append(f"{name}: {exc!r}")
                log(f"probe: {name} FAILED: {exc!r}")

    if calibration:
        measure([("timer", lambda: experiments.timer(gpu)),
                 ("clocks", lambda: experiments.clocks(gpu, sampler)),
                 ("throughput", lambda: experiments.throughput(gpu)),
                 ("issue_sweep", lambda: experiments.issue_sweep(gpu)),
                 ("refill", lambda: experiments.refill(gpu)),
                 ("dispatch", lambda: experiments.dispatch(gpu)),
                 ("clusters", lambda: experiments.clusters(gpu))])
    cases = select(default_suite(gpu.n_sm), case_names)
    suite_raw: dict[str, dict[str, Any]] = {}
    buffers: dict[str, Any] = {}
    for case in cases:
        t = time.perf_counter()
        sampler.mark(f"case:{case.name}")
        try:
            suite_raw[case.name] = experiments.run_case(gpu, case, arch, repeats, buffers)
            log(f"probe: case {case.name} done ({time.perf_counter() - t:.1f} s)")
        except Exception as exc:
            meta["errors"].append(f"case {case.name}: {exc!r}")
            log(f"probe: case {case.name} FAILED: {exc!r}")
    buffers.clear()
    if calibration:  # last: a pointer chase gone wrong would poison the CUDA context for the rest
        measure([("latencies", lambda: experiments.latencies(gpu, rng))])
    meta["nvml"] = sampler.stop()
    meta["nvidia_smi_after"] = nvidia_smi()
    store.save_raw(out, raw, suite_raw)
    save_json(out / "device.json", meta)
    return store.write_derived(out, raw, suite_raw, cases, arch, gpu.sass, gpu.n_sm, arch_name)
