"""Plots: each kind renders a non-trivial PNG (and SVG), through the API and `jaxsched plot`, on
grid sweeps and on a Latin-hypercube design sweep (crossed with a grid)."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import xarray as xr

import jaxsched as js
from jaxsched import plot, sweep
from jaxsched.cli import main

SPEC = """
title = "plots"
arch = "h200"
replicates = 2
seed = 1
chunk = 6

[kernel]
name = "tiny"
grid = 300
threads = 64
program = "loop 3 cta_spread=2\\n ldg\\n fma dep\\nend"

[clocks]
mean_ghz = 1.8

[grid]
"policy.warp" = ["lrr", "gto"]
"clocks.sigma" = [0.0, 0.05, 0.1]
"""

# Same kernel and batch size (6) as SPEC: one compilation for both sweeps.
DESIGN_SPEC = SPEC.replace('title = "plots"', 'title = "design plots"').replace('"clocks.sigma" = [0.0, 0.05, 0.1]\n', "") + """
[design]
kind = "lhs"
samples = 6
seed = 2

[design.ranges]
"clocks.sigma" = [0.0, 0.2]
"policy.dispatch" = ["hardware", "closed_loop"]
"""

KERNEL = """
[kernel]
name = "tiny"
grid = 300
threads = 64
program = "loop 3 cta_spread=2\\n ldg\\n fma dep\\nend"
"""


@pytest.fixture(scope="module")
def out(tmp_path_factory) -> Path:
    """A finished sweep folder (sweep.zarr + sweep.nc), without the CLI's compile overhead."""
    folder = tmp_path_factory.mktemp("plots")
    (folder / "spec.toml").write_text(SPEC)
    outcome = sweep.execute(sweep.load(folder / "spec.toml"), folder, log=lambda _: None)
    assert outcome.complete and outcome.netcdf is not None
    return folder


@pytest.fixture(scope="module")
def ds(out) -> xr.Dataset:
    return sweep.open_result(out)


@pytest.fixture(scope="module")
def design_out(tmp_path_factory) -> Path:
    """A finished design sweep: policy_warp (grid) x config (6 LHS samples) x replicate."""
    folder = tmp_path_factory.mktemp("design_plots")
    (folder / "spec.toml").write_text(DESIGN_SPEC)
    spec = sweep.load(folder / "spec.toml")
    assert sweep.make_layout(spec, spec.chunk).chunk_size == 6
    assert sweep.execute(spec, folder, log=lambda _: None).complete
    return folder


def _nontrivial(path: Path, min_bytes: int = 8000) -> None:
    assert path.is_file() and path.stat().st_size > min_bytes, path


def test_dataset_has_floorplan_coordinates(ds):
    assert ds["sm_x_mm"].dims == ("sm",) and ds["sm_y_mm"].dims == ("sm",)
    assert 0 < float(ds["sm_x_mm"].min()) < float(ds["sm_x_mm"].max()) < ds.attrs["die_width_mm"]
    u = ds["sm_utilisation"].values
    assert np.all((u >= 0) & (u <= 1)) and u.max() > 0


def test_makespan_plot(ds, tmp_path):
    _nontrivial(plot.makespan(ds, tmp_path / "m.png", x="clocks_sigma"))
    _nontrivial(plot.makespan(ds, tmp_path / "m.svg", x="policy_warp"))


def test_makespan_plot_on_a_design_sweep(design_out, tmp_path):
    ds = sweep.open_result(design_out)
    assert ds["makespan_ns"].dims == ("policy_warp", "config", "replicate")
    _nontrivial(plot.makespan(ds, tmp_path / "d.png"))  # x: the first numeric sampled parameter
    _nontrivial(plot.makespan(ds, tmp_path / "d2.png", x="policy_dispatch"))  # categorical
    _nontrivial(plot.makespan(ds, tmp_path / "d3.svg", x="policy_warp"))  # grid dimension
    with pytest.raises(js.JaxschedError, match=r"sampled parameters \['clocks_sigma', 'policy_dispatch'\]"):
        plot.makespan(ds, tmp_path / "x.png", x="config")
    _nontrivial(plot.stalls(ds, tmp_path / "s.png"))  # averaged over the samples


def test_binned_median_bins():
    few = np.array([3.0, 1.0, 3.0, 2.0])
    bins, centres = plot._bins(few)
    np.testing.assert_array_equal(centres, [1.0, 2.0, 3.0])
    np.testing.assert_array_equal(bins, [2, 0, 2, 1])
    many = np.linspace(0.0, 1.0, 200)
    bins, centres = plot._bins(many)
    assert len(centres) == plot._MAX_BINS and bins.min() == 0 and bins.max() == plot._MAX_BINS - 1
    assert np.all(np.diff(bins) >= 0)  # monotone: each bin is an interval of x
    assert np.all(np.abs(many - centres[bins]) <= 0.5 / plot._MAX_BINS + 1e-12)


def test_cli_plot_on_a_design_sweep(design_out, tmp_path, capsys):
    assert main(["plot", str(design_out)]) == 0  # kind makespan, default x
    _nontrivial(design_out / "makespan.png")
    target = tmp_path / "sigma.png"
    assert main(["plot", str(design_out), "--kind", "makespan", "--x", "clocks_sigma", "-o", str(target)]) == 0
    _nontrivial(target)
    capsys.readouterr()
    assert main(["plot", str(design_out), "--x", "kernel_trips"]) == 2
    assert "sampled parameters" in capsys.readouterr().err


def test_floorplan_plot(ds, tmp_path):
    _nontrivial(plot.floorplan(ds, tmp_path / "f.png"))
    _nontrivial(plot.floorplan(ds, tmp_path / "c.svg", var="sm_ctas", sel={"policy_warp": "gto"}))
    with pytest.raises(js.JaxschedError, match="per-SM"):
        plot.floorplan(ds, tmp_path / "x.png", var="makespan_ns")


def test_stalls_plot(ds, tmp_path):
    _nontrivial(plot.stalls(ds, tmp_path / "s.png"))
    _nontrivial(plot.stalls(ds, tmp_path / "s2.png", x="clocks_sigma", sel={"policy_warp": "lrr"}))


def test_gantt_from_result_and_from_run_json(tmp_path, capsys):
    arch = js.presets.get("h200")
    kfile = tmp_path / "k.toml"
    kfile.write_text(KERNEL)
    assert main(["run", str(kfile), "--json"]) == 0
    trace = tmp_path / "trace.json"
    trace.write_text(capsys.readouterr().out)
    assert len(json.loads(trace.read_text())["cta_trace"]["sm"]) == 300
    _nontrivial(plot.gantt(trace, arch, tmp_path / "g.png"))
    result = js.simulate(arch, js.load_kernel(kfile))  # same shapes as `run`: no new compile
    _nontrivial(plot.gantt(result, arch, tmp_path / "g2.svg", n_ctas=300))
    # CLI: the kind defaults to gantt for a .json trace
    assert main(["plot", str(trace), "-o", str(tmp_path / "g3.png")]) == 0
    _nontrivial(tmp_path / "g3.png")


def test_lanes_never_overlap():
    sm = np.array([0, 0, 0, 1, 0])
    start = np.array([0.0, 1.0, 5.0, 0.0, 2.0])
    end = np.array([4.0, 6.0, 8.0, 3.0, 4.5])
    lane, n = plot._lanes(sm, start, end)
    assert n == {0: 3, 1: 1}
    for a in range(len(sm)):
        for b in range(a + 1, len(sm)):
            if sm[a] == sm[b] and lane[a] == lane[b]:
                assert end[a] <= start[b] or end[b] <= start[a]


@pytest.mark.parametrize("kind, extra", [
    ("makespan", []), ("floorplan", ["--sel", "policy_warp=gto", "--sel", "clocks_sigma=0.1"]),
    ("stalls", ["--x", "clocks_sigma"]),
])
def test_cli_plot_kinds(out, tmp_path, capsys, kind, extra):
    target = tmp_path / f"{kind}.png"
    assert main(["plot", str(out), "--kind", kind, "-o", str(target), *extra]) == 0
    _nontrivial(target)
    assert str(target) in capsys.readouterr().out


def test_cli_plot_defaults_and_errors(out, capsys):
    assert main(["plot", str(out / sweep.STORE), "--kind", "floorplan"]) == 0
    _nontrivial(out / "floorplan.png")
    assert main(["plot", str(out), "--kind", "floorplan", "--sel", "policy_warp=fifo"]) == 2
    assert "policy_warp values" in capsys.readouterr().err
    assert main(["plot", str(out), "--kind", "gantt"]) == 2
    assert "jaxsched run" in capsys.readouterr().err
