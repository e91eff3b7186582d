"""`jaxsched.kernel`: the program text form, `make_kernel`, `kernel_from_dict`, `load_kernel`,
the example kernels in `sweeps/kernels/`, and bad programs / launch values naming the line."""

from __future__ import annotations

import re
import textwrap
from pathlib import Path

import numpy as np
import pytest

import jaxsched as js
from jaxsched import kernel as kmod
from jaxsched.isa import Op
from jaxsched.kernel import Instr, kernel_from_dict, load_kernel, make_kernel, parse_program

KERNELS = sorted((Path(__file__).resolve().parent.parent / "sweeps" / "kernels").glob("*.toml"))


def docstring_program() -> str:
    """The example program of `jaxsched.kernel`'s module docstring."""
    doc = kmod.__doc__
    start = doc.index("(also the TOML `program` field):")
    end = doc.index("See docs/model.md")
    block = doc[start:end].split("\n", 1)[1]
    return textwrap.dedent(block)


def test_docstring_program_parses():
    text = docstring_program()
    assert "loop 64" in text and "exit" in text  # the extraction found the example
    instrs, struct = parse_program(text)
    assert [i.op for i in instrs] == [Op.LDG, Op.FMA, Op.LDS, Op.SFU, Op.FMA, Op.BAR, Op.EXIT]
    assert [i.dep for i in instrs] == [False, True, False, True, True, False, False]
    assert [i.bytes_per_warp for i in instrs] == [128, 0, 0, 0, 0, 0, 0]
    assert [i.bank_ways for i in instrs] == [1, 1, 2, 1, 1, 1, 1]
    assert struct.loops == [(0, 2, 64, 8, 4)]
    assert struct.branches == [(3, 4, 5, 0.25, -1)]


def test_docstring_program_kernel_arrays():
    k = make_kernel(docstring_program(), grid=10, threads=128, regs=40, smem_bytes=1024,
                    static_smem_bytes=512, l2_hit_rate=0.75, seed=3, name="doc")
    assert k.name == "doc" and k.n_instr == 7
    np.testing.assert_array_equal(k.op, [4, 0, 3, 2, 0, 6, 7])
    np.testing.assert_array_equal(k.dep, [0, 1, 0, 1, 1, 0, 0])
    np.testing.assert_array_equal(k.bytes_per_warp, [128, 0, 0, 0, 0, 0, 0])
    np.testing.assert_array_equal(k.bank_ways, [1, 1, 2, 1, 1, 1, 1])
    assert (k.loop_start.tolist(), k.loop_end.tolist()) == ([0], [2])
    assert (k.branch_start.tolist(), k.branch_mid.tolist(), k.branch_end.tolist()) == ([3], [4], [5])
    assert (k.trips.tolist(), k.trips_cta_spread.tolist(), k.trips_warp_spread.tolist()) == ([64], [8], [4])
    assert k.branch_if_probability.tolist() == [0.25] and k.branch_parent.tolist() == [-1]
    assert float(k.l2_hit_rate) == 0.75
    assert (int(k.grid_ctas), int(k.threads_per_cta), int(k.regs_per_thread)) == (10, 128, 40)
    assert (int(k.dynamic_smem_bytes), int(k.static_smem_bytes), int(k.seed)) == (1024, 512, 3)
    for field in ("op", "bytes_per_warp", "bank_ways", "loop_start", "trips", "grid_ctas", "seed"):
        assert getattr(k, field).dtype == np.int32, field
    assert k.dep.dtype == bool
    assert k.branch_if_probability.dtype == np.float32 and k.l2_hit_rate.dtype == np.float32


def test_no_loop_no_branch_marked_minus_one():
    k = make_kernel("alu\nshfl dep", grid=1, threads=32)
    np.testing.assert_array_equal(k.op, [Op.ALU, Op.SHFL, Op.EXIT])
    for field in ("loop_start", "loop_end", "branch_start", "branch_mid", "branch_end", "branch_parent"):
        assert getattr(k, field).tolist() == [-1], field
    assert k.trips.tolist() == [0] and k.branch_if_probability.tolist() == [0.0]
    assert (k.n_loops, k.n_branches) == (0, 0)


def test_if_inside_loop_and_branch_after_loop():
    _, s = parse_program("loop 3\n fma\n if 0.5\n  sfu\n else\n  alu\n end\n fma dep\nend")
    assert s.loops == [(0, 3, 3, 0, 0)] and s.branches == [(1, 2, 3, 0.5, -1)]
    _, s = parse_program("loop 3\n fma\nend\nif 1\n sfu\nelse\n alu\nend")
    assert s.loops == [(0, 0, 3, 0, 0)] and s.branches == [(1, 2, 3, 1.0, -1)]


def test_nested_structure_in_opening_order():
    """Loops and branches are numbered as they open; a branch names the path around it."""
    _, s = parse_program("""
loop 4
  fma
  if 0.5
    loop 3
      alu
    end
    if 0.25
      sfu
    end
  else
    loop @rows
      lds
    end
  end
  alu
end
if 0.3
  fma
end""")
    assert s.loops == [(0, 4, 4, 0, 0), (1, 1, 3, 0, 0), (3, 3, "rows", 0, 0)]
    # branch 0: if-path 1..2, else 3..3; branch 1 inside branch 0's if-path, without else
    assert s.branches == [(1, 3, 4, 0.5, -1), (2, 3, 3, 0.25, 0), (5, 6, 6, 0.3, -1)]
    _, s = parse_program("if 0.5\n fma\nelse\n if 0.5\n  alu\n else\n  sfu\n end\nend")
    assert s.branches == [(0, 1, 3, 0.5, -1), (1, 2, 3, 0.5, 1)]


def test_exit_appended_when_missing():
    instrs, _ = parse_program("fma")
    assert instrs == [Instr(Op.FMA, writes=1), Instr(Op.EXIT)]  # an unnamed result goes to slot 0
    instrs, _ = parse_program("fma\nexit dep  # explicit exit kept, not doubled\n\n")
    assert [i.op for i in instrs] == [Op.FMA, Op.EXIT] and instrs[-1].dep
    instrs, _ = parse_program("loop 2\n fma\nend")
    assert [i.op for i in instrs] == [Op.FMA, Op.EXIT]


def test_comments_blank_lines_case_and_defaults():
    instrs, _ = parse_program("\n# header\n  LDG   # default 128 bytes\n\tLds ways=32\nldg bytes=4096 dep\n")
    assert [i.op for i in instrs] == [Op.LDG, Op.LDS, Op.LDG, Op.EXIT]
    assert [i.bytes_per_warp for i in instrs] == [128, 0, 4096, 0]
    assert [i.bank_ways for i in instrs] == [1, 32, 1, 1]
    assert [i.dep for i in instrs] == [False, False, True, False]


def test_pad_to():
    prog = "loop 4\n ldg bytes=64\n fma dep\nend"
    k = make_kernel(prog, grid=2, threads=64, pad_to=8)
    assert k.n_instr == 8
    np.testing.assert_array_equal(k.op, [Op.LDG, Op.FMA] + [Op.EXIT] * 6)
    np.testing.assert_array_equal(k.dep, [False, True] + [False] * 6)
    np.testing.assert_array_equal(k.bytes_per_warp, [64] + [0] * 7)
    np.testing.assert_array_equal(k.bank_ways, [1] * 8)
    assert (k.loop_start.tolist(), k.loop_end.tolist(), k.trips.tolist()) == ([0], [1], [4])
    # exactly full: no padding; padding is the only difference from the unpadded kernel
    assert make_kernel(prog, grid=2, threads=64, pad_to=3).n_instr == 3
    unpadded = make_kernel(prog, grid=2, threads=64)
    np.testing.assert_array_equal(np.asarray(k.op)[:3], unpadded.op)
    with pytest.raises(js.JaxschedError) as exc:
        make_kernel(prog, grid=2, threads=64, pad_to=2)
    assert "pad_to" in str(exc.value) and "2" in str(exc.value) and "3 instructions" in str(exc.value)


# --------------------------------------------------------------------------- example kernels


def test_example_kernels_exist():
    assert {p.stem for p in KERNELS} >= {"compute_bound", "divergent", "fma_ldg", "memory_bound"}


@pytest.mark.parametrize("path", KERNELS, ids=[p.stem for p in KERNELS])
def test_example_kernel_loads(path):
    k = load_kernel(path)
    assert isinstance(k, js.Kernel)
    assert k.name == path.stem
    assert int(k.grid_ctas) >= 1 and 1 <= int(k.threads_per_cta) <= 1024
    op = np.asarray(k.op)
    assert op[-1] == Op.EXIT and np.sum(op == Op.EXIT) == 1
    assert 0.0 <= float(k.l2_hit_rate) <= 1.0
    assert np.all(k.loop_start <= k.loop_end) and np.all(k.loop_end < k.n_instr - 1)


def test_divergent_example_fields():
    k = load_kernel(KERNELS[0].parent / "divergent.toml")
    assert (int(k.grid_ctas), int(k.threads_per_cta), int(k.regs_per_thread), int(k.seed)) == (528, 200, 40, 7)
    np.testing.assert_array_equal(
        k.op, [Op.LDS, Op.FMA, Op.SFU, Op.SFU, Op.FMA, Op.BAR, Op.EXIT])
    np.testing.assert_array_equal(k.dep, [0, 1, 1, 1, 1, 0, 1])
    np.testing.assert_array_equal(k.bank_ways, [2, 1, 1, 1, 1, 1, 1])
    assert (k.trips.tolist(), k.trips_cta_spread.tolist(), k.trips_warp_spread.tolist()) == ([32], [24], [8])
    assert (k.branch_start.tolist(), k.branch_mid.tolist(), k.branch_end.tolist()) == ([2], [4], [5])
    assert k.branch_if_probability.tolist() == [0.25]


def test_kernel_from_dict_top_level_or_table():
    body = {"program": "fma dep", "grid": 3, "threads": 96, "name": "x", "l2_hit_rate": 0.0}
    a = kernel_from_dict(body)
    b = kernel_from_dict({"kernel": body})
    assert a.name == b.name == "x"
    np.testing.assert_array_equal(a.op, b.op)
    assert int(a.grid_ctas) == 3 and float(a.l2_hit_rate) == 0.0


# --------------------------------------------------------------------------- bad programs

# program text, line the error must name, fragment of the message
BAD_PROGRAMS = {
    "unknown instruction": ("fma\nfoo dep", 2, "unknown instruction"),
    "nested loops sharing the back-edge": ("loop 2\n loop 3\n  fma\n end\nend", 5, "back-edge"),
    "branch ending on the back-edge": ("loop 2\n fma\n if 0.5\n  fma\n else\n  alu\n end\nend", 8, "back-edge"),
    "33 loops": ("loop 1\n fma\nend\n" * 32 + "loop 1\n fma\nend", 97, "at most 32 loops"),
    "33 branches": ("if 0.5\n fma\nend\n" * 32 + "if 0.5\n fma\nend", 97, "at most 32 if/else"),
    "empty loop": ("fma\nloop 2\nend", 3, "empty"),
    "empty if-block": ("if 0.5\nelse\n fma\nend", 2, "if-block is empty"),
    "empty else-block": ("if 0.5\n fma\nelse\nend", 4, "else-block is empty"),
    "else after else": ("if 0.5\n fma\nelse\n alu\nelse\n sfu\nend", 5, "without `if`"),
    "end without opener": ("fma\nend", 2, "without"),
    "else without if": ("fma\nelse", 2, "without"),
    "bytes on fma": ("fma\nalu bytes=64", 2, "ldg only"),
    "ways on ldg": ("ldg ways=2", 1, "lds only"),
    "ldg bytes 0": ("ldg bytes=0", 1, "1..4096"),
    "ldg bytes too large": ("ldg bytes=8192", 1, "1..4096"),
    "ways 33": ("lds ways=33", 1, "1..32"),
    "ways 1e22": ("lds ways=10000000000000000000000", 1, "1..32"),
    "bytes 1e22": ("ldg bytes=10000000000000000000000", 1, "1..4096"),
    "probability above 1": ("if 1.5\n fma\nelse\n alu\nend", 1, "[0, 1]"),
    "probability below 0": ("fma\nif -0.1\n fma\nelse\n alu\nend", 2, "[0, 1]"),
    "probability nan": ("if nan\n fma\nelse\n alu\nend", 1, "[0, 1]"),
    "probability not a number": ("if half\n fma\nelse\n alu\nend", 1, "float"),
    "negative trips": ("alu\nloop -3\n fma\nend", 2, "trip count"),
    "negative spread": ("loop 3 cta_spread=-1\n fma\nend", 1, "0 .. 16777215"),
    "spread too large": ("loop 3 warp_spread=16777216\n fma\nend", 1, "0 .. 16777215"),
    "trips too large": ("loop 3000000000\n fma\nend", 1, "trip count"),
    "unknown loop option": ("loop 3 lane_spread=2\n fma\nend", 1, "unknown option"),
    "loop without trips": ("loop\n fma\nend", 1, "trip count"),
    "unknown flag": ("fma fast", 1, "dep"),
    "comments count as lines": ("# one\n\n# three\nbogus", 4, "unknown instruction"),
}


@pytest.mark.parametrize("case", list(BAD_PROGRAMS))
def test_bad_program_names_line(case):
    text, line, fragment = BAD_PROGRAMS[case]
    with pytest.raises(js.JaxschedError) as exc:
        parse_program(text)
    message = str(exc.value)
    assert f"program line {line} " in message, message
    assert fragment in message, message
    # make_kernel reports the same error
    with pytest.raises(js.JaxschedError, match=re.escape(f"program line {line} ")):
        make_kernel(text, grid=1, threads=32)


def test_unclosed_blocks():
    for text, kind in (("loop 2\n fma", "loop"), ("if 0.5\n fma\nelse\n alu", "else"),
                       ("if 0.5\n fma", "if")):
        with pytest.raises(js.JaxschedError) as exc:
            parse_program(text)
        assert f"this `{kind}` has no `end`" in str(exc.value) and "line 1" in str(exc.value) or kind == "else"


def test_exit_not_last():
    for text in ("exit\nfma", "fma\nexit\nalu", "fma\nexit\nexit"):
        with pytest.raises(js.JaxschedError) as exc:
            parse_program(text)
        assert "exit" in str(exc.value)


def test_empty_programs():
    for text in ("", "# nothing\n", "exit"):
        with pytest.raises(js.JaxschedError, match="at least one instruction"):
            parse_program(text)


def test_structure_fields_checked_when_built_by_hand():
    """A structure set field by field (not parsed) is checked too: regions nest, a loop's last
    instruction is its own, branch_parent names the path around each branch."""
    k = make_kernel("loop 2\n fma\n alu\nend\nif 0.5\n fma\nend", grid=1, threads=32)
    bad = {"crossing regions": dict(branch_start=np.int32([1]), branch_mid=np.int32([3]), branch_end=np.int32([3])),
           "inner ends on the back-edge": dict(branch_start=np.int32([1]), branch_mid=np.int32([2]),
                                               branch_end=np.int32([2])),
           "wrong parent": dict(branch_parent=np.int32([0])),
           "loop past the exit": dict(loop_end=np.int32([9]))}
    for name, change in bad.items():
        with pytest.raises(js.JaxschedError, match="loop_start, loop_end, branch_start"):
            k.replace(**change)
    k.replace(branch_start=np.int32([0]), branch_mid=np.int32([3]), branch_end=np.int32([3]))  # if around the loop


@pytest.mark.parametrize("text,line", [("alu\nloop 2\n fma", 2), ("exit\nfma", 1)])
def test_unclosed_loop_and_exit_name_line(text, line):
    with pytest.raises(js.JaxschedError, match=f"line {line}"):
        parse_program(text)


@pytest.mark.parametrize("text", ["loop 0\n fma\n exit\nend", "if 1.0\n fma\nelse\n exit\nend"])
def test_exit_inside_loop_or_branch_rejected(text):
    with pytest.raises(js.JaxschedError):
        parse_program(text)


# --------------------------------------------------------------------------- bad launch values


@pytest.mark.parametrize("kwargs,field,value", [
    (dict(grid=0), "grid", "0"),
    (dict(grid=-3), "grid", "-3"),
    (dict(grid=2.0), "grid", "2.0"),
    (dict(l2_hit_rate=1.5), "l2_hit_rate", "1.5"),
    (dict(l2_hit_rate=-0.1), "l2_hit_rate", "-0.1"),
    (dict(l2_hit_rate=float("nan")), "l2_hit_rate", "nan"),
])
def test_bad_launch_values(kwargs, field, value):
    args = dict(grid=4, threads=64) | kwargs
    with pytest.raises(js.JaxschedError) as exc:
        make_kernel("fma", **args)
    assert exc.value.field == field
    assert f"{field} = {value}" in str(exc.value)


def test_numpy_numbers_are_numbers():
    """numpy scalars (np.float32 from an array, np.int64 from a range) are accepted like Python numbers."""
    k = make_kernel("fma", grid=np.int64(4), threads=np.int32(64), l2_hit_rate=np.float32(0.25),
                    grid_sync_ns=np.float64(100.0))
    assert int(k.grid_ctas) == 4 and float(k.l2_hit_rate) == 0.25 and float(k.grid_sync_ns) == 100.0


def test_kernel_from_dict_errors():
    with pytest.raises(js.JaxschedError) as exc:
        kernel_from_dict({"kernel": {"program": "fma", "grid": 4, "threads": 64, "blocks": 2}}, "k.toml")
    assert "k.toml: kernel.blocks" in str(exc.value) and "2" in str(exc.value)
    with pytest.raises(js.JaxschedError) as exc:
        kernel_from_dict({"kernel": {"program": "fma", "grid": 4}}, "k.toml")
    assert "kernel.threads" in str(exc.value) and "required" in str(exc.value)
    with pytest.raises(js.JaxschedError, match="l2_hit_rate = 1.5"):
        kernel_from_dict({"program": "fma", "grid": 4, "threads": 64, "l2_hit_rate": 1.5})
    with pytest.raises(js.JaxschedError, match="grid = 0"):
        kernel_from_dict({"program": "fma", "grid": 0, "threads": 64})


def test_load_kernel_errors(tmp_path):
    missing = tmp_path / "missing.toml"
    with pytest.raises(js.JaxschedError) as exc:
        load_kernel(missing)
    assert "kernel file" in str(exc.value) and str(missing) in str(exc.value)

    bad = tmp_path / "bad.toml"
    bad.write_text("[kernel\ngrid = 1\n")
    with pytest.raises(js.JaxschedError) as exc:
        load_kernel(bad)
    assert str(bad) in str(exc.value) and "malformed TOML" in str(exc.value)

    bad_prog = tmp_path / "prog.toml"
    bad_prog.write_text('[kernel]\ngrid = 1\nthreads = 32\nprogram = """\nfma\nfrob\n"""\n')
    with pytest.raises(js.JaxschedError) as exc:
        load_kernel(bad_prog)
    assert "frob" in str(exc.value) and "program line 2" in str(exc.value)


@pytest.mark.parametrize("table", [
    {"program": "fma", "grid": 10**10, "threads": 64},
    {"program": "fma", "grid": 4, "threads": 10**10},
    {"program": 5, "grid": 4, "threads": 64},
    {"program": "fma", "grid": 4, "threads": 64, "l2_hit_rate": "high"},
], ids=["grid-overflow", "threads-overflow", "program-int", "l2-string"])
def test_bad_types_raise_jaxsched_error(table):
    with pytest.raises(js.JaxschedError):
        kernel_from_dict(table)
