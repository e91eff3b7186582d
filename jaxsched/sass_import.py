"""A kernel's SASS as a jaxsched warp program: `cuobjdump -sass` / `nvdisasm` text in, the
program text form (jaxsched/kernel.py) out.

Each instruction the warp issues becomes one program line of its class (`CLASSES`); backward
branches become `loop`s, forward conditional branches `if` regions; each line names the
registers it writes (`out=`) and the earlier results it waits for (`dep=`). What SASS cannot know
(trip counts, the lanes that take a branch) comes from the caller, by the names `L1, L2, ...`
(loops) and `B1, B2, ...` (branches) in address order, or by SASS address. docs/sass_import.md
states every rule.

    text = from_sass(listing, kernel="reduce_sum", trips={"L1": 8, "L2": 3})
"""

from __future__ import annotations

import dataclasses
import numbers
import re

from .errors import INT32_MAX, JaxschedError, check
from .sass import Function, Instr, find_function, read_listing

# Instruction class of each SASS opcode (the opcode without modifiers). Sources: NVIDIA's CUDA
# binary utilities instruction-set reference (sm_80, sm_90) and the CUDA C++ programming guide's
# arithmetic throughput table. The classes are jaxsched's (jaxsched/isa.py); where a pipe is not
# modelled the nearest class stands in, as noted.
_FMA = ("FFMA FADD FMUL FMNMX FSEL FSET FSETP FCHK FSWZADD HFMA2 HADD2 HMUL2 HMNMX2 HSET2 HSETP2 "
        "DFMA DADD DMUL DMNMX DSETP")  # FP32 pipe; FP16x2 and FP64 (a separate pipe) stand in as fma
_ALU = ("IMAD IADD3 IADD VIADD VIADDMNMX IMNMX VIMNMX VIMNMX3 IABS ISETP ISCADD LEA LOP3 PLOP3 SHF SEL MOV PRMT "
        "POPC FLO BREV BMSK SGXT P2R R2P S2R CS2R S2UR R2UR LDC ULDC I2FP F2IP VOTE VOTEU MATCH ELECT "
        "UIADD3 UIMAD UMOV ULOP3 USHF ULEA USEL UISETP UPLOP3 UPRMT UFLO UPOPC USGXT UBMSK UBREV")
_SFU = "MUFU I2F F2I F2F I2I FRND"  # MUFU and the type conversions share the quarter-rate XU pipe
_LDS = "LDS STS LDSM STSM ATOMS"
_LDG = "LDG STG LD ST LDL STL ATOMG ATOM RED REDG LDGSTS"  # global and local memory, loads and stores
# Control: they take an issue slot and no pipe jaxsched models, so they stand in as alu.
_CONTROL = ("BRA BSSY BSYNC WARPSYNC NOP YIELD CALL BREAK MEMBAR FENCE ERRBAR CCTL DEPBAR LDGDEPBAR "
            "NANOSLEEP BMOV")
CLASSES: dict[str, str] = {
    **{op: cls for cls, ops in (("fma", _FMA), ("alu", _ALU), ("sfu", _SFU), ("lds", _LDS), ("ldg", _LDG),
                                ("alu", _CONTROL)) for op in ops.split()},
    "SHFL": "shfl", "BAR": "bar", "EXIT": "exit",
}
MAP_CLASSES = ("fma", "alu", "sfu", "lds", "ldg", "shfl", "bar", "drop")  # what `opmap` may give an opcode

_UNSTRUCTURED = {"BRX", "JMX", "JMP", "RET", "RTT", "CALL.ABS"}  # indirect jumps and returns
_NO_WRITE = set("STG STS ST STL RED REDG BAR BRA EXIT CALL BSYNC WARPSYNC NOP YIELD MEMBAR FENCE ERRBAR CCTL "
                "DEPBAR LDGDEPBAR LDGSTS STSM NANOSLEEP BREAK".split())
_TWO_DESTS = set("ISETP FSETP DSETP HSETP2 PLOP3 UISETP UPLOP3 VOTE VOTEU".split())  # Pd, Pq, ... / Rd, Pd, ...
_ONE_DEST = {"FCHK"}  # FCHK Pd, Ra, Rb
_DOUBLE = set("DFMA DADD DMUL DMNMX DSETP".split())
_MEMORY = set("LDG STG LD ST LDL STL LDS STS ATOMG ATOM ATOMS RED REDG LDC ULDC".split())
_CONVERT = set("F2F I2F F2I I2I FRND F2IP I2FP".split())

_PRED = re.compile(r"U?P(?:\d|T)")
_REG = re.compile(r"(?:U?R(?:\d+|Z)|B\d+)(?:\.\w+)*")
_READ = re.compile(r"(?<![\w$.])(U?R\d+|U?P\d|B\d+)((?:\.\w+)*)")
_ARRAY = re.compile(r"[A-Za-z_]\w*")
_LANES = 32
SECTOR_BYTES = 32  # the unit in which L2 and DRAM serve a warp's coalesced accesses


@dataclasses.dataclass
class Loop:
    """A loop: SASS instructions `header` .. `latch` (indices; the latch is the backward branch)."""

    header: int
    latch: int
    body: list = dataclasses.field(default_factory=list)
    name: str = ""


@dataclasses.dataclass
class Branch:
    """An `if` region: the lanes that fall through the branch at `branch` run `then`; with
    `orelse`, the others run it (if/else). `guard_of`: the loop this branch skips when its trip
    count is zero."""

    branch: int
    then: list
    orelse: list | None = None
    guard_of: Loop | None = None
    name: str = ""


@dataclasses.dataclass
class Structure:
    """A function's body as nested loops and branches over instruction indices (`nodes`; an int is
    one instruction). `instrs[-1]` is the final EXIT."""

    function: Function
    instrs: list[Instr]
    nodes: list
    loops: list[Loop]
    branches: list[Branch]


def _conditional(ins: Instr) -> bool:
    """Whether a branch or exit depends on the lanes: a guard predicate, a predicate operand
    (`BRA !P2, 0x..`) or `BRA.DIV` (taken while the warp is diverged)."""
    preds = [op.lstrip("!") for op in ins.operands if _PRED.fullmatch(op.lstrip("!"))]
    return ins.guard not in ("", "PT") or "DIV" in ins.mods or any(p not in ("PT", "UPT") for p in preds)


class _Builder:
    """Structures one function's control flow (the rules of docs/sass_import.md, "Control flow")."""

    def __init__(self, function: Function):
        self.function = function
        instrs = list(function.instrs)
        name = function.name
        calls = [i.target for i in instrs if i.opcode == "CALL" and i.target is not None]
        if calls:  # subroutines (division's slow path, ...) follow the kernel's last EXIT
            instrs = [i for i in instrs if i.addr < min(calls)]
        exits = [k for k, i in enumerate(instrs) if i.opcode == "EXIT" and not _conditional(i)]
        check(bool(exits), f"kernel {name}", "no EXIT", "a kernel's SASS ends in an unpredicated EXIT")
        self.instrs = instrs[:exits[-1] + 1]
        self.exit = len(self.instrs) - 1
        index = {ins.addr: k for k, ins in enumerate(self.instrs)}
        self.jump: dict[int, tuple[int, bool]] = {}
        self.back_to: dict[int, list[int]] = {}
        for k, ins in enumerate(self.instrs[:-1]):
            if ins.opcode in _UNSTRUCTURED:
                raise JaxschedError(self._where(k), ins.full, "an indirect jump or return cannot be structured")
            if ins.opcode == "EXIT":  # an early exit: a jump to the final EXIT
                self.jump[k] = (self.exit, _conditional(ins))
            elif ins.opcode == "BRA":
                t = ins.target
                check(t is not None, self._where(k), ins.full, "a branch without a target address")
                if t not in index:
                    past = t > self.instrs[-1].addr
                    raise JaxschedError(self._where(k), ins.full, "jumps past the last EXIT (code placed after the "
                                        "exit cannot be structured)" if past else "jumps to no instruction")
                self.jump[k] = (index[t], _conditional(ins))
                if index[t] <= k:
                    self.back_to.setdefault(index[t], []).append(k)
        self.latches: dict[int, int] = {}  # back-edge -> its loop's header, once structured
        self.headers: set[int] = set()
        self.loops: list[Loop] = []
        self.branches: list[Branch] = []

    def _where(self, k: int) -> str:
        return f"kernel {self.function.name} at 0x{self.instrs[k].addr:04x}"

    def _fail(self, k: int, reason: str) -> JaxschedError:
        return JaxschedError(self._where(k), self.instrs[k].full, f"cannot be structured: {reason}")

    def _span(self, lo: int, hi: int) -> str:
        return f"0x{self.instrs[lo].addr:04x}..0x{self.instrs[hi - 1].addr:04x}"

    def build(self) -> Structure:
        nodes = self.region(0, self.exit, None) + [self.exit]
        return Structure(self.function, self.instrs, nodes, self.loops, self.branches)

    def region(self, lo: int, hi: int, loop_exit: int | None) -> list:
        """The nodes of instructions [lo, hi); `loop_exit` is the index just past the innermost loop."""
        nodes: list = []
        k = lo
        while k < hi:
            latches = self.back_to.get(k, [])
            if latches and k not in self.headers:
                if len(latches) > 1:
                    sources = ", ".join(f"0x{self.instrs[j].addr:04x}" for j in latches)
                    raise JaxschedError(self._where(k), self.instrs[k].full, "cannot be structured: several backward "
                                        f"branches reach this loop header (from {sources})")
                j = latches[0]
                if j >= hi:
                    raise self._fail(j, f"the loop {self._span(k, j + 1)} crosses the end of the enclosing region "
                                     f"{self._span(lo, hi)} (a jump into the loop, or out of an if)")
                loop = Loop(k, j)
                self.latches[j] = k
                self.headers.add(k)
                self.loops.append(loop)
                loop.body = self.region(k, j + 1, j + 1)
                nodes.append(loop)
                k = j + 1
                continue
            if k not in self.jump or self.latches.get(k) is not None:
                nodes.append(k)
                k += 1
                continue
            t, cond = self.jump[k]
            if t <= k:
                raise self._fail(k, f"a backward branch into the loop or if-region it leaves ({self._span(lo, hi)})")
            if t == k + 1 or t == loop_exit:  # to the next instruction; a loop's exit test or `break`
                nodes.append(k)
                k += 1
                continue
            if not cond:
                raise self._fail(k, "an unconditional forward jump that ends no if-block")
            if t > hi:
                raise self._fail(k, f"it jumps out of the enclosing region {self._span(lo, hi)}")
            nodes.append(k)
            last = t - 1
            inner = self.jump.get(last)
            if inner is not None and inner[0] > t and inner[0] != loop_exit:
                u, inner_cond = inner
                if u > hi:
                    raise self._fail(last, f"it jumps out of the enclosing region {self._span(lo, hi)}")
                first = Branch(k, [])
                self.branches.append(first)
                first.then = self.region(k + 1, last, loop_exit) + [last]
                if inner_cond:  # lanes from both sides run [t, u): its own branch
                    nodes.append(first)
                    nodes.append(self._branch(last, self.region(t, u, loop_exit)))
                else:  # if/else: the jump at the if-block's end skips the else-block
                    first.orelse = self.region(t, u, loop_exit)
                    nodes.append(first)
                k = u
            else:
                nodes.append(self._branch(k, self.region(k + 1, t, loop_exit)))
                k = t
        return nodes

    def _branch(self, k: int, then: list) -> Branch:
        """A branch without else; one whose if-block ends in a loop guards that loop."""
        branch = Branch(k, then, guard_of=then[-1] if isinstance(then[-1], Loop) else None)
        self.branches.append(branch)
        return branch


def structure(function: Function) -> Structure:
    """`function`'s body as nested loops and branches, named `L1, L2, ...` and `B1, B2, ...` in
    address order (a loop by its first instruction, a branch by its branch instruction)."""
    s = _Builder(function).build()
    s.loops.sort(key=lambda loop: loop.header)
    s.branches.sort(key=lambda b: b.branch)
    for n, loop in enumerate(s.loops, 1):
        loop.name = f"L{n}"
    for n, branch in enumerate(s.branches, 1):
        branch.name = f"B{n}"
    return s


# --- registers ---------------------------------------------------------------------------------

def _expand(name: str, width: int) -> list[str]:
    if width == 1 or name[0] in "PB" or name.startswith("UP"):
        return [name]
    prefix, number = re.match(r"(\D+)(\d+)", name).groups()
    return [f"{prefix}{int(number) + w}" for w in range(width)]


def _data_width(ins: Instr) -> int:
    """Registers per data operand of a memory or constant access (`.64`: 2, `.128`: 4)."""
    if ins.opcode in ("LDSM", "STSM"):
        counts = [int(m) for m in ins.mods if m in ("1", "2", "4")]
        return counts[-1] if counts else 1
    if "128" in ins.mods:
        return 4
    return 2 if any(m in ("64", "F64", "U64", "S64") for m in ins.mods) else 1


def _widths(ins: Instr) -> tuple[int, int]:
    """(registers per destination, registers per data source) of `ins`, where SASS says 64 bits."""
    op = ins.opcode
    if op in _DOUBLE:
        return 2, 2
    if op in _MEMORY or op in ("LDSM", "STSM"):
        w = _data_width(ins)
        return w, w
    if op == "CS2R":
        return (1 if "32" in ins.mods else 2), 1
    if op == "IMAD" and "WIDE" in ins.mods:  # IMAD.WIDE Rd, Ra, Rb, Rc: Rd and Rc are 64-bit
        return 2, 1
    if op in _CONVERT:  # F2F.F64.F32: the destination's type, then the source's
        types = [m for m in ins.mods if re.fullmatch(r"[FSU](?:8|16|32|64)", m)]
        source = types[1] if len(types) > 1 else types[0] if op == "FRND" and types else ""
        return (2 if types and types[0].endswith("64") else 1), (2 if source.endswith("64") else 1)
    return 1, 1


def _dest_count(ins: Instr) -> int:
    """How many leading operands `ins` writes: none for stores, branches and barriers; two for
    the compare-to-predicate family (`ISETP P0, PT, ...`); else the leading predicates, the first
    register, and the predicates right after it (`IADD3 R4, P0, ...` writes a carry;
    `LOP3.LUT P0, RZ, ...` and `SHFL.DOWN PT, R3, ...` a predicate and a register)."""
    if ins.opcode in _NO_WRITE:
        return 0
    if ins.opcode in _TWO_DESTS:
        return min(2, len(ins.operands))
    if ins.opcode in _ONE_DEST:
        return min(1, len(ins.operands))
    ops, n = ins.operands, 0
    while n < len(ops) and _PRED.fullmatch(ops[n]):
        n += 1
    if n < len(ops) and _REG.fullmatch(ops[n]):
        n += 1
        while n < len(ops) and _PRED.fullmatch(ops[n]):
            n += 1
    return n


def registers(ins: Instr) -> tuple[list[str], list[str]]:
    """(registers `ins` writes, registers it reads), in operand order, without RZ, PT, URZ, UPT.
    `R2.64` is R2 and R3; a `desc[UR4]` descriptor UR4 and UR5; a predicated instruction reads
    its guard predicate."""
    n_dest = _dest_count(ins)
    dst_w, src_w = _widths(ins)
    writes: list[str] = []
    for op in ins.operands[:n_dest]:
        m = _READ.match(op)
        if m:
            writes += _expand(m.group(1), dst_w)
    reads: list[str] = []
    if ins.guard and ins.guard not in ("PT", "!PT"):
        reads.append(ins.guard.lstrip("!"))
    sources = list(ins.operands[n_dest:])
    wide_addend = ins.opcode == "IMAD" and "WIDE" in ins.mods
    last_reg = max((i for i, op in enumerate(sources) if _READ.search(op)), default=-1)
    for i, op in enumerate(sources):
        address = "[" in op
        for m in _READ.finditer(op):
            name, suffix = m.groups()
            if name[0] == "P" or name.startswith("UP") or name[0] == "B":
                width = 1
            elif address:
                width = 4 if ".128" in suffix else 2 if ".64" in suffix or op[:m.start()].endswith("desc[") else 1
            elif wide_addend:
                width = 2 if i == last_reg else 1
            else:
                width = src_w
            reads += _expand(name, width)
    return _unique(writes), _unique(reads)


def _unique(names: list[str]) -> list[str]:
    return list(dict.fromkeys(names))


# --- classes -----------------------------------------------------------------------------------

def _opmap(opmap: dict[str, str] | None) -> dict[str, str]:
    opmap = dict(opmap or {})
    for op, cls in opmap.items():
        check(isinstance(op, str) and re.fullmatch(r"[A-Z][A-Z0-9_]*", op) is not None, "opmap", op,
              "a SASS opcode without modifiers, in capitals (FFMA, not FFMA.FTZ)")
        check(op != "EXIT", "opmap", op, "EXIT ends the program; it cannot be mapped")
        check(cls in MAP_CLASSES, f"opmap.{op}", cls, f"a class: one of {MAP_CLASSES}")
    return opmap


def instruction_class(ins: Instr, opmap: dict[str, str] | None = None) -> str | None:
    """The class of `ins` (`fma`, `alu`, ..., or `drop`), `opmap` first; None if unknown.
    `BAR.ARV` (arrive without waiting) is alu; every other BAR is a CTA barrier."""
    if opmap and ins.opcode in opmap:
        return opmap[ins.opcode]
    if ins.opcode == "BAR" and "ARV" in ins.mods:
        return "alu"
    return CLASSES.get(ins.opcode)


def _check_known(s: Structure, opmap: dict[str, str]) -> dict[int, str]:
    classes = {k: instruction_class(ins, opmap) for k, ins in enumerate(s.instrs)}
    unknown = sorted({s.instrs[k].opcode for k, c in classes.items() if c is None})
    if unknown:
        raise JaxschedError(f"kernel {s.function.name}", ", ".join(unknown),
                            "unknown SASS opcodes: give each a class with opmap={'OP': 'alu'} or --map OP=alu "
                            f"(classes: {', '.join(MAP_CLASSES)})")
    return classes


# --- trip counts and branch outcomes -----------------------------------------------------------

def _lookup(given: dict, items: list, what: str, noun: str, kernel: str, addr_of) -> dict[str, object]:
    """`given` by item name: keys are names (`L1`) or SASS addresses (`0x0250`)."""
    names = {item.name: item for item in items}
    by_addr = {addr_of(item): item.name for item in items}
    out: dict[str, object] = {}
    for key, value in given.items():
        name = key
        if isinstance(key, str) and re.fullmatch(r"0[xX][0-9a-fA-F]+", key):
            name = by_addr.get(int(key, 16), key)
        if name not in names:
            listed = ", ".join(f"{n} (0x{addr_of(item):04x})" for n, item in names.items()) or "none"
            raise JaxschedError(what, key, f"kernel {kernel} has no such {noun}; it has {listed}")
        out[name] = value
    return out


def _trip_text(name: str, value: object) -> str:
    if isinstance(value, str):
        array = value.removeprefix("@")
        check(_ARRAY.fullmatch(array) is not None, f"trips.{name}", value, "a trip count or an array name (@rows)")
        return f"@{array}"
    check(isinstance(value, numbers.Integral) and not isinstance(value, bool) and 0 <= value <= INT32_MAX,
          f"trips.{name}", value, "a trip count (an integer >= 0) or an array name (@rows)")
    return str(int(value))


def _outcome_text(name: str, value: object) -> str:
    if isinstance(value, str):
        array = value.removeprefix("@")
        check(_ARRAY.fullmatch(array) is not None, f"branches.{name}", value,
              "a lane probability in [0, 1] or an array name (@taken)")
        return f"@{array}"
    check(isinstance(value, numbers.Real) and not isinstance(value, bool) and 0.0 <= value <= 1.0,
          f"branches.{name}", value, "a lane probability in [0, 1] or an array name (@taken)")
    return f"{float(value):g}"


def _resolve(s: Structure, trips: dict | None, branches: dict | None) -> tuple[dict[str, str], dict[str, str]]:
    kernel = s.function.name
    loop_addr = lambda loop: s.instrs[loop.header].addr  # noqa: E731
    branch_addr = lambda b: s.instrs[b.branch].addr  # noqa: E731
    given_trips = _lookup(trips or {}, s.loops, "trips", "loop", kernel, loop_addr)
    given_branches = _lookup(branches or {}, s.branches, "branches", "branch", kernel, branch_addr)
    trip = {name: _trip_text(name, v) for name, v in given_trips.items()}
    outcome = {name: _outcome_text(name, v) for name, v in given_branches.items()}
    for b in s.branches:  # a zero-trip guard takes its loop's trip count: skipped where it is 0 (`if @rows>0`)
        if b.name not in outcome and b.guard_of is not None and b.guard_of.name in trip:
            trips = trip[b.guard_of.name]
            outcome[b.name] = f"{trips}>0" if trips.startswith("@") else "0" if trips == "0" else "1"
    no_trips = [f"{loop.name} (0x{loop_addr(loop):04x})" for loop in s.loops if loop.name not in trip]
    no_outcome = [f"{b.name} (0x{branch_addr(b):04x})" for b in s.branches
                  if b.name not in outcome and b.guard_of is None]
    if no_trips:
        raise JaxschedError("trips", ", ".join(no_trips), f"kernel {kernel}: these loops need a trip count "
                            "(trips={'L1': 100} or --trips L1=100; a per-CTA or per-warp array: L1=@rows)",
                            f"branches without an outcome: {', '.join(no_outcome)}" if no_outcome else "")
    if no_outcome:
        raise JaxschedError("branches", ", ".join(no_outcome), f"kernel {kernel}: these branches need the fraction "
                            "of lanes that fall through them (branches={'B1': 0.5} or --branch B1=0.5; an array: "
                            "B1=@taken)")
    return trip, outcome


# --- program text ------------------------------------------------------------------------------

_CODE_WIDTH = 44  # the column of the `#` comments


def _line(depth: int, code: str, comment: str, comments: bool) -> str:
    text = "  " * depth + code
    return f"{text:<{_CODE_WIDTH}} # {comment}" if comments and comment else text


def _ldg_bytes(ins: Instr) -> int:
    """Bytes a warp moves: the access width per lane times 32 lanes."""
    if "128" in ins.mods:
        per_lane = 16
    elif any(m in ("64", "F64", "U64", "S64") for m in ins.mods):
        per_lane = 8
    elif any(m in ("U16", "S16", "F16") for m in ins.mods):
        per_lane = 2
    elif any(m in ("U8", "S8") for m in ins.mods):
        per_lane = 1
    else:
        per_lane = 4
    return per_lane * _LANES


def _sector_bytes(s: Structure, classes: dict[int, str], sectors: dict | None) -> dict[int, int]:
    """Bytes of the global memory instructions whose 32-byte sectors `sectors` gives, by
    instruction index; keys are SASS addresses."""
    memory = {s.instrs[k].addr: k for k, cls in classes.items() if cls == "ldg"}
    out: dict[int, int] = {}
    for key, value in (sectors or {}).items():
        addr = int(key, 16) if isinstance(key, str) and re.fullmatch(r"0[xX][0-9a-fA-F]+", key) else None
        if addr not in memory:
            listed = ", ".join(f"0x{a:04x}" for a in memory) or "none"
            raise JaxschedError("sectors", key, f"kernel {s.function.name} has no global memory instruction at "
                                f"that address; it has {listed}")
        check(isinstance(value, numbers.Integral) and not isinstance(value, bool) and 1 <= value <= _LANES,
              f"sectors.{key}", value, f"the 32-byte sectors a warp's accesses touch: an integer in [1, {_LANES}]")
        out[memory[addr]] = int(value) * SECTOR_BYTES
    return out


def _emit(s: Structure, classes: dict[int, str], trip: dict[str, str], outcome: dict[str, str],
          sector_bytes: dict[int, int], comments: bool) -> str:
    # Dependences: a read waits for a register some earlier instruction writes, or (inside a loop)
    # one the loop writes anywhere: the previous trip's result.
    order: list[tuple[int, Loop | None]] = []

    def walk(nodes: list, loop: Loop | None) -> None:
        for node in nodes:
            if isinstance(node, Loop):
                walk(node.body, loop or node)
            elif isinstance(node, Branch):
                walk(node.then, loop)
                walk(node.orelse or [], loop)
            else:
                order.append((node, loop))

    walk(s.nodes, None)
    kept = [(k, loop) for k, loop in order if classes[k] != "drop"]
    regs = {k: registers(s.instrs[k]) for k, _ in kept}
    written_in: dict[int, set[str]] = {}
    for k, loop in kept:
        if loop is not None:
            written_in.setdefault(loop.header, set()).update(regs[k][0])
    deps: dict[int, list[str]] = {}
    before: set[str] = set()
    for k, loop in kept:
        carried = written_in.get(loop.header, set()) if loop is not None else set()
        deps[k] = [r for r in regs[k][1] if r in before or r in carried]
        before.update(regs[k][0])

    lines: list[str] = []

    def instr_line(k: int, depth: int) -> None:
        cls = classes[k]
        if cls == "drop":
            return
        ins = s.instrs[k]
        final = k == len(s.instrs) - 1
        if cls == "exit" and not final:
            cls = "alu"  # an early exit: the lanes leave; the warp goes on (its if-region)
        words = [cls]
        if cls != "exit":
            if regs[k][0]:
                words.append("out=" + ",".join(regs[k][0]))
            if ins.opcode == "DEPBAR":  # waits for the scoreboards of earlier loads: every earlier result
                words.append("dep")
            elif deps[k]:
                words.append("dep=" + ",".join(deps[k]))
            if cls == "ldg":
                words.append(f"bytes={sector_bytes.get(k) or _ldg_bytes(ins)}")
        note = " (callee not imported)" if ins.opcode == "CALL" else ""
        lines.append(_line(depth, " ".join(words), f"{ins.addr:04x} {ins.full}{note}", comments))

    def block(nodes: list, depth: int) -> None:
        for node in nodes:
            if isinstance(node, Loop):
                first, latch = s.instrs[node.header].addr, s.instrs[node.latch].addr
                lines.append(_line(depth, f"loop {trip[node.name]}", f"{node.name}: 0x{first:04x}..0x{latch:04x}",
                                   comments))
                block(node.body, depth + 1)
                lines.append("  " * depth + "end")
            elif isinstance(node, Branch):
                ins = s.instrs[node.branch]
                guard = f" (zero-trip guard of {node.guard_of.name})" if node.guard_of is not None else ""
                note = f"{node.name}: 0x{ins.addr:04x} {ins.full}{guard}"
                lines.append(_line(depth, f"if {outcome[node.name]}", note, comments))
                block(node.then, depth + 1)
                if node.orelse is not None:
                    lines.append("  " * depth + "else")
                    block(node.orelse, depth + 1)
                lines.append("  " * depth + "end")
            else:
                instr_line(node, depth)

    block(s.nodes, 0)
    return "\n".join(lines) + "\n"


def from_sass(text: str, kernel: str | None = None, *, trips: dict | None = None, branches: dict | None = None,
              sectors: dict | None = None, opmap: dict[str, str] | None = None, arch: str | None = None,
              comments: bool = True) -> str:
    """The warp program (jaxsched's program text form) of `kernel` in the SASS listing `text`.

    `trips` gives each loop's trip count (`{"L1": 100}`; a string names an array: `{"L2": "rows"}`
    becomes `loop @rows`); `branches` each branch's fraction of lanes that fall through it into the
    `if` block (`{"B1": 0.5}`, or an array name); keys are names or SASS addresses (`"0x0250"`).
    `sectors` gives a global memory instruction whose accesses are not 32 distinct coalesced
    lanes the 32-byte sectors they touch, by SASS address (`{"0x0c90": 1}`: thread 0's store, or a
    load of one address by every lane); it then moves that many sectors.
    `opmap` classes opcodes the table lacks or overrides it (`{"HMMA": "fma", "NOP": "drop"}`).
    `arch` picks the architecture of a multi-architecture listing; `comments` adds each line's
    SASS address and text. Raises `JaxschedError` naming every missing trip count or outcome,
    every unknown opcode, or the address that cannot be structured."""
    function = find_function(text, kernel, arch)
    s = structure(function)
    classes = _check_known(s, _opmap(opmap))
    trip, outcome = _resolve(s, trips, branches)
    return _emit(s, classes, trip, outcome, _sector_bytes(s, classes, sectors), comments)


def describe(text: str, kernel: str | None = None, arch: str | None = None) -> str:
    """The functions of a listing with their loops and branches (names, SASS addresses): what
    `trips` and `branches` name. A function that cannot be structured says why."""
    funcs = [find_function(text, kernel, arch)] if kernel is not None else read_listing(text)
    if arch is not None and kernel is None:
        funcs = [f for f in funcs if f.arch == arch]
    out: list[str] = []
    for f in funcs:
        title = f.name if f.short_name == f.name else f"{f.name} ({f.short_name})"
        out.append(f"{title}{' ' + f.arch if f.arch else ''}")
        try:
            s = structure(f)
        except JaxschedError as exc:
            out.append(f"  does not import: {exc}")
            continue
        unknown = sorted({i.opcode for i in s.instrs if instruction_class(i) is None})
        out.append(f"  {len(s.instrs)} instructions to the last EXIT at 0x{s.instrs[-1].addr:04x}"
                   + (f"; unknown opcodes (need --map): {', '.join(unknown)}" if unknown else ""))
        items = [(s.instrs[loop.header].addr, loop) for loop in s.loops]
        items += [(s.instrs[b.branch].addr, b) for b in s.branches]
        depth = _depths(s.nodes)
        for _, item in sorted(items, key=lambda x: (x[0], isinstance(x[1], Branch))):
            pad = "  " * (depth[id(item)] + 1)
            if isinstance(item, Loop):
                first, latch = s.instrs[item.header].addr, s.instrs[item.latch].addr
                n = _count(item.body)
                out.append(f"{pad}{item.name:<4} loop 0x{first:04x}..0x{latch:04x}, {n} instructions per trip")
            else:
                ins = s.instrs[item.branch]
                kind = "if/else" if item.orelse is not None else "if"
                guard = f", zero-trip guard of {item.guard_of.name} (default: from its trips)" \
                    if item.guard_of is not None else ""
                out.append(f"{pad}{item.name:<4} {kind} at 0x{ins.addr:04x} {ins.full}: "
                           f"{_count(item.then)} instructions{guard}")
    return "\n".join(out) + "\n"


def _depths(nodes: list, depth: int = 0, out: dict | None = None) -> dict[int, int]:
    out = {} if out is None else out
    for node in nodes:
        if isinstance(node, Loop):
            out[id(node)] = depth
            _depths(node.body, depth + 1, out)
        elif isinstance(node, Branch):
            out[id(node)] = depth
            _depths(node.then, depth + 1, out)
            _depths(node.orelse or [], depth + 1, out)
    return out


def _count(nodes: list) -> int:
    n = 0
    for node in nodes:
        if isinstance(node, Loop):
            n += _count(node.body)
        elif isinstance(node, Branch):
            n += _count(node.then) + _count(node.orelse or [])
        else:
            n += 1
    return n


def kernel_toml(program: str, *, name: str, source: str = "", grid: int | None = None,
                threads: int | None = None, regs: int | None = None) -> str:
    """A kernel TOML file (`[kernel]` table, sweeps/kernels/) holding `program`. Without `grid` and
    `threads` they are left as comments to fill in before `jaxsched run`."""
    lines = [f"# {line}" for line in source.splitlines()]
    lines += ["[kernel]", f"name = {_toml_string(name)}"]
    for key, value in (("grid", grid), ("threads", threads), ("regs", regs)):
        if value is not None:
            check(isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= INT32_MAX, key, value,
                  "a positive integer")
            lines.append(f"{key} = {value}")
        elif key != "regs":
            lines.append(f"# {key} = ...  (required by `jaxsched run`)")
    check('"""' not in program and "\\" not in program, "program", "\"\"\" or \\", "cannot go into a TOML string")
    lines += ['program = """', program.rstrip("\n"), '"""']
    return "\n".join(lines) + "\n"


def _toml_string(text: str) -> str:
    return '"' + text.replace("\\", "\\\\").replace('"', '\\"') + '"'
