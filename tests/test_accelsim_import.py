"""Accel-Sim trace import (jaxsched/accelsim_import.py): the trace format, the compression into
one program per kernel, each warp's instruction count against the trace, and the workload files."""

from __future__ import annotations

import lzma
import subprocess
import sys
import tomllib
from pathlib import Path

import numpy as np
import pytest

from jaxsched import accelsim_import as ai
from jaxsched.cli import main
from jaxsched.errors import JaxschedError

DATA = Path(__file__).parent / "data" / "accelsim"
MY_APP = DATA / "my_app"
VECTORADD = DATA / "vectoradd"

# A kernel with an outer loop around an inner loop and an optional tail, as the tracer writes it.
_LINES = {
    0x00: "1 R1 MOV 0 0",
    0x10: "1 R0 S2R 0 0",
    0x20: "1 R2 IADD3 2 R2 R255 0",  # outer loop header
    0x30: "1 R5 LDS.U.32 1 R3 4 1 {smem}",  # inner loop: LDS, FFMA, BRA
    0x40: "1 R4 FFMA 3 R4 R5 R4 0",
    0x50: "0 BRA 0 0",
    0x60: "0 ISETP.GE.AND 1 R2 0",
    0x70: "0 BRA 0 0",  # back to the outer header
    0x80: "0 ISETP.GE.AND 1 R0 0",
    0x90: "1 R6 MUFU.RCP 1 R4 0",  # tail, only some warps
    0xA0: "0 STG.E 2 R8 R6 4 1 0x7f0000001000 4",
    0xB0: "0 EXIT 0 0",
}


def _warp_pcs(inner: list[int], tail: bool) -> list[int]:
    pcs = [0x00, 0x10]
    for n in inner:
        pcs += [0x20] + [0x30, 0x40, 0x50] * n + [0x60, 0x70]
    return pcs + [0x80] + ([0x90, 0xA0] if tail else []) + [0xB0]


def _trace(warps: list[list[list[int]]], block: int = 64, version: int = 5) -> str:
    """A .traceg text: warps[cta][warp] their PCs (from `_LINES`)."""
    text = [f"-kernel name = loops\n-kernel id = 1\n-grid dim = ({len(warps)},1,1)\n-block dim = ({block},1,1)",
            f"-shmem = 2048\n-nregs = 40\n-cuda stream id = 7\n-accelsim tracer version = {version}",
            "-enable lineinfo = 0\n\n#traces format = [line_num] PC mask dest_num [reg_dests] opcode ...\n"]
    for c, cta in enumerate(warps):
        text.append(f"#BEGIN_TB\n\nthread block = {c},0,0\n")
        for w, pcs in enumerate(cta):
            text.append(f"warp = {w}\ninsts = {len(pcs)}")
            # shared addresses: lanes 8 B apart, a 2-way bank conflict
            text += [f"{pc:04x} ffffffff " + _LINES[pc].format(smem="0x0 8") + " 0" for pc in pcs]
            text.append("")
        text.append("#END_TB\n")
    return "\n".join(text)


LOOPS = [[_warp_pcs([2, 2, 2], True), _warp_pcs([4, 4], False)],
         [_warp_pcs([1, 5, 2], True), _warp_pcs([0], False)]]


def _folder(tmp_path: Path, text: str, name: str = "kernel-1.traceg") -> Path:
    (tmp_path / name).write_text(text)
    (tmp_path / "kernelslist.g").write_text(f"MemcpyHtoD,0x00007f0000000000,4096\n{name}\n")
    return tmp_path


def _counts(k: ai.ImportedKernel) -> np.ndarray:
    return ai.count_instructions(k.program, k.arrays, k.grid, k.warp_insts.shape[1])


def test_no_jax_and_the_kernel_limits():
    code = "import sys, jaxsched.accelsim_import; print('jax' in sys.modules)"
    assert subprocess.run([sys.executable, "-c", code], capture_output=True, text=True).stdout.strip() == "False"
    from jaxsched import kernel

    assert (ai.MAX_TRIPS, ai.MAX_LDG_BYTES) == (kernel.MAX_TRIPS, kernel.MAX_LDG_BYTES)


def test_header():
    h = ai.read_header(MY_APP / "kernel-593-ctx_0x55c28dad19e0.traceg")
    assert h.name.startswith("_ZN2at6native29vectorized_elementwise_kernel")
    assert (h.grid, h.block, h.threads, h.warps_per_cta, h.ctas) == ((2, 1, 1), (128, 1, 1), 128, 4, 2)
    assert (h.shmem_bytes, h.nregs, h.trace_version, h.lineinfo) == (1, 21955, 5, False)
    v = ai.read_header(VECTORADD / "kernel-1.traceg")
    assert (v.name, v.block, v.nregs, v.trace_version) == ("_Z6vecAddIfEvPT_S1_S1_i", (1024, 1, 1), 8, 4)


def test_kernelslist_skips_copies():
    assert ai.trace_files(VECTORADD) == [VECTORADD / "kernel-1.traceg"]


def test_my_app_sample():
    """accel-sim-framework's own sample: 8 identical warps of 33 instructions, no structure."""
    (k,) = ai.import_traces(MY_APP, regs=32)
    assert (k.grid, k.threads, k.regs, k.smem_bytes) == (2, 128, 32, 1)
    assert (k.warp_insts == 33).all() and k.warp_insts.shape == (2, 4)
    assert k.arrays == {}
    lines = [line.split("#")[0].strip() for line in k.program.splitlines()]
    assert len(lines) == 33 and lines[-1] == "exit"
    assert lines[10] == "ldg out=R12,R13,R14,R15 dep=R2 bytes=512"  # LDG.E.128: 16 B x 32 lanes
    assert lines[14] == "fma out=R11 dep=R12"  # FMUL waits for the load's first register
    assert lines[5] == "alu"  # the predicated-off BRA still issues
    assert (_counts(k) == k.warp_insts).all()


def test_my_app_registers_need_a_count():
    with pytest.raises(JaxschedError, match="nregs = 21955.*regs="):
        ai.import_traces(MY_APP)


def test_vectoradd_sample():
    """Warps 4-31 exit after 9 instructions, warps 0-3 run the body: an `if` taken by 0-3."""
    (k,) = ai.import_traces(VECTORADD)
    assert (k.grid, k.threads, k.regs) == (1, 1024, 8)
    assert k.warp_insts.tolist() == [[23] * 4 + [9] * 28]
    assert list(k.arrays) == ["I1"]
    assert k.arrays["I1"].dtype == bool and k.arrays["I1"].tolist() == [[True] * 4 + [False] * 28]
    assert "if @I1" in k.program and k.program.count("exit") == 1
    assert "bytes=100" in k.program  # 4 B x (32, 32, 32, 4 lanes): the mean over warps 0-3
    assert (_counts(k) == k.warp_insts).all()


def test_loops_found_where_the_trace_repeats(tmp_path):
    (k,) = ai.import_traces(_folder(tmp_path, _trace(LOOPS)))
    assert k.warp_insts.tolist() == [[len(p) for p in cta] for cta in LOOPS]
    assert (_counts(k) == k.warp_insts).all()
    code = [line.split("#")[0].rstrip() for line in k.program.splitlines()]
    outer, inner = code.index("loop @L1"), code.index("  loop @L2")
    assert outer < inner and code[inner + 1:inner + 4] == ["    lds out=R5 ways=2", "    fma out=R4 dep=R4,R5",
                                                            "    alu"]
    assert k.arrays["L1"].tolist() == [[3, 2], [3, 1]]  # the outer trips
    # the inner trips: 2, 4, and 0 as traced; (1, 5, 2) varies between iterations: 8 // 3 = 2 each,
    # and the 2 iterations left run after the outer loop (L3)
    assert k.arrays["L2"].tolist() == [[2, 4], [2, 0]]
    assert code[code.index("loop @L3") + 1:code.index("loop @L3") + 4] == [
        "  lds out=R5 ways=2", "  fma out=R4 dep=R4,R5", "  alu"]
    assert k.arrays["L3"].tolist() == [[0, 0], [2, 0]]
    assert k.arrays["I1"].tolist() == [[True, False], [True, False]]  # the tail
    assert k.arrays["L1"].dtype == np.int32 and k.arrays["L1"].shape == (k.grid, 2)


def test_counts_exact_for_nested_varying_loops(tmp_path):
    """Inner trips that vary between outer iterations, per warp and per CTA: every warp's count
    is its trace's, however the leftovers are split."""
    rng = np.random.default_rng(5)
    warps = [[_warp_pcs(list(rng.integers(0, 6, rng.integers(1, 5))), bool(rng.integers(2))) for _ in range(3)]
             for _ in range(4)]
    (k,) = ai.import_traces(_folder(tmp_path, _trace(warps, block=96)))
    assert (_counts(k) == k.warp_insts).all()
    assert k.program.count("exit") == 1


def _random_program(rng, depth: int, pc: list[int]) -> list:
    """Straight-line code, loops (header ... latch) and optional regions, nested up to 3 deep."""
    items = []
    for _ in range(rng.integers(1, 5)):
        r = rng.random()
        if r < 0.5 or depth >= 3:
            items.append(pc[0])
            pc[0] += 16
        elif r < 0.75:
            header = pc[0]
            pc[0] += 16
            body = _random_program(rng, depth + 1, pc)
            items.append(("loop", header, body, pc[0]))
            pc[0] += 16
        else:
            items.append(("if", _random_program(rng, depth + 1, pc)))
    return items


def _random_run(rng, items: list, out: list[int]) -> None:
    """One warp's PCs: every loop instance and iteration draws its own trips and if-outcomes."""
    for it in items:
        if isinstance(it, int):
            out.append(it)
        elif it[0] == "loop":
            for _ in range(rng.integers(0, 5)):
                out.append(it[1])
                _random_run(rng, it[2], out)
                out.append(it[3])
        elif rng.random() < 0.5:
            _random_run(rng, it[1], out)


@pytest.mark.parametrize("seed", range(40))
def test_random_programs_exact_per_pc(tmp_path, seed):
    """Whatever the loops' trips and the ifs do from iteration to iteration, each warp runs every
    PC as often as traced: count the program with all but one PC's lines removed."""
    rng = np.random.default_rng(seed)
    pc = [0]
    program = _random_program(rng, 0, pc)
    exit_pc = pc[0]
    warps = []
    for _ in range(2):
        cta = []
        for _ in range(3):
            run: list[int] = []
            _random_run(rng, program, run)
            cta.append(run + [exit_pc])
        warps.append(cta)
    text = [f"-grid dim = ({len(warps)},1,1)\n-block dim = (96,1,1)\n-nregs = 32\n-accelsim tracer version = 4\n#"]
    for c, cta in enumerate(warps):
        text.append(f"#BEGIN_TB\nthread block = {c},0,0")
        for w, pcs in enumerate(cta):
            text.append(f"warp = {w}\ninsts = {len(pcs)}")
            text += [f"{p:04x} ffffffff 1 R{p // 16} IADD3 1 R{p // 16 + 1} 0" if p != exit_pc else
                     f"{p:04x} ffffffff 0 EXIT 0 0" for p in pcs]
        text.append("#END_TB")
    (k,) = ai.import_traces(_folder(tmp_path, "\n".join(text)))
    assert (_counts(k) == k.warp_insts).all()
    lines = k.program.splitlines()
    for p in sorted({p for cta in warps for pcs in cta for p in pcs} - {exit_pc}):
        only = "\n".join(line for line in lines if line.split()[0] in ("loop", "if", "else", "end")
                         or line.endswith(f"# {p:04x} IADD3"))
        traced = [[pcs.count(p) for pcs in cta] for cta in warps]
        assert ai.count_instructions(only, k.arrays, k.grid, 3).tolist() == traced, (seed, p)


def test_xz_and_old_trace_version(tmp_path):
    """Before tracer version 3 each line starts with the block and warp ids."""
    text = _trace([[_warp_pcs([3], False)]], block=32, version=2)
    old = "\n".join(("0 0 0 0 " + line if line[:4].isalnum() and " ffffffff " in line else line)
                    for line in text.splitlines())
    (tmp_path / "kernel-1.traceg.xz").write_bytes(lzma.compress(old.encode()))
    (tmp_path / "kernelslist.g").write_text("kernel-1.traceg.xz\n")
    (k,) = ai.import_traces(tmp_path)
    assert "loop 3" in k.program and (_counts(k) == k.warp_insts).all()


def test_unknown_opcodes(tmp_path):
    text = _trace(LOOPS).replace("MUFU.RCP", "HMMA.16816.F32").replace("FFMA", "QQQ")
    folder = _folder(tmp_path, text)
    with pytest.raises(JaxschedError, match=r"opcodes = 'HMMA QQQ': no instruction class.*opmap"):
        ai.import_traces(folder)
    (k,) = ai.import_traces(folder, opmap={"HMMA": "fma", "QQQ": "alu"})
    assert (_counts(k) == k.warp_insts).all()
    with pytest.raises(JaxschedError, match="opmap"):
        ai.import_traces(folder, opmap={"HMMA": "tensor"})


@pytest.mark.parametrize("bad, match", [
    ("0040 ffffffff 1 R4 FFMA 3 R4 R5", "not a trace instruction line"),
    ("0040 ffffffff x R4 FFMA 3 R4 R5 R4 0", "not a trace instruction line"),
    ("0040 ffffffff 1 R4 FFMA 3 R4 R5 R4 0 7 7 7", "unexpected fields"),
])
def test_malformed_line_names_file_and_line(tmp_path, bad, match):
    text = _trace(LOOPS).splitlines()
    at = next(i for i, line in enumerate(text) if line.startswith("0040 "))
    text[at] = bad
    folder = _folder(tmp_path, "\n".join(text))
    with pytest.raises(JaxschedError, match=rf"kernel-1.traceg line {at + 1}.*{match}"):
        ai.import_traces(folder)


def test_inst_count_mismatch(tmp_path):
    text = _trace(LOOPS).replace("insts = ", "insts = 1", 1)
    with pytest.raises(JaxschedError, match=r"kernel-1.traceg line \d+ = 'insts = 1\d+': the warp has"):
        ai.import_traces(_folder(tmp_path, text))


def test_count_instructions_reads_the_text_form():
    program = "loop @T\n fma\n if @B\n  alu\n else\n  sfu\n  sfu\n end\nend\nloop 2\n if 1\n  lds\n end\nend\nexit\n"
    arrays = {"T": np.array([3, 0], np.int32), "B": np.array([[True, False], [False, True]])}
    assert ai.count_instructions(program, arrays, 2, 2).tolist() == [[3 * 2 + 3, 3 * 3 + 3], [3, 3]]
    lanes = {"M": np.array([[0, -1], [5, 1]], np.int32)}  # a lane mask: both paths when divergent
    assert ai.count_instructions("if @M\n fma\nelse\n alu\nend\nexit", lanes, 2, 2).tolist() == [[2, 2], [3, 3]]
    with pytest.raises(JaxschedError, match="no exact count"):
        ai.count_instructions("if 0.5\n fma\nend\nexit", {}, 1, 1)


def test_cli_writes_toml_and_arrays(tmp_path, capsys):
    (tmp_path / "trace").mkdir()
    folder = _folder(tmp_path / "trace", _trace(LOOPS))
    out = tmp_path / "out" / "workload.toml"
    assert main(["import-traces", str(folder), "-o", str(out), "--opmap", "MUFU=sfu"]) == 0
    assert "workload.toml" in capsys.readouterr().out
    doc = tomllib.loads(out.read_text())
    (launch,) = doc["workload"]["launch"]
    kernel = launch["kernel"]
    assert (launch["stream"], kernel["grid"], kernel["threads"], kernel["regs"]) == (0, 2, 64, 40)
    assert kernel["static_smem_bytes"] == 2048
    assert kernel["arrays"] == {name: f"workload.arrays/k0_{name}.npy" for name in ("L1", "L2", "L3", "I1")}
    arrays = {name: np.load(out.parent / ref) for name, ref in kernel["arrays"].items()}
    assert arrays["L1"].tolist() == [[3, 2], [3, 1]] and arrays["I1"].dtype == bool
    counts = ai.count_instructions(kernel["program"], arrays, kernel["grid"], 2)
    assert counts.tolist() == [[len(p) for p in cta] for cta in LOOPS]


def test_cli_errors_in_one_line(tmp_path, capsys):
    assert main(["import-traces", str(MY_APP), "-o", str(tmp_path / "w.toml")]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "nregs = 21955" in err
    assert main(["import-traces", str(MY_APP), "-o", str(tmp_path / "w.toml"), "--regs", "32"]) == 0
    assert "arrays" not in tomllib.loads((tmp_path / "w.toml").read_text())["workload"]["launch"][0]["kernel"]
