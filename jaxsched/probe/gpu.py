"""The GPU side of the probe: CuPy (imported lazily), compilation, launches, clock sampling.

Everything that needs a CUDA GPU lives here and in `experiments.py`; the rest of the package is
plain NumPy and runs anywhere. `open_gpu()` raises a `JaxschedError` that says what is missing
(CuPy, a driver, a device) instead of an import or driver traceback.
"""

from __future__ import annotations

import json
import shutil
import subprocess
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np

from ..errors import JaxschedError
from . import kernels

# queried as separate groups: a field an older driver lacks fails only its own group
_NVIDIA_SMI_FIELDS = ("name,driver_version,pstate,clocks.sm,clocks.max.sm,clocks.mem,power.draw,"
                      "power.limit,temperature.gpu", "clocks.applications.graphics",
                      "clocks_event_reasons.active")


def load_cupy() -> Any:
    """CuPy with at least one CUDA device, or a `JaxschedError` naming what is missing."""
    try:
        import cupy
    except ImportError:
        raise JaxschedError("probe", "CuPy is not installed", "the probe needs CuPy and an NVIDIA GPU",
                            "pip install 'jaxsched[probe]' on a machine with a CUDA GPU") from None
    try:
        count = int(cupy.cuda.runtime.getDeviceCount())
    except Exception as exc:  # CUDARuntimeError: no driver, no device, driver too old
        raise JaxschedError("probe", "no usable CUDA GPU",
                            "the probe runs only where an NVIDIA GPU and its driver are present",
                            str(exc)) from None
    if count < 1:
        raise JaxschedError("probe", "0 CUDA devices", "the probe needs one NVIDIA GPU")
    return cupy


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.decode(errors="replace").rstrip("\x00")
    if isinstance(value, (np.integer, np.floating)):
        return value.item()
    if isinstance(value, (list, tuple)):
        return [_jsonable(v) for v in value]
    return value


def nvidia_smi() -> dict[str, str]:
    """One `nvidia-smi --query-gpu` reading (read-only; empty if the tool is missing)."""
    exe = shutil.which("nvidia-smi")
    out: dict[str, str] = {}
    if exe is None:
        return out
    for fields in _NVIDIA_SMI_FIELDS:
        res = subprocess.run([exe, f"--query-gpu={fields}", "--format=csv"],
                             capture_output=True, text=True, check=False)
        lines = res.stdout.strip().splitlines()
        if res.returncode != 0 or len(lines) < 2:
            out[f"error[{fields}]"] = (res.stderr or res.stdout).strip()
            continue
        out.update(zip([k.strip() for k in lines[0].split(",")], [v.strip() for v in lines[1].split(",")]))
    return out


class Gpu:
    """One CUDA device with the probe's kernels compiled for it."""

    def __init__(self, cupy: Any, workdir: Path):
        self.cp = cupy
        dev = cupy.cuda.Device()
        self.props = {k: _jsonable(v) for k, v in cupy.cuda.runtime.getDeviceProperties(dev.id).items()
                      if isinstance(v, (int, float, str, bytes, list, tuple))}
        self.cc = str(dev.compute_capability)
        self.n_sm = int(self.props["multiProcessorCount"])
        self.smem_optin = int(self.props["sharedMemPerBlockOptin"])
        self.smem_per_sm = int(self.props["sharedMemPerMultiprocessor"])
        self.reserved_smem = int(self.props.get("reservedSharedMemPerBlock", 0))
        self.module, self.sass, self.compiler = self._compile(workdir)

    def _compile(self, workdir: Path) -> tuple[Any, str, str]:
        """nvcc + cuobjdump where present (the SASS is what the analysis counts), else NVRTC."""
        workdir.mkdir(parents=True, exist_ok=True)
        src = workdir / "probe.cu"
        src.write_text(kernels.source())
        flags = [f"-D{k}={v}" for k, v in kernels.defines().items()]
        nvcc = shutil.which("nvcc")
        if nvcc:
            cubin = workdir / "probe.cubin"
            subprocess.run([nvcc, "-cubin", f"-arch=sm_{self.cc}", "-O3", *flags, "-o", str(cubin), str(src)],
                           check=True, capture_output=True, text=True)
            sass = ""
            cuobjdump = shutil.which("cuobjdump")
            if cuobjdump:
                sass = subprocess.run([cuobjdump, "-sass", str(cubin)], capture_output=True, text=True,
                                      check=False).stdout
            return self.cp.RawModule(path=str(cubin)), sass, f"nvcc {nvcc}"
        module = self.cp.RawModule(code=kernels.source(), options=tuple(flags))
        return module, "", "nvrtc"

    def kernel(self, name: str, smem: int = 0) -> Any:
        """A probe kernel opted in to exactly `smem` bytes of dynamic shared memory, the launch
        attributes `jaxsched.occupancy` assumes (docs/model.md section 1)."""
        fn = self.module.get_function(name)
        fn.max_dynamic_shared_size_bytes = int(smem)
        return fn

    def launch(self, name: str, grid: int, block: int, args: tuple, smem: int = 0) -> None:
        self.kernel(name, smem)((int(grid),), (int(block),), args, shared_mem=int(smem))

    def records(self, grid: int) -> Any:
        """A zeroed per-CTA stamp buffer (RECORD_WORDS uint64 per CTA)."""
        return self.cp.zeros(grid * kernels.RECORD_WORDS, dtype=self.cp.uint64)

    def driver_occupancy(self, name: str, threads: int, smem: int) -> int:
        """`cuOccupancyMaxActiveBlocksPerMultiprocessor` for a probe kernel."""
        fn = self.kernel(name, smem)
        return int(self.cp.cuda.driver.occupancyMaxActiveBlocksPerMultiprocessor(
            fn.kernel.ptr, int(threads), int(smem)))

    @property
    def one_per_sm_smem(self) -> int:
        """Dynamic shared memory that leaves room for exactly one CTA per SM."""
        return self.smem_optin

    @property
    def two_per_sm_smem(self) -> int:
        return self.smem_per_sm // 2 - self.reserved_smem

    def sync(self) -> None:
        self.cp.cuda.Device().synchronize()


def unpack_records(rec: Any, grid: int) -> dict[str, np.ndarray]:
    """Host copies of a stamp buffer: smid, start/end globaltimer ns, start/end clock64."""
    r = rec.get().reshape(grid, kernels.RECORD_WORDS)
    return dict(sm=r[:, 0].astype(np.int32), t0=r[:, 1].astype(np.int64), t1=r[:, 2].astype(np.int64),
                c0=r[:, 3].astype(np.int64), c1=r[:, 4].astype(np.int64))


class ClockSampler(threading.Thread):
    """Samples the SM clock, power, temperature and clock-event reasons through NVML.

    Read-only: it never changes a clock or a limit. `mark(label)` stamps what the probe is
    doing so that the samples can be attributed. Without NVML (`pynvml`) it records nothing.
    """

    def __init__(self, period_s: float = 0.01):
        super().__init__(daemon=True)
        self.period_s = period_s
        self.samples: list[tuple[float, float, float, float, int]] = []
        self.marks: list[tuple[float, str]] = []
        self.error = ""
        self._stop_event = threading.Event()
        try:
            import pynvml

            pynvml.nvmlInit()
            self._nvml = pynvml
            self._handle = pynvml.nvmlDeviceGetHandleByIndex(0)
        except Exception as exc:  # no pynvml, or NVML unavailable
            self._nvml = None
            self.error = f"NVML unavailable: {exc}"

    def mark(self, label: str) -> None:
        self.marks.append((time.perf_counter(), label))

    def run(self) -> None:
        if self._nvml is None:
            return
        nv, h = self._nvml, self._handle
        reasons = getattr(nv, "nvmlDeviceGetCurrentClocksEventReasons", None) or \
            nv.nvmlDeviceGetCurrentClocksThrottleReasons
        while not self._stop_event.is_set():
            try:
                self.samples.append((time.perf_counter(), float(nv.nvmlDeviceGetClockInfo(h, nv.NVML_CLOCK_SM)),
                                     nv.nvmlDeviceGetPowerUsage(h) / 1000.0,
                                     float(nv.nvmlDeviceGetTemperature(h, nv.NVML_TEMPERATURE_GPU)),
                                     int(reasons(h))))
            except Exception as exc:  # a failing query ends sampling, the probe goes on
                self.error = f"NVML query failed: {exc}"
                return
            time.sleep(self.period_s)

    def stop(self) -> dict[str, Any]:
        self._stop_event.set()
        if self.is_alive():
            self.join(timeout=2.0)
        s = np.asarray(self.samples, dtype=np.float64).reshape(-1, 5)
        return {"columns": ["t_s", "sm_mhz", "power_w", "temp_c", "event_reasons"],
                "samples": s.tolist(), "marks": [[t, label] for t, label in self.marks], "error": self.error}


def save_json(path: Path, obj: Any, indent: int | None = 1) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(obj, indent=indent, default=_jsonable))
