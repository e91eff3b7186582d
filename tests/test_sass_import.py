"""`import-sass`: SASS listings into program text (jaxsched.sass_import, jaxsched.sass): the opcode
table, register dependences, control-flow structuring (hand-made listings, random structured
programs, and real kernels for sm_80 and sm_90: the listings in tests/data/sass/ and the same
sources compiled by the test run's nvcc), the probe's own kernel, errors, and the command line.
The program text is what is checked; the freshly compiled kernels also run in the reference."""

from __future__ import annotations

import collections
import re
import subprocess
import tempfile
import tomllib
from pathlib import Path

import pytest
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from jaxsched import clocks, reference, sass, sass_import
from jaxsched.cli import main
from jaxsched.errors import JaxschedError
from jaxsched.probe import sass as probe_sass
from jaxsched.kernel import make_kernel
from jaxsched.sass_import import from_sass, instruction_class, registers

from helpers import cuda_tools, small_arch

ROOT = Path(__file__).resolve().parent.parent
DATA = ROOT / "tests" / "data" / "sass"
PROBE_SASS = ROOT / "data" / "h200" / "sass_work.txt"

_REGS = r"(?:U?R\d+|U?P\d|B\d+)(?:,(?:U?R\d+|U?P\d|B\d+))*"
_OP_LINE = re.compile(rf"(?:fma|alu|sfu|lds|shfl|bar)(?: out={_REGS})?(?: dep(?:={_REGS})?)?"
                      rf"|ldg(?: out={_REGS})?(?: dep(?:={_REGS})?)? bytes=\d+|exit")


def tree(text: str) -> list:
    """The program text as nested lists, checking its grammar on the way: an op line is a string,
    a loop `["loop", N, body]`, an if `["if", P, then, else or None]`; `exit` only last."""
    root: list = []
    stack = [root]
    lines = [raw.split("#", 1)[0].strip() for raw in text.splitlines()]
    lines = [line for line in lines if line]
    for n, line in enumerate(lines):
        head, *rest = line.split()
        if head == "loop":
            assert len(rest) == 1 and re.fullmatch(r"\d+|@\w+", rest[0]), line
            node = ["loop", rest[0], []]
            stack[-1].append(node)
            stack.append(node[2])
        elif head == "if":
            assert len(rest) == 1 and re.fullmatch(r"[\d.e-]+|@\w+(>0)?", rest[0]), line
            node = ["if", rest[0], [], None]
            stack[-1].append(node)
            stack.append(node[2])
        elif head == "else":
            stack.pop()
            node = stack[-1][-1]
            assert node[0] == "if" and node[3] is None, line
            node[3] = []
            stack.append(node[3])
        elif head == "end":
            assert len(stack) > 1 and stack[-1], "empty block"
            stack.pop()
        else:
            assert _OP_LINE.fullmatch(line), line
            assert (head == "exit") == (n == len(lines) - 1 and len(stack) == 1), line
            stack[-1].append(line)
    assert len(stack) == 1, "unclosed block"
    return root


def loops(nodes: list) -> list:
    out = []
    for node in nodes:
        if isinstance(node, list):
            if node[0] == "loop":
                out.append(node)
            for block in node[2:]:
                out += loops(block or [])
    return out


def classes(nodes: list, deep: bool = True) -> collections.Counter:
    """Instruction classes of a block (with its nested blocks when `deep`)."""
    count: collections.Counter = collections.Counter()
    for node in nodes:
        if isinstance(node, str):
            count[node.split()[0]] += 1
        elif deep:
            for block in node[2:]:
                count += classes(block or [])
    return count


def listing(*lines: str, name: str = "k") -> str:
    """A cuobjdump-style listing of `lines`, 16 bytes apart, padded as ptxas pads it."""
    body = [f"        /*{16 * i:04x}*/                   {text} ;" for i, text in enumerate(lines)]
    end = 16 * len(lines)
    body += [f"        /*{end:04x}*/                   BRA 0x{end:x};", f"        /*{end + 16:04x}*/  NOP;"]
    return "\n\tcode for sm_90\n\t\tFunction : " + name + "\n" + "\n".join(body) + "\n"


def names_of(text: str, kernel: str | None = None, arch: str | None = None):
    s = sass_import.structure(sass.find_function(text, kernel, arch))
    return [loop.name for loop in s.loops], [b.name for b in s.branches]


# --------------------------------------------------------------------------- opcode table


@pytest.mark.parametrize("text, cls", [
    ("FFMA R1, R2, R3, R4", "fma"), ("FADD.FTZ R3, -R2, -RZ", "fma"), ("HFMA2.MMA R5, -RZ, RZ, 0, 0", "fma"),
    ("FSETP.NEU.AND P1, PT, R9, UR5, PT", "fma"), ("DFMA R2, R4, R6, R2", "fma"), ("FMNMX R0, R0, R3, !PT", "fma"),
    ("IMAD.WIDE.U32 R2, R5, 0x28, R2", "alu"), ("IADD3 R4, R4, 0x1, RZ", "alu"),
    ("LOP3.LUT R6, R10, 0x1f, RZ, 0xc0, !PT", "alu"),
    ("ISETP.GE.AND P1, PT, R4, R3, PT", "alu"), ("MOV R4, UR4", "alu"), ("S2R R10, SR_TID.X", "alu"),
    ("LDC.64 R2, c[0x0][0x210]", "alu"), ("ULDC UR4, c[0x0][0x0]", "alu"), ("UIADD3 UR4, UR4, 0x1f, URZ", "alu"),
    ("MUFU.EX2 R3, R2", "sfu"), ("F2F.F64.F32 R2, R4", "sfu"), ("I2FP.F32.U32 R6, R6", "alu"),
    ("LDS R3, [R0]", "lds"), ("STS [R0], R3", "lds"), ("LDSM.16.M88.4 R4, [R2]", "lds"),
    ("LDG.E.CONSTANT R3, desc[UR6][R4.64]", "ldg"), ("STG.E.64 desc[UR6][R2.64], R4", "ldg"),
    ("ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, R2, desc[UR4][R4.64], R7", "ldg"),
    ("REDG.E.ADD.F32.FTZ.RN.STRONG.GPU desc[UR6][R2.64], R7", "ldg"), ("RED.E.ADD.STRONG.GPU [R2.64], R5", "ldg"),
    ("SHFL.DOWN PT, R3, R2, 0x10, 0x1f", "shfl"), ("BAR.SYNC.DEFER_BLOCKING 0x0", "bar"), ("BAR.ARV 0x1, 0x40", "alu"),
    ("EXIT", "exit"), ("BRA 0x100", "alu"), ("BSSY B0, 0x130", "alu"), ("WARPSYNC 0xffffffff", "alu"),
    ("HMMA.16816.F32 R4, R8, R12, R4", None),
])
def test_opcode_classes(text, cls):
    assert instruction_class(sass.parse_instr(text)) == cls


def test_every_class_in_the_table_is_an_instruction_class():
    assert set(sass_import.CLASSES.values()) <= {"fma", "alu", "sfu", "lds", "ldg", "shfl", "bar", "exit"}
    assert instruction_class(sass.parse_instr("IMAD R2, R0, UR4, R3"), {"IMAD": "fma"}) == "fma"


@pytest.mark.parametrize("text, nbytes", [
    ("LDG.E R3, desc[UR6][R4.64]", 128), ("LDG.E.64 R2, desc[UR6][R4.64]", 256),
    ("LDG.E.128.CONSTANT R4, desc[UR6][R2.64]", 512), ("LDG.E.U8 R3, desc[UR6][R4.64]", 32),
    ("LDG.E.S16 R3, desc[UR6][R4.64]", 64), ("STG.E.64 desc[UR6][R2.64+0x8], R8", 256),
    ("ATOMG.E.ADD.F64.RN.STRONG.GPU PT, R2, desc[UR4][R4.64], R6", 256),
    ("LDGSTS.E.BYPASS.128 [R3], desc[UR4][R4.64]", 512),
])
def test_ldg_bytes_from_the_access_width(text, nbytes):
    program = from_sass(listing(text, "EXIT"), comments=False)
    assert f"bytes={nbytes}" in program.splitlines()[0]


def test_sectors_give_a_memory_instruction_its_bytes():
    """Thread 0's 8-byte store touches one sector (32 bytes, not 256), a strided 4-byte load 32
    (1024 bytes, not 128); the others keep the width times 32 lanes."""
    text = listing("@!P0 STG.E.64 desc[UR6][R2.64+0x8], R8", "LDG.E R3, desc[UR6][R4.64]",
                   "LDG.E R5, desc[UR6][R6.64]", "EXIT")
    lines = from_sass(text, comments=False, sectors={"0x0000": 1, "0x0010": 32}).splitlines()
    assert [re.search(r"bytes=(\d+)", line).group(1) for line in lines[:3]] == ["32", "1024", "128"]


@pytest.mark.parametrize("sectors, match", [
    ({"0x0020": 1}, "sectors = '0x0020'.*no global memory instruction.*0x0000, 0x0010"),
    ({"L1": 1}, "sectors = 'L1'.*no global memory instruction"),
    ({"0x0000": 0}, "sectors.0x0000 = 0.*\\[1, 32\\]"), ({"0x0000": 33}, "sectors.0x0000 = 33"),
    ({"0x0000": 1.5}, "sectors.0x0000"),
])
def test_sectors_of_no_memory_instruction_or_out_of_range(sectors, match):
    text = listing("STG.E desc[UR6][R2.64], R8", "LDG.E R3, desc[UR6][R4.64]", "IADD3 R1, R1, 0x1, RZ", "EXIT")
    with pytest.raises(JaxschedError, match=match):
        from_sass(text, sectors=sectors)


# --------------------------------------------------------------------------- registers


@pytest.mark.parametrize("text, writes, reads", [
    ("IADD3 R4, P0, R2, R3, RZ", ["R4", "P0"], ["R2", "R3"]),
    ("IADD3.X R5, R3, R5, RZ, P0, !PT", ["R5"], ["R3", "R5", "P0"]),
    ("ISETP.GE.AND P0, PT, R3, R2, PT", ["P0"], ["R3", "R2"]),
    ("LOP3.LUT P0, RZ, R10, 0x1f, RZ, 0xc0, !PT", ["P0"], ["R10"]),
    ("LDG.E.64 R2, desc[UR4][R6.64+0x8]", ["R2", "R3"], ["UR4", "UR5", "R6", "R7"]),
    ("STG.E.128 desc[UR4][R2.64], R8", [], ["UR4", "UR5", "R2", "R3", "R8", "R9", "R10", "R11"]),
    ("LDS.128 R4, [R2+0x10]", ["R4", "R5", "R6", "R7"], ["R2"]),
    ("@!P0 FADD R3, R3, R2", ["R3"], ["P0", "R3", "R2"]),
    ("FMNMX R0, |R0|, -R3.reuse, !PT", ["R0"], ["R0", "R3"]),
    ("SHFL.DOWN PT, R3, R2, 0x10, 0x1f", ["R3"], ["R2"]),
    ("IMAD.WIDE R4, R3, 0x4, R4", ["R4", "R5"], ["R3", "R4", "R5"]),
    ("DFMA R2, R4, R6, R2", ["R2", "R3"], ["R4", "R5", "R6", "R7", "R2", "R3"]),
    ("F2F.F64.F32 R2, R4", ["R2", "R3"], ["R4"]),
    ("CS2R R6, SR_CLOCKLO", ["R6", "R7"], []),
    ("ULDC.64 UR6, c[0x0][0x208]", ["UR6", "UR7"], []),
    ("VOTE.ANY R4, PT, P0", ["R4"], ["P0"]),
    ("ATOMG.E.ADD.F32.FTZ.RN.STRONG.GPU PT, R2, desc[UR4][R4.64], R7", ["R2"], ["UR4", "UR5", "R4", "R5", "R7"]),
    ("LEA.HI.X R7, R2, R7, RZ, 0x3, P1", ["R7"], ["R2", "R7", "P1"]),
    ("@P0 BRA 0x120", [], ["P0"]),
    ("BAR.SYNC.DEFER_BLOCKING 0x0", [], []),
    ("BSSY B0, 0x130", ["B0"], []),
    ("BSYNC B0", [], ["B0"]),
    ("DEPBAR.LE SB0, 0x0", [], []),
])
def test_registers_written_and_read(text, writes, reads):
    assert registers(sass.parse_instr(text)) == (writes, reads)


def test_ffma_chain_is_a_chain_of_deps():
    program = from_sass(listing("FFMA R1, R0, R0, R0", "FFMA R2, R1, R1, R1", "FFMA R3, R2, R2, R2",
                                "FFMA R4, R3, R2, R0", "EXIT"), comments=False)
    assert program.splitlines() == ["fma out=R1", "fma out=R2 dep=R1", "fma out=R3 dep=R2", "fma out=R4 dep=R3,R2",
                                    "exit"]


def test_loop_carried_and_later_writes():
    # R1 feeds itself around the loop; R5 is written only after the loop, so the read before it
    # is of the warp's initial value (no dependence)
    program = from_sass(listing("MOV R5, R6", "FFMA R1, R1, R2, R5", "IADD3 R0, R0, 0x1, RZ",
                                "ISETP.GE.AND P0, PT, R0, R3, PT", "@!P0 BRA 0x10", "FADD R5, R1, R1", "EXIT"),
                        trips={"L1": 4}, comments=False)
    assert program.splitlines() == [
        "alu out=R5", "loop 4", "  fma out=R1 dep=R1,R5", "  alu out=R0 dep=R0", "  alu out=P0 dep=R0",
        "  alu dep=P0", "end", "fma out=R5 dep=R1", "exit"]


def test_depbar_waits_for_every_earlier_result():
    program = from_sass(listing("LDGSTS.E [R3], desc[UR4][R4.64]", "LDGDEPBAR", "DEPBAR.LE SB0, 0x0", "EXIT"),
                        comments=False)
    assert program.splitlines()[2] == "alu dep"


# --------------------------------------------------------------------------- control flow


def test_if_else_and_early_exit():
    program = from_sass(listing(
        "ISETP.GE.AND P0, PT, R0, R1, PT",  # 0x00
        "@P0 EXIT",                          # 0x10: the rest is the if-block of the lanes that stay
        "@P1 BRA 0x50",                      # 0x20: if ...
        "FFMA R2, R2, R2, R2",               # 0x30
        "BRA 0x60",                          # 0x40: ... else
        "MUFU.EX2 R2, R2",                   # 0x50
        "STG.E desc[UR4][R4.64], R2",        # 0x60
        "EXIT"), branches={"B1": 0.75, "B2": 0.25}, comments=False)
    assert program.splitlines() == [
        "alu out=P0", "alu dep=P0", "if 0.75", "  alu", "  if 0.25", "    fma out=R2", "    alu",
        "  else", "    sfu out=R2 dep=R2", "  end", "  ldg dep=R2 bytes=128", "end", "exit"]


def test_joined_ifs_and_zero_trip_guards():
    # an unrolled loop's shape: a guard (B1) around a loop, then a branch (B2) whose block ends
    # in the test that skips the remainder loop (B3, a guard of L2)
    text = listing(
        "@!P0 BRA 0x30",          # 0x00 B1: guard of L1
        "FFMA R1, R1, R1, R1",    # 0x10 L1
        "@P1 BRA 0x10",           # 0x20
        "IADD3 R0, R0, 0x1, RZ",  # 0x30
        "@P2 BRA 0x70",           # 0x40 B2 ...
        "FMUL R1, R1, R1",        # 0x50
        "@!P3 BRA 0x90",          # 0x60 ... ends in B3, which skips [0x70, 0x90)
        "FFMA R1, R1, R1, R1",    # 0x70 L2
        "@P1 BRA 0x70",           # 0x80
        "EXIT")                   # 0x90
    with pytest.raises(JaxschedError, match=r"B2 \(0x0040\)") as err:
        from_sass(text, trips={"L1": 3, "L2": 0})
    assert "B1 (" not in str(err.value) and "B3 (" not in str(err.value)  # guards default from trips
    t = tree(from_sass(text, trips={"L1": 3, "L2": 0}, branches={"B2": 0.5}))
    assert [n[0] if isinstance(n, list) else n.split()[0] for n in t] == ["alu", "if", "alu", "alu", "if", "if", "exit"]
    assert t[1][1] == "1" and t[1][2][-1][0] == "loop"  # guard of a loop with trips: every lane enters
    assert t[4][1] == "0.5" and t[4][2] == ["fma out=R1 dep=R1", "alu"]  # B2: FMUL and B3's branch
    assert t[5][1] == "0" and t[5][2][-1][:2] == ["loop", "0"]  # B3 guards L2, whose trip count is 0
    t = tree(from_sass(text, trips={"0x0010": 3, "L2": "rows"}, branches={"0x0040": "@taken", "B1": 0.25}))
    assert (t[1][1], t[4][1], t[5][1], t[5][2][-1][1]) == ("0.25", "@taken", "@rows>0", "@rows")  # guard: rows > 0


def test_loop_exit_test_inside_the_body():
    # a top-tested loop: the exit test jumps just past the back-edge (rule 7)
    program = from_sass(listing("ISETP.GE.AND P0, PT, R0, R1, PT", "@P0 BRA 0x40", "IADD3 R0, R0, 0x1, RZ",
                                "BRA 0x0", "EXIT"), trips={"L1": 5}, comments=False)
    assert program.splitlines() == ["loop 5", "  alu out=P0 dep=R0", "  alu dep=P0", "  alu out=R0 dep=R0",
                                    "  alu", "end", "exit"]


def test_break_at_the_end_of_an_if_block():
    program = from_sass(listing("FFMA R1, R1, R1, R1", "@P1 BRA 0x30", "BRA 0x50", "IADD3 R0, R0, 0x1, RZ",
                                "@P0 BRA 0x0", "EXIT"), trips={"L1": 2}, branches={"B1": 0.5}, comments=False)
    assert program.splitlines() == ["loop 2", "  fma out=R1 dep=R1", "  alu", "  if 0.5", "    alu", "  end",
                                    "  alu out=R0 dep=R0", "  alu", "end", "exit"]


@pytest.mark.parametrize("lines, where", [
    # a jump into a loop
    (("@P0 BRA 0x30", "FFMA R1, R1, R1, R1", "FFMA R1, R1, R1, R1", "FFMA R1, R1, R1, R1", "@P1 BRA 0x20", "EXIT"),
     "0x0040"),
    # overlapping ifs
    (("@P0 BRA 0x40", "FFMA R1, R1, R1, R1", "@P1 BRA 0x50", "FFMA R1, R1, R1, R1", "FFMA R1, R1, R1, R1", "EXIT"),
     "0x0020"),
    # two back-edges to one header (`continue`)
    (("FFMA R1, R1, R1, R1", "@P0 BRA 0x0", "FFMA R1, R1, R1, R1", "@P1 BRA 0x0", "EXIT"), "0x0000"),
    # an unconditional jump over code nothing reaches
    (("BRA 0x20", "FFMA R1, R1, R1, R1", "EXIT"), "0x0000"),
    # a jump past the last EXIT
    (("@P0 BRA 0x30", "EXIT", "FFMA R1, R1, R1, R1", "BRA 0x10"), "0x0000"),
    # an indirect jump
    (("BRX R2 -0x40", "EXIT"), "0x0000"),
])
def test_unstructured_control_flow_names_the_address(lines, where):
    with pytest.raises(JaxschedError, match=where):
        from_sass(listing(*lines), trips={"L1": 1, "L2": 1}, branches={"B1": 1})


# Random structured programs, compiled to SASS the way ptxas lays out loops, ifs and if/elses,
# import back to the same structure.
_SAMPLE = {"fma": "FFMA R1, R2, R3, R4", "alu": "IADD3 R5, R6, 0x1, RZ", "sfu": "MUFU.EX2 R7, R8",
           "lds": "LDS R9, [R10]", "ldg": "LDG.E R11, desc[UR4][R12.64]", "shfl": "SHFL.DOWN PT, R13, R14, 0x1, 0x1f",
           "bar": "BAR.SYNC.DEFER_BLOCKING 0x0"}


def _blocks(depth: int):
    op = st.sampled_from(sorted(_SAMPLE)).map(lambda c: ("op", c))
    if depth == 0:
        return st.lists(op, min_size=1, max_size=3)
    inner = _blocks(depth - 1)
    node = st.one_of(op, inner.map(lambda b: ("loop", [("op", "alu"), *b])),  # a loop starts with its own instruction
                     inner.map(lambda b: ("if", b)), st.tuples(inner, inner).map(lambda p: ("ifelse", *p)))
    return st.lists(node, min_size=1, max_size=4)


def _compile(nodes: list, sass_lines: list, skeleton: list) -> None:
    """Append each node's SASS (addresses are line numbers x 16) and its expected program lines."""
    def at(i: int) -> str:
        return f"0x{16 * i:x}"

    for node in nodes:
        if node[0] == "op":
            sass_lines.append(_SAMPLE[node[1]])
            skeleton.append(node[1])
        elif node[0] == "loop":
            header = len(sass_lines)
            skeleton.append("loop")
            _compile(node[1], sass_lines, skeleton)
            sass_lines.append(f"@P0 BRA {at(header)}")
            skeleton += ["alu", "end"]
        elif node[0] == "if":
            branch = len(sass_lines)
            sass_lines.append(None)
            skeleton += ["alu", "if"]
            _compile(node[1], sass_lines, skeleton)
            sass_lines[branch] = f"@P1 BRA {at(len(sass_lines))}"
            skeleton.append("end")
        else:
            branch = len(sass_lines)
            sass_lines.append(None)
            skeleton += ["alu", "if"]
            _compile(node[1], sass_lines, skeleton)
            jump = len(sass_lines)
            sass_lines.append(None)
            skeleton += ["alu", "else"]
            sass_lines[branch] = f"@!P1 BRA {at(len(sass_lines))}"
            _compile(node[2], sass_lines, skeleton)
            sass_lines[jump] = f"BRA {at(len(sass_lines))}"
            skeleton.append("end")


@settings(max_examples=60, deadline=None)
@given(_blocks(3))
def test_structured_programs_round_trip(nodes):
    sass_lines: list = []
    skeleton: list = []
    _compile(nodes, sass_lines, skeleton)
    text = listing(*sass_lines, "EXIT")
    loop_names, branch_names = names_of(text)
    program = from_sass(text, trips={n: i for i, n in enumerate(loop_names)},
                        branches={n: 0.5 for n in branch_names}, comments=False)
    tree(program)
    assert [line.split()[0] for line in program.splitlines()] == skeleton + ["exit"]
    assert len(loop_names) == skeleton.count("loop") and len(branch_names) == skeleton.count("if")


# --------------------------------------------------------------------------- real kernels

# Per kernel: (loops, nesting depth of loops, instruction classes the program must hold, and
# per listed loop index the classes its body holds directly).
_KERNELS = {
    "reduction": ("reduce_sum", {"loops": 2, "shfl": 5, "bar": 2, "lds": 6},
                  {0: {"ldg": 1, "fma": 1}, 1: {"bar": 1, "lds": 3}}),
    "matmul": ("matmul_tiled", {"loops": 1, "bar": 2},
               {0: {"bar": 2, "ldg": 2, "lds": 18, "fma": 16}}),
    "stencil": ("stencil2d", {"loops": 2},  # the remainder loop, then the 4x unrolled one
                {0: {"ldg": 6, "fma": 4}, 1: {"ldg": 18, "fma": 16}}),
    "spmv": ("spmv_csr", {"loops": 2},  # three loads per nonzero: column, value, x
             {0: {"ldg": 3, "fma": 1}, 1: {"ldg": 48, "fma": 16}}),
    "softmax": ("softmax_rows", {"loops": 6, "shfl": 10, "sfu": 20},  # max, exp-sum, output: each 2 loops
                {1: {"ldg": 16}, 3: {"sfu": 16, "ldg": 16}, 5: {"sfu": 4, "ldg": 8}}),
}


@pytest.mark.parametrize("arch", ["sm_80", "sm_90"])
@pytest.mark.parametrize("name", sorted(_KERNELS))
def test_compiled_kernels_import(name, arch):
    _check_import(name, (DATA / f"{name}.{arch}.sass").read_text())


def test_kernels_compiled_now_import_and_run():
    """The five kernels' sources compiled here (nvcc -O3 -cubin, cuobjdump -sass, sm_80 and
    sm_90) import as the committed listings do, and each runs in the reference."""
    tools = cuda_tools()
    if tools is None:
        pytest.skip("no nvcc and cuobjdump (pip install -e '.[test]' brings them) or no host C++ compiler")
    with tempfile.TemporaryDirectory() as tmp:
        for name in sorted(_KERNELS):
            for arch in ("sm_80", "sm_90"):
                cubin = Path(tmp) / f"{name}.{arch}.cubin"
                subprocess.run([tools["nvcc"], "-cubin", f"-arch={arch}", "-O3", "-o", str(cubin),
                                str(DATA / f"{name}.cu")], check=True, capture_output=True)
                text = subprocess.run([tools["cuobjdump"], "-sass", str(cubin)], check=True, capture_output=True,
                                      text=True).stdout
                program = _check_import(name, text)
                if arch == "sm_90":
                    arch_ = small_arch(1)
                    ref = reference.simulate(arch=arch_, kernel=make_kernel(program, grid=2, threads=64, seed=3),
                                             clocks=clocks.from_array(arch_, np.full(arch_.n_sm_slots, 1500.0)))
                    assert int(ref["warp_issued"].sum()) > 0


def _check_import(name: str, text: str) -> str:
    """`text`'s kernel `name` imports with 4 trips per loop and half the lanes in every branch,
    with the loops and instruction classes of `_KERNELS`; the program text."""
    kernel, totals, per_loop = _KERNELS[name]
    loop_names, branch_names = names_of(text, kernel)
    program = from_sass(text, kernel, trips={n: 4 for n in loop_names}, branches={n: 0.5 for n in branch_names})
    t = tree(program)
    found = loops(t)
    assert len(found) == totals["loops"]
    count = classes(t)
    for cls, at_least in totals.items():
        if cls != "loops":
            assert count[cls] >= at_least, (cls, count)
    for i, body in per_loop.items():
        direct = classes(found[i][2], deep=False)
        for cls, at_least in body.items():
            assert direct[cls] >= at_least, (i, cls, direct)
    assert "bytes=" in program and "dep=" in program
    return program


def test_unrolled_loops_nest_in_their_guards():
    text = (DATA / "spmv.sm_90.sass").read_text()
    s = sass_import.structure(sass.find_function(text, "spmv_csr"))
    guards = {b.name: b.guard_of.name for b in s.branches if b.guard_of is not None}
    assert guards == {"B3": "L1", "B5": "L2"}
    with pytest.raises(JaxschedError) as err:
        from_sass(text, "spmv_csr", trips={"L1": 3})
    assert "L2 (0x04b0)" in str(err.value) and "B1 (0x0070)" in str(err.value) and "B3 (" not in str(err.value)


def test_nvdisasm_listing_reads_like_cuobjdump():
    kw = dict(trips={"L1": 8, "L2": 3}, branches={"B3": 0.125, "B4": 1 / 32}, comments=False)
    cuobjdump = from_sass((DATA / "reduction.sm_90.sass").read_text(), "reduce_sum", **kw)
    nvdisasm = from_sass((DATA / "reduction.sm_90.nvdisasm").read_text(), "_Z10reduce_sumPKfPfi", **kw)
    assert nvdisasm == cuobjdump


def test_division_slow_path_is_a_call():
    text = (DATA / "softmax.sm_90.sass").read_text()
    s = sass_import.structure(sass.find_function(text, "softmax_rows"))
    assert s.instrs[-1].opcode == "EXIT" and not any(i.opcode == "RET" for i in s.instrs)
    calls = [i for i in s.instrs if i.opcode == "CALL"]
    assert len(calls) == 1 and calls[0].target > s.instrs[-1].addr
    assert sum(b.orelse is not None for b in s.branches) == 1  # the call's if/else around MUFU.RCP


# --------------------------------------------------------------------------- the probe's kernel


def test_probe_fma_dep_loop_matches_the_suite():
    """jaxsched/probe/suite.py: 256 FFMA + IADD3 + ISETP + BRA per trip of work_fma_dep."""
    text = PROBE_SASS.read_text()
    program = from_sass(text, "work_fma_dep", trips={"L1": 100}, branches={"B1": 1 / 256, "B3": 0.0})
    (loop,) = loops(tree(program))
    assert loop[1] == "100"
    assert classes(loop[2]) == {"fma": 256, "alu": 3}
    assert loop[2][0] == "fma out=R9 dep=R9,UR4"


@pytest.mark.parametrize("kernel", ["work_fma_dep", "work_fma_dep_bank", "work_fma_ilp", "work_ldg"])
def test_probe_loops_have_the_probe_helpers_counts(kernel):
    text = PROBE_SASS.read_text()
    ops = probe_sass.loop_with(text, kernel, "FFMA")
    loop_names, branch_names = names_of(text, kernel)
    program = from_sass(text, kernel, trips={n: 2 for n in loop_names}, branches={n: 1 for n in branch_names})
    body = max(loops(tree(program)), key=lambda lp: classes(lp[2])["fma"])
    expected: collections.Counter = collections.Counter()
    for op, n in ops.items():
        expected[sass_import.CLASSES[op]] += n
    assert classes(body[2]) == expected


# --------------------------------------------------------------------------- errors


def test_unknown_opcodes_are_listed_and_opmap_maps_them():
    text = listing("HMMA.16816.F32 R4, R8, R12, R4", "IMMA.16816.S32 R4, R8, R12, R4", "HMMA.1688.F32 R4, R8, R12, R4",
                   "EXIT")
    with pytest.raises(JaxschedError, match="HMMA, IMMA") as err:
        from_sass(text)
    assert "\n" not in str(err.value)
    program = from_sass(text, opmap={"HMMA": "fma", "IMMA": "drop"}, comments=False)
    assert program.splitlines() == ["fma out=R4", "fma out=R4 dep=R4", "exit"]
    with pytest.raises(JaxschedError, match="opmap"):
        from_sass(text, opmap={"HMMA": "tensor"})
    with pytest.raises(JaxschedError, match="opmap"):
        from_sass(text, opmap={"HMMA.16816": "fma"})


def test_missing_trip_counts_name_every_loop():
    text = (DATA / "softmax.sm_90.sass").read_text()
    with pytest.raises(JaxschedError) as err:
        from_sass(text, trips={"L3": 2})
    message = str(err.value)
    for name in ("L1", "L2", "L4", "L5", "L6"):
        assert re.search(rf"\b{name} \(0x[0-9a-f]{{4}}\)", message)
    assert "L3" not in message


def test_bad_names_and_values():
    text = PROBE_SASS.read_text()
    ok = dict(trips={"L1": 2}, branches={"B1": 0.5, "B3": 0.0})
    from_sass(text, "work_fma_dep", **ok)
    for trips, branches, match in (({"L9": 2}, {}, "no such loop.*L1 \\(0x0250\\)"),
                                   ({"0x0999": 2}, {}, "no such loop"),
                                   ({"L1": -1}, {}, "trips.L1"), ({"L1": "no way"}, {}, "trips.L1"),
                                   ({}, {"B1": 1.5}, "branches.B1"), ({}, {"B7": 0.5}, "no such branch")):
        with pytest.raises(JaxschedError, match=match):
            from_sass(text, "work_fma_dep", trips={**ok["trips"], **trips}, branches={**ok["branches"], **branches})


def test_choosing_the_kernel():
    text = PROBE_SASS.read_text()
    with pytest.raises(JaxschedError, match="several functions"):
        from_sass(text)
    with pytest.raises(JaxschedError, match="not in the listing.*work_ldg"):
        from_sass(text, "nope")
    both = (DATA / "reduction.sm_80.sass").read_text() + (DATA / "reduction.sm_90.sass").read_text()
    with pytest.raises(JaxschedError, match="several architectures"):
        from_sass(both, "reduce_sum", trips={"L1": 1, "L2": 1}, branches={"B3": 1, "B4": 1})
    for arch in ("sm_80", "sm_90"):
        one = from_sass(both, "reduce_sum", arch=arch, trips={"L1": 1, "L2": 1}, branches={"B3": 1, "B4": 1})
        assert one == from_sass((DATA / f"reduction.{arch}.sass").read_text(), trips={"L1": 1, "L2": 1},
                                branches={"B3": 1, "B4": 1})


def test_short_names():
    assert sass.short_name("_Z10reduce_sumPKfPfi") == "reduce_sum"
    assert sass.short_name("work_fma_dep") == "work_fma_dep"


# --------------------------------------------------------------------------- command line


def test_cli_list(capsys):
    rc = main(["import-sass", str(DATA / "stencil.sm_90.sass"), "--list"])
    out = capsys.readouterr().out
    assert rc == 0
    assert "_Z9stencil2dPKfPfiii (stencil2d) sm_90" in out
    assert re.search(r"L2\s+loop 0x0550\.\.0x08e0", out) and re.search(r"B4\s+if at 0x0430 @!P0 EXIT", out)


def test_cli_writes_a_kernel_toml(capsys, tmp_path):
    out = tmp_path / "reduce.toml"
    rc = main(["import-sass", str(DATA / "reduction.sm_90.sass"), "--trips", "L1=8,L2=@steps", "--branch", "B3=0.125",
               "--branch", "0x0390=0.03125", "--grid", "528", "--threads", "256", "--regs", "16", "-o", str(out)])
    assert rc == 0 and "wrote" in capsys.readouterr().out
    doc = tomllib.loads(out.read_text())["kernel"]
    assert (doc["name"], doc["grid"], doc["threads"], doc["regs"]) == ("reduce_sum", 528, 256, 16)
    assert doc["program"].strip() == from_sass((DATA / "reduction.sm_90.sass").read_text(),
                                               trips={"L1": 8, "L2": "steps"},
                                               branches={"B3": 0.125, "B4": 0.03125}).strip()


def test_cli_prints_and_maps(capsys):
    path = ROOT / "tests" / "data" / "sass" / "matmul.sm_90.sass"
    rc = main(["import-sass", str(path), "--trips", "L1=4", "--map", "LDS=drop,STS=drop"])
    out = capsys.readouterr().out
    assert rc == 0
    doc = tomllib.loads(out)["kernel"]
    assert "grid" not in doc and "# grid = ..." in out
    assert "lds" not in doc["program"].replace("# ", "#").split("#")[0]
    assert all(not line.split("#")[0].strip().startswith("lds") for line in doc["program"].splitlines())


def test_cli_sectors(capsys):
    path = DATA / "matmul.sm_90.sass"
    addr = next(f"0x{ins.addr:04x}" for ins in sass.find_function(path.read_text()).instrs if ins.opcode == "STG")
    rc = main(["import-sass", str(path), "--trips", "L1=4", "--sectors", f"{addr}=1"])
    doc = tomllib.loads(capsys.readouterr().out)["kernel"]
    assert rc == 0
    assert doc["program"] == from_sass(path.read_text(), trips={"L1": 4}, sectors={addr: 1})
    assert "bytes=32" in doc["program"]


@pytest.mark.parametrize("argv, match", [
    (["--trips", "L1=abc"], "--trips"), (["--trips", "L1"], "KEY=VALUE"), ([], "L1 \\(0x0230\\)"),
    (["--trips", "L1=4", "--map", "FFMA=gpu"], "opmap.FFMA"),
    (["--trips", "L1=4", "--sectors", "0x0000=one"], "--sectors.*ADDRESS=SECTORS"),
    (["--trips", "L1=4", "--sectors", "0x0000=1"], "sectors = '0x0000'.*no global memory instruction"),
])
def test_cli_errors(capsys, argv, match):
    rc = main(["import-sass", str(DATA / "matmul.sm_90.sass"), *argv])
    err = capsys.readouterr().err
    assert rc == 2 and re.search(match, err) and err.count("\n") == 1
