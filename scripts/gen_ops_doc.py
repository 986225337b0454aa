"""Generates docs/ops.md, the op index: one row per op the engine knows, read from the sources.

    .venv/bin/python scripts/gen_ops_doc.py    # rewrites docs/ops.md

It scans csrc/ for the registration macros (REGISTER_KERNEL[_IN], REGISTER_FUSED_CUDA,
REGISTER_SHAPE_RULE[_IN], REGISTER_GRADIENT[_IN], NO_GRADIENT), the op-traits lines of
csrc/core/ops/*.cc and the parity cases of tests/python/op_table. An argument it cannot read (a
name that is neither a string literal nor a `constexpr const char*` constant) is an error, never a
skipped row; tests/python/test_ops_doc.py compares what it finds with torch_ort._C's registries.

Its last section walks the exporter's op vocabulary: every ONNX op that a translation of
torch.onnx's default registry (onnxscript's torch_lib) calls, and lists those without a kernel,
each with the operators whose translation emits it; tests/python/test_ops_doc.py checks that
list against the kernels.
"""
import collections
import functools
import inspect
import pathlib
import re
import sys
from dataclasses import dataclass, field

ROOT = pathlib.Path(__file__).resolve().parents[1]
CSRC = ROOT / "csrc"
OPS_DIR = CSRC / "core" / "ops"
OP_TABLE = ROOT / "tests" / "python"
DOC = ROOT / "docs" / "ops.md"

# macro -> (registry, whether its first argument is the domain)
MACROS = {
    "REGISTER_KERNEL_IN": ("kernel", True),
    "REGISTER_KERNEL": ("kernel", False),
    "REGISTER_FUSED_CUDA": ("cuda", False),
    "REGISTER_SHAPE_RULE_IN": ("shape", True),
    "REGISTER_SHAPE_RULE": ("shape", False),
    "REGISTER_GRADIENT_IN": ("gradient", True),
    "REGISTER_GRADIENT": ("gradient", False),
    "NO_GRADIENT": ("no_gradient", False),
}
MACRO_RE = re.compile(r"\b(" + "|".join(sorted(MACROS, key=len, reverse=True)) + r")\s*\(")
# inline constexpr const char* kAtenOp = "ATenOp";  (or: constexpr char kAtenOp[] = "ATenOp";)
CONST_RE = re.compile(r'constexpr\s+(?:const\s+)?char\s*'
                      r'(?:\*\s*(?:const\s+)?(k\w+)|\s*(k\w+)\s*\[\s*\])\s*=\s*"([^"]*)"')
SOURCE_SUFFIXES = {".cc", ".h", ".cu", ".cuh"}


@dataclass
class Op:
    domain: str
    name: str
    kernel: str = ""              # file:line of REGISTER_KERNEL[_IN]
    cuda: str = ""                # file:line of REGISTER_FUSED_CUDA
    shape: str = ""               # file:line of REGISTER_SHAPE_RULE[_IN]
    gradient: str = ""            # file:line of REGISTER_GRADIENT[_IN] or NO_GRADIENT
    no_gradient: bool = False     # its gradient entry is a NO_GRADIENT line
    no_gradient_reason: str = ""  # that line's reason
    non_differentiable: str = ""  # REGISTER_GRADIENT's inputs that never get a gradient ("1,2")
    traits: str = ""              # the op-traits line's fields, compact
    traits_at: str = ""           # file:line of the op-traits line
    cases: list = field(default_factory=list)

    @property
    def key(self):
        return f"{self.domain}::{self.name}"

    @property
    def label(self):
        return f"{self.domain}::{self.name}" if self.domain else self.name


def _rel(path: pathlib.Path) -> str:
    return path.relative_to(ROOT).as_posix()


def _sources():
    return sorted(p for p in CSRC.rglob("*") if p.suffix in SOURCE_SUFFIXES and p.is_file())


def _strip_comments(text: str) -> str:
    """Blanks // and /* */ comments (keeping offsets and newlines); string literals are kept."""
    out = list(text)
    i, n = 0, len(text)
    while i < n:
        ch = text[i]
        if ch == '"' or ch == "'":
            j = i + 1
            while j < n and text[j] != ch and text[j] != "\n":
                j += 2 if text[j] == "\\" else 1
            i = j + 1
        elif text.startswith("//", i):
            j = text.find("\n", i)
            j = n if j < 0 else j
            for k in range(i, j):
                out[k] = " "
            i = j
        elif text.startswith("/*", i):
            j = text.find("*/", i + 2)
            j = n if j < 0 else j + 2
            for k in range(i, j):
                if out[k] != "\n":
                    out[k] = " "
            i = j
        else:
            i += 1
    return "".join(out)


def _preprocessor_lines(text: str) -> set:
    """1-based numbers of the lines that belong to a preprocessor directive (with continuations)."""
    lines, inside = set(), False
    for no, line in enumerate(text.split("\n"), 1):
        if inside or line.lstrip().startswith("#"):
            lines.add(no)
            inside = line.rstrip().endswith("\\")
        else:
            inside = False
    return lines


def _balanced(text: str, start: int, open_ch: str, close_ch: str) -> int:
    """Index just past the bracket closing the one at text[start] (string literals skipped)."""
    depth, i = 0, start
    while i < len(text):
        ch = text[i]
        if ch == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch == open_ch:
            depth += 1
        elif ch == close_ch:
            depth -= 1
            if depth == 0:
                return i + 1
        i += 1
    raise ValueError(f"unbalanced {open_ch}{close_ch} at offset {start}")


def _split_args(text: str, start: int, end: int):
    """Top-level comma-separated arguments of text[start:end] as (stripped text, offset)."""
    args, depth, i, begin = [], 0, start, start
    while i < end:
        ch = text[i]
        if ch == '"':
            i += 1
            while text[i] != '"':
                i += 2 if text[i] == "\\" else 1
        elif ch in "([{":
            depth += 1
        elif ch in ")]}":
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(text[begin:i])
            begin = i + 1
        i += 1
    args.append(text[begin:end])
    out, offset = [], start
    for a in args:
        lead = len(a) - len(a.lstrip())
        out.append((a.strip(), offset + lead))
        offset += len(a) + 1
    return out


@functools.cache
def constants() -> dict:
    """Every `constexpr const char* kName = "..."` (or `char kName[]`) in csrc/, by name."""
    found = {}
    for path in _sources():
        for m in CONST_RE.finditer(_strip_comments(path.read_text())):
            name, value = m.group(1) or m.group(2), m.group(3)
            if found.get(name, value) != value:
                raise ValueError(f"{name} has two values: {found[name]!r} and {value!r}")
            found[name] = value
    return found


def _string(arg: str, consts: dict, where: str) -> str:
    m = re.fullmatch(r'"((?:[^"\\]|\\.)*)"', arg)
    if m:
        return re.sub(r"\\(.)", r"\1", m.group(1))
    if arg in consts:
        return consts[arg]
    raise ValueError(f"{where}: cannot read {arg!r} (not a string literal or a known constant)")


def _domain(d: str) -> str:
    return "" if d == "ai.onnx" else d


def registrations():
    """Every registration macro in csrc/: (registry, domain, op, 'file:line', remaining args)."""
    consts = constants()
    found = []
    for path in _sources():
        raw = path.read_text()
        text = _strip_comments(raw)
        directives = _preprocessor_lines(text)
        for m in MACRO_RE.finditer(text):
            line = text.count("\n", 0, m.start()) + 1
            if line in directives:
                continue  # the macros' own definitions
            registry, has_domain = MACROS[m.group(1)]
            open_at = m.end() - 1
            args = _split_args(text, open_at + 1, _balanced(text, open_at, "(", ")") - 1)
            where = f"{_rel(path)}:{line}"
            domain = _string(args[0][0], consts, where) if has_domain else ""
            if has_domain:
                args = args[1:]
            op_text, op_offset = args[0]
            op = _string(op_text, consts, where)
            op_line = text.count("\n", 0, op_offset) + 1  # the line that names the op
            found.append((registry, _domain(domain), op, f"{_rel(path)}:{op_line}", [a for a, _ in args[1:]]))
    return found


TRAIT_ENTRY_RE = re.compile(r'\{\s*(kOurDomain|"[^"]*")\s*,\s*("[^"]*"|k\w+)\s*,\s*\{')


def _trait_value(value: str, local: dict) -> str:
    if value in local:
        value = local[value]
    if value.startswith("{"):
        items = [v.strip() for v in value.strip("{}").split(",") if v.strip()]
        return ",".join(re.sub(r"^(?:\w+::)?k(?=[A-Z])", "", v) for v in items)
    return re.sub(r"^(?:\w+::)?k(?=[A-Z])", "", value)


def traits():
    """The op-traits lines of csrc/core/ops/*.cc: {(domain, op): (compact fields, 'file:line')}."""
    consts = constants()
    found = {}
    for path in sorted(OPS_DIR.glob("*.cc")):
        text = _strip_comments(path.read_text())
        # Named lists the lines use (const std::vector<DType> kInt64Out{DType::kInt64};).
        local = {m.group(1): "{" + m.group(2) + "}"
                 for m in re.finditer(r"\b(k\w+)\s*(?:=\s*)?\{([^{}]*)\}\s*;", text)}
        entries = list(TRAIT_ENTRY_RE.finditer(text))
        # Each family function returns a braced list of {domain, op, {fields}} lines: every
        # `{"` / `{kOurDomain` that opens a line must be one this scan read.
        openers = len(re.findall(r'\{\s*(?:kOurDomain|"[^"]*")\s*,', text))
        if openers != len(entries):
            raise ValueError(f"{_rel(path)}: read {len(entries)} op-traits lines of {openers}")
        for m in entries:
            where = f"{_rel(path)}:{text.count(chr(10), 0, m.start()) + 1}"
            domain = _domain(_string(m.group(1), consts, where))
            op = _string(m.group(2), consts, where)
            open_at = m.end() - 1
            fields = []
            for arg, _ in _split_args(text, open_at + 1, _balanced(text, open_at, "{", "}") - 1):
                if not arg:
                    continue
                fm = re.fullmatch(r"\.(\w+)\s*=\s*(.+)", arg, flags=re.S)
                if not fm:
                    raise ValueError(f"{where}: cannot read the field {arg!r}")
                name, value = fm.group(1), " ".join(fm.group(2).split())
                if value == "true":
                    fields.append(name)
                elif value != "false":
                    fields.append(f"{name} {_trait_value(value, local)}")
            if (domain, op) in found:
                raise ValueError(f"{where}: a second op-traits line for {domain}::{op}")
            found[(domain, op)] = ("; ".join(fields), where)
    return found


def cases():
    """{(domain, op): [case id, ...]} of tests/python/op_table's ALL_CASES."""
    if str(OP_TABLE) not in sys.path:
        sys.path.insert(0, str(OP_TABLE))
    from op_table import ALL_CASES

    out = {}
    for c in ALL_CASES:
        out.setdefault((_domain(c.domain), c.op), []).append(c.id)
    return out


def collect() -> dict:
    """{(domain, op): Op} of every op some registry, op-traits line or parity case names."""
    ops = {}

    def op(domain, name):
        return ops.setdefault((domain, name), Op(domain, name))

    cuda = []
    for registry, domain, name, where, rest in registrations():
        if registry == "cuda":
            cuda.append((name, where))
            continue
        o = op(domain, name)
        slot = "gradient" if registry == "no_gradient" else registry
        if getattr(o, slot):
            raise ValueError(f"{o.label}: two {slot} registrations ({getattr(o, slot)}, {where})")
        setattr(o, slot, where)
        if registry == "no_gradient":
            o.no_gradient = True
            o.no_gradient_reason = _string(rest[0], {}, where)
        elif registry == "gradient":
            # REGISTER_GRADIENT(op, rule, {inputs that never get a gradient})
            o.non_differentiable = _trait_value(rest[1], {}) if len(rest) > 1 else ""
    # REGISTER_FUSED_CUDA names the CUDA implementation of our fused kernel of the same name
    # (kernels/cuda_table.h): the kernel looks it up by that name on CUDA tensors.
    for name, where in cuda:
        o = ops.get((constants()["kOurDomain"], name))
        if o is None or not o.kernel:
            raise ValueError(f"{where}: CUDA kernel {name!r} has no kernel of ours by that name")
        o.cuda = where
    for (domain, name), (fields, where) in traits().items():
        o = op(domain, name)
        o.traits, o.traits_at = fields, where
    for (domain, name), ids in cases().items():
        op(domain, name).cases = ids
    return ops


# ONNX ops the engine never sees as such: the forward pipeline lowers them (passes/sequence_to_split.cc).
LOWERED = {"SplitToSequence": "sequence_to_split", "SequenceAt": "sequence_to_split"}
OP_CALL_RE = re.compile(r"\bop\.([A-Z][A-Za-z0-9]*)\s*\(")


def exporter_vocabulary() -> dict:
    """{ONNX op: sorted operator names whose torch_lib translation calls it}, read from the source
    of every translation in torch.onnx's default registry (traced and scripted functions alike)."""
    import onnxscript.function_libs.torch_lib.ops  # noqa: F401  (registers the translations)
    from onnxscript.function_libs.torch_lib.registration import default_registry

    uses = collections.defaultdict(set)
    for name, overloaded in default_registry.items():
        for fn in list(overloaded.overloads) + list(overloaded.complex):
            body = getattr(fn, "func", None) or fn.function
            for onnx_op in OP_CALL_RE.findall(inspect.getsource(body)):
                uses[onnx_op].add(name)
    return {k: sorted(v) for k, v in sorted(uses.items())}


def vocabulary_gap(kernel_ops) -> list:
    """[(ONNX op, emitted for, how it runs)] of the exporter's ops that have no kernel."""
    rows = []
    for onnx_op, users in exporter_vocabulary().items():
        if f"::{onnx_op}" in kernel_ops:
            continue
        if onnx_op in LOWERED:
            how = f"lowered by the {LOWERED[onnx_op]} pass (a lone one is refused, named)"
        elif all(u.startswith("aten::") for u in users):
            how = "ATen fallback"
        elif any(u.startswith("aten::") for u in users):
            how = "ATen fallback for the aten:: operators; the others are refused, named"
        else:
            how = "no route: refused, named (or eager per ORTMODULE_FALLBACK_POLICY)"
        shown = ", ".join(f"`{u}`" for u in users[:4]) + (f" and {len(users) - 4} more" if len(users) > 4 else "")
        rows.append((onnx_op, shown, how))
    return rows


HEADER = """\
# Op index

Every op the engine knows, one row each: the kernel that runs it, its shape rule, its gradient
rule (or the reason it declares none), the parity cases that test it (tests/python/op_table) and
its traits (csrc/core/ops/). This page is generated by `scripts/gen_ops_doc.py` from the sources;
`.venv/bin/python scripts/gen_ops_doc.py` rewrites it, and tests/python/test_ops_doc.py fails when
it is stale or when the scan and torch_ort._C's registries disagree.

- **kernel**: the `REGISTER_KERNEL` line. These kernels call ATen, so one kernel serves CPU and
  CUDA tensors alike.
- **CUDA**: the hand-written CUDA implementation (`REGISTER_FUSED_CUDA` in
  csrc/runtime/kernels/cuda/, built into torch_ort._C_cuda where nvcc is) that the kernel calls on
  CUDA tensors instead of its ATen reference. Empty: the kernel's ATen code runs on CUDA too.
- **gradient**: the `REGISTER_GRADIENT` line, with the inputs that never get a gradient ("not
  inputs 1"); or `none:` and the reason its `NO_GRADIENT` line gives. Empty: no gradient entry (a
  training graph that needs one raises GradientError, or falls back to PyTorch per
  ORTMODULE_FALLBACK_POLICY).
- **traits**: the fields its op-traits line sets. Empty: no entry (every flag false).
"""


def render() -> str:
    ops = sorted(collect().values(), key=lambda o: (o.domain, o.name))
    n = len(ops)
    kernels = sum(1 for o in ops if o.kernel)
    cuda = sum(1 for o in ops if o.cuda)
    shapes = sum(1 for o in ops if o.shape)
    grads = sum(1 for o in ops if o.gradient and not o.no_gradient)
    no_grads = sum(1 for o in ops if o.no_gradient)
    with_traits = sum(1 for o in ops if o.traits_at)
    with_cases = sum(1 for o in ops if o.cases)
    lines = [HEADER]
    lines.append(f"{n} ops: {kernels} with a kernel ({cuda} of them with a CUDA implementation), "
                 f"{shapes} with a shape rule, {grads} differentiable, {no_grads} declared without "
                 f"gradient, {with_traits} with traits, {with_cases} with parity cases "
                 f"({sum(len(o.cases) for o in ops)} cases).")
    lines.append("")
    lines.append("| op | kernel | CUDA | shape rule | gradient | parity cases | traits |")
    lines.append("|---|---|---|---|---|---|---|")
    for o in ops:
        if o.no_gradient:
            grad = f"none: {o.no_gradient_reason} ({o.gradient})"
        elif o.gradient and o.non_differentiable:
            grad = f"{o.gradient} (not inputs {o.non_differentiable})"
        else:
            grad = o.gradient
        cells = [f"`{o.label}`", o.kernel, o.cuda, o.shape, grad, ", ".join(o.cases), o.traits]
        lines.append("| " + " | ".join(c.replace("|", "\\|") for c in cells) + " |")
    kernel_ops = {o.key for o in ops if o.kernel}
    vocabulary = exporter_vocabulary()
    gap = vocabulary_gap(kernel_ops)
    lines += ["", "## Exporter ops without a kernel", "",
              f"The exporter's vocabulary (every ONNX op a translation of torch.onnx's default registry "
              f"calls) holds {len(vocabulary)} ops; {len(vocabulary) - len(gap)} have a kernel, these "
              f"{len(gap)} do not. An aten:: operator whose translation emits one of them runs through "
              "the ATen fallback instead (docs/user_guide.md), with no second export, where ATenOp can "
              "carry its arguments and results (tensors, scalars, int lists; not a list of tensors): "
              "otherwise the build refuses it, naming it.", "",
              "| ONNX op | emitted for | how it runs |", "|---|---|---|"]
    lines += [f"| `{op}` | {users} | {how} |" for op, users, how in gap]
    return "\n".join(lines) + "\n"


def main():
    DOC.write_text(render())
    print(f"wrote {_rel(DOC)}")


if __name__ == "__main__":
    main()
