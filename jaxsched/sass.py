"""Reading SASS listings: the functions of `cuobjdump -sass` or `nvdisasm` output, each as a list
of instructions split into guard predicate, opcode, modifiers and operands.

Three layouts are read: `cuobjdump -sass` (`Function : NAME` headers, `/*addr*/ TEXT ;` lines
followed by encoding comments, branch targets as addresses), `nvdisasm` (a `.text.NAME:` section
per kernel, branch targets as labels such as `` `(.L_x_3) ``) and the annotated one-line form of
`data/h200/sass_work.txt`. `code for sm_XX` / `.target sm_XX` lines name the architecture of the
functions that follow, so a listing of a multi-architecture binary keeps each copy apart.
"""

from __future__ import annotations

import dataclasses
import re

from .errors import JaxschedError, check

_ARCH = re.compile(r"(?:code for|\.target)\s+(sm_\w+)")
_CUOBJDUMP_FUNC = re.compile(r"^\s*Function\s*:\s*(\S+)")
_NVDISASM_FUNC = re.compile(r"^\.text\.(\S+):\s*$")
_LABEL = re.compile(r"^\s*([\w.$]+):\s*$")
_INSTR = re.compile(r"^\s*/\*([0-9a-fA-F]{4,})\*/\s+([@A-Z][^;]*?)\s*;")
_GUARD = re.compile(r"^@(!?U?P(?:\d|T))\s+")
_HEX = re.compile(r"^-?0x[0-9a-fA-F]+$")
_LABEL_REF = re.compile(r"`\(([^)]+)\)")


@dataclasses.dataclass(frozen=True)
class Instr:
    """One SASS instruction: `@!P0 LDG.E.64 R2, desc[UR4][R4.64]` has guard `!P0`, opcode `LDG`,
    modifiers `("E", "64")` and operands `("R2", "desc[UR4][R4.64]")`."""

    addr: int
    text: str  # as listed, without the guard and the trailing `;`
    guard: str  # "" when unpredicated, else e.g. "P0", "!P0", "UP1"
    opcode: str
    mods: tuple[str, ...]
    operands: tuple[str, ...]
    target: int | None = None  # the address a branch or call jumps to

    @property
    def full(self) -> str:
        """The instruction as listed (with its guard)."""
        return f"@{self.guard} {self.text}" if self.guard else self.text


@dataclasses.dataclass(frozen=True)
class Function:
    """One function of a listing: its (mangled) name, architecture and instructions in address order."""

    name: str
    arch: str
    instrs: tuple[Instr, ...]

    @property
    def short_name(self) -> str:
        return short_name(self.name)


def short_name(name: str) -> str:
    """The identifier of an Itanium-mangled name (`_Z10reduce_sumPKfPfi` -> `reduce_sum`); other
    names as they are."""
    m = re.match(r"_Z(?:N\d*)?(\d+)", name)
    if m:
        length, start = int(m.group(1)), m.end()
        if len(name) >= start + length:
            return name[start:start + length]
    return name


def split_operands(text: str) -> list[str]:
    """The comma-separated operands of an instruction's operand text (commas inside brackets do
    not split)."""
    out, depth, cur = [], 0, ""
    for ch in text:
        if ch in "[(":
            depth += 1
        elif ch in "])":
            depth -= 1
        if ch == "," and depth == 0:
            out.append(cur.strip())
            cur = ""
        else:
            cur += ch
    if cur.strip():
        out.append(cur.strip())
    return out


def _instr(addr: int, raw: str) -> tuple[Instr, str | None]:
    """An instruction and the label its branch names (None: an address or no target)."""
    guard = ""
    m = _GUARD.match(raw)
    if m:
        guard, raw = m.group(1), raw[m.end():]
    head, _, rest = raw.partition(" ")
    opcode, *mods = head.split(".")
    operands = split_operands(rest)
    target, label = None, None
    if opcode in ("BRA", "CALL", "BSSY", "BREAK", "SSY", "PBK", "CAL", "JCAL") and operands:
        last = operands[-1]
        ref = _LABEL_REF.search(last)
        words = last.split()
        if words and _HEX.match(words[-1]):
            target = int(words[-1], 16)
        elif ref:
            label = ref.group(1)
    return Instr(addr, raw.strip(), guard, opcode, tuple(mods), tuple(operands), target), label


def parse_instr(text: str, addr: int = 0) -> Instr:
    """One instruction from its SASS text (`@!P0 LDG.E.64 R2, desc[UR4][R4.64]`); a branch to a
    label keeps no target."""
    return _instr(addr, text.strip().rstrip(";").strip())[0]


def read_listing(text: str) -> list[Function]:
    """Every function in a `cuobjdump -sass` or `nvdisasm` listing, in the order listed."""
    check(isinstance(text, str), "SASS listing", type(text).__name__, "text")
    funcs: list[Function] = []
    arch, name = "", None
    body: list[tuple[Instr, str | None]] = []
    labels: dict[str, int] = {}
    pending: list[str] = []

    def close() -> None:
        if name is not None:
            instrs = []
            for ins, label in body:
                if label is not None:
                    check(label in labels, f"SASS function {name}", ins.full, "branches to a label the listing lacks")
                    ins = dataclasses.replace(ins, target=labels[label])
                instrs.append(ins)
            funcs.append(Function(name, arch, tuple(instrs)))

    for line in text.splitlines():
        m = _ARCH.search(line)
        if m and not line.lstrip().startswith("/*"):
            close()
            arch, name, body, labels = m.group(1), None, [], {}
            continue
        m = _CUOBJDUMP_FUNC.match(line) or _NVDISASM_FUNC.match(line)
        if m:
            close()
            name, body, labels, pending = m.group(1), [], {}, []
            continue
        if name is None:
            continue
        if line.startswith("//---") or line.lstrip().startswith(".section"):  # nvdisasm: the next section
            close()
            name = None
            continue
        m = _LABEL.match(line)
        if m:
            pending.append(m.group(1))
            continue
        m = _INSTR.match(line)
        if m:
            addr = int(m.group(1), 16)
            for label in pending:
                labels[label] = addr
            pending = []
            body.append(_instr(addr, m.group(2)))
    close()
    return funcs


def find_function(text: str, kernel: str | None = None, arch: str | None = None) -> Function:
    """The function `kernel` (its mangled name or its identifier, `reduce_sum`) of a listing, for
    `arch` where the listing holds several architectures. Without `kernel` the listing must hold
    one function."""
    funcs = read_listing(text)
    check(bool(funcs), "SASS listing", "no functions", "expected `cuobjdump -sass` or `nvdisasm` output")
    if arch is not None:
        archs = sorted({f.arch for f in funcs})
        funcs = [f for f in funcs if f.arch == arch]
        check(bool(funcs), "arch", arch, f"the listing has code for {archs}")
    if kernel is None:
        names = sorted({f.name for f in funcs})
        check(len(names) == 1, "kernel", None, f"the listing has several functions, name one of {names}")
        kernel = names[0]
    found = [f for f in funcs if f.name == kernel] or [f for f in funcs if f.short_name == kernel]
    if not found:
        names = ", ".join(f"{f.name} ({f.short_name})" if f.short_name != f.name else f.name
                          for f in funcs)
        raise JaxschedError("kernel", kernel, f"not in the listing; it has {names}")
    check(len({f.name for f in found}) == 1, "kernel", kernel,
          f"matches several functions: {sorted({f.name for f in found})}; give the mangled name")
    check(len(found) == 1, "kernel", kernel,
          f"the listing has it for several architectures {[f.arch for f in found]}; choose one with arch")
    return found[0]
