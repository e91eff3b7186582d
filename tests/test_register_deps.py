"""Register dependences: an instruction waits for the results of the registers it names
(`out=`, `dep=r1,r2`, `dep=-D`), not for every earlier result (docs/model.md section 7), so
independent chains overlap. Hand cases with exact expectations, the engine against the
reference, and bad programs. Random programs with register dependences are in the differential
suite (`helpers.programs`)."""

from __future__ import annotations

import numpy as np
import pytest

import jaxsched as js
from jaxsched import clocks, reference
from jaxsched.kernel import MAX_DEP_SLOTS, make_kernel, parse_program

from helpers import hand_h200, simulate_padded
from test_engine_vs_reference import assert_same


def _ticks(program: str, arch: js.Arch) -> int:
    kernel = make_kernel(program, grid=1, threads=32)
    cfg = dict(arch=arch, kernel=kernel, clocks=clocks.uniform(arch))
    result, ref = simulate_padded(**cfg), reference.simulate(**cfg)
    assert_same(result, ref)
    return int(result.makespan_ticks)


def test_two_independent_chains_take_half_the_time_of_one_twice_as_long() -> None:
    """The issue's hand case: 2 x 100 dependent FMAs (latency 4) in one chain take 4 cycles each;
    interleaved as two chains each waits only for its own, and they overlap."""
    arch = hand_h200(1)
    one = _ticks("loop 100\n fma out=a dep=a\n fma out=a dep=a\nend", arch)
    two = _ticks("loop 100\n fma out=a dep=a\n fma out=b dep=b\nend", arch)
    assert one == 4 * 200 - 1  # the last result is not waited for
    assert two == 4 * 100
    assert abs(two / one - 0.5) < 0.01


def test_bare_dep_still_waits_for_every_earlier_result() -> None:
    arch = hand_h200(1)
    assert _ticks("loop 100\n fma dep\n fma dep\nend", arch) == _ticks(
        "loop 100\n fma out=a dep=a\n fma out=a dep=a\nend", arch)
    # a bare dep also waits for named registers: b waits for a, and the chains overlap less
    assert _ticks("loop 100\n fma out=a dep=a\n fma out=b dep\nend", arch) > _ticks(
        "loop 100\n fma out=a dep=a\n fma out=b dep=b\nend", arch)


def test_a_distance_names_the_instruction_it_waits_for() -> None:
    arch = hand_h200(1)
    # each FMA waits for the one two before it: two interleaved chains again
    assert _ticks("fma\nfma\nfma dep=-2\nfma dep=-2\nfma dep=-2\nfma dep=-2", arch) == _ticks(
        "fma out=a\nfma out=b\nfma out=a dep=a\nfma out=b dep=b\nfma out=a dep=a\nfma out=b dep=b", arch)


def test_a_load_waited_for_by_name_stalls_only_its_consumer() -> None:
    """An independent FMA chain issues under an outstanding global load; only the load's consumer
    waits for it (long scoreboard)."""
    arch = hand_h200(1)
    base = "ldg out=x\nloop 20\n fma out=a dep=a\nend\n"
    early = _ticks(base + "fma dep=x", arch)
    late = _ticks(base.replace("ldg out=x", "ldg") + "fma dep", arch)
    assert early == late  # the chain (80 cycles) hides under the load either way
    assert _ticks(base + "fma dep=a", arch) < early  # not waiting for the load at all


def test_registers_share_slots_past_the_limit() -> None:
    """More registers than dependence slots share slots: only waits are added, never lost."""
    names = [f"r{i}" for i in range(MAX_DEP_SLOTS + 3)]
    text = "\n".join(f"fma out={r}" for r in names) + "\n" + "\n".join(f"fma dep={r}" for r in names)
    instrs, _ = parse_program(text)
    for producer, consumer in zip(instrs[:len(names)], instrs[len(names):-1]):
        assert producer.writes & consumer.waits
    assert max(i.writes for i in instrs) < 1 << MAX_DEP_SLOTS


def test_an_address_chain_never_waits_for_a_load_in_flight() -> None:
    """Results of each kind sit in slots of their own: seven loads take the seven memory slots,
    and the ALU chain after them (the address arithmetic of a real loop) its own fixed-latency
    slot, so it runs under the loads (with one slot set for both it would wait for a load)."""
    arch = hand_h200(1)
    loads = "".join(f"ldg out=x{i}\n" for i in range(7))
    use = "fma dep=" + ",".join(f"x{i}" for i in range(7))
    chain = "loop 30\n alu out=a dep=a\nend\n"
    instrs, _ = parse_program(loads + chain + use)
    alu = next(ins for ins in instrs if ins.op == js.Op.ALU)
    assert alu.waits == alu.writes  # its own slot, of its own kind: bits 0..7
    assert _ticks(loads + chain + use, arch) == _ticks(loads + use, arch)  # hidden under the loads


def test_a_read_waits_only_for_the_writes_that_reach_it() -> None:
    """A register a compiler reuses: `t` was a load's destination, then an ALU result; the read
    after the ALU write waits for the ALU only. A write inside an if-path may be skipped, so a
    read after the branch waits for both; in a loop the previous trip's write reaches the top."""
    memory = lambda ins: ins.waits >> (2 * MAX_DEP_SLOTS)  # noqa: E731  (the memory kind's bits)
    fixed = lambda ins: ins.waits & ((1 << MAX_DEP_SLOTS) - 1)  # noqa: E731
    instrs, _ = parse_program("ldg out=t\nfma dep=t\nalu out=t\nalu dep=t")
    assert memory(instrs[1]) and not fixed(instrs[1])
    assert fixed(instrs[3]) and not memory(instrs[3])
    instrs, _ = parse_program("ldg out=t\nif 0.5\n alu out=t\nend\nalu dep=t")
    assert fixed(instrs[2]) and memory(instrs[2])
    instrs, _ = parse_program("ldg out=t\nloop 4\n alu dep=t\n alu out=t\nend")
    assert fixed(instrs[1]) and memory(instrs[1])


@pytest.mark.parametrize("program, match", [
    ("fma dep=r1\nfma out=r1", r"program line 1 = 'dep=r1': a dependence on a register no earlier"),
    ("fma dep=-1", r"program line 1 = 'dep=-1': a distance 1 .. 0"),
    ("fma\nfma dep=-3", r"a distance 1 .. 1"),
    ("bar\nfma dep=-1", r"waits for instruction 0 \(bar\), which has no result"),
    ("bar out=r1", r"out= applies to instructions with a result"),
    ("fma out=", r"register names"),
    ("fma dep=a;b", r"register names"),
])
def test_bad_register_dependences_get_one_line_errors(program: str, match: str) -> None:
    with pytest.raises(js.JaxschedError, match=match) as info:
        make_kernel(program, grid=1, threads=32)
    assert "\n" not in str(info.value)


def test_a_loop_carried_dependence_is_legal() -> None:
    instrs, _ = parse_program("fma out=b\nloop 3\n fma dep=a\n fma out=a dep=b\nend")
    assert instrs[1].waits == instrs[2].writes
    np.testing.assert_array_equal(make_kernel("loop 3\n fma dep=a\n fma out=a\nend", grid=1, threads=32).waits,
                                  [2, 0, 0])
