"""The `jaxsched` command line, run in-process through `jaxsched.cli.main` (plus one run of the
installed console script): occupancy, arch, run, and bad input as one error line with exit 2."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from jaxsched import archio, presets
from jaxsched.cli import main

ROOT = Path(__file__).resolve().parent.parent
KERNELS = ROOT / "sweeps" / "kernels"
SCRIPT = Path(sys.executable).parent / "jaxsched"


def run_cli(capsys, *argv: str) -> tuple[int, str, str]:
    rc = main(list(argv))
    out, err = capsys.readouterr()
    return rc, out, err


def curve_rows(out: str) -> list[tuple[int, int, float]]:
    return [(int(t), int(b), float(o)) for t, b, o in
            re.findall(r"^\s+(\d+)\s+(\d+) blocks\s+([\d.]+)%", out, flags=re.M)]


# --------------------------------------------------------------------------- occupancy


def check_occupancy_text(out: str) -> None:
    assert re.search(r"active blocks per SM\s*:\s*4\b", out), out
    assert re.search(r"active warps per SM\s*:\s*32 of 64\b", out), out
    assert re.search(r"occupancy\s*:\s*50\.0%", out), out
    assert re.search(r"limited by\s*:\s*registers\s*$", out, flags=re.M), out
    rows = curve_rows(out)
    assert [t for t, _, _ in rows] == list(range(32, 1025, 32))
    assert rows[7] == (256, 4, 50.0)
    marked = [line for line in out.splitlines() if line.rstrip().endswith("<")]
    assert len(marked) == 1 and marked[0].split()[0] == "256"


def test_occupancy_text(capsys):
    rc, out, err = run_cli(capsys, "occupancy", "--arch", "h200", "--threads", "256",
                           "--regs", "64", "--smem", "0")
    assert rc == 0 and err == ""
    check_occupancy_text(out)


def test_occupancy_json(capsys):
    rc, out, err = run_cli(capsys, "occupancy", "--arch", "h200", "--threads", "256",
                           "--regs", "64", "--smem", "0", "--json")
    assert rc == 0 and err == ""
    doc = json.loads(out)
    for key in ("blocks_per_sm", "occupancy_percent", "limiters", "limits", "curve"):
        assert key in doc, key
    assert doc["blocks_per_sm"] == 4
    assert doc["occupancy_percent"] == 50.0
    assert doc["limiters"] == ["registers"]
    assert doc["limits"]["registers"] == 4 and doc["limits"]["warps"] == 8
    assert doc["active_warps"] == 32 and doc["max_warps_per_sm"] == 64
    assert len(doc["curve"]) == 32
    assert [r["threads_per_block"] for r in doc["curve"]] == list(range(32, 1025, 32))
    row = doc["curve"][7]
    assert row == {"threads_per_block": 256, "blocks_per_sm": 4, "occupancy_percent": 50.0}
    # the curve agrees with single-point queries at other sizes
    assert doc["curve"][-1]["blocks_per_sm"] == 1 and doc["curve"][-1]["occupancy_percent"] == 50.0


def test_occupancy_json_other_arch_and_toml_file(capsys, tmp_path):
    """DOMAIN.md's worked check (256 threads, 32 regs: 8 blocks, 100%) through an arch TOML."""
    path = tmp_path / "chip.toml"
    archio.save(presets.get("a100"), path)
    rc, out, _ = run_cli(capsys, "occupancy", "--arch", str(path), "--threads", "256",
                         "--regs", "32", "--json")
    assert rc == 0
    doc = json.loads(out)
    assert doc["arch"] == "a100" and doc["blocks_per_sm"] == 8
    assert doc["occupancy_percent"] == 100.0


# --------------------------------------------------------------------------- arch


def test_arch_text(capsys):
    rc, out, err = run_cli(capsys, "arch", "h200")
    assert rc == 0 and err == ""
    assert re.search(r"SMs: 132 enabled of 144", out), out
    assert "compute capability 9.0" in out
    # docs/calibration.md: 6 x 16 + 2 x 18 SMs, dispatch led by %smid 124-131, then GPC 0's rest
    assert "SMs per GPC: [16, 16, 16, 16, 16, 16, 18, 18]" in out
    assert "[124, 125, 126, 127, 128, 129, 130, 131, 0, 1, 16, 17, 32, 33, 48, 49]" in out


def test_arch_toml_round_trip(capsys):
    rc, out, err = run_cli(capsys, "arch", "h200", "--toml")
    assert rc == 0 and err == ""
    back = archio.loads(out)
    ref = presets.get("h200")
    assert back.name == "h200" and back.sm_count == 132
    import jax

    la, ta = jax.tree_util.tree_flatten(ref)
    lb, tb = jax.tree_util.tree_flatten(back)
    assert ta == tb
    for x, y in zip(la, lb):
        assert np.asarray(x).dtype == np.asarray(y).dtype
        np.testing.assert_array_equal(x, y)


# --------------------------------------------------------------------------- bad input


@pytest.fixture(scope="module")
def bad_arch_file(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("cli") / "bad_arch.toml"
    path.write_text("name = = 3\n")
    return path


OCC = ("occupancy", "--arch", "h200", "--regs", "32")
# Checked before jax.distributed starts: nothing listens on the port.
SWEEP_HOSTS = ("sweep", str(ROOT / "tests" / "data" / "tiny_sweep.toml"), "-o", "/nonexistent/out",
               "--coordinator", "localhost:1")
BAD_INPUT = {
    "threads 0": (("occupancy", "--threads", "0", "--regs", "32"), "threads_per_block", "0"),
    "threads 1025": ((*OCC, "--threads", "1025"), "threads_per_block", "1025"),
    "regs 300": (("occupancy", "--threads", "256", "--regs", "300"), "regs_per_thread", "300"),
    "smem above opt-in": ((*OCC, "--threads", "256", "--smem", "232449"),
                          "dynamic_smem_bytes", "232449"),
    "negative smem": ((*OCC, "--threads", "256", "--smem", "-1"), "dynamic_smem_bytes", "-1"),
    "carveout 150": ((*OCC, "--threads", "256", "--carveout", "150"), "carveout_percent", "150"),
    "unknown arch (occupancy)": (("occupancy", "--arch", "b200", "--threads", "256", "--regs", "32"),
                                 "arch", "b200"),
    "unknown arch (arch)": (("arch", "b200"), "arch", "b200"),
    "unknown arch (run)": (("run", str(KERNELS / "divergent.toml"), "--arch", "b200"), "arch", "b200"),
    "missing kernel file": (("run", "/nonexistent/kernel.toml"), "kernel file",
                            "/nonexistent/kernel.toml"),
    "missing arch file": (("arch", "/nonexistent/chip.toml"), "arch file", "/nonexistent/chip.toml"),
    "malformed arch TOML (arch)": (("arch", "@BAD@"), "@BAD@", "malformed TOML"),
    "malformed arch TOML (occupancy)": (("occupancy", "--arch", "@BAD@", "--threads", "256",
                                         "--regs", "32"), "@BAD@", "malformed TOML"),
    "clock 0": (("run", str(KERNELS / "divergent.toml"), "--clock-ghz", "0"), "clock_ghz", "0"),
    "threads 1e22": ((*OCC, "--threads", "10000000000000000000000"), "threads_per_block",
                     "10000000000000000000000"),
    "num-processes 1e22": ((*SWEEP_HOSTS, "--num-processes", "10000000000000000000000", "--process-id", "0"),
                           "--num-processes", "10000000000000000000000"),
    "process-id 1e22": ((*SWEEP_HOSTS, "--num-processes", "2", "--process-id", "10000000000000000000000"),
                        "--process-id", "10000000000000000000000"),
    "process-id -1": ((*SWEEP_HOSTS, "--num-processes", "2", "--process-id", "-1"), "--process-id", "0 .. 1"),
    "num-processes 0": ((*SWEEP_HOSTS, "--num-processes", "0", "--process-id", "0"), "--num-processes", "1 .."),
}


@pytest.mark.parametrize("case", list(BAD_INPUT))
def test_bad_input_one_line_exit_2(capsys, bad_arch_file, case):
    argv, field, value = BAD_INPUT[case]
    argv = [str(bad_arch_file) if a == "@BAD@" else a for a in argv]
    field = str(bad_arch_file) if field == "@BAD@" else field
    rc, out, err = run_cli(capsys, *argv)
    assert rc == 2
    assert out == ""
    lines = err.splitlines()
    assert len(lines) == 1, err
    assert lines[0].startswith(f"jaxsched {argv[0]}: error: "), err
    assert "Traceback" not in err
    assert field in lines[0] and value in lines[0], err


@pytest.mark.parametrize("kind", ["dispatch-start", "grid", "program"])
def test_bad_input_no_traceback(capsys, tmp_path, kind):
    kernel = tmp_path / "k.toml"
    grid = "10000000000" if kind == "grid" else "4"
    program = "5" if kind == "program" else '"fma"'
    kernel.write_text(f"[kernel]\ngrid = {grid}\nthreads = 64\nprogram = {program}\n")
    argv = ["run", str(kernel)]
    if kind == "dispatch-start":
        argv += ["--dispatch-start", "10000000000"]
    assert main(argv) == 2


# --------------------------------------------------------------------------- run


def test_run_json(capsys):
    rc, out, err = run_cli(capsys, "run", str(KERNELS / "compute_bound.toml"), "--json")
    assert rc == 0
    doc = json.loads(out)
    grid = 1056
    assert doc["arch"] == "h200" and doc["kernel"] == "compute_bound" and doc["ctas"] == grid
    assert doc["makespan_ns"] > 0
    assert doc["makespan_cycles"] > 0
    # makespan_cycles counts cycles of the boost clock (all SMs run at it here)
    assert doc["makespan_cycles"] == pytest.approx(doc["makespan_ns"] * 1.98, rel=1e-6)
    # 64 dependent FMAs per warp, 16 warps per scheduler: at least 64 x 16 issue cycles
    assert doc["makespan_cycles"] >= 64 * 16
    # one wave, no refills: the issue-slot bound is the instructions over 132 x 4 schedulers
    assert doc["issue_bound_ns"] == pytest.approx(doc["issued_instructions"] / (132 * 4 * 1.98), rel=1e-6)
    assert doc["issue_bound_ns"] <= doc["makespan_ns"]
    counts = doc["ctas_per_sm"]
    assert len(counts) == 132 and sum(counts) == grid
    assert counts == [8] * 132  # one full wave: 8 CTAs of 256 threads per SM
    trace = doc["cta_trace"]
    for key in ("sm", "start_ns", "end_ns"):
        assert len(trace[key]) == grid, key
    sm = np.asarray(trace["sm"])
    start, end = np.asarray(trace["start_ns"]), np.asarray(trace["end_ns"])
    assert sm.min() >= 0 and sm.max() < 132
    np.testing.assert_array_equal(np.bincount(sm, minlength=132), counts)
    assert np.all(start >= 0) and np.all(end > start)
    assert end.max() == pytest.approx(doc["makespan_ns"], abs=1e-3)


def _run_json(capsys, *argv: str) -> dict:
    rc, out, err = run_cli(capsys, "run", *argv, "--json")
    assert rc == 0, err
    return json.loads(out)


def test_run_clock_map_per_enabled_sm_or_per_slot(capsys, tmp_path):
    """`--clocks` takes one MHz value per enabled SM (132) or per SM slot of the die (144, the
    floorswept slots last): the same run either way; the summary has each SM's clock, GPC, CTAs
    and busy time, and their sums per GPC."""
    mhz = np.linspace(1500, 1980, 132).round()
    np.save(tmp_path / "enabled.npy", mhz)
    (tmp_path / "slots.csv").write_text("# %smid order\n" + ",".join(f"{v:g}" for v in np.r_[mhz, np.zeros(12)]))
    kernel = str(KERNELS / "compute_bound.toml")
    doc = _run_json(capsys, kernel, "--clocks", str(tmp_path / "enabled.npy"))
    assert _run_json(capsys, kernel, "--clocks", str(tmp_path / "slots.csv")) == doc
    assert doc["sm_clock_mhz"] == mhz.tolist()
    gpc, busy, ctas = (np.asarray(doc[k]) for k in ("sm_gpc", "sm_busy_ns", "ctas_per_sm"))
    assert gpc.tolist() == np.asarray(presets.get("h200").sm_gpc)[:132].tolist()
    assert [row["gpc"] for row in doc["gpcs"]] == list(range(8))
    for row in doc["gpcs"]:
        m = gpc == row["gpc"]
        assert row["sms"] == m.sum() and row["ctas"] == ctas[m].sum()
        assert (row["clock_mhz_min"], row["clock_mhz_max"]) == (mhz[m].min(), mhz[m].max())
        assert row["busy_ns_max"] == busy[m].max()
    assert busy.max() <= doc["makespan_ns"]
    # one wave of dependent FMAs: an SM's busy time follows its clock
    assert busy[np.argmin(mhz)] > 1.2 * busy[np.argmax(mhz)]


def test_run_clock_model(capsys):
    kernel = str(KERNELS / "compute_bound.toml")
    a, b, c = (_run_json(capsys, kernel, "--clock-model", "variation", "--sigma", "0.1", "--seed", seed)
               for seed in ("3", "3", "4"))
    assert a == b and a["sm_clock_mhz"] != c["sm_clock_mhz"]
    f = np.asarray(a["sm_clock_mhz"])
    assert f.max() <= 1980 and 0.03 < f.std() / f.mean() < 0.2 and np.all(f % 15 == 0)  # binned to 15 MHz
    g = _run_json(capsys, kernel, "--clock-model", "gaussian", "--sigma", "0.05", "--clock-ghz", "1.7")
    assert abs(np.median(g["sm_clock_mhz"]) - 1700) < 50
    rc, out, _ = run_cli(capsys, "run", kernel, "--clock-model", "gaussian", "--sigma", "0.05")
    assert rc == 0 and "per GPC" in out and len(re.findall(r"^    GPC \d", out, flags=re.M)) == 8
    assert re.search(r"SMs at 1\.\d+\.\.1\.980 GHz", out), out


@pytest.mark.parametrize("case", ["short map", "GHz map", "map and model", "map and clock", "sigma alone",
                                  "model without sigma", "unknown model", "negative seed"])
def test_run_bad_clock_options_one_line_exit_2(capsys, tmp_path, case):
    np.save(tmp_path / "short.npy", np.full(100, 1900.0))
    np.save(tmp_path / "ghz.npy", np.full(132, 1.9))
    kernel = str(KERNELS / "compute_bound.toml")
    argv, words = {
        "short map": (["--clocks", str(tmp_path / "short.npy")], ["100 values", "144", "132", "%smid"]),
        "GHz map": (["--clocks", str(tmp_path / "ghz.npy")], ["MHz"]),
        "map and model": (["--clocks", str(tmp_path / "ghz.npy"), "--clock-model", "gaussian"], ["--clocks"]),
        "map and clock": (["--clocks", str(tmp_path / "ghz.npy"), "--clock-ghz", "1.5"], ["--clock-ghz"]),
        "sigma alone": (["--sigma", "0.1"], ["--sigma", "--clock-model"]),
        "model without sigma": (["--clock-model", "gaussian"], ["--sigma"]),
        "unknown model": (["--clock-model", "flat", "--sigma", "0.1"], ["flat", "gaussian", "variation"]),
        "negative seed": (["--clock-model", "gaussian", "--sigma", "0.1", "--seed", "-1"], ["seed", "-1"]),
    }[case]
    rc, out, err = run_cli(capsys, "run", kernel, *argv)
    assert rc == 2 and out == "" and "Traceback" not in err
    assert len(err.splitlines()) == 1 and all(w in err for w in words), err


def test_run_names_the_binding_bound(capsys, tmp_path):
    """A memory-bound kernel (sweeps/kernels/memory_bound.toml at a quarter of its trips) is
    measured against DRAM bandwidth, not issue slots; a chain of short kernels in a stream
    against its launch calls. Every bound is at or below the run."""
    memory_bound = tmp_path / "memory_bound.toml"
    memory_bound.write_text((KERNELS / "memory_bound.toml").read_text().replace("loop 16", "loop 4"))
    doc = _run_json(capsys, str(memory_bound))
    assert doc["binding_bound"] == "dram_bandwidth" and set(doc["bounds_ns"]) == {
        "dram_bandwidth", "l2_bandwidth", "issue_slots"}
    assert all(v <= doc["makespan_ns"] for v in doc["bounds_ns"].values())
    assert 0 <= doc["above_binding_percent"] < 5
    rc, out, _ = run_cli(capsys, "run", str(memory_bound))
    line = next(l for l in out.splitlines() if l.strip().startswith("bound"))
    assert re.search(r"bound\s+: DRAM bandwidth, [\d.]+ ns; makespan \+\d\.\d% above it \(also L2 bandwidth", line), line
    chain = _run_json(capsys, str(ROOT / "examples" / "workloads" / "chain_stream.toml"))
    assert chain["binding_bound"] == "launch" and "issue_slots" in chain["bounds_ns"]
    assert all(v <= chain["makespan_ns"] for v in chain["bounds_ns"].values())
    assert chain["above_binding_percent"] < 5


# --------------------------------------------------------------------------- console script


def test_run_no_fast_forward_same_numbers(capsys, tmp_path):
    """`--no-fast-forward` steps every event: the same numbers, more ticks processed."""
    kernel = tmp_path / "loop.toml"
    kernel.write_text('name = "loop"\ngrid = 1056\nthreads = 256\nregs = 32\n'
                      'program = "loop 40\\n fma dep\\n alu\\n alu dep\\nend"\n')
    docs = []
    for extra in ((), ("--no-fast-forward",)):
        rc, out, _ = run_cli(capsys, "run", str(kernel), "--warp-policy", "lrr", "--json", *extra)
        assert rc == 0
        docs.append(json.loads(out))
    on, off = docs
    assert on["ticks_stepped"] < off["ticks_stepped"] <= off["makespan_ticks"]
    for doc in docs:
        doc.pop("ticks_stepped")
    assert on == off


def test_console_script_occupancy():
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "jaxsched.cli"]
    proc = subprocess.run(
        [*cmd, "occupancy", "--arch", "h200", "--threads", "256", "--regs", "64", "--smem", "0"],
        capture_output=True, text=True, timeout=120, cwd=ROOT,
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stderr == ""
    check_occupancy_text(proc.stdout)


@pytest.mark.parametrize("case", ["threads 1e22", "trips 3e9", "not utf-8"])
def test_reported_tracebacks_are_one_line_in_the_console_script(tmp_path, case):
    """The three inputs once reported with a Python traceback, through the installed command."""
    cmd = [str(SCRIPT)] if SCRIPT.exists() else [sys.executable, "-m", "jaxsched.cli"]
    if case == "threads 1e22":
        argv, words = ["occupancy", "--threads", "10000000000000000000000", "--regs", "32"], \
            ["threads_per_block", "10000000000000000000000", "2^31 - 1"]
    elif case == "trips 3e9":
        k = _write(tmp_path / "k.toml", b'[kernel]\ngrid = 4\nthreads = 64\nprogram = "loop 3000000000\\n fma\\nend"\n')
        argv, words = ["run", str(k)], ["program line 1", "3000000000", "16777215"]
    else:
        k = _write(tmp_path / "k.toml", b'[kernel]\nname = "\xff\xfe"\n')
        argv, words = ["run", str(k)], ["kernel file", "k.toml", "not UTF-8"]
    proc = subprocess.run([*cmd, *argv], capture_output=True, text=True, timeout=120, cwd=ROOT)
    assert proc.returncode == 2 and proc.stdout == "", proc.stderr
    lines = proc.stderr.splitlines()
    assert len(lines) == 1 and lines[0].startswith(f"jaxsched {argv[0]}: error: "), proc.stderr
    assert all(w in lines[0] for w in words), lines[0]


def _write(path: Path, data: bytes) -> Path:
    path.write_bytes(data)
    return path


@pytest.mark.parametrize("case", ["trips 3e9", "not utf-8", "sweep onto a file", "damaged store", "corrupt netcdf"])
def test_bad_files_one_line_exit_2(capsys, tmp_path, case):
    """Inputs that once printed a Python traceback: one error line naming the field, exit 2."""
    tiny = ROOT / "tests" / "data" / "tiny_sweep.toml"
    if case == "trips 3e9":
        k = _write(tmp_path / "k.toml", b'[kernel]\ngrid = 4\nthreads = 64\nprogram = "loop 3000000000\\n fma\\nend"\n')
        argv, words = ["run", str(k)], ["program line 1", "3000000000", "16777215"]
    elif case == "not utf-8":
        k = _write(tmp_path / "k.toml", b'[kernel]\nname = "\xff\xfe"\n')
        argv, words = ["run", str(k)], ["kernel file", "UTF-8"]
    elif case == "sweep onto a file":
        out = _write(tmp_path / "afile", b"")
        argv, words = ["sweep", str(tiny), "-o", str(out)], ["-o", "not a folder"]
    else:
        out = tmp_path / "out"
        assert main(["sweep", str(tiny), "-o", str(out)]) == 0
        capsys.readouterr()
        if case == "damaged store":
            import shutil

            shutil.rmtree(out / "sweep.zarr" / "done")
            argv, words = ["sweep", str(tiny), "-o", str(out), "--resume"], ["missing arrays", "done"]
        else:
            import shutil

            shutil.rmtree(out / "sweep.zarr")
            (out / "sweep.nc").write_bytes(b"garbage")
            argv, words = ["info", str(out)], ["sweep.nc", "not a netCDF"]
    rc, out_text, err = run_cli(capsys, *argv)
    lines = [line for line in err.splitlines() if line.startswith(f"jaxsched {argv[0]}: error: ")]
    assert rc == 2, err
    assert len(lines) == 1 and "Traceback" not in err, err
    assert all(w in lines[0] for w in words), lines[0]
