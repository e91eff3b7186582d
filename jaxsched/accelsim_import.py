"""Import Accel-Sim traces: a folder of NVBit traces becomes a jaxsched workload.

Accel-Sim's tracer (github.com/accel-sim/accel-sim-framework, `util/tracer_nvbit`) writes
`kernelslist.g` (one line per kernel trace file, `MemcpyHtoD,...` lines between them) and one
`.traceg` (or `.traceg.xz`) per kernel: `-key = value` header lines, then per thread block
(`#BEGIN_TB`, `thread block = x,y,z`) and per warp (`warp = N`, `insts = M`) the warp's dynamic
instructions, one a line:

    [tb_x tb_y tb_z warp]  [line_num]  PC mask dest_num [R..] opcode src_num [R..] mem_width [addresses] [imm]

(the block and warp ids before tracer version 3; `line_num` with `-enable lineinfo = 1`; the
immediate from version 5). A memory instruction's `mem_width > 0` is followed by the address
format (0: one address per active lane; 1: base and stride; 2: base and one delta per further
active lane) and its fields; `mask` is the active and predicated-on lanes. This module reads
exactly that (`gpu-simulator/trace-parser/trace_parser.cc` and the tracer's writer are the
reference) and turns each kernel into a jaxsched kernel: CTA shape from the header, grid = the
traced CTAs, and one warp program shared by all warps, with per-warp trip counts and if-outcomes
in arrays of shape [grid, warps_per_cta].

**Compression** (`_build`). Each warp's instruction stream, less its final EXIT (the program's
`exit`), is cut into loops by the control-flow graph of the kernel's traced PCs: a loop is the
natural loop of a back edge (an edge to a PC that dominates its source), so a divergent warp's
serialised paths and CALL/RET are not loops; irreducible flow stays straight-line. The streams of
all warps, and at each loop all iterations of all warps, are aligned into one sequence (difflib
on PCs and loop headers); instructions not present in every instance form `if` regions taken by
the instances that have them. A loop's iterations must share one body and its inner parameters:
where they differ (an inner loop's trip count or an `if` outcome varying between iterations),
the body takes, per warp, the floor of their mean (or their minimum, if the mean would run an
instruction more often than traced) and the iterations left over are run after the loop, as one
straight-line loop per block of the body. Every warp therefore executes each PC exactly as often
as traced, so its instruction count is exact; what is lost there is the order (`count_instructions`
replays the counting, tests check it against `insts`).

**Instructions.** `OP_CLASSES` maps a SASS opcode (its part before the first dot) to a jaxsched
instruction class; `opmap` adds or overrides entries. Registers: `out=` the destinations (a load
of W > 4 bytes fills W/4 registers, a `.WIDE` result 2; RZ = R255 dropped), `dep=` the sources
that some instruction of the program writes. `ldg bytes=` is mem_width x active lanes (mean over
the PC's executions, 1 .. 4096); `lds ways=` the bank-conflict degree from the addresses (the most
distinct 4-byte words a bank serves, mean over executions).
"""

from __future__ import annotations

import dataclasses
import difflib
import json
import lzma
import math
from collections.abc import Iterator, Sequence
from pathlib import Path

import numpy as np

from .errors import JaxschedError, check

WARP_SIZE = 32
# jaxsched.kernel's limits (not imported from there: it imports JAX, and this module needs none)
MAX_TRIPS = 2**24 - 1
MAX_LDG_BYTES = 4096
MAX_REGS = 255  # registers per thread, a CUDA limit
CLASSES = ("fma", "alu", "sfu", "lds", "ldg", "shfl", "bar")  # what `opmap` may name

# SASS opcode (before the first dot) -> instruction class. One table, to be shared with the SASS
# importer. Control flow (BRA, BSSY, ...) issues from the warp scheduler like an ALU instruction
# and counts as one; an EXIT that is not the warp's last instruction (predicated off, or only some
# lanes exiting) is such a control instruction. Type conversions run on the XU with MUFU (Nsight
# Compute's pipe names). Tensor-core instructions (HMMA, ...) have no class yet: map them.
OP_CLASSES: dict[str, str] = {
    **dict.fromkeys(("FFMA", "FADD", "FMUL", "FMNMX", "FSET", "FSETP", "FSEL", "FCHK", "FSWZADD", "FCMP",
                     "HFMA2", "HADD2", "HMUL2", "HMNMX2", "HSET2", "HSETP2", "DFMA", "DADD", "DMUL",
                     "DSETP", "DMNMX", "FFMA32I", "FADD32I", "FMUL32I", "HFMA2MMA"), "fma"),
    **dict.fromkeys(("IMAD", "IMADSP", "IMUL", "IMUL32I", "IADD", "IADD3", "IADD32I", "IABS", "IMNMX", "ISCADD",
                     "ISCADD32I", "ISETP", "ISET", "ICMP", "LOP", "LOP3", "LOP32I", "PLOP3", "PSETP", "LEA",
                     "LEA_HI", "SHF", "SHL", "SHR", "SEL", "PRMT", "SGXT", "BMSK", "BREV", "FLO", "POPC",
                     "XMAD", "MOV", "MOV32I", "P2R", "R2P", "S2R", "CS2R", "S2UR", "R2UR", "VOTE", "VOTEU",
                     "VABSDIFF", "VABSDIFF4", "IDP", "IDP4A", "BFE", "BFI", "MATCH", "REDUX",
                     "UMOV", "UIADD3", "UIMAD", "ULOP3", "ULOP", "USHF", "UISETP", "USEL", "UPRMT", "ULEA",
                     "UFLO", "UPOPC", "UBMSK", "USGXT", "UBREV", "UPLOP3", "UP2UR", "ULDC",
                     "BRA", "BRX", "JMP", "JMX", "CALL", "RET", "BSSY", "BSYNC", "BREAK", "BMOV", "WARPSYNC",
                     "NOP", "YIELD", "KILL", "BPT", "SSY", "SYNC", "PBK", "BRK", "PCNT", "CONT", "PRET",
                     "PEXIT", "RPCMOV", "MEMBAR", "FENCE", "ERRBAR", "CCTL", "CCTLL", "DEPBAR",
                     "LDGDEPBAR", "ARRIVES", "NANOSLEEP"), "alu"),
    **dict.fromkeys(("MUFU", "RRO", "F2F", "F2I", "I2F", "I2I", "FRND", "F2FP", "I2FP", "F2IP"), "sfu"),
    **dict.fromkeys(("LDS", "STS", "LDSM", "ATOMS", "LDC"), "lds"),
    **dict.fromkeys(("LDG", "STG", "LD", "ST", "LDL", "STL", "ATOM", "ATOMG", "RED", "LDGSTS", "TEX", "TLD",
                     "TLD4", "TXQ", "TMML", "TXD", "SULD", "SUST", "SUATOM", "SURED"), "ldg"),
    "SHFL": "shfl",
    "BAR": "bar",
    "EXIT": "exit",
}


@dataclasses.dataclass(frozen=True)
class TraceHeader:
    """The `-key = value` lines of a `.traceg` file."""

    name: str
    grid: tuple[int, int, int]
    block: tuple[int, int, int]
    shmem_bytes: int  # static + dynamic shared memory per CTA (the tracer writes their sum)
    nregs: int
    stream: int  # the CUDA stream handle
    trace_version: int
    lineinfo: bool

    @property
    def threads(self) -> int:
        return self.block[0] * self.block[1] * self.block[2]

    @property
    def warps_per_cta(self) -> int:
        return -(-self.threads // WARP_SIZE)

    @property
    def ctas(self) -> int:
        return self.grid[0] * self.grid[1] * self.grid[2]


@dataclasses.dataclass
class _Static:
    """What a PC's trace lines share, and its memory statistics over its executions."""

    opcode: str
    dests: tuple[int, ...]
    srcs: tuple[int, ...]
    executions: int = 0
    bytes_sum: int = 0  # mem_width x active lanes
    ways_sum: int = 0  # shared-memory bank-conflict degree


@dataclasses.dataclass
class TraceKernel:
    """One kernel trace: its header, each warp's PCs (`pcs[cta][warp]`), and per PC its static
    part and memory statistics."""

    path: Path
    header: TraceHeader
    pcs: list[list[list[int]]]
    static: dict[int, _Static]


@dataclasses.dataclass(frozen=True)
class ImportedKernel:
    """A kernel as the workload TOML carries it: `program` in the program text form and its
    arrays (trip counts int32, if-outcomes bool, each [grid, warps_per_cta]); `warp_insts` the
    traced instruction count of every warp."""

    name: str
    source: str
    grid: int
    threads: int
    regs: int
    smem_bytes: int
    stream: int
    program: str
    arrays: dict[str, np.ndarray]
    warp_insts: np.ndarray


# ---------------------------------------------------------------------------------------------
# Reading


def _open(path: Path) -> Iterator[str]:
    check(path.is_file(), "trace file", str(path), "no such file")
    opener = lzma.open if path.suffix == ".xz" else open
    with opener(path, "rt", encoding="utf-8", errors="replace") as f:
        yield from f


def trace_files(folder: str | Path) -> list[Path]:
    """The kernel trace files `kernelslist.g` lists, in launch order (memcpy lines skipped: copies
    are not simulated)."""
    folder = Path(folder)
    listing = folder / "kernelslist.g" if folder.is_dir() else folder
    check(listing.is_file(), "trace folder", str(folder), "has no kernelslist.g (Accel-Sim's list of kernel traces)")
    files = []
    for lineno, raw in enumerate(listing.read_text(encoding="utf-8").splitlines(), start=1):
        line = raw.strip()
        if not line or line.startswith("Memcpy"):
            continue
        check(line.startswith("kernel"), f"{listing} line {lineno}", line,
              "expected a kernel trace file (kernel-N.traceg) or a MemcpyHtoD line")
        files.append(listing.parent / line)
    check(bool(files), str(listing), "no kernels", "lists no kernel trace")
    return files


def _triple(value: str, where: str) -> tuple[int, int, int]:
    try:
        x, y, z = (int(v) for v in value.strip().strip("()").split(","))
    except ValueError:
        raise JaxschedError(where, value, "expected (x,y,z)") from None
    check(min(x, y, z) >= 1, where, value, "dimensions of at least 1")
    return x, y, z


def _header(lines: dict[str, tuple[str, int]], path: Path) -> TraceHeader:
    def get(key: str, default: str | None = None) -> tuple[str, str]:
        if key in lines:
            return lines[key][0], f"{path} line {lines[key][1]}"
        check(default is not None, str(path), f"-{key}", "missing from the header")
        return default, str(path)

    def integer(key: str, default: str) -> int:
        value, where = get(key, default)
        try:
            return int(value, 0) if value.lower().startswith("0x") else int(value)
        except ValueError:
            raise JaxschedError(where, value, f"-{key}: expected an integer") from None

    return TraceHeader(name=get("kernel name", path.stem)[0], grid=_triple(*get("grid dim")),
                       block=_triple(*get("block dim")), shmem_bytes=integer("shmem", "0"),
                       nregs=integer("nregs", "0"), stream=integer("cuda stream id", "0"),
                       trace_version=integer("accelsim tracer version", "0"),
                       lineinfo=bool(integer("enable lineinfo", "0")))


def read_header(path: str | Path) -> TraceHeader:
    """The header of a `.traceg` file (the lines before the first `#`)."""
    path = Path(path)
    lines: dict[str, tuple[str, int]] = {}
    for lineno, raw in enumerate(_open(path), start=1):
        line = raw.strip()
        if line.startswith("#"):
            break
        if line.startswith("-"):
            key, _, value = line[1:].partition("=")
            lines[" ".join(key.split())] = (value.strip(), lineno)
    return _header(lines, path)


def _register(word: str) -> int:
    if not (word[:1] == "R" and word[1:].isdigit()):
        raise ValueError(f"{word!r} is not a register")
    return int(word[1:])


def _addresses(mode: int, fields: list[str], mask: int) -> tuple[list[int], int]:
    """The active lanes' addresses of a memory instruction, and how many fields they took."""
    lanes = bin(mask).count("1")
    if mode == 0:
        return [int(w, 16) for w in fields[:lanes]], lanes
    if mode == 1:
        base, stride = int(fields[0], 16), int(fields[1])
        return [base + stride * i for i in range(lanes)], 2
    if mode == 2:
        n = max(lanes - 1, 0)
        addrs = [int(fields[0], 16)]
        for d in fields[1:1 + n]:
            addrs.append(addrs[-1] + int(d))
        return addrs[:lanes], 1 + n
    raise ValueError(f"address format {mode} (expected 0, 1 or 2)")


def _bank_ways(addrs: list[int], width: int) -> int:
    """Shared-memory bank-conflict degree: the most distinct 4-byte words one of the 32 banks
    serves (lanes reading the same word share it: a broadcast)."""
    words: dict[int, set[int]] = {}
    for a in addrs:
        for word in range(a // 4, (a + max(width, 1) - 1) // 4 + 1):
            words.setdefault(word % 32, set()).add(word)
    return max((len(w) for w in words.values()), default=1)


def _parse_line(words: list[str], header: TraceHeader) -> tuple[int, int, tuple, str, tuple, int, list[int]]:
    """(pc, mask, dests, opcode, srcs, mem_width, addresses) of one instruction line."""
    i = (4 if header.trace_version < 3 else 0) + (1 if header.lineinfo else 0)
    pc, mask = int(words[i], 16), int(words[i + 1], 16)
    n_dst = int(words[i + 2])
    dests = tuple(_register(w) for w in words[i + 3:i + 3 + n_dst])
    i += 3 + n_dst
    opcode = words[i]
    n_src = int(words[i + 1])
    srcs = tuple(_register(w) for w in words[i + 2:i + 2 + n_src])
    i += 2 + n_src
    if len(dests) != n_dst or len(srcs) != n_src or not opcode[:1].isalpha():
        raise ValueError("fewer registers than their count")
    width = int(words[i])
    i += 1
    addrs: list[int] = []
    if width > 0:
        addrs, used = _addresses(int(words[i]), words[i + 1:], mask)
        i += 1 + used
    if len(words) - i > 1:  # at most the immediate (tracer version 5)
        raise ValueError(f"{len(words) - i} unexpected fields at the end")
    return pc, mask, dests, opcode, srcs, width, addrs


def read_kernel(path: str | Path) -> TraceKernel:
    """Parse one `.traceg` (or `.traceg.xz`) file. Errors name the file and line."""
    path = Path(path)
    header_lines: dict[str, tuple[str, int]] = {}
    header: TraceHeader | None = None
    pcs: list[list[list[int]] | None] = []
    static: dict[int, _Static] = {}
    cta: list[list[int]] | None = None
    warp: list[int] | None = None
    declared = declared_at = 0
    ways_cache: dict[tuple, int] = {}
    parsed: dict[str, tuple] = {}  # lines without addresses repeat: parse each once

    def close_warp() -> None:
        if warp is not None and len(warp) != declared:
            raise JaxschedError(f"{path} line {declared_at}", f"insts = {declared}",
                                f"the warp has {len(warp)} instruction lines")

    def instruction(line: str, lineno: int) -> None:
        check(warp is not None, f"{path} line {lineno}", line, "an instruction outside a warp")
        hit = parsed.get(line)
        if hit is None:
            try:
                hit = _parse_line(line.split(), header)
            except (ValueError, IndexError) as exc:
                raise JaxschedError(f"{path} line {lineno}", line[:120],
                                    f"not a trace instruction line ({exc or 'too few fields'})") from None
            if not hit[6]:
                if len(parsed) > 100_000:
                    parsed.clear()
                parsed[line] = hit
        pc, mask, dests, opcode, srcs, width, addrs = hit
        s = static.get(pc)
        if s is None:
            s = static[pc] = _Static(opcode, dests, srcs)
        elif s.opcode != opcode:
            raise JaxschedError(f"{path} line {lineno}", opcode, f"PC {pc:#06x} was {s.opcode} before")
        s.executions += 1
        if width:
            s.bytes_sum += width * bin(mask).count("1")
            if addrs and OP_CLASSES.get(opcode.split(".", 1)[0]) == "lds":
                k = (tuple(a - addrs[0] for a in addrs), addrs[0] % 128, width)
                if k not in ways_cache:
                    ways_cache[k] = _bank_ways(addrs, width)
                s.ways_sum += ways_cache[k]
        warp.append(pc)

    for lineno, raw in enumerate(_open(path), start=1):
        line = raw.strip()
        if not line:
            continue
        if header is not None and "=" not in line and line[0] != "#":
            instruction(line, lineno)
            continue
        where = f"{path} line {lineno}"
        if header is None:
            if line.startswith("-"):
                key, _, value = line[1:].partition("=")
                header_lines[" ".join(key.split())] = (value.strip(), lineno)
                continue
            header = _header(header_lines, path)
            pcs = [None] * header.ctas
        if line.startswith("#"):
            if line.startswith("#BEGIN_TB"):
                check(cta is None, where, line, "a thread block begins before the previous one ended")
                cta = []
            elif line.startswith("#END_TB"):
                check(cta is not None, where, line, "#END_TB without #BEGIN_TB")
                close_warp()
                check(len(cta) == header.warps_per_cta, where, f"{len(cta)} warps",
                      f"a CTA of {header.threads} threads has {header.warps_per_cta} warps")
                cta = warp = None
            continue
        key, eq, value = line.partition("=")
        key = key.strip()
        if key == "thread block":
            check(cta is not None and not cta, where, line, "thread block = outside #BEGIN_TB")
            try:
                x, y, z = (int(v) for v in value.split(","))
            except ValueError:
                raise JaxschedError(where, line, "expected thread block = x,y,z") from None
            gx, gy, gz = header.grid
            check(0 <= x < gx and 0 <= y < gy and 0 <= z < gz, where, line, f"a block of the grid {header.grid}")
            index = x + gx * (y + gy * z)
            check(pcs[index] is None, where, line, "this thread block is traced twice")
            pcs[index] = cta
        elif key.startswith("cluster"):
            continue  # thread block clusters (Hopper): not modelled
        elif key == "warp":
            check(cta is not None, where, line, "warp = outside a thread block")
            close_warp()
            check(value.strip() == str(len(cta)), where, line, f"expected warp = {len(cta)} (warps in order)")
            check(len(cta) < header.warps_per_cta, where, line, f"more than {header.warps_per_cta} warps")
            warp, declared = [], 0
            cta.append(warp)
        elif key == "insts":
            check(warp is not None and not warp and value.strip().isdigit(), where, line,
                  "insts = N, after warp =")
            declared, declared_at = int(value), lineno
        else:
            raise JaxschedError(where, line[:120], "not a trace line")
    check(header is not None, str(path), "no instructions", "not an Accel-Sim kernel trace")
    check(cta is None, str(path), "end of file", "the last thread block has no #END_TB")
    missing = [i for i, c in enumerate(pcs) if c is None]
    check(not missing, str(path), f"{len(missing)} of {header.ctas} CTAs untraced (first: {missing[:1]})",
          "every CTA of the grid must be traced")
    return TraceKernel(path, header, pcs, static)


# ---------------------------------------------------------------------------------------------
# Loops of the control-flow graph


def _natural_loops(streams: Sequence[Sequence[int]]) -> dict[int, frozenset[int]]:
    """Loop header PC -> the PCs of its natural loop, from the edges the streams take."""
    entry = -1
    succ: dict[int, set[int]] = {}
    for s in streams:
        prev = entry
        for pc in s:
            succ.setdefault(prev, set()).add(pc)
            prev = pc
    order: list[int] = []  # reverse postorder from the entry
    seen = {entry}
    stack = [(entry, iter(sorted(succ.get(entry, ()))))]
    while stack:
        node, it = stack[-1]
        nxt = next(it, None)
        if nxt is None:
            order.append(node)
            stack.pop()
        elif nxt not in seen:
            seen.add(nxt)
            stack.append((nxt, iter(sorted(succ.get(nxt, ())))))
    order.reverse()
    index = {n: i for i, n in enumerate(order)}
    preds: dict[int, list[int]] = {}
    for u, vs in succ.items():
        for v in vs:
            preds.setdefault(v, []).append(u)
    idom = {entry: entry}  # Cooper, Harvey and Kennedy's iterative dominators
    changed = True
    while changed:
        changed = False
        for b in order[1:]:
            done = [p for p in preds[b] if p in idom]
            new = done[0]
            for p in done[1:]:
                a = p
                while a != new:
                    while index[a] > index[new]:
                        a = idom[a]
                    while index[new] > index[a]:
                        new = idom[new]
            if idom.get(b) != new:
                idom[b] = new
                changed = True

    def dominates(h: int, u: int) -> bool:
        while u != h and u != entry:
            u = idom[u]
        return u == h

    loops: dict[int, set[int]] = {}
    for u, vs in succ.items():
        for h in vs:
            if u != entry and dominates(h, u):
                body = loops.setdefault(h, {h})
                work = [u]
                while work:
                    n = work.pop()
                    if n not in body:
                        body.add(n)
                        work.extend(preds.get(n, ()))
    return {h: frozenset(b) for h, b in loops.items()}


# An instance tree: a tuple of items, each a PC (int) or a loop ("L", header, iterations), its
# iterations instance trees themselves.
Tree = tuple


def _nest(stream: Sequence[int], loops: dict[int, frozenset[int]]) -> Tree:
    """A warp's PCs as an instance tree: a loop opens at its header, starts an iteration at each
    return to its header and closes at the first PC outside it."""
    root: list = []
    frames: list[tuple[int, list[list]]] = []  # (header, iterations)
    for pc in stream:
        while frames and pc not in loops[frames[-1][0]]:
            frames.pop()
        if pc in loops:
            if frames and frames[-1][0] == pc:
                frames[-1][1].append([])
            else:
                iterations: list[list] = [[]]
                (frames[-1][1][-1] if frames else root).append(("L", pc, iterations))
                frames.append((pc, iterations))
        (frames[-1][1][-1] if frames else root).append(pc)

    def freeze(items: list) -> Tree:
        return tuple(x if isinstance(x, int) else ("L", x[1], tuple(freeze(it) for it in x[2])) for x in items)

    return freeze(root)


# ---------------------------------------------------------------------------------------------
# One program for all instances


@dataclasses.dataclass(eq=False)
class _Block:
    """`loop` (a trip count per instance) or `if` (0 or 1) around `body` (PCs and blocks)."""

    kind: str
    body: list


Params = dict  # _Block -> int, per instance; a block an instance does not reach is 0


def _key(item) -> object:
    return item if isinstance(item, int) else ("L", item[1])


def _align(instances: Sequence[Tree]) -> tuple[list[object], list[dict[int, int]]]:
    """A common supersequence of the instances' items (slots, by PC or loop header) and, per
    instance, its item index -> slot."""
    slots: list[int] = []  # slot ids in order
    keys: list[object] = []  # key per slot id
    maps: list[dict[int, int]] = []
    for inst in instances:
        mine = [_key(x) for x in inst]
        matcher = difflib.SequenceMatcher(None, [keys[s] for s in slots], mine, autojunk=False)
        new_slots: list[int] = []
        m: dict[int, int] = {}
        for tag, a0, a1, b0, b1 in matcher.get_opcodes():
            if tag == "equal":
                for a, b in zip(range(a0, a1), range(b0, b1)):
                    m[b] = slots[a]
                    new_slots.append(slots[a])
                continue
            new_slots.extend(slots[a0:a1])
            for b in range(b0, b1):
                keys.append(mine[b])
                m[b] = len(keys) - 1
                new_slots.append(len(keys) - 1)
        slots = new_slots
        maps.append(m)
    return slots, maps


def _blocks(nodes: list) -> Iterator[tuple[_Block, tuple[_Block, ...]]]:
    """Every block under `nodes` with its enclosing blocks (outermost first), in program order."""
    for n in nodes:
        if isinstance(n, _Block):
            yield n, ()
            for b, path in _blocks(n.body):
                yield b, (n, *path)


def _regularise(body: list, iterations: list[Params]) -> tuple[Params, list[tuple[list[int], int]]]:
    """One instance's parameters for a loop body, constant over its iterations, and the
    straight-line loops (PCs, trips) that run what the iterations did beyond them."""
    groups = [(b, (*path, b)) for b, path in _blocks(body)]
    direct = {b: [n for n in b.body if isinstance(n, int)] for b, _ in groups}

    def actual(path) -> int:
        return sum(math.prod(p.get(b, 0) for b in path) for p in iterations)

    k = len(iterations)
    wanted = {b: actual(path) for b, path in groups}
    for rule in (lambda v: sum(v) // k, min):
        params = {b: rule([p.get(b, 0) for p in iterations]) for b, _ in groups}
        rest = {b: wanted[b] - k * math.prod(params[x] for x in path) for b, path in groups}
        if min(rest.values(), default=0) >= 0:
            break
    return params, [(direct[b], rest[b]) for b, _ in groups if direct[b] and rest[b] > 0]


def _build(instances: Sequence[Tree]) -> tuple[list, list[Params]]:
    """One program (PCs and blocks) and each instance's parameters, such that running the
    program with an instance's parameters executes each PC as often as the instance does."""
    unique: dict[Tree, int] = {}
    which = [unique.setdefault(inst, len(unique)) for inst in instances]
    insts = list(unique)
    slots, maps = _align(insts)
    params: list[Params] = [{} for _ in insts]
    owner_of = [{s: b for b, s in m.items()} for m in maps]  # slot -> item index, per instance
    pieces: list[tuple[list, frozenset[int]]] = []  # per slot: its nodes, the instances present
    for slot in slots:
        present = frozenset(j for j in range(len(insts)) if slot in owner_of[j])
        first = insts[next(iter(present))][owner_of[next(iter(present))][slot]]
        if isinstance(first, int):
            pieces.append(([first], present))
            continue
        iterations, owners = [], []
        for j in sorted(present):
            for it in insts[j][owner_of[j][slot]][2]:
                iterations.append(it)
                owners.append(j)
        body, it_params = _build(iterations)
        loop = _Block("loop", body)
        rest: dict[tuple, _Block] = {}
        nodes = [loop]
        for j in sorted(present):
            mine = [p for p, o in zip(it_params, owners) if o == j]
            p, leftovers = _regularise(body, mine)
            params[j].update(p)
            params[j][loop] = len(mine)
            for pcs_, trips in leftovers:
                key = tuple(pcs_)
                if key not in rest:
                    rest[key] = _Block("loop", list(pcs_))
                    nodes.append(rest[key])
                params[j][rest[key]] = params[j].get(rest[key], 0) + trips
        pieces.append((nodes, present))
    everyone = frozenset(range(len(insts)))
    program: list = []
    i = 0
    while i < len(pieces):
        nodes, present = pieces[i]
        j = i + 1
        while j < len(pieces) and pieces[j][1] == present:
            j += 1
        run = [n for ns, _ in pieces[i:j] for n in ns]
        only_loops = all(isinstance(n, _Block) for n in run)  # an absent loop just runs 0 times
        if present == everyone or only_loops:
            program.extend(run)
        else:
            block = _Block("if", run)
            program.append(block)
            for k in present:
                params[k][block] = 1
        i = j
    return program, [params[w] for w in which]


# ---------------------------------------------------------------------------------------------
# Program text


def _op_class(opcode: str, opmap: dict[str, str]) -> str | None:
    base = opcode.split(".", 1)[0]
    return opmap.get(opcode) or opmap.get(base) or OP_CLASSES.get(base)


def _registers(s: _Static, cls: str) -> tuple[list[int], list[int]]:
    """(registers written, registers read) of a PC, RZ dropped."""
    fill = 1
    if cls in ("ldg", "lds") and s.dests:
        tokens = s.opcode.split(".")
        nums = [int(t.lstrip("U")) for t in tokens[1:] if t.lstrip("U").isdigit()]
        fill = max(nums[0] // 32 if nums else 1, 1)
    elif ".WIDE" in s.opcode:
        fill = 2
    out = sorted({d + i for d in s.dests for i in range(fill) if d + i < MAX_REGS})
    return out, [r for r in s.srcs if r != MAX_REGS]


def _emit(nodes: list, kernel: TraceKernel, values: dict[_Block, np.ndarray], reach: np.ndarray,
          opmap: dict[str, str], written: set[int], names: dict[_Block, str], lines: list[str], depth: int) -> None:
    """Append the program lines of `nodes` (reached by the warps `reach`); a block whose value
    is the same for every warp reaching it needs no array, one run once needs no block."""
    pad = "  " * depth
    for n in nodes:
        if isinstance(n, _Block):
            v = values[n][reach]
            if (v == 1).all():
                _emit(n.body, kernel, values, reach, opmap, written, names, lines, depth)
                continue
            if n.kind == "loop" and (v == v[0]).all():
                lines.append(f"{pad}loop {int(v[0])}")
            else:
                names[n] = f"{'L' if n.kind == 'loop' else 'I'}{sum(1 for b in names if b.kind == n.kind) + 1}"
                lines.append(f"{pad}{n.kind} @{names[n]}")
            _emit(n.body, kernel, values, reach & (values[n] > 0), opmap, written, names, lines, depth + 1)
            lines.append(f"{pad}end")
            continue
        s = kernel.static[n]
        cls = _op_class(s.opcode, opmap)
        if cls == "exit":  # not the warp's last instruction: predicated off, or some lanes leave
            cls = "alu"
        out, srcs = _registers(s, cls)
        words = [cls]
        if out:
            words.append("out=" + ",".join(f"R{r}" for r in out))
        deps = [r for r in dict.fromkeys(srcs) if r in written]
        if deps:
            words.append("dep=" + ",".join(f"R{r}" for r in deps))
        if cls == "ldg":
            words.append(f"bytes={min(max(round(s.bytes_sum / s.executions), 1), MAX_LDG_BYTES)}")
        if cls == "lds" and s.ways_sum:
            ways = min(max(round(s.ways_sum / s.executions), 1), 32)
            if ways > 1:
                words.append(f"ways={ways}")
        lines.append(pad + " ".join(words) + f"  # {n:04x} {s.opcode}")


def import_kernel(kernel: TraceKernel, *, opmap: dict[str, str] | None = None,
                  regs: int | None = None) -> ImportedKernel:
    """One traced kernel as a jaxsched kernel: its program (every warp's instruction count
    exact; module docstring) and arrays."""
    opmap = dict(opmap or {})
    for op, cls in opmap.items():
        check(cls in CLASSES, f"opmap[{op}]", cls, f"one of {CLASSES}")
    h = kernel.header
    src = str(kernel.path)
    unknown = sorted({s.opcode.split(".", 1)[0] for s in kernel.static.values() if _op_class(s.opcode, opmap) is None})
    check(not unknown, f"{src}: opcodes", " ".join(unknown),
          f"no instruction class; map them with opmap (--opmap OP=CLASS, CLASS one of {', '.join(CLASSES)})")
    streams, insts = [], np.zeros((h.ctas, h.warps_per_cta), np.int64)
    for c, cta in enumerate(kernel.pcs):
        for w, pcs in enumerate(cta):
            where = f"{src}: CTA {c} warp {w}"
            check(bool(pcs), where, "no instructions", "every warp must run at least its EXIT")
            last = kernel.static[pcs[-1]].opcode.split(".", 1)[0]
            check(last == "EXIT", where, last, "a warp's last instruction must be EXIT (the program's exit)")
            streams.append(pcs[:-1])
            insts[c, w] = len(pcs)
    loops = _natural_loops(streams)
    program, params = _build([_nest(s, loops) for s in streams])
    blocks = [b for b, _ in _blocks(program)]
    values = {b: np.array([p.get(b, 0) for p in params], np.int64).reshape(insts.shape) for b in blocks}
    for b, v in values.items():
        check(int(v.max()) <= MAX_TRIPS, f"{src}: loop trips", int(v.max()), f"at most {MAX_TRIPS}")
    written: set[int] = set()
    for pc in {n for b in [program, *(b.body for b in blocks)] for n in b if isinstance(n, int)}:
        s = kernel.static[pc]
        written.update(_registers(s, _op_class(s.opcode, opmap) or "alu")[0])
    names: dict[_Block, str] = {}
    lines: list[str] = []
    _emit(program, kernel, values, np.ones(insts.shape, bool), opmap, written, names, lines, 0)
    lines.append("exit")
    arrays = {name: (values[b].astype(np.int32) if b.kind == "loop" else values[b].astype(bool))
              for b, name in names.items()}
    nregs = h.nregs if regs is None else regs
    check(0 <= nregs <= MAX_REGS, f"{src}: -nregs" if regs is None else "regs", nregs,
          f"registers per thread in 0 .. {MAX_REGS}", "the tracer could not read the kernel's attributes: "
          "give the count (regs=, --regs)" if regs is None else "")
    return ImportedKernel(name=h.name, source=src, grid=h.ctas, threads=h.threads, regs=nregs,
                          smem_bytes=h.shmem_bytes, stream=h.stream, program="\n".join(lines) + "\n",
                          arrays=arrays, warp_insts=insts)


def import_traces(folder: str | Path, *, opmap: dict[str, str] | None = None,
                  regs: int | None = None) -> list[ImportedKernel]:
    """Every kernel of an Accel-Sim trace folder (its `kernelslist.g`), in launch order."""
    return [import_kernel(read_kernel(p), opmap=opmap, regs=regs) for p in trace_files(folder)]


# ---------------------------------------------------------------------------------------------
# Counting a program (an independent reading of the text form) and writing the workload


def count_instructions(program: str, arrays: dict[str, np.ndarray], grid: int, warps_per_cta: int) -> np.ndarray:
    """Each warp's dynamic instruction count ([grid, warps_per_cta]) running `program`: a loop
    repeats its body its trip count (a number, or array NAME per CTA [grid] or per warp), an `if`
    runs its if-path where the outcome is true and its else-path where false (an int32 lane mask:
    the if-path where any lane is set, the else-path where not all 32 are); `exit` counts one.
    `if P` with 0 < P < 1 has no count (lanes draw at random)."""
    shape = (grid, warps_per_cta)

    def value(word: str, where: str) -> np.ndarray:
        if word.startswith("@"):
            check(word[1:] in arrays, where, word, f"no such array; have {sorted(arrays)}")
            a = np.asarray(arrays[word[1:]])
            check(a.shape in (shape, shape[:1]), where, f"shape {a.shape}", f"{shape} or {shape[:1]}")
            return np.broadcast_to(a.reshape(grid, -1), shape)
        return np.full(shape, float(word) if "." in word else int(word))

    stack: list[list] = [["seq", np.zeros(shape, np.int64)]]  # [kind, count, (param), (if count)]
    for lineno, raw in enumerate(program.splitlines(), start=1):
        words = raw.split("#", 1)[0].split()
        if not words:
            continue
        where = f"program line {lineno}"
        head = words[0]
        if head in ("loop", "if"):
            check(len(words) == 2, where, raw.strip(), f"`{head}` takes one number or @NAME")
            v = value(words[1], where)
            if head == "if" and v.dtype.kind == "f":
                check(bool(((v == 0) | (v == 1)).all()), where, words[1], "a lane probability has no exact count")
            stack.append([head, np.zeros(shape, np.int64), v, None])
        elif head == "else":
            check(stack[-1][0] == "if" and stack[-1][3] is None, where, head, "`else` without `if`")
            stack[-1][3], stack[-1][1] = stack[-1][1], np.zeros(shape, np.int64)
        elif head == "end":
            check(len(stack) > 1, where, head, "`end` without `loop` or `if`")
            kind, count, v, if_count = stack.pop()
            if kind == "loop":
                stack[-1][1] += v.astype(np.int64) * count
            else:
                if_path, else_path = (count, np.zeros(shape, np.int64)) if if_count is None else (if_count, count)
                if v.dtype == bool or v.dtype.kind == "f":
                    taken = v.astype(bool)
                    stack[-1][1] += np.where(taken, if_path, else_path)
                else:
                    lanes = v.astype(np.int64) & 0xFFFFFFFF
                    stack[-1][1] += np.where(lanes != 0, if_path, 0) + np.where(lanes != 0xFFFFFFFF, else_path, 0)
        else:
            stack[-1][1] += 1
    check(len(stack) == 1, "program", stack[-1][0], "has no `end`")
    return stack[0][1]


def write_workload(kernels: Sequence[ImportedKernel], path: str | Path, source: str = "") -> list[Path]:
    """Write a workload TOML with one launch per kernel and its arrays as `.npy` files in
    `<stem>.arrays/` next to it (`k<launch>_<NAME>.npy`, referenced relative to the TOML as
    `arrays = {NAME = "<stem>.arrays/k0_L1.npy"}`). Kernels of one CUDA stream run in order.
    Returns the files written."""
    path = Path(path)
    folder = path.parent / f"{path.stem}.arrays"
    streams: dict[int, int] = {}
    text = [f"# Imported from the Accel-Sim traces {source} by `jaxsched import-traces`." if source else
            "# Imported from Accel-Sim traces by `jaxsched import-traces`.",
            "# Each warp runs the program with its own trip counts and if-outcomes (the arrays);",
            "# it executes as many instructions as traced. Memory copies are not simulated.",
            "[workload]", 'mode = "stream"']
    written: list[Path] = []
    for l, k in enumerate(kernels):
        refs = {}
        for name, a in k.arrays.items():
            folder.mkdir(parents=True, exist_ok=True)
            file = folder / f"k{l}_{name}.npy"
            np.save(file, a)
            written.append(file)
            refs[name] = f"{folder.name}/{file.name}"
        check("'''" not in k.program, "program", k.name, "cannot hold '''")
        arrays = ", ".join(f'{n} = "{r}"' for n, r in refs.items())
        text += ["", "[[workload.launch]]", f"stream = {streams.setdefault(k.stream, len(streams))}",
                 "", "[workload.launch.kernel]", f"name = {json.dumps(k.name, ensure_ascii=False)}",
                 f"# {k.source}: {int(k.warp_insts.sum())} warp instructions",
                 f"grid = {k.grid}", f"threads = {k.threads}", f"regs = {k.regs}",
                 f"static_smem_bytes = {k.smem_bytes}",
                 *([f"arrays = {{{arrays}}}"] if refs else []),
                 "program = '''", k.program.rstrip("\n"), "'''"]
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text("\n".join(text) + "\n", encoding="utf-8")
    return [path, *written]
