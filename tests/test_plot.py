"""Plots: each kind renders a non-trivial PNG (and SVG), through the API and `jaxsched plot`, on
grid sweeps and on a Latin-hypercube design sweep (crossed with a grid); every text is named
for a reader and inside the figure; files are recognised by content, not by name."""

from __future__ import annotations

import json
from pathlib import Path

import matplotlib.text
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


def _texts(monkeypatch, draw) -> list[str]:
    """Every visible text of the figure `draw()` makes, each checked to lie inside the figure."""
    figs = []
    monkeypatch.setattr(plot, "_save", lambda fig, out: figs.append(fig) or Path(out))
    draw()
    (fig,) = figs
    fig.set_dpi(120)  # as `plot._save` writes it
    fig.canvas.draw()
    renderer, box = fig.canvas.get_renderer(), fig.bbox
    undrawn = set()  # labels of ticks outside an axis's view: matplotlib keeps but does not draw them
    for ax in fig.axes:
        for axis in (ax.xaxis, ax.yaxis):
            lo, hi = sorted(axis.get_view_interval())
            undrawn |= {id(label) for tick in axis.get_major_ticks() if not lo - 1e-9 <= tick.get_loc() <= hi + 1e-9
                        for label in (tick.label1, tick.label2)}
    texts = []
    for t in fig.findobj(matplotlib.text.Text):
        if not t.get_text() or not t.get_visible() or (t.axes is not None and not t.axes.get_visible()) \
                or id(t) in undrawn:
            continue
        bb = t.get_window_extent(renderer)
        assert box.x0 - 1 <= bb.x0 and bb.x1 <= box.x1 + 1 and box.y0 - 1 <= bb.y0 and bb.y1 <= box.y1 + 1, \
            f"cut off: {t.get_text()!r}"
        texts.append(t.get_text())
    return texts


@pytest.mark.parametrize("kind", ["makespan", "makespan design", "floorplan", "stalls"])
def test_figures_name_things_for_a_reader(monkeypatch, ds, design_out, kind):
    """Dimensions and values as the docs name them, not raw variable names; titles inside."""
    draw = {
        "makespan": lambda: plot.makespan(ds, "m.png"),
        "makespan design": lambda: plot.makespan(sweep.open_result(design_out), "d.png"),
        "floorplan": lambda: plot.floorplan(ds, "f.png", sel={"policy_warp": "lrr", "clocks_sigma": 0.05}),
        "stalls": lambda: plot.stalls(ds, "s.png"),
    }[kind]
    text = "\n".join(_texts(monkeypatch, draw))
    for raw in ("policy_warp", "clocks_sigma", "sm_utilisation", "replicate", "=lrr", "=gto"):
        assert raw not in text, raw
    assert "kernel makespan (µs)" in text if kind.startswith("makespan") else "warp policy" in text
    assert "warp policy" in text and "LRR" in text


def test_labels_from_cf_attributes_and_swept_paths(ds):
    assert plot.label(ds, "makespan_ns") == "kernel makespan (ns)"
    assert plot.label(ds, "sm_freq_mhz") == "SM clock (MHz)"
    assert plot.label(ds, "clocks_sigma") == "per-SM clock spread σ"
    assert plot.label(ds, "kernel_block_ghz") == "kernel block (GHz)"  # not in the dataset: the unit suffix
    assert [plot.value_text(v) for v in ("lrr", "round_robin", 0.05, True)] == ["LRR", "round robin", "0.05", "on"]


def test_cli_recognises_files_by_content(out, tmp_path, capsys):
    """A run's JSON trace under any name draws its Gantt chart, a sweep's netCDF under any name
    its makespan; anything else is one line naming the file, exit 2."""
    kfile = tmp_path / "k.toml"
    kfile.write_text(KERNEL)
    assert main(["run", str(kfile), "--json"]) == 0
    renamed = tmp_path / "trace.txt"
    renamed.write_text(capsys.readouterr().out)
    assert main(["plot", str(renamed)]) == 0
    _nontrivial(tmp_path / "gantt.png")
    nc = tmp_path / "result.dat"
    nc.write_bytes((out / sweep.NETCDF).read_bytes())
    assert main(["plot", str(nc), "-o", str(tmp_path / "m.png")]) == 0
    _nontrivial(tmp_path / "m.png")
    capsys.readouterr()
    rng = np.random.default_rng(0)
    cases = {"random.bin": rng.bytes(4000), "notes.nc": b"makespan 3.7 us\n", "v3.nc": b"CDF\x01" + rng.bytes(100),
             "half.json": b'{"cta_trace": ', "other.json": b'{"makespan_ns": 1.0}'}
    for name, data in cases.items():
        (tmp_path / name).write_bytes(data)
        assert main(["plot", str(tmp_path / name)]) == 2, name
        err = capsys.readouterr().err
        assert len(err.splitlines()) == 1 and "Traceback" not in err and name in err, err
    assert main(["plot", str(renamed), "--kind", "floorplan"]) == 2
    assert "gantt" in capsys.readouterr().err

