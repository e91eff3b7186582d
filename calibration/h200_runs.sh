#!/usr/bin/env bash
# The device runs behind benchmarks/RESULTS.md and the README's DVFS and die-scaling results, as
# run on one H200 (`OUT` collects what comes back; big datasets are reduced to what the reports
# need). Usage: OUT=dir bash calibration/h200_runs.sh [overhead|r2r|10k|die|dvfs|validate ...]
set -u
export PYTHONPATH=$PWD${EXTRA_PYTHONPATH:+:$EXTRA_PYTHONPATH}  # e.g. pure-Python wheels the device lacks
OUT=${OUT:-results/h200}
mkdir -p "$OUT"
reduce() {  # reduce SWEEP_DIR VARS... -> SWEEP_DIR.nc with only VARS
  python - "$@" <<'PY'
import sys, xarray as xr
from jaxsched import sweep
ds = sweep.open_result(sys.argv[1])
ds[sys.argv[2:]].to_netcdf(sys.argv[1] + ".nc", engine="h5netcdf")
PY
}
timed() { local name=$1; shift; local t0=$(date +%s%N); "$@" > "$OUT/$name.log" 2>&1; local rc=$?
  echo "$name rc=$rc seconds=$(( ($(date +%s%N) - t0) / 1000000 ))e-3" | tee -a "$OUT/times.txt"; return $rc; }
inmemory() {  # inmemory SPEC OUT.nc VARS...: the same sweep through the Python API (no zarr store)
  python - "$@" <<'PY'
import sys, time
from jaxsched import sweep
t0 = time.perf_counter()
ds = sweep.run(sweep.load(sys.argv[1]))
ds[sys.argv[3:]].to_netcdf(sys.argv[2], engine="h5netcdf")
print(f"in-memory sweep: {time.perf_counter() - t0:.1f} s")
PY
}
python -c "import zarr" 2>/dev/null || echo "no zarr here: sweeps run in memory (sweep.run) instead of the CLI" | tee -a "$OUT/times.txt"
# Sweep stores live in WORK, outside OUT: a call cut by the device's time limit leaves the store
# on the (still warm) machine, and the next call finishes it with --resume. `die` at the spec's
# 200 chips per point (12000 configurations, ~13 min on one H200) needs two such calls.
WORK=${WORK:-/tmp/jaxsched_work}
mkdir -p "$WORK"
cli_or_memory() {  # cli_or_memory NAME SPEC VARS...
  local name=$1 spec=$2; shift 2
  if python -c "import zarr" 2>/dev/null; then
    local resume=""; [ -d "$WORK/$name/sweep.zarr" ] && resume="--resume"
    timed "$name" python -m jaxsched.cli sweep "$spec" -o "$WORK/$name" $resume \
      && reduce "$WORK/$name" "$@" && mv "$WORK/$name.nc" "$OUT/$name.nc" && cp "$WORK/$name/makespan.png" "$OUT/$name.png"
  else
    timed "$name" inmemory "$spec" "$OUT/$name.nc" "$@"
  fi
}
for job in "$@"; do
  case $job in
    r2r) cli_or_memory run_to_run sweeps/run_to_run.toml makespan_ns ;;
    10k) cli_or_memory h200_10k sweeps/h200_10k.toml makespan_ns ;;
    die) cli_or_memory die_scaling sweeps/die_scaling.toml makespan_ns sm_freq_mhz ;;
    dvfs) timed dvfs python benchmarks/throughput.py --batch 1024 --dvfs ;;
    overhead) nvcc -O2 -o /tmp/launch_overhead calibration/launch_overhead.cu \
                && timed overhead /tmp/launch_overhead && cp "$OUT/overhead.log" "$OUT/launch_overhead.json" ;;
    validate) timed validate python calibration/validate_hw.py --data data/h200 -o "$OUT/validate_hw_sass.json" --batch 14 ;;
  esac
done
